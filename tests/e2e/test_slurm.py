"""The Slurm backend end to end, on the project's own two-node test cluster
(tests/slurm/cluster.sh: slurmctld plus slurmd sn1 and sn2, each in its own network namespace
with its own hostname and address, 8 CPUs, 4 GiB and two fake GPUs each). ctest's
slurm_cluster fixture brings it up before these tests and down after them."""

import json
import os
import re
import shutil
import signal
import subprocess
import time

import pytest

import shoal_e2e as e2e


@pytest.fixture(autouse=True)
def slurm_cluster():
    conf = os.environ.get("SLURM_CONF")
    assert conf and os.path.exists(conf), (
        "SLURM_CONF does not name the test cluster's slurm.conf: run these through ctest (its "
        "slurm_cluster fixture starts the cluster) or tests/slurm/cluster.sh up and "
        "eval \"$(tests/slurm/cluster.sh env)\"")
    r = subprocess.run(["sinfo", "-h", "-o", "%n %T"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    states = dict(line.split() for line in r.stdout.splitlines())
    assert set(states) >= {"sn1", "sn2"}, states
    yield
    # No test leaves a Slurm job behind (each checks its own; this catches the rest).
    leftover = squeue_jobs("shoal-")
    for job_id, _ in leftover:
        subprocess.run(["scancel", job_id], timeout=30)


def squeue_jobs(name_prefix):
    """[(slurm job id, name)] of jobs whose name starts with `name_prefix`."""
    r = subprocess.run(["squeue", "-h", "-o", "%i %j"], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0, r.stderr
    return [tuple(line.split(maxsplit=1)) for line in r.stdout.splitlines()
            if line.split(maxsplit=1)[1].startswith(name_prefix)]


def slurm_jobs_of(job_id):
    return squeue_jobs(f"shoal-{job_id}")


def test_pytorch_ddp_with_one_worker_on_each_of_two_nodes(run_shoal, write_job, repo_root,
                                                          jobs_dir):
    train = repo_root / "examples" / "pytorch-ddp" / "train.py"
    # 3 GiB per worker: a node has 4 GiB, so Slurm must put the workers on different nodes.
    job = write_job(f"""
        name: slurm-ddp
        framework: pytorch
        roles:
          worker:
            instances: 2
            command: ["/usr/bin/python3", "{train}", "--epochs", "10"]
            resources: {{cpus: 1, memory: 3GiB}}
        """)
    r = run_shoal("run", "--backend", "slurm", job, timeout=240)
    assert r.returncode == 0, f"rc={r.returncode}\n--- stdout\n{r.stdout}\n--- stderr\n{r.stderr}"
    accuracy = [float(m.group(1)) for l in r.stdout.splitlines()
                if (m := re.fullmatch(r"worker:0 \| final_accuracy=([0-9.]+)", l))]
    assert accuracy and accuracy[0] >= 0.90, r.stdout

    events = e2e.read_events(e2e.only_job_dir(jobs_dir))
    registered = {e["node"]: e for e in e2e.events_of(events, "agent_registered")}
    assert set(registered) == {"worker.0", "worker.1"}, registered
    # Two machines, each with its real address on the cluster network.
    assert {e["hostname"] for e in registered.values()} == {"sn1", "sn2"}, registered
    assert {e["address"] for e in registered.values()} == {"10.213.77.11", "10.213.77.12"}
    (rendezvous,) = e2e.events_of(events, "rendezvous")
    assert {rank["address"] for rank in rendezvous["ranks"]} == {"10.213.77.11", "10.213.77.12"}
    assert not slurm_jobs_of(e2e.only_job_dir(jobs_dir).name)


def agent_step_env(job_id):
    """{SLURM_PROCID: environment} of the job's live agents (srun started them with Slurm's
    variables; the test cluster's nodes are namespaces of this machine)."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
            environ = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
        except OSError:
            continue
        if b"agent" not in argv or not any(job_id.encode() in a for a in argv):
            continue
        env = dict(e.decode().split("=", 1) for e in environ if b"=" in e)
        if "SLURM_PROCID" in env:
            found[env["SLURM_PROCID"]] = env
    return found


def test_gpu_role_gets_the_gpus_slurm_assigned(start_shoal, write_job, jobs_dir, tmp_path):
    out = tmp_path / "gpus"
    out.mkdir()
    # Two tasks with one GPU each; Slurm picks which. Each task writes what it was given.
    job = write_job(f"""
        name: slurm-gpu
        roles:
          trainer:
            instances: 2
            command:
              - /bin/sh
              - -c
              - >-
                echo "${{CUDA_VISIBLE_DEVICES:-none}} $SHOAL_SLURM_JOB_ID $(hostname)
                ${{SLURM_PROCID:-none}} ${{SLURM_JOB_ID:-none}}" > {out}/$SHOAL_INDEX.tmp &&
                mv {out}/$SHOAL_INDEX.tmp {out}/$SHOAL_INDEX; sleep 30
            resources: {{cpus: 1, memory: 256MiB, gpus: 1}}
        """)
    client = start_shoal("run", "--backend", "slurm", job)
    e2e.wait_until(lambda: all((out / i).exists() for i in ("0", "1")), 60,
                   "both tasks to report their GPUs")
    job_id = e2e.wait_for_job(jobs_dir).name
    agents = agent_step_env(job_id)
    assert set(agents) == {"0", "1"}, agents.keys()
    seen = {}
    for index in ("0", "1"):
        cvd, slurm_job, host, procid, hidden_job = (out / index).read_text().split()
        # Slurm bound GPUs to the agent's Slurm task (one task per Shoal task, same index).
        slurms = agents[index]["SLURM_STEP_GPUS"]
        assert cvd == slurms, f"task {index}: CUDA_VISIBLE_DEVICES={cvd}, Slurm's {slurms}"
        assert slurm_job == agents[index]["SLURM_JOB_ID"]
        # Slurm's description of the agents' step is not the training world: hidden.
        assert (procid, hidden_job) == ("none", "none"), (procid, hidden_job)
        seen.setdefault(host, []).append(cvd)
    # Two tasks on one machine never share a GPU.
    for host, gpus in seen.items():
        assert len(gpus) == len(set(gpus)), seen
    subprocess.run([e2e.SHOAL_BIN, "--jobs-dir", str(jobs_dir), "kill", job_id], timeout=60)
    assert client.wait(60) == 1
    events = e2e.read_events(jobs_dir / job_id)
    for e in e2e.events_of(events, "agent_registered"):
        assert len(e["gpus"]) == 1, e


def test_shoal_kill_leaves_no_step_running(run_shoal, detach_job, write_job, wait_for_state,
                                           jobs_dir):
    job = write_job("""
        name: slurm-kill
        roles:
          worker:
            instances: 3
            command: ["sleep", "300"]
            resources: {cpus: 1, memory: 128MiB}
        """)
    job_id = detach_job(job, "--backend", "slurm")
    wait_for_state(job_id, lambda s: s["state"] == "running", 60, "the job to run")
    assert slurm_jobs_of(job_id), "no Slurm job while the job runs"
    r = run_shoal("kill", job_id, timeout=60)
    assert r.returncode == 0, r.stderr
    wait_for_state(job_id, lambda s: s["state"] == "killed", 60, "the job to be killed")
    e2e.wait_until(lambda: not slurm_jobs_of(job_id), 30, "squeue to show nothing of the job")
    r = subprocess.run(["squeue", "-h", "-s", "-o", "%i %j"], capture_output=True, text=True)
    assert job_id not in r.stdout, r.stdout
    assert not e2e.task_processes(job_id)


def test_scancel_from_outside_ends_shoal_run_with_a_clear_message(start_shoal, write_job,
                                                                  jobs_dir):
    job = write_job("""
        name: slurm-scancel
        roles:
          worker:
            instances: 2
            command: ["sleep", "300"]
            resources: {cpus: 1, memory: 128MiB}
        """)
    client = start_shoal("run", "--backend", "slurm", job)
    job_dir = e2e.wait_for_job(jobs_dir, timeout=60)
    job_id = job_dir.name

    def running():
        status = json.loads((job_dir / "status.json").read_text()) if (
            job_dir / "status.json").exists() else {}
        return status.get("state") == "running"
    e2e.wait_until(running, 60, "the job to run")
    ((slurm_id, _),) = slurm_jobs_of(job_id)
    subprocess.run(["scancel", slurm_id], check=True, timeout=30)
    rc = client.wait(60)
    err = client.stderr()
    assert rc == 1, f"rc={rc}\n{err}"  # the job did not succeed
    assert f"Slurm job {slurm_id} was cancelled outside Shoal" in err, err
    assert "killed" in err.splitlines()[-1], err
    e2e.wait_until(lambda: not slurm_jobs_of(job_id), 30, "squeue to show nothing of the job")


def test_job_larger_than_the_cluster_is_refused_with_slurms_reason(run_shoal, write_job,
                                                                   jobs_dir):
    job = write_job("""
        name: slurm-too-big
        roles:
          worker:
            instances: 1
            command: ["true"]
            resources: {cpus: 64}
        """)
    r = run_shoal("run", "--backend", "slurm", job, timeout=60)
    assert r.returncode == 1, f"rc={r.returncode}\n{r.stderr}"
    assert "Slurm refused the job: Unable to allocate resources:" in r.stderr, r.stderr
    assert not slurm_jobs_of(e2e.only_job_dir(jobs_dir).name)


def test_unknown_partition_is_refused_with_slurms_reason(run_shoal, write_job, jobs_dir):
    job = write_job("""
        name: slurm-partition
        slurm: {partition: nosuchpartition}
        roles:
          worker: {command: ["true"]}
        """)
    r = run_shoal("run", "--backend", "slurm", job, timeout=60)
    assert r.returncode == 1, f"rc={r.returncode}\n{r.stderr}"
    assert "Slurm refused the job" in r.stderr and "partition" in r.stderr.lower(), r.stderr


def test_bad_slurm_flag_is_refused_before_anything_starts(run_shoal, write_job, jobs_dir):
    job = write_job("""
        name: slurm-flag
        roles:
          worker: {command: ["true"]}
        """)
    r = run_shoal("run", "--backend", "slurm", "--time-limit", "10s", job, timeout=30)
    assert r.returncode == 2, r.stderr
    assert "--time-limit: must be at least 1m" in r.stderr, r.stderr
    assert not jobs_dir.exists() or not list(jobs_dir.iterdir())


def sinfo_states():
    r = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True,
                       timeout=30)
    return dict(line.split() for line in r.stdout.splitlines()) if r.returncode == 0 else {}


def test_node_slurm_marks_down_is_handled_by_the_failure_policy(start_shoal, write_job,
                                                                 jobs_dir):
    # One worker per node (3 GiB of a node's 4); the default policy, fail-job, ends the job
    # with the lost task named.
    job = write_job("""
        name: slurm-node-down
        roles:
          worker:
            instances: 2
            command: ["sleep", "300"]
            resources: {cpus: 1, memory: 3GiB}
        """)
    client = start_shoal("run", "--backend", "slurm", job)
    job_dir = e2e.wait_for_job(jobs_dir, timeout=60)

    def registered():
        events = e2e.read_events(job_dir)
        nodes = {e["node"]: e["hostname"] for e in e2e.events_of(events, "agent_registered")}
        return nodes if len(nodes) == 2 else None
    nodes = e2e.wait_until(registered, 60, "both agents to register")
    victim = nodes["worker.1"]
    try:
        subprocess.run(["scontrol", "update", f"NodeName={victim}", "State=DOWN",
                        "Reason=shoal-e2e"], check=True, timeout=30)
        rc = client.wait(60)
        err = client.stderr()
        assert rc == 1, f"rc={rc}\n{err}"
        last = err.strip().splitlines()[-1]
        assert "failed" in last and "worker:1 lost" in last, err
        events = e2e.read_events(job_dir)
        assert e2e.events_of(events, "agent_disconnected") or e2e.events_of(events, "place_lost")
        e2e.wait_until(lambda: not slurm_jobs_of(job_dir.name), 30, "the Slurm job to end")
    finally:
        subprocess.run(["scontrol", "update", f"NodeName={victim}", "State=RESUME"],
                       capture_output=True, timeout=30)
        # Agents killed with their node cannot clear their scratch (the nodes share this
        # machine's /tmp here).
        shutil.rmtree(f"/tmp/shoal-agents/{job_dir.name}", ignore_errors=True)
        e2e.wait_until(lambda: set(sinfo_states().values()) == {"idle"}, 90,
                       "every node to be idle again")


def test_a_hung_agent_is_killed_with_its_task_by_its_watchdog(detach_job, run_shoal, write_job,
                                                              wait_for_state, jobs_dir):
    # Slurm cannot end one task of a step, so an agent that hangs (SIGSTOP here) is ended by
    # its own watchdog a heartbeat after the master gave up on it: its task must not keep
    # running while the elastic job goes on without it.
    job = write_job("""
        name: slurm-hung-agent
        on_failure: elastic
        heartbeat: {interval: 200ms, misses: 5}
        roles:
          worker:
            instances: {min: 1, max: 2}
            command: ["sleep", "300"]
            resources: {cpus: 1, memory: 3GiB}
        """)
    job_id = detach_job(job, "--backend", "slurm")
    status = wait_for_state(job_id, lambda s: s["state"] == "running" and len(s["tasks"]) == 2
                            and all(t["state"] == "running" for t in s["tasks"]), 90,
                            "both workers running")
    victim_task = next(t for t in status["tasks"] if t["index"] == 1)
    # The agent of Slurm task 1 (worker 1's place), by the Slurm job's name srun gave it.
    agents = [p for p, environ, _ in e2e._all_processes()
              if p.state != "Z" and " agent " in f" {p.cmdline} " and "--slurm-place" in p.cmdline
              and f"SLURM_JOB_NAME=shoal-{job_id}".encode() in environ
              and b"SLURM_PROCID=1" in environ]
    assert len(agents) == 1, agents
    # Its watchdog: started one heartbeat after the agent, so it may still be on its way.
    e2e.wait_until(lambda: any(f"agent-watchdog {agents[0].pid} " in p.cmdline
                               for p, _, _ in e2e._all_processes()), 10, "the agent's watchdog")
    os.kill(agents[0].pid, signal.SIGSTOP)
    try:
        # The watchdog waits out the agent's master grace (10 s) and one heartbeat.
        e2e.wait_until(lambda: not e2e.is_task_of(victim_task["pid"], job_id), 40,
                       "the hung agent's task to be killed")
        e2e.wait_until(lambda: not os.path.exists(f"/proc/{agents[0].pid}/stat")
                       or open(f"/proc/{agents[0].pid}/stat").read().rsplit(")", 1)[1].split()[0]
                       in ("Z", "X"), 20, "the hung agent to be killed")
        log = (e2e.only_job_dir(jobs_dir) / "agents" / "slurm" / "srun.log").read_text()
        assert "agent-watchdog: the agent" in log and "sent no heartbeat" in log, log[-2000:]
        # The job goes on with the survivor.
        s = wait_for_state(job_id, lambda s: s["state"] == "running" and any(
            t["index"] == 0 and t["state"] == "running" for t in s["tasks"]), 60,
            "the job running on with worker 0")
        assert s["state"] == "running"
    finally:
        try:
            os.kill(agents[0].pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        run_shoal("kill", job_id, timeout=60)
    e2e.wait_until(lambda: not slurm_jobs_of(job_id), 30, "the Slurm job to end")


def test_job_waits_queued_with_slurms_reason_while_the_cluster_is_full(
        detach_job, write_job, wait_for_state, jobs_dir, tmp_path):
    # Another user's job holds every CPU of both nodes.
    blocker = subprocess.Popen(["srun", "--job-name=e2e-blocker", "-N2", "-n16",
                                "--mem-per-cpu=64M", "sleep", "300"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        e2e.wait_until(lambda: squeue_jobs("e2e-blocker"), 30, "the blocker to run")
        e2e.wait_until(lambda: set(sinfo_states().values()) == {"allocated"}, 30,
                       "every node to be allocated")
        job = write_job("""
            name: slurm-queued
            roles:
              worker:
                instances: 2
                command: ["true"]
                resources: {cpus: 1, memory: 128MiB}
            """)
        job_id = detach_job(job, "--backend", "slurm")
        status = wait_for_state(job_id, lambda s: s["state"] == "queued", 30,
                                "the job to be queued")
        assert "waiting for resources" in status["reason"], status
        assert "Slurm's reason: Resources" in status["reason"], status
        blocker.terminate()
        blocker.wait(30)
        wait_for_state(job_id, lambda s: s["state"] == "succeeded", 90,
                       "the job to run once the cluster is free")
    finally:
        if blocker.poll() is None:
            blocker.kill()
        subprocess.run(["scancel", "--name=e2e-blocker"], capture_output=True, timeout=30)


def test_a_new_master_takes_over_a_running_slurm_job(detach_job, run_shoal, write_job,
                                                      wait_for_state, jobs_dir):
    job = write_job("""
        name: slurm-recover
        roles:
          worker:
            instances: 2
            command: ["/bin/sh", "-c", "sleep 5; echo finished-$SHOAL_INDEX"]
            resources: {cpus: 1, memory: 128MiB}
        """)
    job_id = detach_job(job, "--backend", "slurm")
    wait_for_state(job_id, lambda s: s["state"] == "running", 60, "the job to run")
    (job_dir,) = e2e.job_dirs(jobs_dir)
    master_pid = json.loads((job_dir / "master.json").read_text())["pid"]
    os.kill(master_pid, 9)
    # The tasks keep running under srun; a new master re-attaches and sees them finish.
    r = run_shoal("resume", job_id, timeout=90)
    assert r.returncode == 0, f"rc={r.returncode}\n{r.stdout}\n{r.stderr}"
    assert "worker:0 | finished-0" in r.stdout and "worker:1 | finished-1" in r.stdout, r.stdout
    events = e2e.read_events(job_dir)
    assert e2e.events_of(events, "master_recovered"), "no master_recovered record"
    # Each task ran once: none was restarted by the takeover.
    for task in ("worker:0", "worker:1"):
        starts = [e for e in e2e.task_transitions(events, task) if e.get("to") == "running"]
        assert len(starts) == 1, starts
    assert not slurm_jobs_of(job_id)


def test_horovod_ranks_on_two_nodes_rendezvous_through_the_master(run_shoal, repo_root,
                                                                   jobs_dir, tmp_path):
    # The Horovod example with 3 GiB per rank, so one rank on each node: the ranks reach the
    # master's gloo rendezvous store on the cluster network, and each other through gloo.
    python = "/var/cache/shoal/venvs/horovod/bin/python"
    assert os.access(python, os.X_OK), f"{python} is missing: run ./setup.sh"
    example = repo_root / "examples" / "horovod"
    text = (example / "job.yaml").read_text()
    text = text.replace("memory: 2GiB", "memory: 3GiB")
    text = text.replace('"train.py"', f'"{example / "train.py"}"')
    assert "memory: 3GiB" in text and str(example) in text
    job = tmp_path / "job.yaml"
    job.write_text(text)
    r = run_shoal("run", "--backend", "slurm", job, timeout=180)
    assert r.returncode == 0, f"rc={r.returncode}\n{r.stdout}\n{r.stderr}"
    assert "worker:0 | final_accuracy=" in r.stdout, r.stdout
    events = e2e.read_events(e2e.only_job_dir(jobs_dir))
    hosts = {e["hostname"] for e in e2e.events_of(events, "agent_registered")}
    assert hosts == {"sn1", "sn2"}, hosts


def test_mpi4py_ranks_on_two_nodes_through_shoals_remote_shell(run_shoal, repo_root, tmp_path):
    # The MPI example with 1 CPU and 2 GiB for every task: one request, so one component of
    # the Slurm job (components of a heterogeneous job never share a node on 22.05, and three
    # would not fit on two nodes), and at most two tasks per 4 GiB node, laid out in rank
    # order: launcher and worker 0 on one node, worker 1 on the other. mpirun in the launcher
    # starts Open MPI's daemon on the other node through `shoal mpi-rsh`, not ssh, and the
    # ranks talk over the cluster network.
    example = repo_root / "examples" / "mpi"
    text = (example / "job.yaml").read_text()
    text = text.replace("resources: {cpus: 0.1, memory: 256MiB}", "resources: {cpus: 1, memory: 2GiB}")
    text = text.replace("resources: {cpus: 0.9, memory: 1GiB}", "resources: {cpus: 1, memory: 2GiB}")
    text = text.replace('"train.py"', f'"{example / "train.py"}"')
    assert text.count("resources: {cpus: 1, memory: 2GiB}") == 2 and str(example) in text
    job = tmp_path / "job.yaml"
    job.write_text(text)
    r = run_shoal("run", "--backend", "slurm", job, timeout=180)
    assert r.returncode == 0, f"rc={r.returncode}\n{r.stdout}\n{r.stderr}"
    metrics = [json.loads(l.split(" | ", 1)[1]) for l in r.stdout.splitlines()
               if l.startswith("launcher:0 | {")]
    assert metrics, r.stdout
    m = metrics[-1]
    assert m["value"] >= 0.85 and m["world_size"] == 2 and m["weights_identical"], m
    by_task = {h["shoal_task"]: h["host"] for h in m["hosts"]}
    assert set(by_task) == {"worker:0", "worker:1"}, m
    assert set(by_task.values()) == {"sn1", "sn2"}, m


def test_more_distinct_requests_than_nodes_is_refused_before_anything_starts(run_shoal,
                                                                             write_job, jobs_dir):
    # Three different per-task requests make three components of a heterogeneous job, which
    # never share a node: on two nodes Slurm would keep the job queued forever.
    job = write_job("""
        name: slurm-three-components
        roles:
          a: {command: [/bin/true], resources: {cpus: 1}}
          b: {command: [/bin/true], resources: {cpus: 2}}
          c: {command: [/bin/true], resources: {cpus: 3}}
        """)
    r = run_shoal("run", "--backend", "slurm", job, timeout=60)
    assert r.returncode == 2, f"rc={r.returncode}\n{r.stdout}\n{r.stderr}"
    assert ("the job can never run on this Slurm partition: its roles ask 3 different per-task "
            "resources") in r.stderr, r.stderr
    assert "partition (the default) has 2 node(s)" in r.stderr, r.stderr
    assert not jobs_dir.exists() or not list(jobs_dir.iterdir())
    assert not squeue_jobs("shoal-slurm-three-components")


def test_no_reachable_slurm_is_refused_before_anything_starts(run_shoal, write_job, jobs_dir,
                                                              tmp_path):
    job = write_job("""
        name: slurm-nowhere
        roles:
          worker: {command: ["true"]}
        """)
    r = run_shoal("run", "--backend", "slurm", job, timeout=60,
                  env={"SLURM_CONF": str(tmp_path / "no-such-slurm.conf")})
    assert r.returncode == 2, f"rc={r.returncode}\n{r.stderr}"
    assert "--backend slurm: cannot ask Slurm for its controller" in r.stderr, r.stderr
    assert "no-such-slurm.conf" in r.stderr, r.stderr  # Slurm's own words about what is wrong
    assert not jobs_dir.exists() or not list(jobs_dir.iterdir())
