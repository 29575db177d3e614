"""Hang detection: a task that reported progress through the SDK and then stops (SIGSTOP, so it
can answer nothing) is found hung within progress_timeout, killed with SIGKILL, and handled by
its role's policy: restart-task starts it again and the job completes; fail-job fails the job
with a reason naming the task and "hung"."""

import re
import signal
import time

import shoal_e2e as e2e

PROGRESS_TIMEOUT_S = 2.0
HEARTBEAT_S = 0.5
# The requirement: hung within progress_timeout + one heartbeat interval. The margin is for
# this noisy 2-core machine (another test or a build may hold both cores); it is not part of
# the requirement.
MARGIN_S = 2.0

# Reports a step every 20 ms. The first attempt of worker:1 runs until it is stopped; every
# other attempt (and worker:0) finishes after 60 steps.
WORKER = """
import os, sys, time
import shoal
attempt = shoal.env.restart_count()
long_run = shoal.env.index() == 1 and attempt == 0
print(f"attempt {attempt} pid {os.getpid()}", flush=True)
step = 0
while long_run or step < 60:
    step += 1
    shoal.progress(step)
    if step == 10:
        print("progressing", flush=True)
    time.sleep(0.02)
print(f"done after {step} steps", flush=True)
"""


def hang_job(write_file, write_job, name, policy):
    write_file("worker.py", WORKER)
    return write_job(f"""
        name: {name}
        on_failure: {policy}
        max_restarts: 1
        backoff: {{initial: 100ms, max: 100ms}}
        progress_timeout: {PROGRESS_TIMEOUT_S}s
        heartbeat: {{interval: {int(HEARTBEAT_S * 1000)}ms, misses: 20}}
        roles:
          worker:
            instances: 2
            command: ["/usr/bin/python3", "worker.py"]
            resources: {{cpus: 0.5}}
        """)


def stop_worker_1(client, jobs_dir, name, wait_for_state):
    """SIGSTOPs worker:1 once it has reported progress; returns (job_dir, pid, stopped_at)."""
    job_dir = e2e.wait_for_job(jobs_dir, name)
    job_id = job_dir.name
    e2e.wait_until(lambda: "worker:1 | progressing" in client.stdout().splitlines(), 60,
                   "worker:1 to report progress")
    status = wait_for_state(job_id, lambda s: any(t["task"] == "worker:1" and t["step"] > 0
                                                  for t in s["tasks"]), 30,
                            "worker:1's step in the status")
    pid = next(t["pid"] for t in status["tasks"] if t["task"] == "worker:1")
    stopped_at = time.time()
    assert e2e.kill_task(pid, job_id, signal.SIGSTOP), f"worker:1 (pid {pid}) is gone"
    return job_dir, pid, stopped_at


def check_hung_event(job_dir, stopped_at):
    events = e2e.read_events(job_dir)
    hung = e2e.events_of(events, "task_hung")
    assert len(hung) == 1, hung
    h = hung[0]
    assert h["task"] == "worker:1" and h["attempt"] == 0, h
    assert h["last_step"] >= 10, h
    # The watchdog waits the whole timeout after the last report ...
    assert h["silent_ms"] >= PROGRESS_TIMEOUT_S * 1000, h
    detected_after = e2e.event_seconds(h) - stopped_at
    assert detected_after >= PROGRESS_TIMEOUT_S - 0.5, f"hung after only {detected_after:.2f}s"
    # ... and no longer than the timeout plus one heartbeat interval (plus the margin).
    assert detected_after <= PROGRESS_TIMEOUT_S + HEARTBEAT_S + MARGIN_S, (
        f"worker:1 was found hung {detected_after:.2f}s after it stopped; the bound is "
        f"progress_timeout {PROGRESS_TIMEOUT_S}s + heartbeat {HEARTBEAT_S}s + margin {MARGIN_S}s")
    # It was killed (SIGKILL: a stopped process handles nothing) and handled as a failure.
    failed = [e for e in e2e.task_transitions(events, "worker:1") if e["to"] == "failed"]
    assert failed, e2e.task_transitions(events, "worker:1")
    f = failed[0]
    assert f["signal"] == 9, f
    assert re.match(r"hung: no progress for [0-9.]+s after step \d+", f["reason"]), f
    assert e2e.event_seconds(f) >= e2e.event_seconds(h)
    return events


def test_hung_worker_is_killed_and_restarted(write_file, write_job, start_shoal, jobs_dir,
                                             wait_for_state, shoal_status):
    job = hang_job(write_file, write_job, "hangrestart", "restart-task")
    client = start_shoal("run", job)
    job_dir, pid, stopped_at = stop_worker_1(client, jobs_dir, "hangrestart", wait_for_state)

    rc = client.wait(60)
    assert rc == 0, f"rc={rc}\n{client.stderr()}"
    out = client.stdout().splitlines()
    assert "worker:1 | attempt 1 pid" in "\n".join(out), client.stdout()
    assert "worker:1 | done after 60 steps" in out and "worker:0 | done after 60 steps" in out
    check_hung_event(job_dir, stopped_at)
    assert not e2e.is_task_of(pid, job_dir.name), "the stopped process is still alive"

    status = shoal_status(job_dir.name)
    assert status["state"] == "succeeded", status
    tasks = {t["task"]: t for t in status["tasks"]}
    assert tasks["worker:1"]["restarts"] == 1 and tasks["worker:1"]["state"] == "succeeded"
    # restart-task: the healthy worker was left alone.
    assert tasks["worker:0"]["restarts"] == 0 and tasks["worker:0"]["state"] == "succeeded"
    e2e.wait_until(lambda: not e2e.job_processes(job_dir.name, job_dir), 10,
                   "every process of the job to exit")


def test_hung_worker_fails_the_job(write_file, write_job, start_shoal, jobs_dir,
                                   wait_for_state, shoal_status):
    job = hang_job(write_file, write_job, "hangfail", "fail-job")
    client = start_shoal("run", job)
    job_dir, pid, stopped_at = stop_worker_1(client, jobs_dir, "hangfail", wait_for_state)

    rc = client.wait(60)
    assert rc == 1, f"rc={rc}\n{client.stderr()}"
    last = [l for l in client.stderr().splitlines() if l.strip()][-1]
    assert re.fullmatch(rf"shoal \| job {job_dir.name} failed: worker:1 hung: no progress for "
                        r"[0-9.]+s after step \d+", last), last
    check_hung_event(job_dir, stopped_at)
    status = shoal_status(job_dir.name)
    assert status["state"] == "failed"
    assert "worker:1" in status["reason"] and "hung" in status["reason"], status["reason"]
    tasks = {t["task"]: t for t in status["tasks"]}
    assert tasks["worker:1"]["state"] == "failed" and tasks["worker:1"]["restarts"] == 0
    # Nothing is left, the stopped process included.
    e2e.wait_until(lambda: not e2e.job_processes(job_dir.name, job_dir), 10,
                   "every process of the job to exit")
    assert not e2e.is_task_of(pid, job_dir.name)
