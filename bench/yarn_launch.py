#!/usr/bin/env python3
"""Launch overhead on YARN: time from submitting a job to all of its N tasks running, with
`shoal submit --backend yarn`, next to YARN's own DistributedShell running the same command in
the same number of containers, in the same run.

Needs the project's YARN mini-cluster (tests/yarn/cluster.sh up) with room for N + 1
containers of one vcore: for N = 8, start it with SHOAL_YARN_NM_VCORES=8 (the default 2 x 4
vcores hold 7 containers and an AM). Reads $SHOAL_YARN_DIR/env (default /tmp/shoal-yarn).

For each N (default 2, 8), each repetition runs, alternating which goes first:
  dshell  t0, then `tests/yarn/dshell.sh -shell_command 'date +%s%N > DIR/$CONTAINER_ID;
          sleep 1' -num_containers N -container_memory 256`
  shoal   t0, then `shoal submit --backend yarn job.yaml`, one role of N tasks (cpus 1,
          memory 64MiB, so 192 MB containers, normalized by YARN like DistributedShell's)
          running `date +%s%N > DIR/$SHOAL_RANK; sleep 1`
The figure is the last task's start stamp minus t0: everything from the submitting command's
start (for DistributedShell: its client JVM, the submission, the AM's JVM, the allocation and
launches; for Shoal: the client, the master, the submission, the AM, the allocation, the
agents' registration and the launch) to the moment the last task runs. Between runs the driver
waits until the ResourceManager runs no application. One untimed warmup of each first.
Prints one JSON object: per N, median and p90 ms of each, and shoal - dshell (medians);
"target_met": Shoal is no slower than DistributedShell (median) at every N.
"""

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as c  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
STAMP = "date +%s%N > {dir}/{var}; sleep 1"


def cluster_env():
    path = Path(os.environ.get("SHOAL_YARN_DIR", "/tmp/shoal-yarn")) / "env"
    if not path.is_file():
        return None
    return dict(l.split("=", 1) for l in path.read_text().splitlines() if "=" in l)


def running_apps(rm):
    with urllib.request.urlopen(f"{rm}/ws/v1/cluster/apps?states=NEW,NEW_SAVING,SUBMITTED,"
                                f"ACCEPTED,RUNNING", timeout=30) as r:
        return ((json.loads(r.read()).get("apps") or {}).get("app") or [])


def wait_idle(rm, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not running_apps(rm):
            return True
        time.sleep(0.1)
    return False


def last_stamp_ms(stamp_dir, n, t0_ns, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        files = list(stamp_dir.iterdir())
        if len(files) == n:
            stamps = [f.read_text().strip() for f in files]
            if all(stamps):
                return (max(map(int, stamps)) - t0_ns) / 1e6
        time.sleep(0.02)
    return None


def run_dshell(n, stamp_dir, timeout):
    cmd = ["bash", str(REPO / "tests" / "yarn" / "dshell.sh"), "-shell_command",
           STAMP.format(dir=stamp_dir, var="$CONTAINER_ID"), "-num_containers", str(n),
           "-container_memory", "256", "-master_memory", "256"]
    t0 = time.time_ns()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    ms = last_stamp_ms(stamp_dir, n, t0, timeout)
    _, err = p.communicate(timeout=timeout)
    if ms is None or p.returncode != 0:
        return None, f"dshell: exit {p.returncode}: {err.strip()[-300:]}"
    return ms, None


def run_shoal(shoal, n, stamp_dir, work, env, timeout):
    job = work / f"job-{n}.yaml"
    job.write_text(
        f"name: bench-yarn-n{n}\n"
        "roles:\n"
        "  task:\n"
        f"    instances: {n}\n"
        f"    command: [\"/bin/sh\", \"-c\", \"{STAMP.format(dir=stamp_dir, var='$SHOAL_RANK')}\"]\n"
        "    resources: {cpus: 1, memory: 64MiB}\n")
    jobs = work / "jobs"
    t0 = time.time_ns()
    p = subprocess.run([shoal, "--jobs-dir", str(jobs), "submit", "--backend", "yarn", str(job)],
                       capture_output=True, text=True, timeout=timeout, env=env)
    if p.returncode != 0:
        return None, f"shoal submit: exit {p.returncode}: {p.stderr.strip()[-300:]}"
    job_id = p.stdout.strip()
    ms = last_stamp_ms(stamp_dir, n, t0, timeout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = subprocess.run([shoal, "--jobs-dir", str(jobs), "status", job_id, "--json"],
                           capture_output=True, text=True)
        state = json.loads(s.stdout).get("state") if s.returncode == 0 else ""
        if state == "succeeded":
            break
        if state in ("failed", "killed"):
            return None, f"shoal job {state}: {s.stdout[-300:]}"
        time.sleep(0.1)
    if ms is None:
        return None, "the tasks did not all start"
    return ms, None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    c.add_shoal_arg(ap)
    ap.add_argument("--n", default="2,8", help="comma-separated task counts (2,8)")
    ap.add_argument("--reps", type=int, default=5, help="timed runs per mode and N (5)")
    ap.add_argument("--timeout", type=float, default=120, help="per-run limit, s (120)")
    args = ap.parse_args()
    ns = [int(x) for x in args.n.split(",")]
    shoal, why = c.find_shoal(args.shoal)
    result = {"benchmark": "yarn_launch", "machine": c.machine_info(), "reps": args.reps,
              "target": "shoal <= dshell (medians) at every N", "results": {}}
    cluster = cluster_env()
    if shoal is None or cluster is None:
        result["error"] = why or "the YARN test cluster is not up: tests/yarn/cluster.sh up"
        c.emit(result)
        return 1
    rm = cluster["SHOAL_YARN_RM_WEB"]
    # What `cluster.sh env` exports: the ResourceManager, HDFS and WebHDFS (where shoal stages
    # the AM jar and its binary; the AM's Hadoop classpath comes from the cluster).
    env = {**os.environ, **cluster}
    met = True
    with c.temp_dir("shoal-bench-yarn-") as work:
        for n in ns:
            times = {"dshell": [], "shoal": []}
            errors = []
            for rep in range(args.reps + 1):
                order = ["dshell", "shoal"] if rep % 2 == 0 else ["shoal", "dshell"]
                for mode in order:
                    if not wait_idle(rm):
                        errors.append("the cluster did not become idle")
                        continue
                    stamp_dir = work / f"stamps-{n}-{rep}-{mode}"
                    stamp_dir.mkdir()
                    if mode == "dshell":
                        ms, err = run_dshell(n, stamp_dir, args.timeout)
                    else:
                        ms, err = run_shoal(shoal, n, stamp_dir, work, env, args.timeout)
                    if err:
                        errors.append(err)
                    elif rep > 0:  # rep 0 is the warmup
                        times[mode].append(ms)
                c.log(f"N={n} rep {rep}: " + ", ".join(
                    f"{m} {times[m][-1]:.0f} ms" for m in order if times[m] and rep > 0))
            entry = {m: c.summary_ms(v) for m, v in times.items() if v}
            if times["dshell"] and times["shoal"]:
                diff = c.median(times["shoal"]) - c.median(times["dshell"])
                entry["shoal_minus_dshell_ms"] = round(diff, 1)
                entry["ratio"] = c.ratio(c.median(times["shoal"]), c.median(times["dshell"]))
                met = met and diff <= 0
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
