"""Chaos: the PyTorch example (examples/pytorch-ddp) under `elastic` and `restart-group`, with a
random live worker SIGKILLed at a random step five times per run (fixed seed). The job must
still succeed, reach the accuracy of a failure-free run of the same configuration (within 2
points), and account for every kill: a `failed` task_state with signal 9 for the victim in
events.jsonl, a group restart caused by it, and the restart count in `shoal status --json`.

The job files are the example's own elastic.yaml / restart-group.yaml with only timings
changed for a test: a short backoff, frequent heartbeats (so that `step` in the status is
fresh) and --step-delay (so that a run lasts long enough to be killed five times).
"""

import random
import re
import time

import pytest
import yaml

import shoal_e2e as e2e

SEED = 20261202
KILLS = 5


def example_job(write_job, example_file, name, backoff, step_delay, epochs):
    """The example's job file with test timings, its paths made absolute."""
    spec = yaml.safe_load((e2e.EXAMPLE_DIR / example_file).read_text())
    spec["name"] = name
    spec["backoff"] = backoff
    # Fresh `step` values in the status; many misses (30 s), so that a stall of this busy VM
    # is not taken for a lost agent.
    spec["heartbeat"] = {"interval": "250ms", "misses": 120}
    worker = spec["roles"]["worker"]
    # argparse takes the last --epochs: the example's own is replaced.
    worker["command"] = list(worker["command"]) + ["--step-delay", str(step_delay),
                                                   "--epochs", str(epochs)]
    worker["working_dir"] = str(e2e.EXAMPLE_DIR)
    assert "--checkpoint-every" in worker["command"], worker["command"]
    return write_job(yaml.safe_dump(spec, sort_keys=False), name=f"{name}.yaml")


def final_accuracy(stdout):
    values = [float(m.group(1)) for line in stdout.splitlines()
              if (m := re.fullmatch(r"worker:\d+ \| final_accuracy=([0-9.]+)", line))]
    # More than one when a kill landed after rank 0 printed its result but before it exited:
    # that is a failure like any other, and the re-formed group redoes the tail and prints again.
    assert values, f"expected a final_accuracy line:\n{stdout[-4000:]}"
    return values[-1]


def run_baseline(run_shoal, job):
    r = run_shoal("run", "-q", job, timeout=240)
    assert r.returncode == 0, f"failure-free run failed: rc={r.returncode}\n{r.stdout[-3000:]}\n{r.stderr}"
    return final_accuracy(r.stdout)


def group_formed(status, full_world):
    """Every task of the current world runs and has reported a step of this generation."""
    in_world = [t for t in status["tasks"] if t["in_world"]]
    return (status["state"] == "running"
            and (not full_world or len(in_world) == len(status["tasks"]))
            and all(t["state"] == "running" and t["pid"] > 0 and t["step"] > 0
                    for t in in_world))


def kill_steps(rng, total_steps, clear_end):
    """KILLS random global steps spread over the run: one in each of KILLS equal parts of
    [8, total_steps - clear_end] (the end is kept clear so that the last kill lands before the
    job finishes, even when re-forming the group took a while and the status's step, refreshed
    about once a second, lags the training)."""
    lo, hi = 8, total_steps - clear_end
    part = (hi - lo) // KILLS
    return [rng.randint(lo + i * part, lo + (i + 1) * part - 1) for i in range(KILLS)]


def run_with_kills(start_shoal, shoal_status, jobs_dir, job, name, rng, full_world, targets):
    """Runs the job and SIGKILLs a random live worker once the job has reached each of the
    global steps in `targets` (or, when it got past one while re-forming, as soon as it has
    re-formed); returns (client, job_dir, kills), each kill {task, pid, step, generation, at}."""
    client = start_shoal("run", "-q", job)
    job_dir = e2e.wait_for_job(jobs_dir, name, timeout=60)
    job_id = job_dir.name
    kills = []
    deadline = time.monotonic() + 200
    while len(kills) < KILLS:
        assert client.poll() is None, (
            f"the job ended after {len(kills)} of {KILLS} kills: rc={client.poll()}\n"
            f"{client.stderr()[-3000:]}")
        assert time.monotonic() < deadline, f"only {len(kills)} kills: {kills}"
        status = shoal_status(job_id)
        # A kill is planned only once the group formed after the previous one (for elastic,
        # once it grew back to every slot: a kill while a scale-up stops the group would be
        # taken as part of that restart, not as a failure of its own).
        if kills and status["generation"] <= kills[-1]["generation"]:
            time.sleep(0.1)
            continue
        if not group_formed(status, full_world):
            time.sleep(0.1)
            continue
        generation = status["generation"]
        target = targets[len(kills)]
        while True:
            status = shoal_status(job_id)
            if status["generation"] != generation or not group_formed(status, full_world):
                break  # something else happened (e.g. an elastic scale-up): plan again
            live = sorted((t for t in status["tasks"] if t["in_world"]), key=lambda t: t["task"])
            step = max(t["step"] for t in live)
            if step >= target:
                victim = rng.choice(live)
                at = time.time()
                if e2e.kill_task(victim["pid"], job_id):
                    kills.append({"task": victim["task"], "pid": victim["pid"], "step": step,
                                  "generation": generation, "at": at})
                break
            time.sleep(0.05)
    return client, job_dir, kills


def check_kills_accounted(job_dir, status, kills):
    events = e2e.read_events(job_dir)
    by_task = {}
    for k in kills:
        by_task.setdefault(k["task"], []).append(k)
    for task, ks in by_task.items():
        failures = [e for e in e2e.task_transitions(events, task)
                    if e["to"] == "failed" and e.get("signal") == 9]
        assert len(failures) == len(ks), (
            f"{task} was SIGKILLed {len(ks)} times ({ks}) but events.jsonl has "
            f"{len(failures)} failed transitions with signal 9: {failures}")
        for k, f in zip(ks, failures):
            # the failure was journaled after (not before) the kill; 1 s for clock rounding
            assert e2e.event_seconds(f) >= k["at"] - 1, (k, f)
            assert "killed by signal 9" in f.get("reason", ""), f
        # Each kill caused a group restart (elastic: re-formed without the slot) of its own.
        caused = [e for e in e2e.events_of(events, "group_restart_begun")
                  if e["reason"].startswith(f"{task} was killed by signal 9")]
        assert len(caused) == len(ks), (
            f"{len(ks)} kills of {task} but {len(caused)} group restarts name it as the cause: "
            f"{e2e.events_of(events, 'group_restart_begun')}")
    # `shoal status --json` counts them, and nothing else as a failure (a survivor that
    # crashed on its lost peer before it was stopped is part of the same restart).
    assert status["group_restarts"] == len(kills), status
    assert status["generation"] >= len(kills), status
    tasks = {t["task"]: t for t in status["tasks"]}
    for task, ks in by_task.items():
        assert tasks[task]["restarts"] >= len(ks), (task, tasks[task])
    return events


# elastic: a killed slot stays out for its backoff (1 s, then 2 s), longer than the survivors
# take to re-form, so the world really shrinks; restart-group: short waits between restarts.
# total_steps: `epochs` epochs of the digits training set (1437 samples) in global batches of 32
# per worker of the first world: 15 steps an epoch with 3 workers, 23 with 2.
# clear_end: steps kept free of kills at the end. The elastic case waits for the group to grow
# back to every slot (after the slot's backoff, then the next checkpoint, up to 20 steps) before
# its next kill, while the survivors keep training: with 10 epochs (150 steps) five such cycles
# did not always fit, under ASan and once in the plain build on a loaded machine ("the job ended
# after 4 of 5 kills"), so it trains 20 epochs (300 steps).
@pytest.mark.parametrize(
    "example_file,full_world,backoff,step_delay,epochs,total_steps,clear_end", [
        ("elastic.yaml", True, {"initial": "1s", "max": "2s"}, 0.06, 20, 300, 80),
        ("restart-group.yaml", False, {"initial": "200ms", "max": "1s"}, 0.04, 10, 230, 60),
    ], ids=["elastic", "restart_group"])
def test_chaos_kills_do_not_change_the_outcome(example_file, full_world, backoff, step_delay,
                                               epochs, total_steps, clear_end, write_job,
                                               run_shoal,
                                               start_shoal,
                                               shoal_status, jobs_dir):
    rng = random.Random(f"{SEED}-{example_file}")
    stem = example_file.split(".")[0]
    baseline_job = example_job(write_job, example_file, f"calm-{stem}", backoff, step_delay,
                               epochs)
    baseline = run_baseline(run_shoal, baseline_job)

    job = example_job(write_job, example_file, f"chaos-{stem}", backoff, step_delay, epochs)
    targets = kill_steps(rng, total_steps, clear_end)
    client, job_dir, kills = run_with_kills(start_shoal, shoal_status, jobs_dir, job,
                                            f"chaos-{stem}", rng, full_world, targets)
    rc = client.wait(240)
    assert rc == 0, f"rc={rc} after kills {kills}\n{client.stderr()[-4000:]}"
    accuracy = final_accuracy(client.stdout())
    assert abs(accuracy - baseline) <= 0.02, (
        f"accuracy {accuracy} after {len(kills)} kills, {baseline} without: {kills}")

    status = shoal_status(job_dir.name)
    assert status["state"] == "succeeded", status
    events = check_kills_accounted(job_dir, status, kills)

    # Every generation after a kill resumed from a checkpoint, not from scratch, once the
    # first checkpoint existed.
    resumed = e2e.events_of(events, "resumed")
    checkpoints = e2e.events_of(events, "checkpoint")
    assert checkpoints, "no checkpoint was reported"
    first_ckpt = e2e.event_seconds(checkpoints[0])
    later = [e for e in resumed if e2e.event_seconds(e) > first_ckpt]
    assert later and all(e["step"] > 0 for e in later), later
    sizes = [e["world_size"] for e in e2e.events_of(events, "rendezvous")]
    if stem == "elastic":
        # The survivors went on as a world of 2 and the job grew back to 3; generations are
        # the kills' re-formations plus the scale-ups. Growing back waits for the slot's backoff
        # (up to 2 s here) and then the next checkpoint, so after a last kill close to the end
        # the job may rightly finish as 2: every earlier kill must have been grown back from.
        assert sizes[0] == 3 and 2 in sizes, sizes
        regrown = sum(1 for a, b in zip(sizes, sizes[1:]) if (a, b) == (2, 3))
        assert regrown >= KILLS - 1, sizes
        assert status["generation"] == len(sizes) - 1, (status, sizes)
    else:
        # The same world every time, one generation per kill.
        assert set(sizes) == {2}, sizes
        assert status["generation"] == len(kills), status
    e2e.wait_until(lambda: not e2e.job_processes(job_dir.name, job_dir), 10,
                   "every process of the job to exit")
