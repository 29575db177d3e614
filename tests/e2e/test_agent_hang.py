"""An agent that stops answering (SIGSTOP: a hung node) is declared lost after
SHOAL_HEARTBEAT_INTERVAL_MS x 3; its tasks fail, the job fails, and nothing of the job is left
running afterwards."""

import os
import signal

import shoal_e2e as e2e

HEARTBEAT_MS = 200


def test_hung_agent_fails_the_job_and_leaves_nothing(write_job, start_shoal, jobs_dir,
                                                     wait_for_state):
    job = write_job("""
        name: hungagent
        roles:
          worker:
            instances: 2
            command: ["/bin/sh", "-c", "echo up; exec sleep 120"]
            resources: {cpus: 0.5}
        """)
    client = start_shoal("run", job, env={"SHOAL_HEARTBEAT_INTERVAL_MS": str(HEARTBEAT_MS),
                                          "SHOAL_AGENT_MASTER_GRACE_MS": "1500"})
    job_dir = e2e.wait_for_job(jobs_dir, "hungagent")
    job_id = job_dir.name
    status = wait_for_state(job_id, lambda s: s["state"] == "running"
                            and all(t["state"] == "running" for t in s["tasks"]), 60,
                            "every task running")
    pgids = [os.getpgid(t["pid"]) for t in status["tasks"]]
    agents = [p for p in e2e.job_processes(job_id, job_dir) if " agent " in f" {p.cmdline} "]
    assert len(agents) == 1, agents

    os.kill(agents[0].pid, signal.SIGSTOP)
    rc = client.wait(60)
    assert rc == 1, f"rc={rc}\n{client.stderr()}"
    last = [l for l in client.stderr().splitlines() if l.strip()][-1]
    assert last.startswith(f"shoal | job {job_id} failed: ") and "worker:" in last, last

    events = e2e.read_events(job_dir)
    assert any(e["type"] == "agent_silent" for e in events), [e["type"] for e in events]
    final = wait_for_state(job_id, lambda s: s["state"] in e2e.TERMINAL_JOB_STATES, 30,
                           "a terminal state")
    assert final["state"] == "failed"
    assert all(t["state"] in ("failed", "killed") for t in final["tasks"]), final

    # The job has ended: none of its processes (the tasks included) may survive it.
    try:
        e2e.wait_until(lambda: not e2e.job_processes(job_id, job_dir)
                       and all(e2e.pgroup_gone(g) for g in pgids), 10,
                       "every process of the failed job to exit")
    except AssertionError:
        left = e2e.job_processes(job_id, job_dir)
        raise AssertionError(f"job {job_id} ended as {final['state']} but these processes of it "
                             f"are still alive: {left}")
