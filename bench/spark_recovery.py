#!/usr/bin/env python3
"""Time to first training step, and recovery from a killed worker, on Spark: the Keras
MultiWorkerMirroredStrategy example (examples/tensorflow/train_mwms.py, 2 workers) under
`shoal run --backend spark` next to TensorFlowOnSpark 2.2.5 running the same script on the same
standalone cluster, in the same run.

Needs a Spark standalone cluster (tests/spark/cluster.sh up, or --spark-master and --spark-web as
for bench/spark_submit.py) with 2 free task slots and 2 GiB for executors, the `tensorflow` venv
(examples/tensorflow/requirements.txt) for Shoal's tasks and the opt-in `peer-tfos` venv
(./setup.sh --spark-peers: bench/spark/requirements-tfos.txt, the same TensorFlow 2.15.1, Keras
2.15 and NumPy 1.26.4 with tensorflowonspark 2.2.5 and PySpark 4.3.0) for TensorFlowOnSpark.

Modes, each repetition running all of them back to back in a rotating order:
  shoal       `shoal run --backend spark --spark-master URL job.yaml`: framework tensorflow, one
              role `worker` of 2 tasks running train_mwms.py with the tensorflow venv,
              on_failure restart-group, backoff 0s (Shoal stops the group and starts it again).
  tfos        `spark-submit bench/spark/tfos_mwms.py`: TFCluster.run with 2 executors of 1 core
              (chief + worker, InputMode.TENSORFLOW), each running train_mwms.py with the
              peer-tfos venv. TensorFlowOnSpark has no restart of its own: the killed worker's
              Spark task fails and Spark retries it (spark.task.maxFailures, 4); the chief's
              collectives fail when its peer goes (MWMS' peer health check), so its task fails
              and is retried too; the retried tasks find their reservations and join again.
  tfos_again  `tfos` once more: the A/A pair.
Both train from scratch after a failure (train_mwms.py keeps no checkpoint), with the same
arguments: --epochs --epochs (30, long enough to be killed mid-training) --min-accuracy 0.5.

Each run: t0, start; the first training step of every process is stamped by bench/_first_step.py
(installed as sitecustomize through PYTHONPATH: Keras' first train_function call, waited on),
one file per process. When both workers have stepped, the driver waits --kill-after (1 s),
kills the non-chief worker's train_mwms.py with SIGKILL (t_kill) and waits for two processes
started after the kill to step. Figures (ms):
  first_step_ms   t0 -> the later of the two first workers' first step: submission, the Spark
                  application and executors, the gang, TensorFlow's import and the collective
                  group, the first step
  recovery_ms     t_kill -> the later of the two new workers' first step
  restarted_ms    t_kill -> the later of the two new processes' interpreter start (sitecustomize)
A run counts only if its command then exits 0 (the training finished with accuracy >= 0.5).
Rep 0 is an untimed warmup; the master must show no application before each run.

Prints one JSON object: each mode's summaries, the ratios of medians shoal/tfos and
tfos_again/tfos (the A/A) with 95 % bootstrap intervals. No target: the issue asks for the
comparison. Missing pieces are `error` fields; nothing asserts.
"""

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as c  # noqa: E402
import _kube as k  # noqa: E402  (bootstrap_ratio_ci only: standard library)
import spark_submit as ss  # noqa: E402  (the cluster helpers)

MODES = ["shoal", "tfos", "tfos_again"]
TRAIN = c.REPO_ROOT / "examples" / "tensorflow" / "train_mwms.py"
TFOS_DRIVER = c.BENCH_DIR / "spark" / "tfos_mwms.py"
HOOK = c.BENCH_DIR / "_first_step.py"
WORKERS = 2


def hook_env(stamp_dir, site_dir):
    return {"PYTHONPATH": str(site_dir), "SHOAL_BENCH_FIRST_STEP_DIR": str(stamp_dir),
            "SHOAL_BENCH_FIRST_STEP_SCRIPTS": TRAIN.name, "SHOAL_BENCH_FIRST_STEP_KIND": "keras"}


def train_args(args):
    return ["--epochs", str(args.epochs), "--min-accuracy", "0.5"]


def start_tfos(args, stamp_dir, site_dir, log):
    venv = Path(args.tfos_venv)
    cmd = [str(venv / "bin" / "spark-submit"), "--master", args.spark_master,
           "--conf", f"spark.cores.max={WORKERS}", "--conf", "spark.executor.cores=1",
           "--conf", f"spark.executor.memory={args.executor_memory}",
           "--conf", "spark.ui.showConsoleProgress=false", "--driver-memory", "512m"]
    for key, value in hook_env(stamp_dir, site_dir).items():
        cmd += ["--conf", f"spark.executorEnv.{key}={value}"]
    cmd += [str(TFOS_DRIVER), "--cluster-size", str(WORKERS), "--"] + train_args(args)
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=ss.spark_env(venv),
                            start_new_session=True)


def shoal_job_file(args, work, stamp_dir, site_dir):
    env = dict(hook_env(stamp_dir, site_dir), TF_CPP_MIN_LOG_LEVEL="2")
    command = [str(Path(args.tf_venv) / "bin" / "python"), str(TRAIN)] + train_args(args)
    path = work / f"mwms-{stamp_dir.name}.yaml"
    path.write_text(
        "name: bench-spark-mwms\n"
        "framework: tensorflow\n"
        "on_failure: restart-group\n"
        "max_restarts: 3\n"
        "backoff: {initial: 0s}\n"
        "roles:\n"
        "  worker:\n"
        f"    instances: {WORKERS}\n"
        f"    command: {json.dumps(command)}\n"
        f"    working_dir: {json.dumps(str(TRAIN.parent))}\n"
        f"    env: {json.dumps(env)}\n"
        "    resources: {cpus: 1, memory: 2GiB}\n")
    return path


def start_shoal(args, shoal, work, stamp_dir, site_dir, log):
    job = shoal_job_file(args, work, stamp_dir, site_dir)
    cmd = [shoal, "--jobs-dir", str(work / "jobs"), "run", "--backend", "spark",
           "--spark-master", args.spark_master, str(job)]
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def read_stamps(stamp_dir):
    """{pid: {"t_site", "t_first"}} of the processes that have made their first step."""
    out = {}
    for f in stamp_dir.glob("*.jsonl"):
        with contextlib.suppress(OSError, ValueError):
            for line in f.read_text().splitlines():
                rec = json.loads(line)
                if "t_first" in rec:
                    out[int(rec["pid"])] = rec
    return out


def is_chief(pid):
    """From the process' TF_CONFIG: the `chief` task, or worker 0 of a cluster without one.
    None when the process is gone."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for item in environ:
        if item.startswith(b"TF_CONFIG="):
            config = json.loads(item[len(b"TF_CONFIG="):])
            task = config.get("task") or {}
            if task.get("type") == "chief":
                return True
            return (task.get("type") == "worker" and int(task.get("index", 0)) == 0
                    and "chief" not in (config.get("cluster") or {}))
    return None


def wait_for(pred, proc, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        if proc.poll() is not None:
            return pred()
        time.sleep(0.05)
    return None


def stop(proc):
    """Ends a run that went wrong: SIGINT (Ctrl-C) to the command, SIGKILL to its session
    after 30 s."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def one_run(args, mode, shoal, work, rep):
    stamp_dir = work / f"stamps-{rep}-{mode}"
    stamp_dir.mkdir()
    site_dir = work / "site"
    log_path = work / f"{mode}-{rep}.log"
    with open(log_path, "w") as log:
        t0 = time.time()
        if mode == "shoal":
            proc = start_shoal(args, shoal, work, stamp_dir, site_dir, log)
        else:
            proc = start_tfos(args, stamp_dir, site_dir, log)
        try:
            first = wait_for(lambda: (lambda s: s if len(s) >= WORKERS else None)(
                read_stamps(stamp_dir)), proc, args.timeout)
            if not first:
                stop(proc)
                return None, f"the {WORKERS} workers did not all step (log {log_path})"
            res = {"first_step_ms": (max(r["t_first"] for r in first.values()) - t0) * 1e3}
            time.sleep(args.kill_after)
            victims = [pid for pid in first if is_chief(pid) is False]
            if not victims:
                stop(proc)
                return None, "no live non-chief worker to kill (training ended too soon?)"
            os.kill(victims[0], signal.SIGKILL)
            t_kill = time.time()

            def new_generation():
                new = [r for pid, r in read_stamps(stamp_dir).items() if pid not in first]
                return sorted(new, key=lambda r: r["t_first"])[:WORKERS] \
                    if len(new) >= WORKERS else None

            new = wait_for(new_generation, proc, args.timeout)
            if not new:
                stop(proc)
                return None, f"no new generation stepped after the kill (log {log_path})"
            res["recovery_ms"] = (max(r["t_first"] for r in new) - t_kill) * 1e3
            res["restarted_ms"] = (max(r["t_site"] for r in new) - t_kill) * 1e3
            try:
                rc = proc.wait(timeout=args.timeout)
            except subprocess.TimeoutExpired:
                stop(proc)
                return None, f"the run did not end within {args.timeout:g} s (log {log_path})"
            if rc != 0:
                return None, f"exit status {rc} (log {log_path})"
            return res, None
        except BaseException:
            stop(proc)
            raise


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    c.add_shoal_arg(ap)
    ss.add_cluster_args(ap)
    ap.add_argument("--tfos-venv", default="/var/cache/shoal/venvs/peer-tfos",
                    help="TensorFlowOnSpark's venv (./setup.sh --spark-peers)")
    ap.add_argument("--tf-venv", default="/var/cache/shoal/venvs/tensorflow",
                    help="the TensorFlow example's venv, for Shoal's tasks")
    ap.add_argument("--reps", type=int, default=3, help="timed runs per mode (3)")
    ap.add_argument("--modes", default=",".join(MODES), help=f"({','.join(MODES)})")
    ap.add_argument("--epochs", type=int, default=30, help="train_mwms.py --epochs (30)")
    ap.add_argument("--kill-after", type=float, default=1.0,
                    help="s after both workers' first step (1)")
    ap.add_argument("--executor-memory", default="1g", help="TFoS's executors (1g)")
    ap.add_argument("--timeout", type=float, default=300, help="per phase of a run, s (300)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    args = ap.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    result = {"benchmark": "spark_recovery", "machine": c.machine_info(), "reps": args.reps,
              "spark_master": args.spark_master, "epochs": args.epochs,
              "kill_after_s": args.kill_after, "results": {}}
    if not args.spark_master or not args.spark_web:
        result["error"] = ("no Spark cluster: tests/spark/cluster.sh up, or --spark-master "
                           "and --spark-web")
        c.emit(result)
        return 1
    shoal = None
    if "shoal" in modes:
        shoal, why = c.find_shoal(args.shoal)
        if shoal and not ss.shoal_has_spark(shoal):
            shoal, why = None, f"{shoal} has no Spark backend (no --spark-master in run --help)"
        if shoal is None:
            result["shoal_error"] = why
            modes.remove("shoal")
    for m in ("tfos", "tfos_again"):
        if m in modes and not (Path(args.tfos_venv) / "bin" / "spark-submit").exists():
            result["tfos_error"] = f"no TensorFlowOnSpark venv at {args.tfos_venv}: " \
                                   "./setup.sh --spark-peers"
            modes.remove(m)
    runs = {m: [] for m in modes}
    errors = []
    with c.temp_dir("shoal-bench-spark-rec-", keep=args.keep) as work:
        (work / "site").mkdir()
        shutil.copy(HOOK, work / "site" / "sitecustomize.py")
        for rep in range(args.reps + 1):
            order = modes[rep % len(modes):] + modes[:rep % len(modes)] if modes else []
            for mode in order:
                if not ss.wait_idle(args.spark_web):
                    errors.append("the cluster still ran an application after 60 s")
                    continue
                res, err = one_run(args, mode, shoal, work, rep)
                if err:
                    errors.append(f"rep {rep} {mode}: {err}")
                    c.log(f"rep {rep} {mode}: {err}")
                    continue
                c.log(f"rep {rep} {mode}: " + ", ".join(f"{k_} {v:.0f}" for k_, v in res.items())
                      + (" (warmup)" if rep == 0 else ""))
                if rep > 0:
                    runs[mode].append(res)
    for mode, rs in runs.items():
        if rs:
            result["results"][mode] = {key: c.summary_ms([r[key] for r in rs])
                                       for key in ("first_step_ms", "recovery_ms",
                                                   "restarted_ms")}
    for a_mode, name in (("shoal", "shoal_over_tfos"), ("tfos_again", "aa_tfos_again_over_tfos")):
        a, b = runs.get(a_mode) or [], runs.get("tfos") or []
        if a and b:
            result[name] = {key: {"ratio": c.ratio(c.median([r[key] for r in a]),
                                                   c.median([r[key] for r in b])),
                                  "ci95": k.bootstrap_ratio_ci([r[key] for r in a],
                                                               [r[key] for r in b])}
                            for key in ("first_step_ms", "recovery_ms")}
    if errors:
        result["errors"] = errors[:8]
    c.emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
