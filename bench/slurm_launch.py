#!/usr/bin/env python3
"""Launch overhead on Slurm: time from submitting a job to all of its N tasks running, with
`shoal submit --backend slurm`, next to a plain `srun -n N` of the same command.

Needs a Slurm cluster reachable through SLURM_CONF (the project's test cluster:
tests/slurm/cluster.sh up; eval "$(tests/slurm/cluster.sh env)").

For each N (default 2, 8, 16), each repetition runs, alternating which goes first:
  srun   t0, then `srun --job-name=bench-srun -n N --cpus-per-task=1 --mem-per-cpu=64M
         sh -c 'date +%s%N > DIR/$SLURM_PROCID; sleep 1'`
  shoal  t0, then `shoal submit --backend slurm job.yaml`, a job with one role of N tasks
         (cpus 1, memory 64MiB) running `sh -c 'date +%s%N > DIR/$SHOAL_RANK; sleep 1'`
The figure is the last task's start stamp minus t0: everything from the submitting command's
own start (for Shoal: the client, the master, srun's allocation, the agents' registration and
the launch) to the moment the last task runs. Between runs the driver waits until Slurm holds
nothing (squeue empty) so each run finds the cluster idle. One untimed warmup of each first.
Prints one JSON object: per N, median and p90 ms of each, and shoal - srun (medians);
"target_met": that difference is within 200 ms at every N.
"""

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as c  # noqa: E402

TARGET_DIFF_MS = 200.0
STAMP = "date +%s%N > {dir}/{var}; sleep 1"


def wait_idle(timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True)
        if r.returncode == 0 and not r.stdout.strip():
            r = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True)
            if r.returncode == 0 and all(s.strip() == "idle" for s in r.stdout.split()):
                return True
        time.sleep(0.05)
    return False


def last_stamp_ms(stamp_dir, n, t0_ns, timeout):
    """ms from t0 to the latest of the N start stamps, waiting for all N to appear."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        files = list(stamp_dir.iterdir())
        if len(files) == n:
            stamps = []
            for f in files:
                text = f.read_text().strip()
                if not text:
                    break
                stamps.append(int(text))
            if len(stamps) == n:
                return (max(stamps) - t0_ns) / 1e6
        time.sleep(0.02)
    return None


def run_srun(n, stamp_dir, timeout):
    cmd = ["srun", "--job-name=bench-srun", f"--ntasks={n}", "--cpus-per-task=1",
           "--mem-per-cpu=64M", "sh", "-c", STAMP.format(dir=stamp_dir, var="$SLURM_PROCID")]
    t0 = time.time_ns()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    ms = last_stamp_ms(stamp_dir, n, t0, timeout)
    _, err = p.communicate(timeout=timeout)
    if ms is None or p.returncode != 0:
        return None, f"srun: exit {p.returncode}: {err.strip()[-300:]}"
    return ms, None


def run_shoal(shoal, n, stamp_dir, work, timeout):
    job = work / f"job-{n}.yaml"
    job.write_text(
        f"name: bench-slurm-n{n}\n"
        "roles:\n"
        "  task:\n"
        f"    instances: {n}\n"
        f"    command: [\"/bin/sh\", \"-c\", \"{STAMP.format(dir=stamp_dir, var='$SHOAL_RANK')}\"]\n"
        "    resources: {cpus: 1, memory: 64MiB}\n")
    jobs = work / "jobs"
    t0 = time.time_ns()
    p = subprocess.run([shoal, "--jobs-dir", str(jobs), "submit", "--backend", "slurm", str(job)],
                       capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        return None, f"shoal submit: exit {p.returncode}: {p.stderr.strip()[-300:]}"
    job_id = p.stdout.strip()
    ms = last_stamp_ms(stamp_dir, n, t0, timeout)
    # The job ends by itself once the tasks exit; wait for it so the next run finds Slurm idle.
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        s = subprocess.run([shoal, "--jobs-dir", str(jobs), "status", job_id, "--json"],
                           capture_output=True, text=True)
        state = s.stdout
        if '"state": "succeeded"' in state or '"state":"succeeded"' in state:
            break
        if '"state": "failed"' in state or '"state":"failed"' in state:
            return None, f"shoal job failed: {state[-300:]}"
        time.sleep(0.1)
    if ms is None:
        return None, "the tasks did not all start"
    return ms, None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    c.add_shoal_arg(ap)
    ap.add_argument("--n", default="2,8,16", help="comma-separated task counts (2,8,16)")
    ap.add_argument("--reps", type=int, default=10, help="timed runs per mode and N (10)")
    ap.add_argument("--timeout", type=float, default=60, help="per-run limit, s (60)")
    args = ap.parse_args()
    ns = [int(x) for x in args.n.split(",")]
    shoal, why = c.find_shoal(args.shoal)
    result = {"benchmark": "slurm_launch", "machine": c.machine_info(), "reps": args.reps,
              "target": f"shoal - srun <= {TARGET_DIFF_MS:g} ms at every N", "results": {}}
    if shoal is None or not os.environ.get("SLURM_CONF"):
        result["error"] = why or "SLURM_CONF is not set: start the test cluster first"
        c.emit(result)
        return 1
    met = True
    with c.temp_dir("shoal-bench-slurm-") as work:
        for n in ns:
            times = {"srun": [], "shoal": []}
            errors = []
            for rep in range(args.reps + 1):
                order = ["srun", "shoal"] if rep % 2 == 0 else ["shoal", "srun"]
                for mode in order:
                    if not wait_idle():
                        errors.append("the cluster did not become idle")
                        continue
                    stamp_dir = work / f"stamps-{n}-{rep}-{mode}"
                    stamp_dir.mkdir()
                    if mode == "srun":
                        ms, err = run_srun(n, stamp_dir, args.timeout)
                    else:
                        ms, err = run_shoal(shoal, n, stamp_dir, work, args.timeout)
                    if err:
                        errors.append(err)
                    elif rep > 0:  # rep 0 is the warmup
                        times[mode].append(ms)
                c.log(f"N={n} rep {rep}: " + ", ".join(
                    f"{m} {times[m][-1]:.0f} ms" for m in order if times[m] and rep > 0))
            entry = {m: c.summary_ms(v) for m, v in times.items() if v}
            if times["srun"] and times["shoal"]:
                diff = c.median(times["shoal"]) - c.median(times["srun"])
                entry["shoal_minus_srun_ms"] = round(diff, 1)
                entry["ratio"] = c.ratio(c.median(times["shoal"]), c.median(times["srun"]))
                met = met and diff <= TARGET_DIFF_MS
            else:
                met = False
            if errors:
                entry["errors"] = errors[:5]
            result["results"][str(n)] = entry
    result["target_met"] = met
    c.emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
