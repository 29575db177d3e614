"""Exactly-once data: a job with a `dataset` of index ranges, workers that record the sample ids
they train on, workers SIGKILLed in the middle of an epoch; every id must be trained exactly
once per epoch.

Two designs, as docs/sdk-protocol.md describes them:

- restart-task, independent workers (framework none): each worker leases shards with
  shoal.shards(epoch) and, only once `done` succeeded, writes the shard's ids to a file named
  by (epoch, shard). A killed worker's lease goes back to the todo list and another worker (or
  its own next attempt) does the shard.
- restart-group with a `checkpoint` section, synchronous data-parallel workers (torch.distributed,
  lease(wait=False) so that no rank waits for a peer's shard): the ids trained so far are part
  of the checkpointed state (rank 0 gathers them with all_gather_object at every checkpoint).
  After a group restart the workers load the newest checkpoint and report `resumed`; the master
  reopens every shard completed after that step, so the state and the shard table agree.
"""

import json
import random
import time

import shoal_e2e as e2e

# ------------------------------------------------------------------------------------------
# restart-task, independent workers

SHARD_WORKER = """
import json, os, sys, time
import shoal
out, epochs, kill_plan = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
task, attempt = shoal.env.task(), shoal.env.restart_count()
# [epoch, n]: this attempt stops halfway through the n-th shard it leases in that epoch and
# waits there for the test to SIGKILL it.
plan = kill_plan.get(f"{task}/{attempt}")
step = 0
for epoch in range(epochs):
    leased = 0
    for shard in shoal.shards(epoch):
        ids = []
        for i in shard.range():
            ids.append(i)
            step += 1
            shoal.progress(step)
            time.sleep(0.003)
            if plan == [epoch, leased] and len(ids) == (shard.end - shard.start) // 2:
                print(f"MIDSHARD epoch {epoch} shard {shard.id}", flush=True)
                time.sleep(120)
        leased += 1
        try:
            shard.done(step)
        except shoal.LeaseLost as e:
            print(f"LEASELOST {e}", flush=True)
            continue
        name = os.path.join(out, f"e{epoch}-s{shard.id}.json")
        with open(name + f".tmp-{os.getpid()}", "w") as f:
            json.dump({"ids": ids, "task": task, "attempt": attempt}, f)
        os.rename(name + f".tmp-{os.getpid()}", name)
print(f"finished attempt {attempt}", flush=True)
"""

SAMPLES, SHARD_SIZE, EPOCHS = 300, 20, 3
SHARDS = SAMPLES // SHARD_SIZE


def test_restart_task_workers_train_each_sample_once_per_epoch(tmp_path, write_file, write_job,
                                                               start_shoal, jobs_dir,
                                                               shoal_status):
    write_file("shard_worker.py", SHARD_WORKER)
    out = tmp_path / "out"
    out.mkdir()
    # Kills in epochs 0, 1 and 2, one of them of an attempt that was itself a restart.
    plan = {"worker:1/0": [0, 1], "worker:0/0": [1, 1], "worker:1/1": [2, 0]}
    job = write_job(f"""
        name: oncetask
        on_failure: restart-task
        max_restarts: 3
        backoff: {{initial: 100ms, max: 100ms}}
        dataset: {{samples: {SAMPLES}, shard_size: {SHARD_SIZE}, epochs: {EPOCHS}}}
        roles:
          worker:
            instances: 3
            command: ["/usr/bin/python3", "shard_worker.py", "{out}", "{EPOCHS}", '{json.dumps(plan)}']
            resources: {{cpus: 0.5}}
        """)
    client = start_shoal("run", job)
    job_dir = e2e.wait_for_job(jobs_dir, "oncetask")
    job_id = job_dir.name
    killed = []
    for key in plan:  # in the order they happen: each waits for the previous one's restart
        task, attempt = key.split("/")
        epoch = plan[key][0]

        def midshard():
            lines = [l for l in client.stdout().splitlines()
                     if l.startswith(f"{task} | MIDSHARD epoch {epoch} ")]
            if len(lines) <= sum(1 for k in killed if k[0] == task and k[2] == epoch):
                return None
            status = shoal_status(job_id)
            t = next(t for t in status["tasks"] if t["task"] == task)
            return t if t["restarts"] == int(attempt) and t["state"] == "running" else None
        victim = e2e.wait_until(midshard, 60, f"{task} attempt {attempt} to stop mid-shard")
        assert e2e.kill_task(victim["pid"], job_id), victim
        killed.append((task, int(attempt), epoch))
    rc = client.wait(120)
    assert rc == 0, f"rc={rc}\n{client.stdout()[-3000:]}\n{client.stderr()[-3000:]}"
    assert "LEASELOST" not in client.stdout()

    # The journal: exactly one accepted `done` per (epoch, shard), every shard of every epoch.
    events = e2e.read_events(job_dir)
    done = {}
    for e in e2e.events_of(events, "shard_done"):
        key = (e["epoch"], e["shard"])
        assert key not in done, f"shard {key} done twice: {done[key]} and {e}"
        done[key] = e
    assert set(done) == {(e, s) for e in range(EPOCHS) for s in range(SHARDS)}, sorted(done)
    # Each killed attempt's lease (the shard it was in the middle of) went back, and the shard
    # was completed by another attempt.
    returned = e2e.events_of(events, "shard_returned")
    for task, attempt, epoch in killed:
        lost = [r for r in returned if (r["task"], r["attempt"]) == (task, attempt)]
        assert len(lost) == 1 and lost[0]["epoch"] == epoch, (task, attempt, returned)
        d = done[(epoch, lost[0]["shard"])]
        assert (d["task"], d["attempt"]) != (task, attempt), d

    # The files: one per (epoch, shard), written by the attempt whose `done` was accepted, and
    # every sample id exactly once per epoch.
    files = sorted(p.name for p in out.iterdir())
    assert files == sorted(f"e{e}-s{s}.json" for e in range(EPOCHS) for s in range(SHARDS)), files
    for epoch in range(EPOCHS):
        ids = []
        for s in range(SHARDS):
            rec = json.loads((out / f"e{epoch}-s{s}.json").read_text())
            assert (rec["task"], rec["attempt"]) == (done[(epoch, s)]["task"],
                                                     done[(epoch, s)]["attempt"]), rec
            ids += rec["ids"]
        assert sorted(ids) == list(range(SAMPLES)), f"epoch {epoch}: ids not exactly once"

    status = shoal_status(job_id)
    assert status["state"] == "succeeded"
    shards = status["shards"]
    assert shards["complete"] and shards["leases"] == [], shards
    assert [c["done"] for c in shards["epoch_counts"]] == [SHARDS] * EPOCHS, shards
    tasks = {t["task"]: t for t in status["tasks"]}
    assert tasks["worker:1"]["restarts"] == 2 and tasks["worker:0"]["restarts"] == 1
    assert tasks["worker:2"]["restarts"] == 0
    e2e.wait_until(lambda: not e2e.job_processes(job_id, job_dir), 10,
                   "every process of the job to exit")


# ------------------------------------------------------------------------------------------
# restart-group with checkpoints, synchronous data-parallel workers

DP_WORKER = """
import json, os, sys, time
import shoal
import torch
import torch.distributed as dist

out, epochs, every, delay = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
dist.init_process_group(backend="gloo", init_method="env://")
rank, world = dist.get_rank(), dist.get_world_size()
gen = int(os.environ["SHOAL_GENERATION"])

ckpt = shoal.Checkpointer(serializer="pickle")
step, state = ckpt.load_latest()
if state is None:
    # trained[e]: every id trained in epoch e up to the checkpoint's step, duplicates kept;
    # model: the all-reduced sum of those ids, standing in for the weights.
    state = {"epoch": 0, "trained": [[] for _ in range(epochs)], "model": 0}
print(f"rank {rank}/{world} generation {gen} resumed at step {step} epoch {state['epoch']}",
      flush=True)
pending = []  # (epoch, id) this rank trained since the last checkpoint


def gather():
    parts = [None] * world
    dist.all_gather_object(parts, pending)
    for part in parts:
        for e, i in part:
            state["trained"][e].append(i)
    pending.clear()


epoch = state["epoch"]
while epoch < epochs:
    # wait=False: a rank never waits for a shard a peer holds; it trains an empty batch instead.
    reply = shoal.lease(epoch, wait=False)
    shard = reply.shard
    flags = torch.tensor([shard is not None, reply.exhausted], dtype=torch.int64)
    dist.all_reduce(flags)
    if flags[0] == 0:
        if flags[1] == world:  # no rank got a shard and none is waiting: the epoch is over
            epoch += 1
            state["epoch"] = epoch
        else:
            time.sleep(0.1)
        continue
    ids = list(shard.range()) if shard is not None else []
    update = torch.tensor([sum(ids)], dtype=torch.int64)
    dist.all_reduce(update)  # the synchronous step
    state["model"] += int(update.item())
    step += 1
    shoal.progress(step)
    time.sleep(delay)
    if shard is not None:
        try:
            shard.done(step)
        except shoal.LeaseLost as e:
            # Only a generation being torn down loses a lease; it must not checkpoint again.
            print(f"LEASELOST {e}", flush=True)
            sys.exit(3)
        pending += [(epoch, i) for i in ids]
    if step % every == 0:
        gather()
        if rank == 0:
            ckpt.save(step, state)
gather()
if rank == 0:
    path = os.path.join(out, "result.json")
    with open(path + ".tmp", "w") as f:
        json.dump({"step": step, "generation": gen, **state}, f)
    os.rename(path + ".tmp", path)
print(f"rank {rank} finished at step {step}", flush=True)
dist.barrier()
dist.destroy_process_group()
"""

DP_SAMPLES, DP_SHARD_SIZE, DP_EPOCHS = 240, 8, 2
DP_KILLS = 2
DP_CHECKPOINT_EVERY = 4
SEED = 7


def test_restart_group_with_checkpoints_trains_each_sample_once_per_epoch(
        tmp_path, write_file, write_job, start_shoal, jobs_dir, shoal_status):
    write_file("dp_worker.py", DP_WORKER)
    out = tmp_path / "out"
    out.mkdir()
    job = write_job(f"""
        name: oncegroup
        framework: pytorch
        on_failure: restart-group
        max_restarts: {DP_KILLS}
        backoff: {{initial: 100ms, max: 100ms}}
        heartbeat: {{interval: 250ms, misses: 120}}
        checkpoint: {{dir: {tmp_path}/ckpt, keep: 2}}
        dataset: {{samples: {DP_SAMPLES}, shard_size: {DP_SHARD_SIZE}, epochs: {DP_EPOCHS}}}
        roles:
          worker:
            instances: 2
            command: ["/usr/bin/python3", "dp_worker.py", "{out}", "{DP_EPOCHS}",
                      "{DP_CHECKPOINT_EVERY}", "0.08"]
            resources: {{cpus: 1}}
        """)
    # 30 shards x 2 epochs over 2 ranks: 30 steps. Kills at random steps of the first 24,
    # each in a later generation than the one before.
    rng = random.Random(SEED)
    client = start_shoal("run", "-q", job)
    job_dir = e2e.wait_for_job(jobs_dir, "oncegroup")
    job_id = job_dir.name
    kills = []
    deadline = time.monotonic() + 150
    while len(kills) < DP_KILLS:
        assert client.poll() is None, (f"the job ended after {len(kills)} kills\n"
                                       f"{client.stdout()[-3000:]}\n{client.stderr()[-3000:]}")
        assert time.monotonic() < deadline, kills
        status = shoal_status(job_id)
        tasks = status["tasks"]
        if (status["generation"] != len(kills) or status["state"] != "running"
                or not all(t["state"] == "running" and t["step"] > 0 for t in tasks)):
            time.sleep(0.05)
            continue
        target = min(24, max(t["step"] for t in tasks) + rng.randint(1, 6))
        while True:
            status = shoal_status(job_id)
            if status["generation"] != len(kills):
                break
            step = max(t["step"] for t in status["tasks"])
            if step >= target:
                victim = rng.choice(sorted(status["tasks"], key=lambda t: t["task"]))
                if e2e.kill_task(victim["pid"], job_id):
                    kills.append((victim["task"], step))
                break
            time.sleep(0.05)
    rc = client.wait(150)
    assert rc == 0, (f"rc={rc} after kills {kills}\n{client.stdout()[-3000:]}\n"
                     f"{client.stderr()[-3000:]}")
    assert "LEASELOST" not in client.stdout() or len(kills) > 0

    result = json.loads((out / "result.json").read_text())
    assert result["generation"] == DP_KILLS, result
    for epoch in range(DP_EPOCHS):
        ids = result["trained"][epoch]
        duplicates = sorted({i for i in ids if ids.count(i) > 1})
        missing = sorted(set(range(DP_SAMPLES)) - set(ids))
        assert not duplicates and not missing, (
            f"epoch {epoch}: ids trained twice {duplicates}, never {missing}; kills {kills}")
    assert result["model"] == DP_EPOCHS * sum(range(DP_SAMPLES)), result["model"]

    events = e2e.read_events(job_dir)
    status = shoal_status(job_id)
    assert status["state"] == "succeeded", status
    assert status["group_restarts"] == DP_KILLS and status["generation"] == DP_KILLS, status
    assert status["shards"]["complete"], status["shards"]
    # Each group restart froze the table, and the new generation's first `resumed` reopened
    # what was done after the checkpoint it loaded.
    frozen = e2e.events_of(events, "shards_frozen")
    reopened = e2e.events_of(events, "shards_reopened")
    assert len(frozen) == DP_KILLS and len(reopened) == DP_KILLS, (frozen, reopened)
    checkpoints = {e["step"] for e in e2e.events_of(events, "checkpoint")}
    # The SDK reports `checkpointed` after the checkpoint is durable, fire-and-forget: a kill
    # between the two leaves a checkpoint the journal never heard of (seen under ASan, whose
    # slowness widens that window). It can only be a step of the schedule at a kill (the step
    # a kill was recorded at is the status's, which may lag the task's by a little).
    for r in reopened:
        resumed = r["resumed_step"]
        unreported = resumed % DP_CHECKPOINT_EVERY == 0 and any(
            abs(resumed - step) <= DP_CHECKPOINT_EVERY for _, step in kills)
        assert resumed == 0 or resumed in checkpoints or unreported, (r, checkpoints, kills)
    # The journal agrees: per (epoch, shard), dones minus reopenings is exactly one.
    done = {}
    for e in e2e.events_of(events, "shard_done"):
        done.setdefault((e["epoch"], e["shard"]), []).append(e)
    shards = DP_SAMPLES // DP_SHARD_SIZE
    assert set(done) == {(e, s) for e in range(DP_EPOCHS) for s in range(shards)}
    reopened_total = sum(r["count"] for r in reopened)
    assert sum(len(v) for v in done.values()) == DP_EPOCHS * shards + reopened_total
    e2e.wait_until(lambda: not e2e.job_processes(job_id, job_dir), 10,
                   "every process of the job to exit")


# ------------------------------------------------------------------------------------------
# Requests the SDK would never send, straight on the agent's socket

RAW_LEASE_WORKER = """
import json, os, socket, sys
import shoal
from shoal._client import socket_address
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect(socket_address(os.environ["SHOAL_AGENT_SOCKET"]))
reader = sock.makefile("r")
def ask(**fields):
    fields.update(task=shoal.env.task(), attempt=shoal.env.restart_count())
    sock.sendall((json.dumps(fields) + "\\n").encode())
    reply = reader.readline()
    print("REPLY", reply.strip(), flush=True)
    return json.loads(reply)
bad = ask(op="lease", epoch=0, wait=1)
assert bad["ok"] is False, bad
good = ask(op="lease", epoch=0, wait=False)
assert good.get("shard") is not None, good
"""


# Found writing fuzz/fuzz_sdk_protocol: the master read a lease's "wait" with nlohmann's
# value(), which throws on a number, and the exception ended the master.
def test_lease_with_a_wait_that_is_not_a_boolean_is_refused_and_the_job_goes_on(
        write_file, write_job, start_shoal):
    write_file("raw_lease.py", RAW_LEASE_WORKER)
    job = write_job("""
        name: rawlease
        dataset: {samples: 10, shard_size: 5}
        roles:
          worker:
            command: ["/usr/bin/python3", "raw_lease.py"]
        """)
    client = start_shoal("run", job)
    rc = client.wait(60)
    out = client.stdout()
    assert rc == 0, f"rc={rc}\n{out[-3000:]}\n{client.stderr()[-3000:]}"
    assert "lease's wait must be true or false, got 1" in out, out
