"""The agent delivered once per node (docs/backends/kubernetes.md, "Installing the agent on the
nodes"): `shoal kubernetes agent-daemonset | kubectl apply -f -` puts it in a directory of every
node, and a job run with --agent-host-path mounts it there instead of copying it into each pod
with an init container. On the project's one-node test cluster (tests/kubernetes/cluster.sh),
whose node is this machine: the host directory is under /tmp, removed after.

The DaemonSet's init container runs the agent image's own shoal (`shoal kubernetes
agent-install`): the image must come from this build. ctest's kubernetes_cluster fixture imports
this build's as localhost/shoal-agent:latest; by hand, build and import one under a tag of your
own (docs/backends/kubernetes-test-cluster.md) and name it in SHOAL_KUBERNETES_AGENT_IMAGE."""

import json
import os
import shutil
import uuid

import pytest

import shoal_e2e as e2e

IMAGE = "localhost/shoal-python:test"
AGENT_IMAGE = os.environ.get("SHOAL_KUBERNETES_AGENT_IMAGE", "localhost/shoal-agent:latest")
PAUSE_IMAGE = "localhost/pause:test"

kubectl = e2e.kubectl


@pytest.fixture
def cluster():
    e2e.require_kubernetes_cluster()


@pytest.fixture
def namespace(cluster):
    """A namespace of this test's own, deleted with everything in it afterwards."""
    name = f"e2e-agent-host-path-{uuid.uuid4().hex[:6]}"
    kubectl("create", "namespace", name)
    yield name
    kubectl("delete", "namespace", name, "--wait=true", "--timeout=120s", check=False,
            timeout=180)


@pytest.fixture
def host_dir():
    """A directory on the node (this machine) for the agent and the test's gate file."""
    path = f"/tmp/shoal-agent-e2e-{uuid.uuid4().hex[:8]}"
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_job_runs_from_the_agent_on_the_node_without_an_init_container(
        namespace, host_dir, start_shoal, run_shoal, write_job):
    agent_dir = f"{host_dir}/agent"
    manifest = run_shoal("kubernetes", "agent-daemonset", "--agent-image", AGENT_IMAGE,
                         "--agent-host-path", agent_dir, "--pause-image", PAUSE_IMAGE,
                         "--namespace", namespace)
    assert manifest.returncode == 0, manifest.stderr
    kubectl("apply", "-f", "-", stdin=manifest.stdout)
    try:
        r = kubectl("rollout", "status", "daemonset/shoal-agent", "-n", namespace,
                    "--timeout=120s", check=False, timeout=150)
        assert r.returncode == 0, (
            f"the agent DaemonSet did not become ready: {r.stdout}{r.stderr}\n"
            + kubectl("get", "pods", "-n", namespace, "-o", "yaml", check=False).stdout[-3000:])
        assert os.access(f"{agent_dir}/bin/shoal", os.X_OK), os.listdir(host_dir)
        assert sorted(os.listdir(host_dir)) == ["agent"], "a temporary copy was left behind"

        # The tasks wait for the gate, so that their pods can be looked at while they run.
        gate = f"{host_dir}/go"
        wait_then_report = (
            f"import os, time\nwhile not os.path.exists({gate!r}): time.sleep(0.2)\n"
            "print('agent-writable', os.access('/opt/shoal', os.W_OK))\n")
        volumes = [{"name": "gate", "host_path": host_dir, "mount_path": host_dir,
                    "read_only": True}]
        job = write_job(f"""\
name: agent-on-node
heartbeat: {{interval: 1s, misses: 30}}
roles:
  worker:
    instances: 2
    command: {json.dumps(["/usr/bin/python3", "-c", wait_then_report])}
    resources: {{cpus: 0.1, memory: 128MiB}}
kubernetes:
  image: {IMAGE}
  image_pull_policy: Never
  volumes: {json.dumps(volumes)}
""")
        client = start_shoal("run", "--backend", "kubernetes", "--namespace", namespace,
                             "--agent-host-path", agent_dir, job)

        def running_pods():
            out = kubectl("get", "pods", "-n", namespace, "-l", "shoal.io/job", "-o",
                          "json").stdout
            pods = json.loads(out)["items"]
            running = [p for p in pods if p["status"].get("phase") == "Running"]
            return running if len(running) == 2 else None
        e2e.wait_until(lambda: running_pods() or client.poll() is not None, 180,
                       "the job's two pods to run")
        pods = running_pods()
        assert pods, f"the job ended early: {client.stdout()[-2000:]}{client.stderr()[-2000:]}"
        for pod in pods:
            spec = pod["spec"]
            assert "initContainers" not in spec, json.dumps(spec, indent=1)
            agent = [v for v in spec["volumes"] if v["name"] == "shoal-agent"]
            assert agent == [{"name": "shoal-agent",
                              "hostPath": {"path": agent_dir, "type": "Directory"}}], agent
        open(gate, "w").close()
        rc = client.wait(180)
        out = client.stdout()
        assert rc == 0, f"rc={rc}\n{out[-2000:]}\n{client.stderr()[-2000:]}"
        for task in ("worker:0", "worker:1"):
            assert f"{task} | agent-writable False" in out, out[-2000:]
    finally:
        kubectl("delete", "daemonset", "shoal-agent", "-n", namespace, "--wait=true",
                "--timeout=60s", check=False, timeout=90)


def test_bad_agent_host_paths_are_refused_with_exit_2(run_shoal, write_job):
    r = run_shoal("kubernetes", "agent-daemonset", "--agent-host-path", "var/lib/shoal")
    assert r.returncode == 2, r
    assert "--agent-host-path: must be an absolute path on the nodes" in r.stderr
    assert r.stdout == ""

    job = write_job("""\
name: bad-path
roles:
  worker: {command: [/bin/true]}
kubernetes: {image: x:1}
""")
    r = run_shoal("run", "--backend", "kubernetes", "--agent-host-path", "/var/lib/shoal/",
                  job)
    assert r.returncode == 2, r
    assert "--agent-host-path: must be an absolute path on the nodes" in r.stderr

    job = write_job("""\
name: bad-path
roles:
  worker: {command: [/bin/true]}
kubernetes:
  image: x:1
  agent_host_path: shoal/agent
""")
    r = run_shoal("run", "--backend", "kubernetes", job)
    assert r.returncode == 2, r
    assert "job.yaml:6: kubernetes.agent_host_path: must be an absolute path" in r.stderr


def test_a_node_without_the_agent_fails_the_job_fast_with_the_reason(run_shoal, write_job,
                                                                      namespace, host_dir):
    """--agent-host-path naming a directory the node lacks (no DaemonSet there): the kubelet
    cannot mount it and says so only in an event; the job fails within seconds with that
    reason instead of starting forever, and leaves nothing in the namespace."""
    job = write_job(f"""\
name: no-agent
roles:
  worker:
    instances: 1
    command: [/usr/bin/python3, -c, "print('never')"]
    resources: {{cpus: 0.05, memory: 64MiB}}
kubernetes:
  image: {IMAGE}
  image_pull_policy: Never
""")
    missing = os.path.join(host_dir, "absent")
    r = run_shoal("run", "--backend", "kubernetes", "--namespace", namespace,
                  "--agent-host-path", missing, job, timeout=120)
    assert r.returncode == 1, f"rc={r.returncode}\n{r.stdout}\n{r.stderr}"
    assert "cannot mount its volumes" in r.stderr and missing in r.stderr, r.stderr[-2000:]
    left = kubectl("get", "pods,secrets,configmaps", "-n", namespace, "-l",
                   "app.kubernetes.io/managed-by=shoal", "-o", "name").stdout.split()
    assert not left, left
