"""If the master dies (SIGKILL), the agent keeps the tasks for its grace period
(SHOAL_AGENT_MASTER_GRACE_MS), then kills every task and exits."""

import json
import os
import signal

import shoal_e2e as e2e

GRACE_MS = 1500

STUBBORN = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
subprocess.Popen([sys.executable, "-c",
    "import signal, time\\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\\nwhile True: time.sleep(0.1)"])
print("up", flush=True)
while True:
    time.sleep(0.1)
"""


def test_master_sigkill_kills_tasks_after_grace(write_file, write_job, detach_job, jobs_dir,
                                                wait_for_state, run_shoal):
    write_file("stubborn.py", STUBBORN)
    job = write_job("""
        name: orphaned
        roles:
          worker:
            instances: 2
            command: ["/usr/bin/python3", "stubborn.py"]
            resources: {cpus: 0.5}
        """)
    job_id = detach_job(job, env={"SHOAL_AGENT_MASTER_GRACE_MS": str(GRACE_MS)})
    job_dir = jobs_dir / job_id
    status = wait_for_state(job_id, lambda s: s["state"] == "running"
                            and all(t["state"] == "running" for t in s["tasks"]), 60,
                            "every task running")
    # each task has started its child
    e2e.wait_until(lambda: len(e2e.task_processes(job_id)) >= 4, 30,
                   "both tasks and their children")
    master_pid = json.loads((job_dir / "master.json").read_text())["pid"]
    procs = e2e.job_processes(job_id, job_dir)
    agents = [p for p in procs if " agent " in f" {p.cmdline} "]
    assert len(agents) == 1, procs
    assert f"--work-dir {job_dir}/agents/local" in agents[0].cmdline
    pgids = {os.getpgid(t["pid"]) for t in status["tasks"]}

    os.kill(master_pid, signal.SIGKILL)
    # Every task (and child), and the agent, gone within the grace plus a few seconds.
    e2e.wait_until(lambda: not e2e.job_processes(job_id, job_dir)
                   and all(e2e.pgroup_gone(g) for g in pgids), GRACE_MS / 1000 + 5,
                   "the agent to kill every task and exit")

    st = run_shoal("status", job_id, "--json", timeout=30)
    assert st.returncode == 0
    assert json.loads(st.stdout)["state"] == "lost"


def master_dead(pid):
    """The master has exited: its pid is gone or only a zombie (exited, not yet reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_status_is_lost_once_the_master_has_exited(write_job, detach_job, jobs_dir,
                                                   wait_for_state, shoal_status):
    """A master that has died is dead even before its parent (init, here) reaps it: `status`
    must say "lost", not go on reporting the job as running."""
    job = write_job("""
        name: zombiemaster
        roles:
          worker:
            command: ["/bin/sh", "-c", "exec sleep 120"]
            resources: {cpus: 0.5}
        """)
    job_id = detach_job(job, env={"SHOAL_AGENT_MASTER_GRACE_MS": str(GRACE_MS)})
    job_dir = jobs_dir / job_id
    wait_for_state(job_id, lambda s: s["state"] == "running"
                   and all(t["state"] == "running" for t in s["tasks"]), 60, "running")
    master_pid = json.loads((job_dir / "master.json").read_text())["pid"]
    os.kill(master_pid, signal.SIGKILL)
    e2e.wait_until(lambda: master_dead(master_pid), 10, "the master to die")
    assert shoal_status(job_id)["state"] == "lost"
    e2e.wait_until(lambda: not e2e.job_processes(job_id, job_dir), GRACE_MS / 1000 + 5,
                   "the agent to kill every task and exit")
