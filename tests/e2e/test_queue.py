"""Gang admission on one machine: a job that fits the machine but not beside another running
job (same jobs dir, shared ledger) waits in state "queued" with a clear reason, then runs."""

import json
import os
import re
import signal

import shoal_e2e as e2e

HOLDER = """
    name: holder
    roles:
      worker:
        instances: 1
        command: ["/bin/sh", "-c", "echo holding; while [ ! -e {gate} ]; do sleep 0.05; done; echo released"]
        resources: {{cpus: 1}}
    """

WAITER = """
    name: waiter
    roles:
      worker:
        instances: 2
        command: ["/bin/sh", "-c", "echo ran $SHOAL_INDEX"]
        resources: {cpus: 1}
    """


def start_holder(tmp_path, write_job, detach_job, wait_for_state):
    gate = tmp_path / "gate"
    holder = detach_job(write_job(HOLDER.format(gate=gate), name="holder.yaml"))
    wait_for_state(holder, lambda s: s["state"] == "running"
                   and all(t["state"] == "running" for t in s["tasks"]), 60, "holder running")
    return holder, gate


def queued_status(start_shoal, write_job, jobs_dir, wait_for_state):
    client = start_shoal("run", write_job(WAITER, name="waiter.yaml"))
    waiter_dir = e2e.wait_for_job(jobs_dir, "waiter")
    status = wait_for_state(waiter_dir.name, lambda s: s["state"] == "queued", 60,
                            "the waiter to be queued")
    return client, waiter_dir, status


def test_queued_job_waits_with_reason_then_runs(tmp_path, write_job, detach_job, start_shoal,
                                                run_shoal, jobs_dir, wait_for_state):
    holder, gate = start_holder(tmp_path, write_job, detach_job, wait_for_state)
    client, waiter_dir, status = queued_status(start_shoal, write_job, jobs_dir,
                                               wait_for_state)
    waiter = waiter_dir.name

    assert re.fullmatch(rf"waiting for 2(\.0+)? CPUs \(1(\.0+)? free\); held by {re.escape(holder)}",
                        status["reason"]), status["reason"]
    assert all(t["state"] == "pending" for t in status["tasks"]), status
    # No task of the queued job exists while it waits.
    assert e2e.task_processes(waiter) == []
    # `shoal list` shows both, the waiter queued with its reason.
    r = run_shoal("list", "--json", timeout=30)
    assert r.returncode == 0, r.stderr
    rows = {row["job_id"]: row for row in json.loads(r.stdout)}
    assert rows[holder]["state"] == "running"
    assert rows[waiter]["state"] == "queued"
    assert "held by " + holder in rows[waiter]["reason"]
    assert client.poll() is None, "the client of a queued job keeps following it"

    # Let the holder finish: the waiter is admitted and succeeds.
    gate.write_text("go")
    rc = client.wait(120)
    assert rc == 0, f"rc={rc}\n{client.stderr()}"
    out = client.stdout().splitlines()
    assert "worker:0 | ran 0" in out and "worker:1 | ran 1" in out
    assert "queued" in client.stderr() or "waiting for" in client.stderr()

    events = e2e.read_events(waiter_dir)
    types = [e["type"] for e in events]
    assert "queued" in types and "admitted" in types
    assert types.index("queued") < types.index("admitted")
    queued = events[types.index("queued")]
    assert "held by " + holder in queued["reason"]
    # The waiter's tasks started only after every holder task had ended.
    holder_end = max(e["ts"] for e in e2e.read_events(jobs_dir / holder)
                     if e["type"] == "task_state" and e["to"] in e2e.TERMINAL_TASK_STATES)
    first_start = min(e["ts"] for e in events
                      if e["type"] == "task_state" and e["to"] == "starting")
    assert holder_end <= first_start
    assert wait_for_state(holder, lambda s: s["state"] in e2e.TERMINAL_JOB_STATES, 30,
                          "holder ended")["state"] == "succeeded"


def test_interrupting_a_queued_job(tmp_path, write_job, detach_job, start_shoal, jobs_dir,
                                   wait_for_state, run_shoal):
    holder, gate = start_holder(tmp_path, write_job, detach_job, wait_for_state)
    client, waiter_dir, status = queued_status(start_shoal, write_job, jobs_dir,
                                               wait_for_state)
    os.kill(client.pid, signal.SIGINT)
    assert client.wait(30) == 130, client.stderr()
    e2e.wait_until(lambda: not e2e.job_processes(waiter_dir.name, waiter_dir), 5,
                   "every process of the interrupted queued job to exit")
    final = wait_for_state(waiter_dir.name, lambda s: s["state"] in e2e.TERMINAL_JOB_STATES, 10,
                           "a terminal state")
    assert final["state"] == "killed"
    assert not any(e["type"] == "task_state" and e["to"] == "starting"
                   for e in e2e.read_events(waiter_dir)), "a killed queued job started tasks"
    # The holder is untouched, and after it a new job is admitted at once (the ledger holds
    # nothing for the killed one).
    assert wait_for_state(holder, lambda s: True)["state"] == "running"
    gate.write_text("go")
    assert wait_for_state(holder, lambda s: s["state"] in e2e.TERMINAL_JOB_STATES, 30,
                          "holder ended")["state"] == "succeeded"
    r = run_shoal("run", write_job(WAITER.replace("waiter", "third"), name="third.yaml"),
                  timeout=60)
    assert r.returncode == 0, r.stderr
    assert "waiting for" not in r.stderr
    (third,) = [d for d in e2e.job_dirs(jobs_dir) if d.name.startswith("third-")]
    assert "queued" not in [e["type"] for e in e2e.read_events(third)]


def test_quiet_still_says_why_a_job_waits(tmp_path, write_job, detach_job, start_shoal, jobs_dir,
                                          wait_for_state):
    holder, gate = start_holder(tmp_path, write_job, detach_job, wait_for_state)
    client = start_shoal("run", "-q", write_job(WAITER, name="waiter.yaml"))
    waiter_dir = e2e.wait_for_job(jobs_dir, "waiter")
    wait_for_state(waiter_dir.name, lambda s: s["state"] == "queued", 60, "the waiter to queue")
    # Said while it waits, once, not only after it ran.
    line = e2e.wait_until(
        lambda: [l for l in client.stderr().splitlines() if l.startswith("shoal | queued: ")],
        30, "shoal run -q to say why the job waits")
    assert f"held by {holder}" in line[0], line
    gate.write_text("go")
    assert client.wait(120) == 0, client.stderr()
    assert len([l for l in client.stderr().splitlines() if "queued: " in l]) == 1, client.stderr()
