"""The restart policies end to end: restart-task with its limit and backoff, an untracked
parameter server restarted on its own while the workers go on, `restart: always` for an
evaluator loop, and restart-group (every task again, same ports, the generation counted in
TORCHELASTIC_RESTART_COUNT), including failures that arrive while a group restart is under way.
"""

import json
import re

import pytest

import shoal_e2e as e2e


def last_line(text):
    lines = [l for l in text.splitlines() if l.strip()]
    return lines[-1] if lines else ""


def restart_records(events, task):
    """The journal's records of the restarts scheduled for a task alone (restart-task), in
    order: `restart_scheduled`, or `failure_handled` with the restart-task action."""
    return [e for e in events if e.get("task") == task and (
        e["type"] == "restart_scheduled"
        or (e["type"] == "failure_handled" and e.get("action") == "restart-task"))]


def relaunches(events, task):
    """(attempt, journal seconds) of every `-> pending` transition that restarts the task."""
    return [(e["attempt"], e2e.event_seconds(e)) for e in e2e.task_transitions(events, task)
            if e["to"] == "pending" and "attempt" in e]


def nothing_left(job_dir):
    e2e.wait_until(lambda: not e2e.job_processes(job_dir.name, job_dir), 10,
                   "every process of the job to exit")


def test_restart_task_limit_and_backoff(write_job, run_shoal, jobs_dir, shoal_status):
    job = write_job("""
        name: limit
        on_failure: restart-task
        max_restarts: 2
        backoff: {initial: 400ms, max: 600ms}
        roles:
          worker:
            command: ["/bin/sh", "-c", "echo attempt $SHOAL_RESTART_COUNT; exit 3"]
            resources: {cpus: 0.5}
        """)
    r = run_shoal("run", job, timeout=60)
    assert r.returncode == 1, f"rc={r.returncode}\n{r.stderr}"
    out = r.stdout.splitlines()
    assert [l for l in out if "attempt" in l] == [
        "worker:0 | attempt 0", "worker:0 | attempt 1", "worker:0 | attempt 2"], r.stdout
    job_dir = e2e.only_job_dir(jobs_dir)
    assert re.fullmatch(rf"shoal \| job {job_dir.name} failed: worker:0 exited with code 3; its "
                        r"restart limit \(2\) is spent", last_line(r.stderr)), r.stderr
    status = shoal_status(job_dir.name)
    assert status["state"] == "failed"
    assert "restart limit (2) is spent" in status["reason"], status["reason"]
    (task,) = status["tasks"]
    assert task["state"] == "failed" and task["restarts"] == 2 and task["exit_code"] == 3

    events = e2e.read_events(job_dir)
    # Backoff: 400ms, then min(600ms, 800ms); recorded with each restart ...
    records = restart_records(events, "worker:0")
    assert [r["delay_ms"] for r in records] == [400, 600], records
    assert all("exited with code 3" in r["cause"] for r in records), records
    # ... and really waited: each relaunch comes no earlier than its delay after the failure.
    failures = [e2e.event_seconds(e) for e in e2e.task_transitions(events, "worker:0")
                if e["to"] == "failed"]
    again = relaunches(events, "worker:0")
    assert [a for a, _ in again] == [1, 2], again
    for (attempt, at), failed_at, delay_ms in zip(again, failures, (400, 600)):
        assert at - failed_at >= delay_ms / 1000 - 0.005, (
            f"attempt {attempt} relaunched {at - failed_at:.3f}s after the failure, "
            f"backoff {delay_ms}ms")
    assert len(failures) == 3
    nothing_left(job_dir)


def test_untracked_ps_restarts_while_workers_continue(tmp_path, write_job, run_shoal, jobs_dir,
                                                      shoal_status):
    # ps attempt 0 crashes once both workers run; the workers finish only once ps is back.
    job = write_job(f"""
        name: psrestart
        success: {{roles: [worker]}}
        backoff: {{initial: 100ms, max: 100ms}}
        roles:
          ps:
            untracked: true
            on_failure: restart-task
            max_restarts: 2
            command: ["/bin/sh", "-c", "echo ps attempt $SHOAL_RESTART_COUNT; if [ $SHOAL_RESTART_COUNT = 0 ]; then while [ ! -e {tmp_path}/w0 ] || [ ! -e {tmp_path}/w1 ]; do sleep 0.02; done; exit 7; fi; touch {tmp_path}/ps-back; exec sleep 120"]
            resources: {{cpus: 0.25}}
          worker:
            instances: 2
            depends_on: [ps]
            command: ["/bin/sh", "-c", "echo worker attempt $SHOAL_RESTART_COUNT; touch {tmp_path}/w$SHOAL_INDEX; while [ ! -e {tmp_path}/ps-back ]; do sleep 0.02; done; echo worker done"]
            resources: {{cpus: 0.25}}
        """)
    r = run_shoal("run", job, timeout=60)
    assert r.returncode == 0, f"rc={r.returncode}\n{r.stderr}"
    out = r.stdout.splitlines()
    assert [l for l in out if l.startswith("ps:0 | ps attempt")] == [
        "ps:0 | ps attempt 0", "ps:0 | ps attempt 1"], r.stdout
    for i in (0, 1):
        assert [l for l in out if l.startswith(f"worker:{i} | worker attempt")] == [
            f"worker:{i} | worker attempt 0"], r.stdout
        assert f"worker:{i} | worker done" in out

    job_dir = e2e.only_job_dir(jobs_dir)
    status = shoal_status(job_dir.name)
    assert status["state"] == "succeeded", status
    tasks = {t["task"]: t for t in status["tasks"]}
    assert tasks["ps:0"]["restarts"] == 1 and tasks["ps:0"]["state"] == "killed", tasks["ps:0"]
    for i in (0, 1):
        assert tasks[f"worker:{i}"]["restarts"] == 0
        assert tasks[f"worker:{i}"]["state"] == "succeeded"
    assert status["group_restarts"] == 0 and status["generation"] == 0, status

    events = e2e.read_events(job_dir)
    ps = e2e.task_transitions(events, "ps:0")
    assert [(e["to"], e.get("exit_code")) for e in ps if e["to"] in ("failed", "killed")] == [
        ("failed", 7), ("killed", 0)], ps
    assert [a for a, _ in relaunches(events, "ps:0")] == [1]
    assert [r["cause"] for r in restart_records(events, "ps:0")] == ["exited with code 7"]
    # The workers ran straight through: started once, never stopped, succeeded.
    for i in (0, 1):
        assert [e["to"] for e in e2e.task_transitions(events, f"worker:{i}")] == [
            "pending", "starting", "running", "succeeded"]
    assert not e2e.events_of(events, "group_restart_begun")
    nothing_left(job_dir)


def test_restart_always_reruns_an_evaluator(tmp_path, write_job, run_shoal, jobs_dir,
                                            shoal_status):
    # The evaluator exits 0 after each pass and is started again; the worker finishes once
    # the evaluator has run 4 times.
    job = write_job(f"""
        name: evalloop
        success: {{roles: [worker]}}
        backoff: {{initial: 50ms, max: 50ms}}
        roles:
          evaluator:
            on_failure: restart-task
            restart: always
            max_restarts: 100
            command: ["/bin/sh", "-c", "echo eval pass $SHOAL_RESTART_COUNT; touch {tmp_path}/eval-$SHOAL_RESTART_COUNT; sleep 0.1"]
            resources: {{cpus: 0.25}}
          worker:
            command: ["/bin/sh", "-c", "while [ ! -e {tmp_path}/eval-3 ]; do sleep 0.02; done; echo worker done"]
            resources: {{cpus: 0.25}}
        """)
    r = run_shoal("run", job, timeout=60)
    assert r.returncode == 0, f"rc={r.returncode}\n{r.stderr}"
    out = r.stdout.splitlines()
    passes = [l for l in out if l.startswith("evaluator:0 | eval pass")]
    assert passes[:4] == [f"evaluator:0 | eval pass {i}" for i in range(4)], r.stdout
    assert "worker:0 | worker done" in out

    job_dir = e2e.only_job_dir(jobs_dir)
    events = e2e.read_events(job_dir)
    ev = e2e.task_transitions(events, "evaluator:0")
    # Passes 0-2 (at least) ended with exit 0 and each was followed by a relaunch; pass 3 let
    # the worker finish, and may have been stopped with the job.
    clean = [e for e in ev if e["to"] == "succeeded"]
    assert len(clean) >= 3 and all(e["exit_code"] == 0 for e in clean), ev
    assert not [e for e in ev if e["to"] == "failed"], ev
    again = relaunches(events, "evaluator:0")
    assert [a for a, _ in again][:3] == [1, 2, 3], again
    records = restart_records(events, "evaluator:0")
    assert len(records) >= 3 and all(r["delay_ms"] == 50 for r in records), records
    assert all(r["cause"] == "exited with code 0" for r in records), records

    status = shoal_status(job_dir.name)
    assert status["state"] == "succeeded", status
    tasks = {t["task"]: t for t in status["tasks"]}
    assert tasks["evaluator:0"]["restarts"] >= 3, tasks["evaluator:0"]
    # The job has ended: no task may still show as waiting to start.
    assert tasks["evaluator:0"]["state"] in e2e.TERMINAL_TASK_STATES, tasks["evaluator:0"]
    assert tasks["worker:0"]["state"] == "succeeded" and tasks["worker:0"]["restarts"] == 0
    nothing_left(job_dir)


def test_job_end_drops_a_scheduled_restart(tmp_path, write_job, run_shoal, jobs_dir,
                                           shoal_status):
    # The evaluator's first pass ends at once and its restart waits 3 s; the worker finishes
    # right after that first pass, so the job ends while the restart is still scheduled.
    job = write_job(f"""
        name: evaldropped
        success: {{roles: [worker]}}
        backoff: {{initial: 3s, max: 3s}}
        roles:
          evaluator:
            on_failure: restart-task
            restart: always
            command: ["/bin/sh", "-c", "echo eval pass $SHOAL_RESTART_COUNT; touch {tmp_path}/eval-$SHOAL_RESTART_COUNT"]
            resources: {{cpus: 0.25}}
          worker:
            command: ["/bin/sh", "-c", "while [ ! -e {tmp_path}/eval-0 ]; do sleep 0.02; done; echo worker done"]
            resources: {{cpus: 0.25}}
        """)
    r = run_shoal("run", job, timeout=60)
    assert r.returncode == 0, f"rc={r.returncode}\n{r.stderr}"
    assert "evaluator:0 | eval pass 1" not in r.stdout.splitlines()
    job_dir = e2e.only_job_dir(jobs_dir)
    status = shoal_status(job_dir.name)
    assert status["state"] == "succeeded", status
    for source in (status, json.loads((job_dir / "status.json").read_text())):
        ev = next(t for t in source["tasks"] if t["task"] == "evaluator:0")
        # The job is over: the evaluator's last state is final, and no restart is promised.
        assert ev["state"] in e2e.TERMINAL_TASK_STATES, ev
        assert "restarting in" not in ev["reason"], ev
    nothing_left(job_dir)


def test_kill_during_group_backoff_leaves_no_pending_task(tmp_path, write_job, detach_job,
                                                          run_shoal, jobs_dir, wait_for_state):
    job = write_job("""
        name: rgkill
        on_failure: restart-group
        backoff: {initial: 10s, max: 10s}
        roles:
          worker:
            instances: 2
            command: ["/bin/sh", "-c", "if [ $SHOAL_INDEX = 1 ]; then sleep 0.3; exit 3; fi; exec sleep 60"]
            resources: {cpus: 0.25}
        """)
    job_id = detach_job(job)
    wait_for_state(job_id, lambda s: s["group_restarts"] == 1
                   and all(t["state"] != "running" for t in s["tasks"]), 30,
                   "the group to be stopped and waiting out its backoff")
    r = run_shoal("kill", job_id, timeout=30)
    assert r.returncode == 0, r.stderr
    final = wait_for_state(job_id, lambda s: s["state"] in e2e.TERMINAL_JOB_STATES, 30,
                           "the job to end")
    assert final["state"] == "killed", final
    for t in final["tasks"]:
        # The job is over: no task waits for a restart that will never come.
        assert t["state"] in e2e.TERMINAL_TASK_STATES, t
        assert "restarting" not in t["reason"], t
    nothing_left(jobs_dir / job_id)


# Writes its environment to out/<role>-<index>-gen<generation>.json. In generation 0, worker:1
# exits 1 once worker:0 has written its file; worker:0 waits to be stopped. From generation 1
# on the workers exit 0. ps (restart-task, outside the group) only waits.
RECORDER = """
import json, os, sys, time
out = sys.argv[1]
role, index = os.environ["SHOAL_ROLE"], os.environ["SHOAL_INDEX"]
gen = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
name = f"{role}-{index}-gen{gen}-attempt{os.environ['SHOAL_RESTART_COUNT']}.json"
with open(os.path.join(out, name + ".tmp"), "w") as f:
    json.dump(dict(os.environ), f)
os.rename(os.path.join(out, name + ".tmp"), os.path.join(out, name))
print(f"{role} generation {gen} up", flush=True)
if role == "ps":
    time.sleep(120)
elif gen == 0 and index == "1":
    while not any(n.startswith("worker-0-gen0-") for n in os.listdir(out)):
        time.sleep(0.02)
    sys.exit(1)
elif gen == 0:
    time.sleep(120)
"""


def test_restart_group_same_ports_and_generation(tmp_path, write_file, write_job, run_shoal,
                                                 jobs_dir, shoal_status):
    write_file("recorder.py", RECORDER)
    out = tmp_path / "out"
    out.mkdir()
    job = write_job(f"""
        name: regroup
        framework: pytorch
        on_failure: restart-group
        max_restarts: 2
        backoff: {{initial: 200ms, max: 200ms}}
        roles:
          ps:
            untracked: true
            on_failure: restart-task
            command: ["/usr/bin/python3", "recorder.py", "{out}"]
            resources: {{cpus: 0.25}}
          worker:
            instances: 2
            command: ["/usr/bin/python3", "recorder.py", "{out}"]
            resources: {{cpus: 0.25}}
        """)
    r = run_shoal("run", job, timeout=60)
    assert r.returncode == 0, f"rc={r.returncode}\n{r.stdout}\n{r.stderr}"
    files = sorted(p.name for p in out.glob("*.json"))
    assert files == ["ps-0-gen0-attempt0.json",
                     "worker-0-gen0-attempt0.json", "worker-0-gen1-attempt1.json",
                     "worker-1-gen0-attempt0.json", "worker-1-gen1-attempt1.json"], files
    env = {f[:-5]: json.loads((out / f).read_text()) for f in files}
    for i in (0, 1):
        before, after = env[f"worker-{i}-gen0-attempt0"], env[f"worker-{i}-gen1-attempt1"]
        # The same port, rank, world and rendezvous point ...
        for key in ("SHOAL_TASK_PORT", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE",
                    "LOCAL_RANK"):
            assert before[key] == after[key], (i, key, before[key], after[key])
        # ... and the restart counted.
        assert (before["TORCHELASTIC_RESTART_COUNT"], after["TORCHELASTIC_RESTART_COUNT"]) == (
            "0", "1")
        assert (before["SHOAL_GENERATION"], after["SHOAL_GENERATION"]) == ("0", "1")
        assert (before["SHOAL_RESTART_COUNT"], after["SHOAL_RESTART_COUNT"]) == ("0", "1")
        spec = json.loads(open(after["SHOAL_CLUSTER_SPEC_FILE"]).read())
        assert spec["restart_count"] == 1, spec
    assert env["worker-0-gen0-attempt0"]["SHOAL_TASK_PORT"] != env["worker-1-gen0-attempt0"][
        "SHOAL_TASK_PORT"]

    job_dir = e2e.only_job_dir(jobs_dir)
    status = shoal_status(job_dir.name)
    assert status["state"] == "succeeded", status
    assert status["generation"] == 1 and status["group_restarts"] == 1, status
    tasks = {t["task"]: t for t in status["tasks"]}
    assert tasks["ps:0"]["restarts"] == 0 and tasks["ps:0"]["state"] == "killed"
    assert tasks["worker:0"]["restarts"] == 1 and tasks["worker:1"]["restarts"] == 1

    events = e2e.read_events(job_dir)
    w0, w1 = (e2e.task_transitions(events, f"worker:{i}") for i in (0, 1))
    failed = [e for e in w1 if e["to"] == "failed"]
    assert len(failed) == 1 and failed[0]["exit_code"] == 1, w1
    stopped = [e for e in w0 if e["to"] == "killed"]
    assert len(stopped) == 1 and "worker:1 exited with code 1" in stopped[0]["reason"], w0
    (begun,) = e2e.events_of(events, "group_restart_begun")
    assert begun["reason"] == "worker:1 exited with code 1" and begun["generation"] == 1, begun
    (restarted,) = e2e.events_of(events, "group_restarted")
    assert restarted["generation"] == 1 and restarted["world_size"] == 3, restarted
    # The relaunch waited the backoff after the last task of the group was gone.
    gone = max(e2e.event_seconds(e) for e in stopped + failed)
    assert e2e.event_seconds(restarted) - gone >= 0.2 - 0.005
    rendezvous = e2e.events_of(events, "rendezvous")
    assert [r["generation"] for r in rendezvous] == [0, 1]
    ports = [{x["task"]: x["port"] for x in r["ranks"]} for r in rendezvous]
    assert ports[0] == ports[1], ports
    nothing_left(job_dir)


# Workers 1 and 2 of generation 0 fail at (about) the same moment, and worker:0 exits 1 when it
# is told to stop: one incident, one group restart. Generation 1 succeeds.
STORM = """
import os, signal, sys, time
gen = int(os.environ["SHOAL_GENERATION"])
index = int(os.environ["SHOAL_INDEX"])
out = sys.argv[1]
print(f"worker {index} generation {gen} attempt {os.environ['SHOAL_RESTART_COUNT']}", flush=True)
if gen > 0:
    sys.exit(0)
if index == 0:
    signal.signal(signal.SIGTERM, lambda *_: os._exit(1))  # a failure exit while being stopped
open(os.path.join(out, f"up-{index}"), "w").close()
while len(os.listdir(out)) < 3:
    time.sleep(0.01)
if index == 0:
    while True:
        time.sleep(0.1)
os._exit(2 + index)
"""


def test_restart_group_absorbs_failures_of_one_incident(tmp_path, write_file, write_job,
                                                        run_shoal, jobs_dir, shoal_status):
    write_file("storm.py", STORM)
    out = tmp_path / "out"
    out.mkdir()
    job = write_job(f"""
        name: storm
        on_failure: restart-group
        max_restarts: 1
        backoff: {{initial: 100ms, max: 100ms}}
        roles:
          worker:
            instances: 3
            command: ["/usr/bin/python3", "storm.py", "{out}"]
            resources: {{cpus: 0.5}}
        """)
    r = run_shoal("run", job, timeout=60)
    # With max_restarts 1, a second restart charged for the same incident would fail the job.
    assert r.returncode == 0, f"rc={r.returncode}\n{r.stdout}\n{r.stderr}"
    job_dir = e2e.only_job_dir(jobs_dir)
    status = shoal_status(job_dir.name)
    assert status["state"] == "succeeded", status
    assert status["group_restarts"] == 1 and status["generation"] == 1, status
    assert all(t["restarts"] == 1 and t["state"] == "succeeded" for t in status["tasks"]), status
    events = e2e.read_events(job_dir)
    (begun,) = e2e.events_of(events, "group_restart_begun")
    assert begun["reason"] in ("worker:1 exited with code 3", "worker:2 exited with code 4"), begun
    assert len(e2e.events_of(events, "group_restarted")) == 1
    # Workers 1 and 2 failed on their own (codes 3 and 4): the first caused the restart, the
    # other is part of it (failed, or stopped if the stop reached it first). worker:0's exit 1
    # on SIGTERM came while it was being stopped: stopped, not a failure. Every worker ran
    # exactly twice.
    ends = {}
    for i in range(3):
        ts = e2e.task_transitions(events, f"worker:{i}")
        ends[i] = [e for e in ts if e["to"] in e2e.TERMINAL_TASK_STATES]
        assert len(ends[i]) == 2 and ends[i][-1]["to"] == "succeeded", ts
    assert ends[0][0]["to"] == "killed" and ends[0][0]["exit_code"] == 1, ends[0]
    assert "stopped to re-form the group" in ends[0][0]["reason"], ends[0]
    assert sorted(ends[i][0]["to"] for i in (1, 2)) in (["failed", "failed"],
                                                       ["failed", "killed"]), ends
    out_lines = r.stdout.splitlines()
    for i in range(3):
        assert [l for l in out_lines if l.startswith(f"worker:{i} | worker")] == [
            f"worker:{i} | worker {i} generation 0 attempt 0",
            f"worker:{i} | worker {i} generation 1 attempt 1"], r.stdout
    nothing_left(job_dir)
