#!/usr/bin/env python3
"""Log forwarding: what a chatty job's output costs Shoal's own processes.

A job of --tasks tasks, each printing --rate flushed lines a second for --seconds, runs under
`shoal run` in two modes, alternating which goes first every round:
  batched   the agent's default: output held up to SHOAL_AGENT_LOG_FLUSH_MS (250 ms) and sent
            as one chunk per task stream
  per_read  SHOAL_AGENT_LOG_FLUSH_MS=0: every read of a task's pipe is one message to the
            master and on to the client (how Shoal forwarded output before batching)
In a steady window (from 1 s after the first line to 1.5 s before the tasks stop) it reads
the CPU time (/proc/PID/task/*/schedstat, every thread) of every Shoal process of the job (client, master, agent)
and counts the lines the client printed. It reports Shoal's CPU as a percentage of one core
and per line, and checks that every line each task printed was shown (the tasks print their
count last). Prints one JSON object on stdout.
"""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as c  # noqa: E402

MODES = {"batched": None, "per_read": "0"}
TOTAL_RE = re.compile(r"^(\w+:\d+) \| total (\d+)$")


def job_yaml(python, tasks, rate, seconds):
    script = ("import sys, time\n"
              f"end = time.monotonic() + {seconds}\n"
              f"gap = 1.0 / {rate}\n"
              "n = 0\n"
              "nxt = time.monotonic()\n"
              "while time.monotonic() < end:\n"
              "    n += 1\n"
              "    print('line', n, flush=True)\n"
              "    nxt += gap\n"
              "    pause = nxt - time.monotonic()\n"
              "    if pause > 0:\n"
              "        time.sleep(pause)\n"
              "print('total', n, flush=True)\n")
    return ("name: chatty\n"
            "roles:\n"
            "  worker:\n"
            f"    instances: {tasks}\n"
            f"    command: {json.dumps([python, '-c', script])}\n")


def schedstat_ns(pid):
    """CPU time of every thread of pid (a process's own schedstat is its main thread's)."""
    total = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass  # a thread that ended meanwhile
    return total


def shoal_pids(jobs_dir):
    """Client, master and agent of the job: each names the jobs dir in its command line."""
    needle = str(jobs_dir).encode()
    pids = []
    for pid in c.all_pids():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if argv and b"shoal" in os.path.basename(argv[0]) and any(needle in a for a in argv):
            pids.append(pid)
    return pids


def count_lines(path):
    try:
        with open(path, "rb") as f:
            return sum(1 for line in f if b" | line " in line)
    except OSError:
        return 0


def run_once(shoal, tmp, job, mode, counter, args):
    jobs_dir = tmp / f"jobs-{counter}"
    jobs_dir.mkdir()
    out_path = tmp / f"out-{counter}.txt"
    env = dict(os.environ)
    env.pop("SHOAL_AGENT_LOG_FLUSH_MS", None)
    if MODES[mode] is not None:
        env["SHOAL_AGENT_LOG_FLUSH_MS"] = MODES[mode]
    with open(out_path, "w") as out:
        p = subprocess.Popen([shoal, "run", "--jobs-dir", str(jobs_dir), str(job)], stdout=out,
                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                             start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while count_lines(out_path) == 0:
            if p.poll() is not None or time.monotonic() > deadline:
                return {"error": "no task line appeared"}
            time.sleep(0.02)
        first_line = time.monotonic()
        time.sleep(1.0)
        pids = shoal_pids(jobs_dir)
        start = {pid: schedstat_ns(pid) for pid in pids}
        lines0, t0 = count_lines(out_path), time.monotonic()
        time.sleep(max(0.5, args.seconds - 2.5 - (time.monotonic() - first_line)))
        end = {pid: schedstat_ns(pid) for pid in pids}
        lines1, t1 = count_lines(out_path), time.monotonic()
        rc = p.wait(timeout=args.seconds + 60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    text = out_path.read_text(errors="replace")
    totals = {m.group(1): int(m.group(2)) for m in map(TOTAL_RE.match, text.splitlines()) if m}
    shown = count_lines(out_path)
    cpu_ns = sum(end[pid] - start[pid] for pid in pids
                 if start.get(pid) is not None and end.get(pid) is not None)
    window_s = t1 - t0
    lines = lines1 - lines0
    return {
        "rc": rc,
        "shoal_processes": len(pids),
        "window_s": round(window_s, 3),
        "lines_in_window": lines,
        "shoal_cpu_percent": round(100.0 * cpu_ns / 1e9 / window_s, 2),
        "shoal_cpu_us_per_line": round(cpu_ns / 1e3 / lines, 2) if lines else None,
        "lines_printed": sum(totals.values()),
        "lines_shown": shown,
        "complete": len(totals) == args.tasks and shown == sum(totals.values()),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    c.add_shoal_arg(ap)
    ap.add_argument("--reps", type=int, default=3, help="rounds (3)")
    ap.add_argument("--tasks", type=int, default=2, help="tasks printing (2)")
    ap.add_argument("--rate", type=float, default=1000, help="lines/s per task (1000)")
    ap.add_argument("--seconds", type=float, default=8, help="how long each task prints (8)")
    ap.add_argument("--python", default=sys.executable, help="interpreter of the tasks")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = ap.parse_args()
    if args.reps < 1 or args.tasks < 1 or args.rate <= 0 or args.seconds < 4:
        ap.error("--reps and --tasks must be >= 1, --rate > 0 and --seconds >= 4")
    shoal, err = c.find_shoal(args.shoal)
    if err:
        ap.error(err)
    result = {"benchmark": "log_forwarding", "shoal_binary": shoal, "tasks": args.tasks,
              "rate_per_task": args.rate, "seconds": args.seconds, "reps": args.reps,
              "machine": c.machine_info(), "runs": {m: [] for m in MODES}}
    with c.temp_dir("shoal-bench-logs-", keep=args.keep) as tmp:
        job = tmp / "chatty.yaml"
        job.write_text(job_yaml(args.python, args.tasks, args.rate, args.seconds))
        counter = 0
        for rep in range(args.reps):
            order = list(MODES) if rep % 2 == 0 else list(reversed(MODES))
            for mode in order:
                counter += 1
                run = run_once(shoal, tmp, job, mode, counter, args)
                run["rep"] = rep
                result["runs"][mode].append(run)
                c.log(f"log_forwarding: rep {rep + 1}/{args.reps} {mode}: "
                      f"{run.get('shoal_cpu_percent')} % of a core, "
                      f"{run.get('shoal_cpu_us_per_line')} us/line, complete "
                      f"{run.get('complete')}")
    for mode in MODES:
        runs = [r for r in result["runs"][mode] if "error" not in r]
        pct = [r["shoal_cpu_percent"] for r in runs]
        per_line = [r["shoal_cpu_us_per_line"] for r in runs if r["shoal_cpu_us_per_line"]]
        result[mode] = {
            "median_shoal_cpu_percent": round(c.median(pct), 2) if pct else None,
            "median_shoal_cpu_us_per_line": round(c.median(per_line), 2) if per_line else None,
            "every_line_shown": bool(runs) and all(r["complete"] and r["rc"] == 0 for r in runs),
        }
    result["cpu_ratio_batched_per_read"] = c.ratio(
        result["batched"]["median_shoal_cpu_percent"],
        result["per_read"]["median_shoal_cpu_percent"])
    c.emit(result)
    return 0 if all(result[m]["every_line_shown"] for m in MODES) else 1


if __name__ == "__main__":
    sys.exit(main())
