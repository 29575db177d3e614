"""The Kubernetes backend at scale without real machines: a 1,000-pod gang on 100 fake nodes.

kwok (tests/kubernetes/kwok.sh) plays the kubelet of 100 fake nodes on the project's test
cluster: the real scheduler binds the pods to them and kwok marks them Running without running
anything, so no agent ever registers. The job is admitted (every pod bound: the master records
`allocated`), `shoal status` reports its 1,000 tasks, and `shoal kill` removes every pod, the
token Secret and the owner ConfigMap from the namespace.

ctest's kubernetes_kwok fixture starts kwok and its nodes after the kubernetes_cluster fixture;
by hand: tests/kubernetes/cluster.sh up, then tests/kubernetes/kwok.sh up, and export the
cluster's KUBECONFIG=... line."""

import json
import os
import subprocess
import time
import uuid

import pytest

import shoal_e2e as e2e

KWOK_SH = e2e.REPO_ROOT / "tests" / "kubernetes" / "kwok.sh"
PODS = 1000
FAKE_NODES = 100
MANAGED = "app.kubernetes.io/managed-by=shoal"


kubectl = e2e.kubectl


@pytest.fixture(scope="module", autouse=True)
def fake_nodes():
    config = os.environ.get("KUBECONFIG")
    assert config and os.path.exists(config), (
        "KUBECONFIG does not name the test cluster's kubeconfig: run this through ctest (its "
        "kubernetes_cluster and kubernetes_kwok fixtures start the cluster and kwok) or run "
        "tests/kubernetes/cluster.sh up and tests/kubernetes/kwok.sh up, and export the "
        "KUBECONFIG=... line cluster.sh prints")
    r = subprocess.run(["bash", str(KWOK_SH), "status"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, (
        f"kwok is not running with Ready fake nodes ({r.stdout.strip()} {r.stderr.strip()}): "
        f"run tests/kubernetes/kwok.sh up")
    ready = json.loads(kubectl("get", "nodes", "-l", "type=kwok", "-o", "json").stdout)["items"]
    assert len(ready) >= FAKE_NODES, (
        f"{len(ready)} fake nodes, {FAKE_NODES} needed: SHOAL_KWOK_NODES={FAKE_NODES} "
        f"tests/kubernetes/kwok.sh up")


@pytest.fixture
def namespace():
    ns = f"kwok-scale-{uuid.uuid4().hex[:6]}"
    kubectl("create", "namespace", ns)
    yield ns
    kubectl("delete", "namespace", ns, "--wait=false", check=False)


def shoal_objects(ns):
    r = kubectl("get", "pods,secrets,configmaps", "-n", ns, "-l", MANAGED, "-o", "name")
    return [line for line in r.stdout.splitlines() if line.strip()]


def test_a_1000_pod_gang_on_fake_nodes_is_admitted_reported_and_torn_down(
        write_job, start_shoal, run_shoal, jobs_dir, shoal_status, namespace):
    # The image is never pulled: kwok runs nothing. The selector and the toleration put the
    # pods on the fake nodes, and only there.
    job = write_job(f"""\
name: kwok-gang
roles:
  worker:
    instances: {PODS}
    command: [/bin/true]
    resources: {{cpus: 0.1, memory: 64MiB}}
kubernetes:
  image: localhost/never-pulled:kwok
  image_pull_policy: Never
  node_selector: {{type: kwok}}
  tolerations: [{{key: kwok.x-k8s.io/node, operator: Equal, value: fake, effect: NoSchedule}}]
""")
    client = start_shoal("run", "--backend", "kubernetes", "--namespace", namespace, job)
    job_dir = e2e.wait_for_job(jobs_dir, "kwok-gang", timeout=60)
    try:
        # Admitted: every pod created and bound to a fake node by the real scheduler (kwok
        # then marks it Running).
        def placed():
            assert client.poll() is None, (
                f"the client ended before the pods were placed: rc={client.poll()}\n"
                f"{client.stderr()[-3000:]}")
            r = kubectl("get", "pods", "-n", namespace, "-l", MANAGED, "-o",
                        "jsonpath={range .items[*]}{.spec.nodeName}{' '}{.status.phase}"
                        "{'\\n'}{end}")
            pods = [line.split() for line in r.stdout.splitlines() if line.strip()]
            bound = [p for p in pods if len(p) == 2 and p[1] == "Running"]
            return pods if len(bound) == PODS else None
        pods = e2e.wait_until(placed, 300, f"{PODS} pods bound and running", interval=1)
        nodes = {node for node, _ in pods}
        elsewhere = sorted(n for n in nodes if not n.startswith("kwok-node-"))
        assert not elsewhere, f"pods outside the fake nodes: {elsewhere}"
        assert len(nodes) > 1, nodes

        # Reported: the job and its 1,000 tasks, waiting for agents that never come (or, if
        # its registration deadline came first, failed for that).
        status = shoal_status(job_dir.name)
        assert len(status["tasks"]) == PODS, len(status["tasks"])
        assert status["state"] in ("starting", "failed"), status["state"]
        if status["state"] == "failed":
            assert "did not register" in json.dumps(status), status.get("reason")
    finally:
        # Torn down: by kill, or by the job's own end at its registration deadline (30 s
        # after its pods were created) if that came first. `shoal kill` waits 15 s for the
        # master to confirm; releasing 1,000 pods can take longer on this shared machine, so
        # the job's end is waited for here instead.
        started = time.monotonic()
        killed = run_shoal("kill", job_dir.name, timeout=120)
        rc = client.wait(240)
    assert killed.returncode == 0 or "did not confirm the kill" in killed.stderr, killed.stderr
    assert rc != 0, "a job whose agents never registered cannot succeed"
    assert shoal_status(job_dir.name)["state"] in ("killed", "failed")
    left = e2e.wait_until(lambda: not shoal_objects(namespace), 120,
                          "every pod, the secret and the owner configmap to be gone",
                          interval=1)
    assert left
    teardown = time.monotonic() - started
    # How long, for whoever reads the log (never asserted: this machine is shared).
    print(f"{PODS} pods on {len(nodes)} fake nodes; torn down in {teardown:.1f} s")
    log = (job_dir / "master.log").read_text(errors="replace") if (
        job_dir / "master.log").exists() else ""
    assert "API requests to the API server for" in log, log[-2000:]
