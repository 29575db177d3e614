#!/usr/bin/env python3
"""Launch overhead: the wall time `shoal run` takes to start and reap N trivial tasks,
next to the same N processes started from a bash loop and by `mpirun -np N`.

For each N (default 1, 8, 32), each repetition runs, in a rotating order:
  shoal   `shoal run --jobs-dir DIR job.yaml`, a generated job with one role `task` of
          N instances running ["/bin/true"] (framework none, cpus 0.01 so that 32
          tasks fit on 2 cores), until shoal exits 0; a fresh jobs dir per run
  shell   bash -c 'for i in $(seq N); do /bin/true & done; wait'
  mpirun  mpirun --allow-run-as-root --oversubscribe --mca odls_base_num_threads 0
          -np N /bin/true (the MCA setting works around an Open MPI 4.1.4 race that
          leaves mpirun hanging after N=32 fast-exiting tasks about half of the time;
          --mpirun-plain drops it)
One untimed warmup run of each comes first. A run that fails or times out is not
timed; a mode that fails twice for an N is dropped for that N and reported as an error. Prints one JSON object on stdout: per N,
median and p90 ms of each, shoal/shell ratio and shoal-shell difference (medians),
"shoal_phases_median_ms": where shoal's runs spent their time, from each job's events journal
(start to job_submitted, then to the agent's registration, the first task running, all tasks
running, the outcome, job_finished, and the client's exit), and "target_met": the shoal-shell
difference at N=32 is <= 50 ms.
"""

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as c  # noqa: E402

TARGET_N = 32
TARGET_DIFF_MS = 50.0


def job_yaml(n):
    return (f"name: launch-n{n}\n"
            "framework: none\n"
            "roles:\n"
            "  task:\n"
            f"    instances: {n}\n"
            '    command: ["/bin/true"]\n'
            "    resources: {cpus: 0.01}\n")


def parse_ns(text):
    try:
        ns = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--n wants a list like 1,8,32, got {text!r}")
    if not ns or any(n < 1 for n in ns):
        raise argparse.ArgumentTypeError("--n values must be >= 1")
    return ns


# The steps of one `shoal run`, from the job's events journal (microsecond wall clock): each
# phase ends at the first event that matches, and the run's own start and end bracket them.
PHASES = (
    ("start_to_submitted", lambda e: e["type"] == "job_submitted"),
    ("to_agent_registered", lambda e: e["type"] == "agent_registered"),
    ("to_first_task_running", lambda e: e["type"] == "task_state" and e.get("to") == "running"),
    ("to_all_tasks_running", lambda e: e["type"] == "job_state" and e.get("to") == "running"),
    ("to_outcome_decided", lambda e: e["type"] == "outcome_decided"),
    ("to_job_finished", lambda e: e["type"] == "job_finished"),
)


def run_phases(events, start_us, end_us):
    """Milliseconds spent in each phase of one run ({} when an event is missing), ending with
    `to_client_exit` (from job_finished to the client's exit as seen here)."""
    phases, previous = {}, start_us
    for name, matches in PHASES:
        ts = next((e.get("ts_us") for e in events if matches(e)), None)
        if ts is None:
            return {}
        phases[name] = round((ts - previous) / 1000.0, 3)
        previous = ts
    phases["to_client_exit"] = round((end_us - previous) / 1000.0, 3)
    return phases


def read_events(jobs_dir):
    """The records of the one job's events journal under `jobs_dir` ([] when absent)."""
    journals = list(Path(jobs_dir).glob("*/events.jsonl"))
    if len(journals) != 1:
        return []
    events = []
    for line in journals[0].read_text().splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            pass  # a torn last line
    return events


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    c.add_shoal_arg(ap)
    ap.add_argument("--n", type=parse_ns, default=[1, 8, 32],
                    help="comma-separated task counts (default 1,8,32)")
    ap.add_argument("--reps", type=int, default=10, help="timed runs per mode and N (10)")
    ap.add_argument("--quiet", action="store_true", help="pass --quiet to shoal run")
    ap.add_argument("--timeout", type=float, default=30, help="per-run limit, s (30)")
    ap.add_argument("--mpirun-plain", action="store_true",
                    help="run mpirun without --mca odls_base_num_threads 0")
    ap.add_argument("--no-mpirun", action="store_true",
                    help="skip the mpirun anchor (bench/ab.py: ~2.5 s a run, no Shoal in it)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary jobs dir")
    args = ap.parse_args()
    if args.reps < 1:
        ap.error("--reps must be >= 1")

    shoal, shoal_err = c.find_shoal(args.shoal)
    mpirun = None if args.no_mpirun else shutil.which("mpirun")
    result = {
        "benchmark": "launch_overhead",
        "reps": args.reps,
        "ns": args.n,
        "shoal": shoal,
        "mpirun": mpirun,
        "mpirun_args": None if not mpirun else (
            "--allow-run-as-root --oversubscribe"
            + ("" if args.mpirun_plain else " --mca odls_base_num_threads 0")),
        "machine": c.machine_info(),
        "target": f"shoal - shell <= {TARGET_DIFF_MS:g} ms (medians) at N={TARGET_N}",
        "results": {},
        "target_met": None,
    }
    if shoal_err:
        result["shoal_error"] = shoal_err
        c.log(f"launch_overhead: {shoal_err}; measuring the anchors only")
    if args.no_mpirun:
        result["mpirun_error"] = "skipped (--no-mpirun)"
    elif not mpirun:
        result["mpirun_error"] = "mpirun not found on PATH"
        c.log("launch_overhead: mpirun not found; skipping that anchor")

    with c.temp_dir("shoal-bench-launch-", keep=args.keep) as tmp:
        for n in args.n:
            job = tmp / f"launch-n{n}.yaml"
            job.write_text(job_yaml(n))
            run_counter = [0]

            last_jobs_dir = [None]

            def shoal_argv():
                run_counter[0] += 1
                jobs_dir = tmp / f"jobs-n{n}-{run_counter[0]}"
                jobs_dir.mkdir()
                last_jobs_dir[0] = jobs_dir
                argv = [shoal, "run", "--jobs-dir", str(jobs_dir)]
                if args.quiet:
                    argv.append("--quiet")
                return argv + [str(job)]

            modes = {
                "shell": lambda: ["bash", "-c",
                                  f"for i in $(seq {n}); do /bin/true & done; wait"],
            }
            if shoal:
                modes["shoal"] = shoal_argv
            if mpirun:
                modes["mpirun"] = lambda: [mpirun, "--allow-run-as-root", "--oversubscribe"] + (
                    [] if args.mpirun_plain else ["--mca", "odls_base_num_threads", "0"]) + [
                    "-np", str(n), "/bin/true"]
            times = {m: [] for m in modes}
            failures = {m: [] for m in modes}
            errors = {}

            phases = []

            def once(mode):
                start_us = time.time_ns() // 1000
                t = c.run_timed(modes[mode](), timeout=args.timeout)
                end_us = time.time_ns() // 1000
                if mode == "shoal" and t.ok:
                    phases.append(run_phases(read_events(last_jobs_dir[0]), start_us, end_us))
                if not t.ok:
                    failures[mode].append(t.describe())
                    c.log(f"  N={n} {mode}: failed: {failures[mode][-1]}")
                    if len(failures[mode]) >= 2 or t.rc is None and t.error.startswith("cannot"):
                        errors[mode] = failures[mode][-1]
                        c.log(f"  N={n} {mode}: dropping this mode")
                        del modes[mode]
                return t

            c.log(f"launch_overhead: N={n}, warmup")
            for mode in list(modes):
                once(mode)
            phases.clear()  # only timed runs count
            for rep in range(args.reps):
                names = list(modes)
                k = rep % len(names) if names else 0
                for mode in names[k:] + names[:k]:  # rotate who goes first
                    if mode not in modes:
                        continue
                    t = once(mode)
                    if t.ok:
                        times[mode].append(t.ms)
                c.log(f"  N={n} rep {rep + 1}/{args.reps}: " + ", ".join(
                    f"{m} {times[m][-1]:.1f} ms" for m in modes if times[m]))

            entry = {}
            for mode in ("shoal", "shell", "mpirun"):
                if mode in errors:
                    entry[mode] = {"error": errors[mode]}
                elif mode in times:
                    s = c.summary_ms(times[mode])
                    entry[mode] = None if s is None else {
                        "median_ms": s["median_ms"], "p90_ms": s["p90_ms"], "n": s["n"]}
                if mode in failures and failures[mode] and entry.get(mode) is not None:
                    entry[mode]["failed_runs"] = len(failures[mode])
            med = {m: (entry.get(m) or {}).get("median_ms") for m in ("shoal", "shell", "mpirun")}
            entry["ratio_shoal_shell"] = c.ratio(med["shoal"], med["shell"])
            entry["diff_shoal_shell_ms"] = (
                None if med["shoal"] is None or med["shell"] is None
                else round(med["shoal"] - med["shell"], 3))
            entry["ratio_shoal_mpirun"] = c.ratio(med["shoal"], med["mpirun"])
            entry["ratio_mpirun_shell"] = c.ratio(med["mpirun"], med["shell"])
            timed = [p for p in phases if p]
            if timed:
                entry["shoal_phases_median_ms"] = {
                    name: round(statistics.median(p[name] for p in timed), 3) for name in timed[0]}
            result["results"][str(n)] = entry
            c.log(f"launch_overhead: N={n}: " + ", ".join(
                f"{m} median {med[m]:.1f} ms" for m in med if med[m] is not None))

    at = result["results"].get(str(TARGET_N))
    if at and at["diff_shoal_shell_ms"] is not None:
        result["diff_ms_at_32"] = at["diff_shoal_shell_ms"]
        result["target_met"] = at["diff_shoal_shell_ms"] <= TARGET_DIFF_MS
    c.emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
