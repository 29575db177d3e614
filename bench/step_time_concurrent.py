#!/usr/bin/env python3
"""Step time, paired in time: the demo under `shoal run` and started by hand at the same
moment, each in a lane of its own cores, on a machine with cores to spare.

step_time.py runs the modes one after another, so each comparison spans two moments, and on a
shared VM a run's step time drifts by more than 1 % between moments (its A/A pair says how
much). Here both launchers train at the same time, so whatever the machine does to one moment
it does to both. Each lane is a set of CPUs (`--lanes 0-3,4-7`): its first 2 are the job's
cores (what Shoal's local backend pins a 2-task, 1-CPU-each job to: the first 2 CPUs it may
use, shared by both ranks), the rest are where `shoal run`, its master and its agent may run,
as on any machine where a job leaves cores free. Hand-started ranks are bound to the first 2
CPUs of their lane, with the demo's environment (step_time.py's `hand`).

Lanes are paired in order ((0, 1), (2, 3), ...); each pair runs its own rounds, all pairs at
once. Rounds alternate between an A/B round (Shoal in one lane, by hand in the other) and an
A/A round (by hand in both), and which lane takes which side alternates every two rounds, so
a difference between the lanes' cores cancels out. The figure is train.py's median step of
each run (`median_step_ms`, every step after the first epoch), as a ratio to the run beside
it; the A/A ratios say what the method resolves. Prints one JSON object: every round, the
medians of the ratios, and their bootstrap 95 % intervals; `hand_over_hand.resolution` says
how many A/B rounds (and hours, at this run's pace) that interval would need to be +-1 % wide.
"""

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as c  # noqa: E402
import step_time as st  # noqa: E402

JOB_CORES = st.WORLD


def parse_lanes(text):
    """'0-3,4-7' -> [[0, 1, 2, 3], [4, 5, 6, 7]]; raises ValueError naming the bad part."""
    lanes = []
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"{part!r} is not a CPU range like 0-3")
        first, last = int(lo), int(hi) if sep else int(lo)
        if last < first:
            raise ValueError(f"{part!r}: the range ends before it starts")
        lanes.append(list(range(first, last + 1)))
    seen = set()
    for lane in lanes:
        if len(lane) < JOB_CORES:
            raise ValueError(f"lane {lane[0]}-{lane[-1]} has fewer than {JOB_CORES} CPUs")
        if seen & set(lane):
            raise ValueError(f"lane {lane[0]}-{lane[-1]} overlaps another lane")
        seen |= set(lane)
    if len(lanes) < 2 or len(lanes) % 2:
        raise ValueError("give an even number of lanes (at least 2): they run in pairs")
    return lanes


def run_in_lane(mode, lane, args, shoal, job, tmp, tag):
    """One run of `mode` ('shoal' or 'hand') confined to `lane`: (metric, error)."""
    if mode == "hand":
        metric, _, err = st.run_hand(args.python, args.epochs, args.timeout,
                                     cores=set(lane[:JOB_CORES]))
        return metric, err
    jobs_dir = tmp / f"jobs-{tag}"
    jobs_dir.mkdir()
    lane_set = set(lane)
    t = c.run_timed([shoal, "run", "--jobs-dir", str(jobs_dir), str(job)], timeout=args.timeout,
                    preexec_fn=lambda: os.sched_setaffinity(0, lane_set))
    if not t.ok:
        return None, t.describe()
    metric = st.find_metric(t.stdout, prefix="worker:0")
    if metric is None:
        return None, "no `worker:0 | {...}` JSON metric line on shoal's stdout"
    return metric, None


def run_pair(pair_index, lanes, args, shoal, job, tmp, deadline, rounds, errors, lock):
    r = 0
    while time.monotonic() < deadline and r < args.max_rounds:
        kind = "ab" if r % 2 == 0 else "aa"
        first, second = (lanes[0], lanes[1]) if (r // 2) % 2 == 0 else (lanes[1], lanes[0])
        modes = ("shoal", "hand") if kind == "ab" else ("hand", "hand")
        out = [None, None]

        def go(i, mode, lane):
            out[i] = run_in_lane(mode, lane, args, shoal, job, tmp, f"{pair_index}-{r}-{i}")

        threads = [threading.Thread(target=go, args=(i, modes[i], lane))
                   for i, lane in enumerate((first, second))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        (m0, e0), (m1, e1) = out
        if e0 or e1:
            with lock:
                errors.append({"pair": pair_index, "round": r, "kind": kind,
                               "error": e0 or e1})
            c.log(f"step_time_concurrent: pair {pair_index} round {r} {kind}: {e0 or e1}")
            if len(errors) >= 3:
                return
        else:
            row = {"pair": pair_index, "round": r, "kind": kind,
                   "lanes": [f"{first[0]}-{first[-1]}", f"{second[0]}-{second[-1]}"],
                   "modes": list(modes),
                   "median_step_ms": [m0.get("median_step_ms"), m1.get("median_step_ms")],
                   "mean_step_ms": [m0.get("mean_step_ms"), m1.get("mean_step_ms")],
                   "mean_step_cpu_ms": [m0.get("mean_step_cpu_ms"), m1.get("mean_step_cpu_ms")],
                   "accuracy": [m0.get("value"), m1.get("value")]}
            with lock:
                rounds.append(row)
            c.log(f"step_time_concurrent: pair {pair_index} round {r} {kind}: "
                  f"{modes[0]} {row['median_step_ms'][0]} ms, {modes[1]} "
                  f"{row['median_step_ms'][1]} ms")
        r += 1


def ratios(rounds, kind, key):
    out = []
    for row in rounds:
        if row["kind"] != kind:
            continue
        a, b = row[key]
        if a and b:
            out.append(a / b)
    return out


def summary(values):
    return {"n": len(values),
            "median": None if not values else round(c.median(values), 4),
            "ci95": st.bootstrap_ci(values)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    c.add_shoal_arg(ap)
    ap.add_argument("--lanes", default="0-3,4-7",
                    help="CPU ranges, one per lane, paired in order (0-3,4-7)")
    ap.add_argument("--epochs", type=int, default=20, help="train.py --epochs (20)")
    ap.add_argument("--python", default=c.DEFAULT_PYTHON,
                    help=f"interpreter with torch (default {c.DEFAULT_PYTHON})")
    ap.add_argument("--time-budget", type=float, default=300, metavar="SECONDS",
                    help="start no round after this many seconds (300)")
    ap.add_argument("--max-rounds", type=int, default=1000, help="rounds per lane pair (1000)")
    ap.add_argument("--timeout", type=float, default=300, help="per-run limit, s (300)")
    args = ap.parse_args()
    try:
        lanes = parse_lanes(args.lanes)
    except ValueError as e:
        ap.error(f"--lanes: {e}")
    allowed = os.sched_getaffinity(0)
    missing = sorted({cpu for lane in lanes for cpu in lane} - allowed)
    if missing:
        ap.error(f"--lanes: CPU {missing[0]} is not one this process may use "
                 f"(allowed: {sorted(allowed)})")
    if args.epochs < 2 or args.time_budget <= 0 or args.max_rounds < 1:
        ap.error("--epochs must be >= 2, --time-budget > 0 and --max-rounds >= 1")
    shoal, shoal_err = c.find_shoal(args.shoal)
    result = {"benchmark": "step_time_concurrent", "epochs": args.epochs,
              "lanes": [f"{lane[0]}-{lane[-1]}" for lane in lanes],
              "python": args.python, "shoal_binary": shoal, "machine": c.machine_info(),
              "target": "Shoal's median step within 1 % of the hand-started run beside it"}
    if shoal_err:
        result["error"] = shoal_err
        c.emit(result)
        return 0
    rounds, errors, lock = [], [], threading.Lock()
    with tempfile.TemporaryDirectory(prefix="shoal-bench-concurrent-") as tmp_name:
        tmp = Path(tmp_name)
        job = tmp / "digits-ddp-bench.yaml"
        job.write_text(st.job_yaml(args.python, args.epochs))
        started = time.monotonic()
        deadline = started + args.time_budget
        pairs = [threading.Thread(target=run_pair,
                                  args=(p, lanes[2 * p:2 * p + 2], args, shoal, job, tmp,
                                        deadline, rounds, errors, lock))
                 for p in range(len(lanes) // 2)]
        for t in pairs:
            t.start()
        for t in pairs:
            t.join()
        elapsed = time.monotonic() - started
    ab, aa = ratios(rounds, "ab", "median_step_ms"), ratios(rounds, "aa", "median_step_ms")
    result["shoal_over_hand"] = summary(ab)
    result["hand_over_hand"] = summary(aa)
    # A/A rounds alternate with A/B rounds and pairs run at once: an A/B round's share of the
    # wall time is the whole run over the A/B rounds of every pair.
    result["hand_over_hand"]["resolution"] = st.resolution(
        aa, elapsed / len(ab) if ab else None)
    result["shoal_over_hand_mean_step"] = summary(ratios(rounds, "ab", "mean_step_ms"))
    result["shoal_over_hand_cpu"] = summary(ratios(rounds, "ab", "mean_step_cpu_ms"))
    ci_ab, ci_aa = result["shoal_over_hand"]["ci95"], result["hand_over_hand"]["ci95"]
    result["machine_resolves_1_percent"] = (None if ci_aa is None
                                            else ci_aa[0] >= 0.99 and ci_aa[1] <= 1.01)
    result["within_1_percent"] = None if ci_ab is None else ci_ab[0] >= 0.99 and ci_ab[1] <= 1.01
    result["errors"] = errors
    result["rounds"] = sorted(rounds, key=lambda row: (row["pair"], row["round"]))
    c.emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
