#!/usr/bin/env python3
"""Step time: the demo's mean optimizer step under `shoal run` versus the same two
processes started by hand with the same environment.

The demo is examples/pytorch-ddp/train.py (2-rank DDP, gloo, CPU). Modes:
  shoal  `shoal run --jobs-dir DIR job.yaml` for a generated job: framework pytorch,
         role `worker` with 2 instances running [PYTHON, /abs/path/train.py,
         --epochs E], cpus 1 and 2GiB each as in the demo, OMP_NUM_THREADS=1; rank 0's
         JSON line is read from shoal's stdout, where job output is prefixed `worker:0 | `
  hand   the same two commands started directly with MASTER_ADDR=127.0.0.1, a free
         MASTER_PORT, RANK, WORLD_SIZE=2, LOCAL_RANK, LOCAL_WORLD_SIZE=2 and
         OMP_NUM_THREADS=1, both bound to the cores Shoal gives the job (the first 2 CPUs
         the driver may use, shared by both ranks; on a 2-core machine that is every core,
         so nothing changes; --hand-unbound leaves them wherever the kernel puts them);
         rank 0's JSON line is read from its stdout
  pinned `hand` with rank i bound to CPU i alone: what pinning by itself changes (Shoal
         pins a job's whole-CPU tasks to the job's cores, shared among them, which on a
         2-core machine is both cores, so this is not what Shoal does)
  hand_again  `hand` once more: the A/A pair that says what this machine can resolve
         (hand_again/hand should be 1; its interval is the noise any comparison carries)
  shoal_baseline  with --shoal-baseline PATH: `shoal` with another build, for an A/B of two
         builds in the same rounds
With --time-budget S, no round after the first starts after S seconds, so a run with a hard
limit still prints its JSON (with the rounds it finished) instead of nothing.
With --background-load N, N busy loops (each in a session of its own, as another user's
work would be) run for the whole benchmark: the machine is shared, which is when the way
the ranks are scheduled (autogroup sessions, pinning) shows in the step time.
Each round runs every mode once, in an order shuffled afresh per round (seeded). The
figure compared is train.py's mean_step_ms (perf_counter around forward + backward
with allreduce + optimizer step, averaged over every step after the first epoch).
Prints one JSON object on stdout: each mode's runs and median, the ratio shoal/hand of
the medians, and "within_1_percent" (|ratio - 1| <= 0.01). From the A/A pair it also says
what the machine resolves: the bootstrap interval of the A/A ratio
("machine_resolves_1_percent") and "aa_resolution", the spread of one round's ratio and the
rounds (and hours, at the run's pace) the interval would need to be +-1 % wide.
"""

import argparse
import json
import math
import os
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as c  # noqa: E402

TRAIN = c.DEMO_DIR / "train.py"
WORLD = 2
Z95 = 1.96
# A median's standard error over a mean's for normal data, sqrt(pi / 2): the figure compared
# is a median of per-round ratios, which needs this many times more rounds than a mean would.
MEDIAN_EFFICIENCY = 1.2533


def job_yaml(python, epochs, with_env=True):
    argv = json.dumps([python, str(TRAIN), "--epochs", str(epochs)])
    text = ("name: digits-ddp-bench\n"
            "framework: pytorch\n"
            "roles:\n"
            "  worker:\n"
            f"    instances: {WORLD}\n"
            f"    command: {argv}\n"
            "    resources: {cpus: 1, memory: 2GiB}\n")
    if with_env:
        text += '    env: {OMP_NUM_THREADS: "1"}\n'
    return text


def find_metric(stdout, prefix=None):
    """The JSON object with "metric" in train.py's output. With prefix (e.g. "worker:0"),
    only lines `PREFIX | {...}` count; otherwise bare lines."""
    found = None
    for line in stdout.splitlines():
        if prefix is not None:
            head, sep, rest = line.partition(" | ")
            if not sep or head.strip() != prefix:
                continue
            line = rest
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict) and "metric" in obj:
            found = obj
    return found


def job_cores():
    """The CPUs Shoal's local backend pins this benchmark's job to: the first WORLD of those
    the driver may use, shared by the job's tasks (it pins only when every whole-core task
    has a core of its own). None when there are fewer."""
    cpus = sorted(os.sched_getaffinity(0))
    return set(cpus[:WORLD]) if len(cpus) >= WORLD else None


def run_hand(python, epochs, timeout, pin=False, cores=None):
    """Both ranks started directly; returns (metric dict or None, wall ms, error). With pin,
    rank i is bound to CPU i alone; otherwise with cores, both are bound to that set."""
    import subprocess
    import time
    port = c.free_port()
    procs = []
    t0 = time.perf_counter()
    for rank in range(WORLD):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE=str(WORLD), OMP_NUM_THREADS="1")
        cpus = sorted(os.sched_getaffinity(0))
        if pin:
            preexec = (lambda cpu=cpus[rank % len(cpus)]: os.sched_setaffinity(0, {cpu}))
        elif cores:
            preexec = (lambda: os.sched_setaffinity(0, cores))
        else:
            preexec = None
        procs.append(subprocess.Popen(
            [python, str(TRAIN), "--epochs", str(epochs)], cwd=str(c.DEMO_DIR), env=env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True, preexec_fn=preexec))
    outs, error = [], None
    try:
        for p in procs:
            remaining = max(1.0, timeout - (time.perf_counter() - t0))
            outs.append(p.communicate(timeout=remaining)[0])
    except subprocess.TimeoutExpired:
        error = f"timed out after {timeout:g} s"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    ms = (time.perf_counter() - t0) * 1000.0
    if error:
        return None, None, error
    bad = [(r, p.returncode) for r, p in enumerate(procs) if p.returncode != 0]
    if bad:
        tail = " / ".join(outs[bad[0][0]].strip().splitlines()[-3:])
        return None, ms, f"rank {bad[0][0]} exited {bad[0][1]}: {tail}"
    metric = find_metric(outs[0])
    if metric is None:
        return None, ms, "no JSON metric line in rank 0's output"
    return metric, ms, None


def run_shoal(shoal, jobs_root, job, counter, timeout):
    jobs_dir = jobs_root / f"jobs-{counter}"
    jobs_dir.mkdir()
    t = c.run_timed([shoal, "run", "--jobs-dir", str(jobs_dir), str(job)], timeout=timeout)
    if not t.ok:
        return None, t.ms, t.describe(), t.rc
    metric = find_metric(t.stdout, prefix="worker:0")
    if metric is None:
        return None, t.ms, "no `worker:0 | {...}` JSON metric line on shoal's stdout", 0
    return metric, t.ms, None, 0


def paired_ratios(a_runs, b_runs, key):
    """a/b of `key` for runs of the same round (rep), where both modes have one."""
    b_by_rep = {r["rep"]: r[key] for r in b_runs if r.get(key)}
    return [r[key] / b_by_rep[r["rep"]] for r in a_runs
            if r.get(key) and r["rep"] in b_by_rep]


def bootstrap_ci(values, rounds=2000):
    """95% interval of the median of `values` by resampling them (seeded: reproducible)."""
    import random
    if len(values) < 3:
        return None
    rng = random.Random(7)
    medians = sorted(c.median([rng.choice(values) for _ in values]) for _ in range(rounds))
    return [round(medians[int(0.025 * rounds)], 4), round(medians[int(0.975 * rounds) - 1], 4)]


def resolution(aa_ratios, seconds_per_round=None):
    """What an A/A pair's per-round ratios say this machine can resolve: the spread of one
    round's log ratio (1.4826 x its median absolute deviation, so that the odd stalled run does
    not decide it) and how many rounds the 95 % interval of the median ratio needs to be no
    wider than +-1 %: the least with which a 1 % target could be shown met, and only if the
    true ratio were exactly 1. With the measured seconds per round, also how long that takes.
    None with fewer than 3 ratios."""
    logs = [math.log(r) for r in aa_ratios if r and r > 0]
    if len(logs) < 3:
        return None
    centre = c.median(logs)
    spread = 1.4826 * c.median([abs(x - centre) for x in logs])
    needed = max(3, math.ceil((Z95 * MEDIAN_EFFICIENCY * spread / 0.01) ** 2))
    out = {"aa_rounds": len(logs), "spread_per_round": round(spread, 4),
           "rounds_for_interval_within_1_percent": needed}
    if seconds_per_round:
        out["hours_for_interval_within_1_percent"] = round(needed * seconds_per_round / 3600, 2)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    c.add_shoal_arg(ap)
    ap.add_argument("--reps", type=int, default=3, help="runs per mode (3)")
    ap.add_argument("--epochs", type=int, default=30, help="train.py --epochs (30)")
    ap.add_argument("--python", default=c.DEFAULT_PYTHON,
                    help=f"interpreter with torch (default {c.DEFAULT_PYTHON})")
    ap.add_argument("--timeout", type=float, default=300, help="per-run limit, s (300)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary jobs dir")
    ap.add_argument("--shoal-baseline", metavar="PATH",
                    help="another shoal binary, run as mode shoal_baseline in the same rounds")
    ap.add_argument("--modes", default="hand,shoal,pinned,hand_again",
                    help="the modes to run, comma-separated; hand is always run (all four; "
                         "fewer modes fit more rounds into the same time)")
    ap.add_argument("--hand-unbound", action="store_true",
                    help="leave the hand-started ranks on every CPU the driver may use instead "
                         "of binding them to the cores Shoal gives the job")
    ap.add_argument("--time-budget", type=float, default=0, metavar="SECONDS",
                    help="start no round after the first once this many seconds have passed (0: "
                         "no limit); the JSON then holds the rounds that finished")
    ap.add_argument("--background-load", type=int, default=0, metavar="N",
                    help="N busy loops, each in a session of its own, for the whole run (0)")
    args = ap.parse_args()
    if args.reps < 1 or args.epochs < 2:
        ap.error("--reps must be >= 1 and --epochs >= 2 (the first epoch is warmup)")
    if args.background_load < 0:
        ap.error("--background-load must be >= 0")
    if args.time_budget < 0:
        ap.error("--time-budget must be >= 0")
    args.hand_cores = None if args.hand_unbound else job_cores()
    known = ("hand", "shoal", "pinned", "hand_again")
    chosen = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in chosen if m not in known]
    if unknown:
        ap.error(f"--modes: unknown mode {unknown[0]!r} (known: {', '.join(known)})")
    baseline = None
    if args.shoal_baseline:
        baseline = os.path.abspath(args.shoal_baseline)
        if not (os.path.isfile(baseline) and os.access(baseline, os.X_OK)):
            ap.error(f"--shoal-baseline: {args.shoal_baseline} is not an executable file")

    shoal, shoal_err = c.find_shoal(args.shoal)
    result = {
        "benchmark": "step_time",
        "reps": args.reps,
        "epochs": args.epochs,
        "world_size": WORLD,
        "train_py": str(TRAIN),
        "python": args.python,
        "shoal_binary": shoal,
        "machine": c.machine_info(),
        "target": "shoal's median mean_step_ms within 1% of the hand-started median",
        "shoal_baseline_binary": baseline,
        "background_load": args.background_load,
        "hand_cpus": None if args.hand_cores is None else sorted(args.hand_cores),
        "driver_cpus": sorted(os.sched_getaffinity(0)),
        "time_budget_s": args.time_budget or None,
    }
    if shoal_err:
        result["shoal_error"] = shoal_err
        c.log(f"step_time: {shoal_err}; measuring the hand-started anchor only")

    modes = [m for m in known if m == "hand" or m in chosen] + (["shoal_baseline"] if baseline
                                                                 else [])
    reported = list(known) + (["shoal_baseline"] if baseline else [])
    runs = {m: [] for m in reported}
    errors = {m: "not run (--modes)" for m in reported if m not in modes}
    result["modes"] = modes
    import subprocess
    hogs = [subprocess.Popen(["sh", "-c", "while :; do :; done"], stdin=subprocess.DEVNULL,
                             start_new_session=True) for _ in range(args.background_load)]
    try:
        measure(args, shoal, baseline, modes, runs, errors, result)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    summarize(reported, runs, errors, result, baseline)
    c.emit(result)
    return 0


def measure(args, shoal, baseline, modes, runs, errors, result):
    import time
    order_rng = random.Random(11)
    started = time.monotonic()
    result["rounds_done"] = 0
    with c.temp_dir("shoal-bench-step-", keep=args.keep) as tmp:
        job = tmp / "digits-ddp-bench.yaml"
        job.write_text(job_yaml(args.python, args.epochs))
        with_env = True
        counter = 0
        for rep in range(args.reps):
            if rep and args.time_budget and time.monotonic() - started > args.time_budget:
                c.log(f"step_time: --time-budget {args.time_budget:g} s spent after "
                      f"{rep} round(s); stopping")
                break
            # A fresh order every round (seeded): a rotation of one fixed sequence always put
            # the same mode after the same other, so whatever a run leaves behind for the next
            # one (and drifts within a round) landed on one mode only.
            order = order_rng.sample(modes, len(modes))
            for mode in order:
                if mode in errors or (mode == "shoal" and not shoal):
                    continue
                if mode in ("hand", "pinned", "hand_again"):
                    metric, ms, err = run_hand(args.python, args.epochs, args.timeout,
                                               pin=(mode == "pinned"), cores=args.hand_cores)
                else:
                    counter += 1
                    binary = baseline if mode == "shoal_baseline" else shoal
                    metric, ms, err, rc = run_shoal(binary, tmp, job, counter, args.timeout)
                    if err and rc == 2 and with_env:
                        # Exit 2 is "bad spec": retry once without the role's env key
                        # (train.py defaults to 1 thread anyway) before giving up.
                        c.log(f"step_time: shoal rejected the job ({err}); retrying "
                              "without `env:`")
                        with_env = False
                        result["note"] = "job file without env: (shoal exited 2 with it)"
                        job.write_text(job_yaml(args.python, args.epochs, with_env=False))
                        counter += 1
                        metric, ms, err, rc = run_shoal(shoal, tmp, job, counter,
                                                        args.timeout)
                if err:
                    errors[mode] = err
                    c.log(f"step_time: {mode} run failed: {err}; dropping {mode}")
                    continue
                runs[mode].append({
                    "rep": rep,
                    "mean_step_ms": metric.get("mean_step_ms"),
                    "median_step_ms": metric.get("median_step_ms"),
                    "mean_step_cpu_ms": metric.get("mean_step_cpu_ms"),
                    "steps": metric.get("steps"),
                    "accuracy": metric.get("value"),
                    "world_size": metric.get("world_size"),
                    "wall_ms": None if ms is None else round(ms, 1),
                })
                c.log(f"step_time: rep {rep + 1}/{args.reps} {mode}: mean_step_ms "
                      f"{metric.get('mean_step_ms')} (cpu {metric.get('mean_step_cpu_ms')}), "
                      f"accuracy {metric.get('value')}, "
                      f"wall {ms / 1000.0:.2f} s")
            result["rounds_done"] = rep + 1
            result["seconds_per_round"] = round((time.monotonic() - started) / (rep + 1), 2)


def summarize(modes, runs, errors, result, baseline):
    for mode in modes:
        steps = [r["mean_step_ms"] for r in runs[mode] if r["mean_step_ms"] is not None]
        medians = [r["median_step_ms"] for r in runs[mode] if r.get("median_step_ms") is not None]
        walls = [r["wall_ms"] for r in runs[mode] if r["wall_ms"] is not None]
        cpus = [r["mean_step_cpu_ms"] for r in runs[mode] if r.get("mean_step_cpu_ms") is not None]
        result[mode] = {
            "median_step_ms": None if not steps else round(c.median(steps), 4),
            "median_of_step_medians_ms": None if not medians else round(c.median(medians), 4),
            "median_step_cpu_ms": None if not cpus else round(c.median(cpus), 4),
            "min_step_ms": None if not steps else round(min(steps), 4),
            "median_wall_ms": None if not walls else round(c.median(walls), 1),
            "runs": runs[mode],
        }
        if mode in errors:
            result[mode]["error"] = errors[mode]
    r = c.ratio(result["shoal"]["median_step_ms"], result["hand"]["median_step_ms"])
    result["ratio_shoal_hand"] = r
    # The fastest run of each mode is the least disturbed by other load on the machine.
    result["min_ratio_shoal_hand"] = c.ratio(result["shoal"]["min_step_ms"],
                                             result["hand"]["min_step_ms"])
    result["wall_ratio_shoal_hand"] = c.ratio(result["shoal"]["median_wall_ms"],
                                              result["hand"]["median_wall_ms"])
    # CPU time per step (all of rank 0's threads): what the step costs the process itself, far
    # less disturbed than wall time by other load on a shared machine.
    result["cpu_ratio_shoal_hand"] = c.ratio(result["shoal"]["median_step_cpu_ms"],
                                             result["hand"]["median_step_cpu_ms"])
    result["within_1_percent"] = None if r is None else abs(r - 1.0) <= 0.01
    # The robust figure: each run's median step (interruptions by other load fall in the
    # tail, not the median), paired with the other mode's run of the same round, and a
    # bootstrap 95% interval of the median paired ratio.
    for other in ("hand", "pinned") + (("shoal_baseline",) if baseline else ()):
        paired = paired_ratios(runs["shoal"], runs[other], "median_step_ms")
        key = f"shoal_{other}"
        result[f"step_median_ratio_{key}"] = None if not paired else round(c.median(paired), 4)
        result[f"step_median_ratio_{key}_ci95"] = bootstrap_ci(paired)
    # The A/A pair: the same hand-started command twice per round. Its interval is how finely
    # this machine separates two step times at all; a 1 % target can only be judged when it
    # lies within [0.99, 1.01].
    paired = paired_ratios(runs["hand_again"], runs["hand"], "median_step_ms")
    result["step_median_ratio_hand_again_hand"] = (None if not paired
                                                   else round(c.median(paired), 4))
    aa = bootstrap_ci(paired)
    result["step_median_ratio_hand_again_hand_ci95"] = aa
    result["machine_resolves_1_percent"] = (None if aa is None
                                            else aa[0] >= 0.99 and aa[1] <= 1.01)
    # How far from resolving it: the rounds (and hours, at this run's pace) the interval needs.
    result["aa_resolution"] = resolution(paired, result.get("seconds_per_round"))
    lo_hi = result["step_median_ratio_shoal_pinned_ci95"]
    # Against ranks each pinned to a core of their own: Shoal's step no more than 1 % slower.
    # (Shoal shares the job's cores among its tasks instead; on 2 cores that pins nothing.)
    result["step_within_1_percent_of_pinned"] = None if lo_hi is None else lo_hi[1] <= 1.01


if __name__ == "__main__":
    sys.exit(main())
