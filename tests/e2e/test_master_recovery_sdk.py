"""SDK calls that a dead master never handled are answered by the master that replaces it.

A task's `lease`, `done`, `resumed`, `checkpointed` and `published` go to its agent, which relays
them to the master over its one stream. When the master dies (SIGKILL) the agent keeps its tasks
for its grace period and dials the master's address until a new one (`shoal resume`, or `shoal
run`'s own recovery) takes over. A call made in that gap, or delivered to the master just before
it died and never handled, must be answered by the new master, not lost (the task used to get
AgentTimeout after 30 s and fail for no fault of its own), and the exactly-once bookkeeping must
come out whole: every shard done once, by the task that did it.
"""

import json
import os
import signal

import pytest

import shoal_e2e as e2e

# worker:0 stops holding its first shard (processed, not yet `done`); worker:1 stops after its
# first shard is done, before its next `lease`. Each says so with a file `paused-<task>`, then
# waits for the test's `go` file (written once the master is dead), reports a checkpoint and
# says `asking-<task>` right before the call that the dead master cannot answer.
WORKER = """
import json, os, sys, time
import shoal
out, epochs = sys.argv[1], int(sys.argv[2])
task = shoal.env.task()
name = task.replace(":", "-")
hold_done = task.endswith(":0")
step = 0
paused = False


def pause():
    global paused
    paused = True
    open(os.path.join(out, f"paused-{name}"), "w").close()
    while not os.path.exists(os.path.join(out, "go")):
        time.sleep(0.02)
    shoal.checkpointed(step)
    open(os.path.join(out, f"asking-{name}"), "w").close()


for epoch in range(epochs):
    while True:
        if step > 0 and not paused and not hold_done:
            pause()
        reply = shoal.lease(epoch)
        if reply.exhausted:
            break
        if reply.shard is None:
            time.sleep(reply.retry_ms / 1000.0)
            continue
        shard = reply.shard
        ids = list(shard.range())
        step += 1
        shoal.progress(step)
        if not paused and hold_done:
            pause()
        shard.done(step)
        path = os.path.join(out, f"e{epoch}-s{shard.id}.json")
        with open(path + ".tmp", "w") as f:
            json.dump({"ids": ids, "task": task}, f)
        os.rename(path + ".tmp", path)
print(f"finished at step {step}", flush=True)
"""

SAMPLES, SHARD_SIZE, EPOCHS = 80, 10, 2
SHARDS = SAMPLES // SHARD_SIZE


def master_dead(pid):
    """The master has exited: its pid is gone or only a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def received_unread(port):
    """Bytes that arrived on the connections of the master's port and that it has not read yet
    (the rx_queue of /proc/net/tcp): what agents wrote to a master that no longer reads."""
    total = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, state, queues = fields[1], fields[3], fields[4]
            if state == "01" and int(local.rsplit(":", 1)[1], 16) == port:
                total += int(queues.split(":")[1], 16)
    return total


def kill_master_after_the_calls(job_dir, out, relayed_first):
    """SIGKILLs the job's master around the paused workers' calls: after them when
    `relayed_first` (they reach the master, which never handles them), else before them (they
    reach the agent while no master listens)."""
    master = json.loads((job_dir / "master.json").read_text())
    old_master, port = master["pid"], int(master["address"].rsplit(":", 1)[1])
    asked = lambda: all((out / f"asking-worker-{i}").exists() for i in (0, 1))
    if not relayed_first:
        os.kill(old_master, signal.SIGKILL)
        e2e.wait_until(lambda: master_dead(old_master), 10, "the master to die")
        (out / "go").touch()
        e2e.wait_until(asked, 30, "both workers to make their call")
        return
    # Stopped first, the master reads nothing more: what the agent relays stays in its socket
    # until the SIGKILL drops it. The agent wrote those calls to a live stream.
    os.kill(old_master, signal.SIGSTOP)
    try:
        unread_before = received_unread(port)
        (out / "go").touch()
        e2e.wait_until(asked, 30, "both workers to make their call")
        # Two calls and two reports are some 400 bytes; a heartbeat is a few dozen a second.
        e2e.wait_until(lambda: received_unread(port) - unread_before >= 300, 10,
                       "the agent to relay the calls to the stopped master")
    finally:
        os.kill(old_master, signal.SIGKILL)
    e2e.wait_until(lambda: master_dead(old_master), 10, "the master to die")


# How the calls meet the master's death, and who starts the new master: `shoal resume` for a
# detached job, or the `shoal run` that follows the job (it notices its master is gone).
@pytest.mark.parametrize("relayed_first,replacement", [
    (True, "resume"), (False, "resume"), (True, "run")],
    ids=["relayed-to-the-dying-master", "asked-while-no-master", "relayed-then-run-recovers"])
def test_lease_and_done_are_answered_by_the_master_that_replaced_a_dead_one(
        relayed_first, replacement, tmp_path, write_file, write_job, detach_job, start_shoal,
        run_shoal, jobs_dir, wait_for_state):
    write_file("worker.py", WORKER)
    out = tmp_path / "out"
    out.mkdir()
    job = write_job(f"""
        name: recover-shards
        dataset: {{samples: {SAMPLES}, shard_size: {SHARD_SIZE}, epochs: {EPOCHS}}}
        roles:
          worker:
            instances: 2
            command: ["/usr/bin/python3", "worker.py", "{out}", "{EPOCHS}"]
            resources: {{cpus: 0.5}}
        """)
    # The gap lasts until the new master is up: well within 20 s.
    env = {"SHOAL_AGENT_MASTER_GRACE_MS": "20000"}
    if replacement == "resume":
        job_id = detach_job(job, env=env)
    else:
        client = start_shoal("run", job, env=env)
        job_id = e2e.wait_for_job(jobs_dir, "recover-shards").name
    job_dir = jobs_dir / job_id
    status = wait_for_state(job_id, lambda s: len(s["tasks"]) == 2 and all(
        t["state"] == "running" for t in s["tasks"]), 60, "both workers running")
    pids = sorted(t["pid"] for t in status["tasks"])
    e2e.wait_until(lambda: all((out / f"paused-worker-{i}").exists() for i in (0, 1)), 60,
                   "both workers to pause before their next shard call")

    # worker:0 is about to send `done`, worker:1 `lease`, each after a `checkpointed`.
    kill_master_after_the_calls(job_dir, out, relayed_first)

    if replacement == "resume":
        r = run_shoal("resume", job_id, timeout=180)
        assert r.returncode == 0, f"rc={r.returncode}\n{r.stderr[-3000:]}"
        assert "starting a new master" in r.stderr
    else:
        rc = client.wait(timeout=180)
        assert rc == 0, f"rc={rc}\n{client.stderr()[-3000:]}"
        assert "died; starting a new one from the job's journal" in client.stderr()
    log = (job_dir / "logs.txt").read_text(errors="replace")
    assert "AgentTimeout" not in log and "did not answer" not in log, log[-3000:]
    final = json.loads((job_dir / "status.json").read_text())
    assert final["state"] == "succeeded", final
    # The same processes throughout: no task failed or restarted because of the master.
    assert sorted(t["pid"] for t in final["tasks"]) == pids
    assert all(t["restarts"] == 0 and t["state"] == "succeeded" for t in final["tasks"]), final

    events = e2e.read_events(job_dir)
    assert len(e2e.events_of(events, "master_recovered")) == 1
    # Exactly once: one accepted `done` per (epoch, shard), each by the task that wrote it.
    done = {}
    for e in e2e.events_of(events, "shard_done"):
        key = (e["epoch"], e["shard"])
        assert key not in done, f"shard {key} done twice: {done[key]} and {e}"
        done[key] = e
    assert set(done) == {(e, s) for e in range(EPOCHS) for s in range(SHARDS)}, sorted(done)
    assert not e2e.events_of(events, "shard_returned")
    for epoch in range(EPOCHS):
        ids = []
        for s in range(SHARDS):
            rec = json.loads((out / f"e{epoch}-s{s}.json").read_text())
            assert rec["task"] == done[(epoch, s)]["task"], (rec, done[(epoch, s)])
            ids += rec["ids"]
        assert sorted(ids) == list(range(SAMPLES)), f"epoch {epoch}: ids not exactly once"
    # The checkpoint reports made in the gap arrived too, once each.
    reported = sorted(e["task"] for e in e2e.events_of(events, "checkpoint"))
    assert reported == ["worker:0", "worker:1"], reported


# A task's exit is the same kind of message: written to a master that was stopped and then
# SIGKILLed, it is lost with that master's socket unless the agent reports it again.
EXITING_WORKER = """
import os, sys, time
out = sys.argv[1]
open(os.path.join(out, "started"), "w").close()
while not os.path.exists(os.path.join(out, "go")):
    time.sleep(0.02)
print("leaving with status 0", flush=True)
"""


def test_a_task_exit_written_to_a_dying_master_reaches_the_new_one(
        tmp_path, write_file, write_job, detach_job, run_shoal, jobs_dir, wait_for_state):
    write_file("worker.py", EXITING_WORKER)
    out = tmp_path / "out"
    out.mkdir()
    # No restarts: a task the new master counted as lost would fail the job.
    job = write_job(f"""
        name: recover-exit
        roles:
          worker:
            command: ["/usr/bin/python3", "worker.py", "{out}"]
            resources: {{cpus: 0.5}}
        """)
    job_id = detach_job(job, env={"SHOAL_AGENT_MASTER_GRACE_MS": "20000"})
    job_dir = jobs_dir / job_id
    status = wait_for_state(job_id, lambda s: s["tasks"] and s["tasks"][0]["state"] == "running",
                            60, "the worker running")
    e2e.wait_until((out / "started").exists, 30, "the worker to start")
    task_pid = status["tasks"][0]["pid"]
    master = json.loads((job_dir / "master.json").read_text())
    old_master, port = master["pid"], int(master["address"].rsplit(":", 1)[1])
    os.kill(old_master, signal.SIGSTOP)
    try:
        unread_before = received_unread(port)
        (out / "go").touch()
        e2e.wait_until(lambda: master_dead(task_pid), 30, "the worker to exit")
        # Its last line and its exit: some 100 bytes, written to a live stream.
        e2e.wait_until(lambda: received_unread(port) - unread_before >= 60, 10,
                       "the agent to report the exit to the stopped master")
    finally:
        os.kill(old_master, signal.SIGKILL)
    e2e.wait_until(lambda: master_dead(old_master), 10, "the master to die")

    r = run_shoal("resume", job_id, timeout=180)
    assert r.returncode == 0, f"rc={r.returncode}\n{r.stderr[-3000:]}"
    final = json.loads((job_dir / "status.json").read_text())
    assert final["state"] == "succeeded", final
    (task,) = final["tasks"]
    assert task["state"] == "succeeded" and task["restarts"] == 0, task
    log = (job_dir / "logs.txt").read_text(errors="replace")
    assert "lost while the master was down" not in log, log[-3000:]
