"""The Kubernetes backend when capacity comes and goes, end to end on the project's one-node
test cluster (tests/kubernetes/cluster.sh; see test_kubernetes.py): elastic jobs preempted by a
higher-priority job and started in a busy cluster (EDL), and a node lost and back."""

import json
import os
import signal

import shoal_e2e as e2e
from kubernetes_jobs import (TICKER, TRAIN, cluster, k8s_job, kubectl,  # noqa: F401
                             nothing_left_behind, pods_of, wait_for_pods_running)


PRIORITY_CLASSES = """
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: shoal-test-low}
value: 100
description: Shoal's tests - an elastic training job that may be preempted
---
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: shoal-test-high}
value: 1000
description: Shoal's tests - a job that preempts the elastic one
"""


def with_priority(path, priority_class):
    """The job file at `path` with the PriorityClass named."""
    path.write_text(path.read_text().replace(
        "  image_pull_policy: Never\n",
        f"  image_pull_policy: Never\n  priority_class: {priority_class}\n"))
    return path


def high_priority_ticker(write_job, write_file, name, ticks):
    """A job of 2 x 0.45 cpu at high priority that prints `ticks` ticks, 4 a second."""
    script = write_file("ticker.py", TICKER)
    return with_priority(k8s_job(write_job, name, f"""\
  worker:
    instances: 2
    command: [/usr/bin/python3, {script}, "{ticks}"]
    resources: {{cpus: 0.45, memory: 256MiB}}
""", volumes=[script.parent]), "shoal-test-high")


def world_sizes(job_dir):
    return [e["world_size"] for e in e2e.events_of(e2e.read_events(job_dir), "rendezvous")]


def test_an_elastic_job_shrinks_when_preempted_and_grows_back(write_job, write_file, run_shoal,
                                                              start_shoal, jobs_dir,
                                                              shoal_status, tmp_path):
    """EDL: a low-priority elastic job (2 to 3 workers of 0.5 cpu) on the 2-cpu node; a
    high-priority job of 2 x 0.45 cpu comes: the scheduler preempts one elastic pod, the job goes
    on as 2 from its checkpoint, its third pod waits for room without blocking anyone, and it
    grows back to 3 when the high-priority job ends. It trains to within 2 points of an
    undisturbed run."""
    kubectl("apply", "-f", "-", stdin=PRIORITY_CLASSES)

    def elastic_job(name, step_delay):
        ckpt = tmp_path / f"ckpt-{name}"
        ckpt.mkdir()
        roles = f"""\
  worker:
    instances: {{min: 2, max: 3}}
    command: [/usr/bin/python3, {TRAIN}, --epochs, "10", --checkpoint-every, "10",
              --step-delay, "{step_delay}"]
    working_dir: {e2e.EXAMPLE_DIR}
    resources: {{cpus: 0.5, memory: 1GiB}}
"""
        extra = (f"framework: pytorch\non_failure: elastic\nmax_restarts: 10\n"
                 f"backoff: {{initial: 1s, max: 2s}}\ncheckpoint: {{dir: {ckpt}}}\n")
        return with_priority(k8s_job(write_job, name, roles, extra=extra, volumes=[ckpt]),
                             "shoal-test-low")

    calm = run_shoal("run", "--backend", "kubernetes", elastic_job("undisturbed", 0.02),
                     timeout=300)
    assert calm.returncode == 0, calm.stderr[-3000:]
    baseline = [float(line.split("=")[1]) for line in calm.stdout.splitlines()
                if "final_accuracy=" in line][-1]

    client = start_shoal("run", "--backend", "kubernetes", elastic_job("edl", 0.4))
    job_dir = e2e.wait_for_job(jobs_dir, "edl", timeout=60)
    e2e.wait_until(lambda: (s := shoal_status(job_dir.name))["state"] == "running"
                   and sum(t["in_world"] and t["state"] == "running" for t in s["tasks"]) == 3,
                   180, "the elastic job running as 3")
    high = high_priority_ticker(write_job, write_file, "urgent", 40)
    urgent = run_shoal("run", "--backend", "kubernetes", high, timeout=300)
    assert urgent.returncode == 0, urgent.stderr[-3000:]

    rc = client.wait(600)
    assert rc == 0, f"rc={rc}\n{client.stderr()[-4000:]}"
    accuracy = [float(line.split("=")[1]) for line in client.stdout().splitlines()
                if "final_accuracy=" in line][-1]
    assert abs(accuracy - baseline) <= 0.02, (accuracy, baseline)
    sizes = world_sizes(job_dir)
    assert sizes[0] == 3 and 2 in sizes and sizes[-1] == 3, sizes
    assert sizes.index(2) < len(sizes) - 1 - sizes[::-1].index(3), sizes
    events = e2e.read_events(job_dir)
    assert "PreemptionByScheduler" in json.dumps(events), "no event names the preemption"
    # It grew back only once the third pod's new agent was there: a world of 3 formed earlier
    # would hold the two running workers in their rendezvous for as long as the room is taken.
    assert_worlds_form_only_with_their_agents(events)


def assert_worlds_form_only_with_their_agents(events):
    """Every world formed holds only tasks whose place had a registered agent at that moment."""
    registered = {}
    for e in events:
        if e["type"] == "agent_registered":
            registered[e["node"]] = e["ts_us"]
        elif e["type"] in ("place_lost", "place_replacing", "agent_disconnected"):
            registered.pop(e["node"], None)
        elif e["type"] == "rendezvous":
            missing = [r["node"] for r in e["ranks"] if r["node"] not in registered]
            assert not missing, (f"generation {e['generation']} formed with {missing} "
                                 f"before their agents registered")


def test_an_elastic_job_starts_with_what_fits_and_grows_when_room_comes(
        write_job, write_file, start_shoal, jobs_dir, shoal_status, tmp_path):
    """EDL, the other way round: a high-priority job holds 0.9 of the node's 2 cpus; an elastic
    job of 2 to 3 workers of 0.5 cpu starts with the 2 that fit instead of waiting for 3, its
    third pod waits for room (gated: holding nothing), and it grows to 3 when the high-priority
    job ends."""
    kubectl("apply", "-f", "-", stdin=PRIORITY_CLASSES)
    high = high_priority_ticker(write_job, write_file, "holder", 120)
    holder = start_shoal("run", "--backend", "kubernetes", high)
    holder_dir = e2e.wait_for_job(jobs_dir, "holder", timeout=60)
    e2e.wait_until(lambda: shoal_status(holder_dir.name)["state"] == "running", 120,
                   "the high-priority job running")

    ckpt = tmp_path / "ckpt-grow"
    ckpt.mkdir()
    path = k8s_job(write_job, "grow", f"""\
  worker:
    instances: {{min: 2, max: 3}}
    command: [/usr/bin/python3, {TRAIN}, --epochs, "6", --checkpoint-every, "10",
              --step-delay, "0.3"]
    working_dir: {e2e.EXAMPLE_DIR}
    resources: {{cpus: 0.5, memory: 1GiB}}
""", extra=(f"framework: pytorch\non_failure: elastic\nmax_restarts: 10\n"
            f"backoff: {{initial: 1s, max: 2s}}\ncheckpoint: {{dir: {ckpt}}}\n"),
                   volumes=[ckpt])
    with_priority(path, "shoal-test-low")
    client = start_shoal("run", "--backend", "kubernetes", path)
    job_dir = e2e.wait_for_job(jobs_dir, "grow", timeout=60)

    def started_as_two():
        s = shoal_status(job_dir.name)
        running = [t for t in s["tasks"] if t["in_world"] and t["state"] == "running"]
        return s if s["state"] == "running" and len(running) == 2 else None
    status = e2e.wait_until(started_as_two, 180, "the elastic job running as 2")
    waiting = [t for t in status["tasks"] if not t["in_world"]]
    assert len(waiting) == 1 and "room" in waiting[0]["reason"], status["tasks"]
    assert holder.poll() is None, "the high-priority job was disturbed"

    assert holder.wait(300) == 0, holder.stderr()[-3000:]
    rc = client.wait(600)
    assert rc == 0, f"rc={rc}\n{client.stderr()[-4000:]}"
    sizes = world_sizes(job_dir)
    assert sizes[0] == 2 and sizes[-1] == 3, sizes
    accuracy = [float(line.split("=")[1]) for line in client.stdout().splitlines()
                if "final_accuracy=" in line][-1]
    assert accuracy >= 0.9, accuracy
    assert_worlds_form_only_with_their_agents(e2e.read_events(job_dir))


def pod_processes(uid):
    """Pids of every process in the pod `uid` (its cgroups, cgroupfs driver: .../pod<uid>/...)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cgroup") as f:
                if f"pod{uid}" in f.read():
                    pids.append(int(entry))
        except OSError:
            continue
    return pids


def signal_all(pids, sig):
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def test_a_lost_node_is_seen_by_its_silent_agent_and_its_task_runs_again(
        write_job, write_file, start_shoal, jobs_dir, shoal_status):
    """A node lost: its kubelet stops and everything in the pod on it stops (SIGSTOP), as on a
    machine cut off. The agent's silence is seen within the heartbeat limit, the pod is deleted
    (by force: no kubelet will confirm), the group restarts with the task on a new pod, which
    starts once the node is back, and the job completes."""
    script = write_file("ticker.py", TICKER)
    path = k8s_job(write_job, "nodelost", f"""\
  worker:
    instances: 2
    command: [/usr/bin/python3, {script}, "60"]
    resources: {{cpus: 0.1, memory: 256MiB}}
""", extra="on_failure: restart-group\nmax_restarts: 2\nbackoff: {initial: 1s}\n",
                   volumes=[script.parent])
    path.write_text(path.read_text().replace("misses: 30", "misses: 5"))
    client = start_shoal("run", "--backend", "kubernetes", path)
    job_dir = e2e.wait_for_job(jobs_dir, "nodelost", timeout=60)
    pods = wait_for_pods_running(job_dir.name, 2)
    e2e.wait_until(lambda: shoal_status(job_dir.name)["state"] == "running", 120,
                   "the job running")
    victim = next(p for p in pods if p["metadata"]["annotations"]["shoal.io/place"] == "worker.1")
    frozen = []
    try:
        e2e.kubernetes_cluster("node-down")
        frozen = pod_processes(victim["metadata"]["uid"])
        assert frozen, "no process of the victim pod found"
        signal_all(frozen, signal.SIGSTOP)
        def silent_seen():
            s = shoal_status(job_dir.name)
            return s if any("silent" in f["cause"] for f in s["failures"]) else None
        status = e2e.wait_until(silent_seen, 60, "the lost node's agent counted silent")
        failure = next(f for f in status["failures"] if "silent" in f["cause"])
        assert failure["task"] == "worker:1", status["failures"]
        # The pod is gone from the API (nothing on the node will confirm a graceful deletion).
        e2e.wait_until(lambda: not any(p["metadata"]["uid"] == victim["metadata"]["uid"]
                                       for p in pods_of(job_dir.name)),
                       60, "the lost pod deleted")
    finally:
        e2e.kubernetes_cluster("node-up")
        signal_all(frozen, signal.SIGCONT)
    rc = client.wait(300)
    assert rc == 0, f"rc={rc}\n{client.stderr()[-4000:]}"
    events = e2e.read_events(job_dir)
    assert e2e.events_of(events, "agent_silent"), "no agent_silent record"
    replaced = [e for e in e2e.events_of(events, "place_replacing") if e["node"] == "worker.1"]
    assert replaced and replaced[0]["ok"], replaced
    # The old pod's agent, alive again once the node is back, is not taken for its replacement
    # (which would cost a second restart when the kubelet then ends the deleted pod).
    assert len(e2e.events_of(events, "group_restart_begun")) == 1, \
        e2e.events_of(events, "group_restart_begun", "agent_registered", "agent_refused")
    ticks = [line for line in client.stdout().splitlines() if "tick 59" in line]
    assert len(ticks) >= 2, client.stdout()[-2000:]
