#!/usr/bin/env python3
"""Lost work: how many training steps a failure throws away when the job checkpoints every N
steps through the SDK and runs under on_failure: restart-group.

The job: framework pytorch, 2 ranks of bench/_ddp_worker.py (DDP, gloo, CPU, synthetic data),
`checkpoint: {keep: 3}`, restart-group with backoff 0s. Every rank loads the latest checkpoint
at start with shoal.Checkpointer.load_latest() (the journal's `resumed` record), rank 0 saves
one every --ckpt-every N steps (20) with Checkpointer.save() (the journal's `checkpoint`
record), every step is reported with shoal.progress() and logged by the worker with its
wall-clock time. The worker sleeps --step-sleep (10 ms) after each step, so that a kill lands
on a chosen step.

Each fault (--faults, 20) picks a random step 1..2N past the current one, waits until rank 0
has completed it, waits a random fraction of a step more, and SIGKILLs a random rank. Then, once both ranks of the new generation
have done a step:
  last completed = the highest step either rank of the old generation logged before the kill
  resumed        = the step the new generation's ranks resumed from (their `resumed` records,
                   which must agree with what the workers loaded)
  lost           = last completed - resumed
and also whether `resumed` is the latest checkpoint the journal recorded before the new
generation started (a complete checkpoint must never be skipped).

Prints one JSON object on stdout: lost steps per failure (each, mean, max), the target
max(lost) <= N, and, for comparison, what the same failures would have lost with no checkpoint
at all (every step since the start). There is no measured anchor: with torchrun, checkpointing
is the training script's own business.
"""

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as c  # noqa: E402

DDP_WORKER = c.BENCH_DIR / "_ddp_worker.py"


class StepLog:
    """A worker's steps-g<G>-r<R>.log ("<step> <ts_us>" lines), read incrementally."""

    def __init__(self, path):
        self.path, self.pos, self.partial, self.steps = Path(path), 0, b"", []

    def poll(self):
        try:
            with open(self.path, "rb") as f:
                f.seek(self.pos)
                data = f.read()
        except FileNotFoundError:
            return
        self.pos += len(data)
        parts = (self.partial + data).split(b"\n")
        self.partial = parts.pop()
        for line in parts:
            try:
                step, ts = line.split()
                self.steps.append((int(step), int(ts)))
            except ValueError:
                pass

    def last(self):
        self.poll()
        return self.steps[-1][0] if self.steps else 0

    def last_before(self, t_us):
        self.poll()
        best = 0
        for step, ts in self.steps:
            if ts < t_us:
                best = max(best, step)
        return best


def job_yaml(args, out):
    argv = [args.python, str(DDP_WORKER), "--out", str(out), "--ckpt-every",
            str(args.ckpt_every), "--step-sleep", str(args.step_sleep)]
    return ("name: lost-work\n"
            "framework: pytorch\n"
            "on_failure: restart-group\n"
            "max_restarts: 1000\n"
            "backoff: {initial: 0s}\n"
            "checkpoint: {keep: 3}\n"
            "roles:\n"
            "  worker:\n"
            "    instances: 2\n"
            f"    command: {json.dumps(argv)}\n"
            f"    env: {{OMP_NUM_THREADS: \"1\", PYTHONPATH: {json.dumps(str(c.SDK_PYTHON))}}}\n"
            "    resources: {cpus: 0.5}\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    c.add_shoal_arg(ap)
    ap.add_argument("--faults", type=int, default=20, help="faults (20)")
    ap.add_argument("--ckpt-every", type=int, default=20, help="N: steps between checkpoints (20)")
    ap.add_argument("--step-sleep", type=float, default=0.01,
                    help="seconds the worker sleeps after each step (0.01)")
    ap.add_argument("--python", default=c.DEFAULT_PYTHON,
                    help=f"interpreter with torch (default {c.DEFAULT_PYTHON})")
    ap.add_argument("--timeout", type=float, default=120, help="per-fault limit, s (120)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = ap.parse_args()
    if args.ckpt_every < 1:
        ap.error("--ckpt-every must be >= 1")
    rng = random.Random(args.seed)
    n = args.ckpt_every
    shoal, shoal_err = c.find_shoal(args.shoal)
    result = {"benchmark": "lost_work", "shoal": shoal, "machine": c.machine_info(),
              "seed": args.seed, "ckpt_every": n, "step_sleep_s": args.step_sleep,
              "faults_requested": args.faults, "worker": str(DDP_WORKER),
              "policy": "restart-group, backoff 0s, checkpoint {keep: 3}"}
    if shoal_err:
        result["shoal_error"] = shoal_err
        c.emit(result)
        return 0
    failures, errors = [], []
    t_all = time.monotonic()
    with c.temp_dir("shoal-bench-lost-", keep=args.keep) as tmp:
        out = tmp / "out"
        out.mkdir()
        job_file = tmp / "lost-work.yaml"
        job_file.write_text(job_yaml(args, out))
        job = c.ShoalJob(shoal, tmp / "jobs", job_file)
        try:
            err = job.start()
            if err:
                errors.append(err)
            elif c.wait_generation(out, 0, 2, args.timeout) is None:
                errors.append("the ranks did not reach a first step")
            gen = 0
            for i in range(args.faults if not errors else 0):
                cur = c.read_generation(out, gen)
                logs = {r: StepLog(out / f"steps-g{gen}-r{r}.log") for r in (0, 1)}
                target = logs[0].last() + rng.randint(1, 2 * n)
                deadline = time.monotonic() + args.timeout
                while logs[0].last() < target and time.monotonic() < deadline:
                    time.sleep(0.001)
                if logs[0].last() < target:
                    errors.append(f"fault {i}: rank 0 never reached step {target}")
                    break
                time.sleep(rng.uniform(0, args.step_sleep + 0.003))  # anywhere in a step
                rank = rng.randrange(2)
                job.journal.poll()
                mark = len(job.journal.records)
                t0 = c.now_us()
                c.kill_quietly(cur[rank]["pid"])
                new = c.wait_generation(out, gen + 1, 2, args.timeout)
                if new is None:
                    errors.append(f"fault {i}: generation {gen + 1} never reached a step")
                    break
                time.sleep(0.05)  # the old generation's last log lines are on disk
                last_done = max(logs[r].last_before(t0) for r in (0, 1))
                job.journal.poll()
                recs = job.journal.records
                # The new generation begins at its group_restarted record after the kill.
                g_idx = next((k for k in range(mark, len(recs))
                              if recs[k].get("type") == "group_restarted"), len(recs))
                ckpts = [r["step"] for r in job.journal.records[:g_idx]
                         if r.get("type") == "checkpoint"]
                latest_ckpt = max(ckpts) if ckpts else 0
                resumed_recs = [r for r in job.journal.records[g_idx:]
                                if r.get("type") == "resumed"]
                resumed_by_worker = sorted({w["resumed_step"] for w in new.values()})
                resumed_journal = sorted({r["step"] for r in resumed_recs})
                resumed = resumed_by_worker[0]
                f = {"fault": i, "killed_rank": rank, "target_step": target,
                     "last_completed": last_done, "resumed": resumed,
                     "lost": last_done - resumed,
                     "latest_checkpoint_recorded": latest_ckpt,
                     "recovery_ms": round(
                         (max(w["t_first_step"] for w in new.values()) * 1e6 - t0) / 1000, 1)}
                problems = []
                if len(resumed_by_worker) != 1:
                    problems.append(f"ranks resumed from different steps {resumed_by_worker}")
                if resumed_journal != resumed_by_worker:
                    problems.append(f"journal resumed {resumed_journal} != workers "
                                    f"{resumed_by_worker}")
                if resumed < latest_ckpt:
                    problems.append(f"resumed from {resumed}, older than the latest checkpoint "
                                    f"recorded ({latest_ckpt})")
                if problems:
                    f["problems"] = problems
                failures.append(f)
                c.log(f"  fault {i + 1}/{args.faults}: killed rank {rank} after step "
                      f"{last_done}, resumed from {resumed}: lost {f['lost']} steps")
                gen += 1
        finally:
            result["leftover_after_stop"] = job.stop()
    lost = [f["lost"] for f in failures]
    result["faults"] = len(failures)
    result["lost_steps"] = None if not lost else {
        "mean": round(sum(lost) / len(lost), 2), "max": max(lost), "min": min(lost),
        "each": lost}
    since_start = [f["last_completed"] for f in failures]
    result["without_checkpoints_lost_steps"] = None if not since_start else {
        "mean": round(sum(since_start) / len(since_start), 2), "max": max(since_start),
        "note": "what the same failures would lose restarting from step 0 (no checkpoint)"}
    result["recovery"] = c.summary_ms([f["recovery_ms"] for f in failures])
    result["failures"] = failures
    result["checkpoint_problems"] = sum(1 for f in failures if "problems" in f)
    if errors:
        result["errors"] = errors
    result["target"] = f"max lost steps <= N = {n}"
    result["target_met"] = None if not lost else max(lost) <= n
    result["seconds"] = round(time.monotonic() - t_all, 1)
    c.emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
