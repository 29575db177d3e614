#!/usr/bin/env python3
"""Submit -> all tasks running on Spark: `shoal run --backend spark` of N trivial tasks next to a
bare barrier-mode PySpark job that starts the same task processes, on the same standalone
cluster, in the same run.

Needs a Spark standalone cluster: the project's (tests/spark/cluster.sh up; its env file gives
the master) or any other (--spark-master spark://HOST:PORT, --spark-web http://HOST:PORT for its
master's web UI, which the driver reads to wait until no application runs). The bare job runs
with spark-submit from --venv (default the `spark` venv: PySpark 4.3.0).

Modes, each repetition running all of them back to back in a rotating order (ABC, BCA, CAB):
  shoal       t0, then `shoal run --backend spark --spark-master URL job.yaml`: one role of N
              tasks running `date +%s%N > DIR/$SHOAL_RANK; sleep 1` (the backend's barrier
              stage starts one agent per task, the agent the task).
  bare        t0, then `spark-submit --master URL bench/spark/bare_barrier.py N CMD`: a driver
              whose barrier stage of N tasks runs the same command (RANK for SHOAL_RANK)
              directly from each task's Python worker. Spark's defaults otherwise, as Shoal's
              driver has them (executors of all a worker's cores; spark.executor.memory
              --executor-memory, 1g, Spark's default), and the same 1 s barrier check interval
              that Shoal's driver sets (Spark's default, 15 s, would dominate both figures).
  bare_again  `bare` once more: the A/A pair, which says how much two identical runs differ.
The figure of a run is the last task's start stamp minus t0 (ms): for both, everything from
the submitting command's start (client, driver JVM, application registration, executors'
JVMs, the barrier stage's scheduling, Python workers; for Shoal also its master and agents) to
the moment the last of the N processes runs. Each run must then end with exit status 0, and the
master must show no running application, before the next starts. Rep 0 is an untimed warmup.

Prints one JSON object: per N, each mode's summary (median, p90, min, max), the ratios of
medians shoal/bare and bare_again/bare (the A/A), each with a 95 % bootstrap interval over the
repetitions, and target_met: shoal's median <= 1.1 x bare's at every N. Missing pieces (no
cluster, a shoal without the Spark backend) are `error` fields; nothing asserts.
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
import _kube as k  # noqa: E402  (bootstrap_ratio_ci only: standard library)

MODES = ["shoal", "bare", "bare_again"]
STAMP = "date +%s%N > {dir}/${var}; sleep 1"
TARGET_RATIO = 1.1
BARE_DRIVER = c.BENCH_DIR / "spark" / "bare_barrier.py"


def cluster_env():
    """SHOAL_SPARK_MASTER and SHOAL_SPARK_MASTER_WEB: the environment, else the env file that
    tests/spark/cluster.sh up writes into $SHOAL_SPARK_DIR (default /tmp/shoal-spark)."""
    found = {k_: os.environ[k_] for k_ in ("SHOAL_SPARK_MASTER", "SHOAL_SPARK_MASTER_WEB")
             if os.environ.get(k_)}
    path = Path(os.environ.get("SHOAL_SPARK_DIR", "/tmp/shoal-spark")) / "env"
    if path.is_file():
        for line in path.read_text().splitlines():
            key, _, value = line.partition("=")
            found.setdefault(key.strip(), value.strip())
    return found


def add_cluster_args(ap, venv_default="/var/cache/shoal/venvs/spark"):
    env = cluster_env()
    ap.add_argument("--spark-master", default=env.get("SHOAL_SPARK_MASTER"),
                    help="spark://HOST:PORT (default: $SHOAL_SPARK_MASTER, else "
                         "tests/spark/cluster.sh's env file)")
    ap.add_argument("--spark-web", default=env.get("SHOAL_SPARK_MASTER_WEB"),
                    help="the master's web UI, http://HOST:PORT (default: "
                         "$SHOAL_SPARK_MASTER_WEB, else the env file)")
    ap.add_argument("--venv", default=venv_default,
                    help=f"the venv whose spark-submit runs the anchor ({venv_default})")


def active_apps(web):
    with urllib.request.urlopen(f"{web.rstrip('/')}/json/", timeout=10) as r:
        return json.loads(r.read()).get("activeapps") or []


def wait_idle(web, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if not active_apps(web):
                return True
        except OSError:
            pass
        time.sleep(0.1)
    return False


def spark_env(venv):
    """What spark-submit from a pip-installed PySpark needs: SPARK_HOME inside the venv (its
    find-spark-home would look for `python3` on PATH) and the venv's Python on both sides."""
    python = Path(venv) / "bin" / "python"
    homes = sorted((Path(venv) / "lib").glob("python3*/site-packages/pyspark"))
    env = dict(os.environ, PYSPARK_PYTHON=str(python), PYSPARK_DRIVER_PYTHON=str(python))
    if homes:
        env["SPARK_HOME"] = str(homes[-1])
    return env


def last_stamp_ms(stamp_dir, n, t0_ns, proc, timeout):
    """The last of the n stamps minus t0, in ms; None if the command ended or time ran out
    before all n were written."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        files = list(stamp_dir.iterdir())
        if len(files) == n:
            stamps = [f.read_text().strip() for f in files]
            if all(stamps):
                return (max(map(int, stamps)) - t0_ns) / 1e6
        if proc.poll() is not None and len(files) < n:
            return None
        time.sleep(0.02)
    return None


def finish(proc, what, timeout):
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        return f"{what}: did not end within {timeout:g} s"
    if proc.returncode != 0:
        tail = " / ".join((err or "").strip().splitlines()[-3:])
        return f"{what}: exit status {proc.returncode}: {tail[-400:]}"
    return None


def run_bare(args, n, stamp_dir, env):
    cmd = [str(Path(args.venv) / "bin" / "spark-submit"), "--master", args.spark_master,
           # Shoal's Spark driver sets the same: Spark's default 15 s between two checks that
           # the cluster has slots for the whole barrier stage would make most of the figure.
           "--conf", "spark.scheduler.barrier.maxConcurrentTasksCheck.interval=1s",
           "--conf", "spark.ui.showConsoleProgress=false",
           "--conf", f"spark.executor.memory={args.executor_memory}",
           "--driver-memory", "512m",
           str(BARE_DRIVER), str(n), STAMP.format(dir=stamp_dir, var="RANK")]
    t0 = time.time_ns()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         env=env, start_new_session=True)
    ms = last_stamp_ms(stamp_dir, n, t0, p, args.timeout)
    err = finish(p, "bare barrier job", args.timeout)
    if err or ms is None:
        return None, err or "bare barrier job: not all tasks started"
    return ms, None


def shoal_job_file(work, n, stamp_dir, args):
    path = work / f"job-{n}-{stamp_dir.name}.yaml"
    path.write_text(
        f"name: bench-spark-n{n}\n"
        "roles:\n"
        "  task:\n"
        f"    instances: {n}\n"
        f"    command: [\"/bin/sh\", \"-c\", \"{STAMP.format(dir=stamp_dir, var='SHOAL_RANK')}\"]\n"
        "    resources: {cpus: 1, memory: 64MiB}\n")
    return path


def run_shoal(args, shoal, n, stamp_dir, work):
    job = shoal_job_file(work, n, stamp_dir, args)
    cmd = [shoal, "--jobs-dir", str(work / "jobs"), "run", "--backend", "spark",
           "--spark-master", args.spark_master, str(job)]
    t0 = time.time_ns()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    ms = last_stamp_ms(stamp_dir, n, t0, p, args.timeout)
    err = finish(p, "shoal run --backend spark", args.timeout)
    if err or ms is None:
        return None, err or "shoal: not all tasks started"
    return ms, None


def shoal_has_spark(shoal):
    p = subprocess.run([shoal, "run", "--help"], capture_output=True, text=True)
    return "--spark-master" in (p.stdout + p.stderr)


def summarize(times, errors):
    entry = {m: c.summary_ms(v) for m, v in times.items() if v}
    for a_mode, name in (("shoal", "shoal_over_bare"), ("bare_again", "aa_bare_again_over_bare")):
        a, b = times.get(a_mode) or [], times.get("bare") or []
        if a and b:
            entry[name] = {"ratio": c.ratio(c.median(a), c.median(b)),
                           "ci95": k.bootstrap_ratio_ci(a, b)}
    if errors:
        entry["errors"] = errors[:5]
    return entry


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    c.add_shoal_arg(ap)
    add_cluster_args(ap)
    ap.add_argument("--n", default="2", help="comma-separated task counts (2); the cluster "
                    "needs N free cores")
    ap.add_argument("--reps", type=int, default=5, help="timed runs per mode and N (5)")
    ap.add_argument("--modes", default=",".join(MODES), help=f"({','.join(MODES)})")
    ap.add_argument("--executor-memory", default="1g",
                    help="the bare job's (1g: Spark's default, which a job file without "
                         "spark.executor_memory gets)")
    ap.add_argument("--timeout", type=float, default=180, help="per-run limit, s (180)")
    args = ap.parse_args()
    ns = [int(x) for x in args.n.split(",")]
    modes = [m for m in args.modes.split(",") if m]
    result = {"benchmark": "spark_submit", "machine": c.machine_info(), "reps": args.reps,
              "spark_master": args.spark_master,
              "target": f"shoal <= {TARGET_RATIO} x bare (medians) at every N", "results": {}}
    if not args.spark_master or not args.spark_web:
        result["error"] = ("no Spark cluster: tests/spark/cluster.sh up, or --spark-master "
                           "and --spark-web")
        c.emit(result)
        return 1
    shoal = None
    if "shoal" in modes:
        shoal, why = c.find_shoal(args.shoal)
        if shoal and not shoal_has_spark(shoal):
            shoal, why = None, f"{shoal} has no Spark backend (no --spark-master in run --help)"
        if shoal is None:
            result["shoal_error"] = why
            modes.remove("shoal")
    env = spark_env(args.venv)
    met = "shoal" in modes
    with c.temp_dir("shoal-bench-spark-") as work:
        for n in ns:
            times = {m: [] for m in modes}
            errors = []
            for rep in range(args.reps + 1):
                order = modes[rep % len(modes):] + modes[:rep % len(modes)]
                for mode in order:
                    if not wait_idle(args.spark_web):
                        errors.append("the cluster still ran an application after 60 s")
                        continue
                    stamp_dir = work / f"stamps-{n}-{rep}-{mode}"
                    stamp_dir.mkdir()
                    if mode == "shoal":
                        ms, err = run_shoal(args, shoal, n, stamp_dir, work)
                    else:
                        ms, err = run_bare(args, n, stamp_dir, env)
                    if err:
                        errors.append(f"{mode}: {err}")
                        c.log(f"N={n} rep {rep} {mode}: {err}")
                    elif rep > 0:  # rep 0 is the warmup
                        times[mode].append(ms)
                    c.log(f"N={n} rep {rep} {mode}: "
                          + ("warmup" if rep == 0 else f"{ms:.0f} ms" if ms else "failed"))
            entry = summarize(times, errors)
            ratio = (entry.get("shoal_over_bare") or {}).get("ratio")
            met = met and ratio is not None and ratio <= TARGET_RATIO
            result["results"][str(n)] = entry
    result["target_met"] = met
    c.emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
