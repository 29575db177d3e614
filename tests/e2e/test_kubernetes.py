"""The Kubernetes backend end to end, on the project's one-node test cluster (tests/kubernetes/
cluster.sh: a real kube-apiserver, scheduler, controller-manager, containerd and kubelet on this
machine). ctest's kubernetes_cluster fixture brings it up (with this build's agent image) before
these tests and down after them; by hand: SHOAL_BIN=build/src/cli/shoal tests/kubernetes/
cluster.sh up, then export the KUBECONFIG=... line it prints.

Every job runs in localhost/shoal-python:test, an image with Debian's python3, torch and
scikit-learn and nothing of Shoal: the agent and the SDK come in through the agent image."""

import json
import os
import re
import signal
import time
import uuid

import pytest

import shoal_e2e as e2e
from kubernetes_jobs import (IMAGE, TICKER, TRAIN, cluster, k8s_job, kubectl,  # noqa: F401
                             nothing_left_behind, shoal_objects, wait_for_pods_running)


def test_the_demo_trains_in_pods_and_leaves_nothing(write_job, run_shoal):
    job = k8s_job(write_job, "digits-k8s", f"""\
  worker:
    instances: 2
    command: [/usr/bin/python3, {TRAIN}, --epochs, "10"]
    working_dir: {e2e.EXAMPLE_DIR}
    resources: {{cpus: 0.5, memory: 1GiB}}
""", extra="framework: pytorch\n")
    r = run_shoal("run", "--backend", "kubernetes", job, timeout=300)
    assert r.returncode == 0, f"rc={r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    accuracy = [float(line.split("=")[1]) for line in r.stdout.splitlines()
                if line.startswith("worker:0 | final_accuracy=")]
    assert accuracy and accuracy[0] >= 0.9, r.stdout[-2000:]
    # Each rank ran in its own pod (its hostname is the pod's name).
    assert "world_size\": 2" in r.stdout
    assert shoal_objects() == []


ENV_DUMP = ("import json, os; print('ENV ' + json.dumps({k: v for k, v in os.environ.items() "
            "if k in %s}))")
TORCHRUN_KEYS = ["MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                 "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_NAME", "ROLE_RANK",
                 "ROLE_WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT", "OMP_NUM_THREADS",
                 "SHOAL_JOB_ID", "SHOAL_TASK", "SHOAL_ROLE", "SHOAL_TASK_INDEX"]


def test_the_task_environment_is_the_local_backends(write_job, run_shoal):
    """The same job file on both backends gives each task the same variables, with the same
    values but for the addresses (pods have their own), the job's id, and where the task sits
    among its node's: each pod is a node of its own."""
    command = json.dumps(["/usr/bin/python3", "-c", ENV_DUMP % TORCHRUN_KEYS])
    roles = f"""\
  worker:
    instances: 2
    command: {command}
    resources: {{cpus: 0.25, memory: 256MiB}}
"""
    job = k8s_job(write_job, "env-k8s", roles, extra="framework: pytorch\n")

    def envs(*backend):
        r = run_shoal("run", *backend, job, timeout=180)
        assert r.returncode == 0, f"{backend}: rc={r.returncode}\n{r.stderr[-2000:]}"
        out = {}
        for line in r.stdout.splitlines():
            task, _, text = line.partition(" | ")
            if text.startswith("ENV "):
                out[task] = json.loads(text[4:])
        assert set(out) == {"worker:0", "worker:1"}, r.stdout
        return out

    local = envs()
    pods = envs("--backend", "kubernetes")
    # Each pod is a node of its own (as each container is on YARN): one task per node.
    per_node = {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
    for task in local:
        assert set(pods[task]) == set(local[task]), (task, local[task], pods[task])
        for key, value in local[task].items():
            if key in ("MASTER_ADDR", "SHOAL_JOB_ID", "MASTER_PORT"):
                continue
            want = per_node.get(key, pods[task]["RANK"] if key == "GROUP_RANK" else value)
            assert pods[task][key] == want, (task, key, local[task], pods[task])
    # Rank 0's pod address, the same for both ranks, and not this machine's loopback.
    assert pods["worker:0"]["MASTER_ADDR"] == pods["worker:1"]["MASTER_ADDR"]
    assert not pods["worker:0"]["MASTER_ADDR"].startswith("127."), pods


@pytest.mark.parametrize("policy", ["restart-task", "restart-group"])
def test_a_deleted_pod_is_handled_by_the_failure_policy(policy, write_job, write_file,
                                                         start_shoal, jobs_dir, shoal_status):
    script = write_file("ticker.py", TICKER)
    roles = f"""\
  worker:
    instances: 2
    command: [/usr/bin/python3, {script}, "120"]
    resources: {{cpus: 0.25, memory: 256MiB}}
"""
    job = k8s_job(write_job, f"kill-{policy}", roles,
                  extra=f"on_failure: {policy}\nbackoff: {{initial: 200ms, max: 1s}}\n",
                  volumes=[script.parent])
    client = start_shoal("run", "--backend", "kubernetes", job)
    job_dir = e2e.wait_for_job(jobs_dir, f"kill-{policy}", timeout=60)
    pods = wait_for_pods_running(job_dir.name, 2)
    # A pod of a running job: one taken away before every agent registered fails the job.
    e2e.wait_until(lambda: shoal_status(job_dir.name)["state"] == "running", 120,
                   "the job running")
    victim = next(p for p in pods if p["metadata"]["annotations"]["shoal.io/place"] == "worker.1")
    kubectl("delete", "pod", victim["metadata"]["name"], "--wait=false")
    rc = client.wait(240)
    assert rc == 0, f"rc={rc}\n{client.stderr()[-3000:]}"
    status = shoal_status(job_dir.name)
    assert status["state"] == "succeeded", status
    events = e2e.read_events(job_dir)
    failures = [e for e in e2e.task_transitions(events, "worker:1") if e["to"] == "failed"]
    assert failures, events
    restarted = {t["task"]: t["restarts"] for t in status["tasks"]}
    if policy == "restart-task":
        assert restarted["worker:1"] >= 1 and restarted["worker:0"] == 0, status
    else:
        assert status["group_restarts"] >= 1, status
    # The place got a new pod: the first was worker-1-0, its successor worker-1-1 or later.
    lost = [e for e in events if "pod " + victim["metadata"]["name"] in json.dumps(e)]
    assert lost, f"no event names the deleted pod {victim['metadata']['name']}: {events}"


def test_ctrl_c_leaves_nothing_in_the_namespace(write_job, write_file, start_shoal, jobs_dir):
    script = write_file("ticker.py", TICKER)
    roles = f"""\
  worker:
    instances: 2
    command: [/usr/bin/python3, {script}, "600"]
    resources: {{cpus: 0.25, memory: 256MiB}}
"""
    job = k8s_job(write_job, "interrupted", roles, volumes=[script.parent])
    client = start_shoal("run", "--backend", "kubernetes", job)
    job_dir = e2e.wait_for_job(jobs_dir, "interrupted", timeout=60)
    wait_for_pods_running(job_dir.name, 2)
    os.kill(client.pid, signal.SIGINT)
    rc = client.wait(120)
    assert rc != 0, client.stderr()
    assert shoal_objects() == [], "objects left after Ctrl-C"


def test_a_missing_image_fails_fast_with_the_reason_and_leaves_nothing(write_job, run_shoal):
    job = write_job("""\
name: no-image
roles:
  worker: {command: [python3, -c, "print(1)"], resources: {cpus: 0.1}}
kubernetes: {image: "localhost/no-such-image:1", image_pull_policy: Never}
""")
    started = time.monotonic()
    r = run_shoal("run", "--backend", "kubernetes", job, timeout=120)
    assert r.returncode == 1, f"rc={r.returncode}\n{r.stderr}"
    assert "localhost/no-such-image:1" in r.stderr and "ErrImageNeverPull" in r.stderr, r.stderr
    assert time.monotonic() - started < 60
    assert shoal_objects() == []


def test_a_bad_kubeconfig_is_a_usage_error_that_starts_nothing(write_job, run_shoal, tmp_path,
                                                               jobs_dir):
    bad = tmp_path / "kubeconfig"
    bad.write_text("apiVersion: v1\nkind: Config\nclusters: [}\n")
    job = write_job("""\
name: bad-config
roles:
  worker: {command: [python3, -c, "print(1)"]}
kubernetes: {image: busybox}
""")
    r = run_shoal("run", "--backend", "kubernetes", "--kubeconfig", bad, job, timeout=60)
    assert r.returncode == 2, f"rc={r.returncode}\n{r.stderr}"
    assert str(bad) in r.stderr, r.stderr
    assert not jobs_dir.exists() or not any(jobs_dir.iterdir())


def test_a_namespace_without_permission_is_refused_before_anything_starts(
        write_job, run_shoal, tmp_path, jobs_dir):
    """A user whose RBAC allows nothing in the namespace: exit 2 naming what it may not do."""
    ns = f"locked-{uuid.uuid4().hex[:6]}"
    kubectl("create", "namespace", ns)
    try:
        kubectl("create", "serviceaccount", "nobody", "-n", ns)
        token = kubectl("create", "token", "nobody", "-n", ns).stdout.strip()
        admin = json.loads(kubectl("config", "view", "--raw", "-o", "json").stdout)
        cluster = admin["clusters"][0]["cluster"]
        config = tmp_path / "nobody.kubeconfig"
        config.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "nobody",
            "clusters": [{"name": "test", "cluster": cluster}],
            "users": [{"name": "nobody", "user": {"token": token}}],
            "contexts": [{"name": "nobody",
                          "context": {"cluster": "test", "user": "nobody", "namespace": ns}}]}))
        job = write_job("""\
name: locked
roles:
  worker: {command: [python3, -c, "print(1)"]}
kubernetes: {image: busybox}
""")
        r = run_shoal("run", "--backend", "kubernetes", "--kubeconfig", config, job, timeout=60)
        assert r.returncode == 2, f"rc={r.returncode}\n{r.stderr}"
        assert f"may not create pods in namespace {ns}" in r.stderr, r.stderr
        assert token not in r.stderr + r.stdout
        assert shoal_objects(ns) == []
    finally:
        kubectl("delete", "namespace", ns, "--wait=false", check=False)


def test_a_job_the_cluster_cannot_hold_waits_saying_why(
        write_job, start_shoal, jobs_dir, shoal_status, run_shoal):
    job = write_job(f"""\
name: too-big
roles:
  worker: {{command: [python3, -c, "print(1)"], resources: {{cpus: 64}}}}
kubernetes: {{image: {IMAGE}, image_pull_policy: Never}}
""")
    client = start_shoal("run", "--backend", "kubernetes", job)
    job_dir = e2e.wait_for_job(jobs_dir, "too-big", timeout=60)

    def queued():
        s = shoal_status(job_dir.name)
        return s if "Insufficient cpu" in json.dumps(s) else None
    # In the scheduler's words (Shoal's admission checks the room before the scheduler sees the
    # gang), with what the gang needs and what is free.
    status = e2e.wait_until(queued, 60, "the reason in shoal status")
    assert re.search(r"0/\d+ nodes are available: .*1 Insufficient cpu", json.dumps(status)), status
    assert "does not fit now" in json.dumps(status), status
    assert status["state"] in ("queued", "starting"), status
    r = run_shoal("kill", job_dir.name, timeout=60)
    assert r.returncode == 0, r.stderr
    client.wait(120)
    assert shoal_objects() == []


def test_a_killed_master_is_replaced_and_no_task_restarts(write_job, write_file, start_shoal,
                                                          jobs_dir, shoal_status):
    script = write_file("ticker.py", TICKER)
    roles = f"""\
  worker:
    instances: 2
    command: [/usr/bin/python3, {script}, "80"]
    resources: {{cpus: 0.25, memory: 256MiB}}
"""
    job = k8s_job(write_job, "recover-k8s", roles, volumes=[script.parent])
    client = start_shoal("run", "--backend", "kubernetes", job)
    job_dir = e2e.wait_for_job(jobs_dir, "recover-k8s", timeout=60)
    wait_for_pods_running(job_dir.name, 2)
    e2e.wait_until(lambda: "tick 5" in (job_dir / "logs.txt").read_text(errors="replace"), 60,
                   "the tasks to tick")
    master = json.loads((job_dir / "master.json").read_text())["pid"]
    os.kill(master, signal.SIGKILL)
    rc = client.wait(240)
    assert rc == 0, client.stderr()[-3000:]
    assert "died; starting a new one from the job's journal" in client.stderr()
    status = shoal_status(job_dir.name)
    assert status["state"] == "succeeded", status
    assert all(t["restarts"] == 0 for t in status["tasks"]), status
    events = e2e.read_events(job_dir)
    for task in ("worker:0", "worker:1"):
        starts = [e for e in e2e.task_transitions(events, task) if e["to"] == "running"]
        assert len(starts) == 1, (task, starts)


def test_two_gangs_racing_for_the_same_room_run_one_after_the_other(write_job, write_file,
                                                                    start_shoal, jobs_dir,
                                                                    shoal_status):
    """Each gang needs 1.8 of the node's 2 cpus: admitted whole or not at all, the two never
    hold part of the node each (which would leave both waiting forever); one runs, then the
    other, and the one that waited says why."""
    script = write_file("ticker.py", TICKER)
    clients = {}
    for name in ("race-a", "race-b"):
        roles = f"""\
  worker:
    instances: 2
    command: [/usr/bin/python3, {script}, "16"]
    resources: {{cpus: 0.9, memory: 256MiB}}
"""
        job = k8s_job(write_job, name, roles, volumes=[script.parent])
        clients[name] = start_shoal("run", "--backend", "kubernetes", job)
    for name, client in clients.items():
        rc = client.wait(300)
        assert rc == 0, f"{name}: rc={rc}\n{client.stderr()[-3000:]}"
    spans = {}
    waited = []
    for name in clients:
        job_dir = e2e.wait_for_job(jobs_dir, name, timeout=10)
        events = e2e.read_events(job_dir)
        running = [e2e.event_seconds(e) for e in events
                   if e.get("type") == "task_state" and e.get("to") == "running"]
        ended = [e2e.event_seconds(e) for e in events
                 if e.get("type") == "task_state" and e.get("to") == "succeeded"]
        spans[name] = (min(running), max(ended))
        waited += [e for e in e2e.events_of(events, "queued")
                   if "does not fit now" in e.get("reason", "")
                   or "which is being admitted" in e.get("reason", "")]
    first, second = sorted(spans.values())
    # Their tasks never ran at the same time (1 s for the events' clock rounding).
    assert second[0] >= first[1] - 1, spans
    assert waited, "neither job said it waited for room"
