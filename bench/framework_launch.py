#!/usr/bin/env python3
"""Framework launchers: the examples' training scripts under `shoal run` versus under each
framework's own launcher, for step time and time to the first training step.

Frameworks (the same script, arguments and working directory under both launchers; the
arguments are read from the `command:` of the example's job file):
  pytorch     shoal: examples/pytorch-ddp/job.yaml (2 workers, Debian's /usr/bin/python3)
              anchor: /usr/bin/python3 bench/_torchrun.py --standalone --nproc_per_node 2
                      train.py --epochs 10            (torchrun, see bench/_torchrun.py)
  tensorflow  shoal: examples/tensorflow/mwms.yaml (2 workers, the tensorflow venv)
              anchor: /usr/bin/python3 bench/_tf_launch.py worker:2 -- VENV/python
                      train_mwms.py --epochs 8 --min-accuracy 0.9 --model-dir TMP/model
              (under Shoal the script saves its model to $SHOAL_JOB_DIR/model; the anchor is
              given a --model-dir so that both runs do the same work)
  horovod     shoal: examples/horovod/job.yaml (2 workers, the horovod venv, gloo)
              anchor: VENV/horovodrun --gloo -np 2 -H localhost:2 VENV/python train.py
                      --epochs 10
Each command runs in the example's directory (the job file's, which is also Shoal's default
working directory), with the driver's environment plus OMP_NUM_THREADS=1 (what Shoal sets for
`cpus: 1`, torchrun for nproc > 1 and _tf_launch.py by default; horovodrun sets nothing) and the
first-step hook's variables. shoal runs as `shoal --jobs-dir FRESH_TMP run --quiet JOB`.

Order: one untimed warmup of each launcher per framework, then --reps rounds; every round
runs each framework in turn, the two launchers back to back, the anchor first in even rounds
and Shoal first in odd ones. A launcher that fails twice for a framework is dropped for it
(its error is reported); every run's exit status and wall time are kept.

Figures, per framework and launcher (medians over the timed runs, then shoal/anchor ratios):
- step time: the script's own "mean_step_ms" (rank 0's JSON line: the mean wall time of one
  optimizer step after the first epoch; train_mwms.py times each Keras training step with a
  callback). `fit_after_first_step_ms` (below) is a second, hook-measured figure for tensorflow.
- time to first training step: from time.time() just before Popen of the launcher to the
  moment the LAST rank completed its first training step (time.time() in that rank). It is
  observed without editing the scripts by bench/_first_step.py, copied into a temporary
  directory as sitecustomize.py and put first on PYTHONPATH (every launcher passes its
  environment on to the ranks; the venvs' pythons honour PYTHONPATH too). In the ranks only
  (it matches the script's file name, so Python launchers are left alone) it stamps, once,
  the end of the first optimizer step that follows a backward pass (PyTorch, Horovod) or the
  first call of Keras's train_function (TensorFlow), and then removes every wrapper it
  installed, so the later steps run unchanged. Both clocks are the same wall clock on one
  machine. Split into `to_script_start_ms` (-> the last rank's interpreter start, i.e. the
  launcher's own part) and the rest (interpreter, imports, rendezvous, first step).
- wall time of the whole run (Popen to exit) and its exit status.

Prints one JSON object on stdout; progress on stderr. Targets: step time within 1 % (ratio of
the medians), and Shoal's time to first step no slower than the anchor's (median).
"""

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as c  # noqa: E402

EXAMPLES = c.REPO_ROOT / "examples"
HOOK = c.BENCH_DIR / "_first_step.py"
WORLD = 2
LEFTOVER_GRACE_S = 3.0
STEP_TARGET = 0.01

FRAMEWORKS = {
    "pytorch": {
        "job": EXAMPLES / "pytorch-ddp" / "job.yaml",
        "script": "train.py",
        "kind": "torch",
        "anchor_name": "torchrun (bench/_torchrun.py --standalone --nproc_per_node 2)",
    },
    "tensorflow": {
        "job": EXAMPLES / "tensorflow" / "mwms.yaml",
        "script": "train_mwms.py",
        "kind": "keras",
        "anchor_name": "bench/_tf_launch.py worker:2",
    },
    "horovod": {
        "job": EXAMPLES / "horovod" / "job.yaml",
        "script": "train.py",
        "kind": "torch",
        "anchor_name": "horovodrun --gloo -np 2 -H localhost:2",
    },
}


def job_command(job_file):
    """The role's `command:` list from an example job file (a JSON-compatible flow list), or
    raises ValueError."""
    text = Path(job_file).read_text()
    m = re.search(r"^\s*command:\s*(\[.*?\])\s*$", text, re.M | re.S)
    if not m:
        raise ValueError(f"no `command: [...]` line in {job_file}")
    argv = json.loads(m.group(1))
    if not isinstance(argv, list) or len(argv) < 2 or not all(isinstance(a, str) for a in argv):
        raise ValueError(f"unexpected command in {job_file}: {m.group(1)}")
    return argv


def anchor_argv(fw, cmd, tmp, counter):
    """The framework's own launcher running the job's command (interpreter, script, args)."""
    python, script_args = cmd[0], cmd[1:]
    if fw == "pytorch":
        # torchrun starts each rank as [sys.executable, -u, script, args]: its own interpreter
        # must be the job's (Debian's python3, which has torch).
        return [python, str(c.BENCH_DIR / "_torchrun.py"), "--standalone",
                "--nproc_per_node", str(WORLD)] + script_args
    if fw == "tensorflow":
        return ([c.DEFAULT_PYTHON, str(c.BENCH_DIR / "_tf_launch.py"), f"worker:{WORLD}", "--",
                 python] + script_args + ["--model-dir", str(tmp / f"model-{counter}")])
    if fw == "horovod":
        horovodrun = str(Path(python).parent / "horovodrun")
        return [horovodrun, "--gloo", "-np", str(WORLD), "-H", f"localhost:{WORLD}",
                python] + script_args
    raise ValueError(fw)


def find_step_metric(stdout):
    """The last JSON object with "mean_step_ms" on any line, after any launcher prefix
    (`worker:0 | `, `[0]<stdout>:`)."""
    found = None
    for line in stdout.splitlines():
        i = line.find("{")
        if i < 0:
            continue
        try:
            obj = json.loads(line[i:])
        except ValueError:
            continue
        if isinstance(obj, dict) and "mean_step_ms" in obj:
            found = obj
    return found


def read_stamps(stamp_dir):
    """{pid: merged record} from the hook's DIR/<pid>.jsonl files."""
    out = {}
    for p in Path(stamp_dir).glob("*.jsonl"):
        rec = {}
        with contextlib.suppress(OSError):
            for line in p.read_text().splitlines():
                with contextlib.suppress(ValueError):
                    rec.update(json.loads(line))
        if rec:
            out[p.stem] = rec
    return out


def leftover_processes(marker):
    """Live processes whose environment carries SHOAL_BENCH_FIRST_STEP_DIR=marker (the run's
    own stamp directory): anything of that run still alive after its launcher exited."""
    found = []
    for pid in c.all_pids():
        if pid == os.getpid():
            continue
        env = c.proc_environ(pid)
        if env and env.get("SHOAL_BENCH_FIRST_STEP_DIR") == marker and c.proc_alive(pid):
            found.append(pid)
    return found


def tail(text, n=4):
    return " / ".join((text or "").strip().splitlines()[-n:])


def run_once(argv, cwd, env, stamp_dir, timeout):
    """Runs one launcher command to completion. Returns a dict: rc, wall_ms, the metric,
    the first-step figures, error."""
    stamp_dir.mkdir(parents=True)
    env = dict(env, SHOAL_BENCH_FIRST_STEP_DIR=str(stamp_dir))
    res = {"rc": None, "wall_ms": None}
    with contextlib.suppress(OSError):
        res["loadavg_1m_before"] = round(os.getloadavg()[0], 2)
    t0_wall = time.time()
    t0 = time.perf_counter()
    try:
        p = subprocess.Popen(argv, cwd=str(cwd), env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                             start_new_session=True)
    except OSError as e:
        res["error"] = f"cannot run {argv[0]}: {e}"
        return res
    timed_out = False
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        out, err = "", ""
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        raise
    wall_ms = (time.perf_counter() - t0) * 1000.0
    res["rc"] = p.returncode
    res["wall_ms"] = round(wall_ms, 1)
    # Anything of the run still alive after the launcher exited (in its session, or carrying
    # the run's stamp directory in its environment, as every process the run started does):
    # given LEFTOVER_GRACE_S to go by itself, then killed and reported.
    deadline = time.monotonic() + LEFTOVER_GRACE_S
    left = leftover_processes(str(stamp_dir))
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = leftover_processes(str(stamp_dir))
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(p.pid, signal.SIGKILL)
    for pid in left:
        c.kill_quietly(pid)
    if left:
        res["leftover_pids_killed"] = left
    if timed_out:
        res["error"] = f"timed out after {timeout:g} s"
        return res
    if p.returncode != 0:
        last = tail(err) or tail(out)
        res["error"] = f"exit status {p.returncode}" + (f": {last}" if last else "")

    metric = find_step_metric(out)
    if metric is not None:
        res["mean_step_ms"] = metric.get("mean_step_ms")
        if metric.get("mean_step_cpu_ms") is not None:  # pytorch-ddp's train.py only
            res["mean_step_cpu_ms"] = metric["mean_step_cpu_ms"]
        res["steps"] = metric.get("steps")
        res["accuracy"] = metric.get("value")

    stamps = read_stamps(stamp_dir)
    firsts = [s["t_first"] for s in stamps.values() if "t_first" in s]
    sites = [s["t_site"] for s in stamps.values() if "t_first" in s and "t_site" in s]
    res["ranks_stamped"] = len(firsts)
    allowed = {str(s.get("rank")): s["cpus_allowed"] for s in stamps.values()
               if "cpus_allowed" in s}
    if allowed:
        res["cpus_allowed_by_rank"] = dict(sorted(allowed.items()))
    hook_errors = [s["error"] for s in stamps.values() if "error" in s]
    if hook_errors:
        res["hook_error"] = hook_errors[0]
    if len(firsts) >= WORLD:
        res["first_step_ms"] = round((max(firsts) - t0_wall) * 1000.0, 1)
        res["first_rank_first_step_ms"] = round((min(firsts) - t0_wall) * 1000.0, 1)
        res["to_script_start_ms"] = round((max(sites) - t0_wall) * 1000.0, 1)
        res["script_start_to_first_step_ms"] = round((max(firsts) - max(sites)) * 1000.0, 1)
        fit = [s["t_fit_end"] - s["t_first"] for s in stamps.values()
               if "t_fit_end" in s and "t_first" in s]
        if len(fit) >= WORLD:
            res["fit_after_first_step_ms"] = round(max(fit) * 1000.0, 1)
    elif "error" not in res:
        res["error"] = (f"the first-step hook stamped {len(firsts)} of {WORLD} ranks"
                        + (f" ({hook_errors[0]})" if hook_errors else ""))
    return res


def med(runs, key, nd=3):
    vals = [r[key] for r in runs if r.get(key) is not None]
    return None if not vals else round(c.median(vals), nd)


def pct(a, b):
    if a is None or b is None or b == 0:
        return None
    return round((a / b - 1.0) * 100.0, 2)


def summarize(fw, info, runs, errors):
    ok = {k: [r for r in runs if r["launcher"] == k and not r["warmup"] and "error" not in r]
          for k in ("shoal", "anchor")}
    out = {}
    # Step time
    if info.get("step_time_error"):
        out["step_time"] = {"error": info["step_time_error"]}
    else:
        s, a = med(ok["shoal"], "mean_step_ms", 4), med(ok["anchor"], "mean_step_ms", 4)
        r = c.ratio(s, a)
        mins = {k: min((x["mean_step_ms"] for x in ok[k] if x.get("mean_step_ms") is not None),
                       default=None) for k in ok}
        out["step_time"] = {
            "shoal_median_ms": s, "anchor_median_ms": a,
            "ratio_shoal_anchor": r, "diff_pct": pct(s, a),
            "shoal_min_ms": mins["shoal"], "anchor_min_ms": mins["anchor"],
            "min_ratio_shoal_anchor": c.ratio(mins["shoal"], mins["anchor"]),
            "runs": {k: [x.get("mean_step_ms") for x in ok[k]] for k in ok},
            "within_1_percent": None if r is None else abs(r - 1.0) <= STEP_TARGET,
        }
        sc, ac = med(ok["shoal"], "mean_step_cpu_ms", 4), med(ok["anchor"], "mean_step_cpu_ms", 4)
        if sc is not None and ac is not None:
            # rank 0's CPU time per step (all its threads), where the script prints it: less
            # disturbed than wall time by other load on a shared machine
            out["step_time"].update({"shoal_median_cpu_ms": sc, "anchor_median_cpu_ms": ac,
                                     "cpu_ratio_shoal_anchor": c.ratio(sc, ac)})
        if s is None or a is None:
            out["step_time"]["error"] = "no mean_step_ms from " + " and ".join(
                k for k, v in (("shoal", s), ("anchor", a)) if v is None)
    # Time to first training step
    s, a = med(ok["shoal"], "first_step_ms", 1), med(ok["anchor"], "first_step_ms", 1)
    out["first_step"] = {
        "shoal_median_ms": s, "anchor_median_ms": a,
        "diff_ms": None if s is None or a is None else round(s - a, 1),
        "diff_pct": pct(s, a), "ratio_shoal_anchor": c.ratio(s, a),
        # each phase's own median over the runs (so they need not add up to the total's)
        "phases_median_ms": {
            k: {"to_script_start": med(ok[k], "to_script_start_ms", 1),
                "script_start_to_first_step": med(ok[k], "script_start_to_first_step_ms", 1),
                "first_rank_first_step": med(ok[k], "first_rank_first_step_ms", 1)}
            for k in ok},
        "runs": {k: [x.get("first_step_ms") for x in ok[k]] for k in ok},
        "shoal_not_slower": None if s is None or a is None else s <= a,
    }
    for k in ok:
        vals = [x["first_step_ms"] for x in ok[k] if x.get("first_step_ms") is not None]
        if vals:
            out["first_step"][f"{k}_p90_ms"] = round(c.p90(vals), 1)
    if s is None or a is None:
        out["first_step"]["error"] = "no first-step figure from " + " and ".join(
            k for k, v in (("shoal", s), ("anchor", a)) if v is None)
    # TensorFlow stand-in for the step time: model.fit from the first step's end to its return.
    if fw == "tensorflow":
        s, a = med(ok["shoal"], "fit_after_first_step_ms", 1), \
            med(ok["anchor"], "fit_after_first_step_ms", 1)
        out["fit_after_first_step"] = {
            "what": ("not the script's own figure: rank-max of model.fit's return minus the end "
                     "of the first step (every later step plus the per-epoch callbacks and "
                     "metric syncs), measured by the hook; the same number of steps under both "
                     "launchers, so the ratio is a per-step ratio"),
            "shoal_median_ms": s, "anchor_median_ms": a,
            "ratio_shoal_anchor": c.ratio(s, a), "diff_pct": pct(s, a)}
    # Whole runs
    out["wall"] = {"shoal_median_ms": med(ok["shoal"], "wall_ms", 1),
                   "anchor_median_ms": med(ok["anchor"], "wall_ms", 1)}
    out["wall"]["ratio_shoal_anchor"] = c.ratio(out["wall"]["shoal_median_ms"],
                                                out["wall"]["anchor_median_ms"])
    out["timed_runs_ok"] = {k: len(v) for k, v in ok.items()}
    if errors:
        out["errors"] = errors
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    c.add_shoal_arg(ap)
    ap.add_argument("--reps", type=int, default=5, help="timed runs per launcher (5)")
    ap.add_argument("--frameworks", default="pytorch,tensorflow,horovod",
                    help="comma-separated subset of pytorch,tensorflow,horovod (all)")
    ap.add_argument("--timeout", type=float, default=240, help="per-run limit, s (240)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = ap.parse_args()
    fws = [f.strip() for f in args.frameworks.split(",") if f.strip()]
    bad = [f for f in fws if f not in FRAMEWORKS]
    if args.reps < 1 or bad or not fws:
        ap.error(f"--reps must be >= 1; unknown framework(s) {bad}" if bad else
                 "--reps must be >= 1 and --frameworks not empty")

    shoal, shoal_err = c.find_shoal(args.shoal)
    result = {
        "benchmark": "framework_launch",
        "reps": args.reps,
        "warmup_runs_per_launcher": 1,
        "world_size": WORLD,
        "shoal_binary": shoal,
        "machine": c.machine_info(),
        "env_added": {"OMP_NUM_THREADS": "1",
                      "PYTHONPATH": "TMP/site (first-step hook) prepended"},
        "targets": {"step_time": "median mean_step_ms of shoal within 1% of the anchor's",
                    "first_step": "shoal's median time to first step <= the anchor's"},
        "frameworks": {},
    }
    if shoal_err:
        result["shoal_error"] = shoal_err
        c.log(f"framework_launch: {shoal_err}; measuring the anchors only")
    t_start = time.perf_counter()

    with c.temp_dir("shoal-bench-fwlaunch-", keep=args.keep) as tmp:
        site = tmp / "site"
        site.mkdir()
        shutil.copyfile(HOOK, site / "sitecustomize.py")
        base_env = dict(os.environ, OMP_NUM_THREADS="1")
        base_env["PYTHONPATH"] = str(site) + (
            os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")

        setup = {}
        for fw in fws:
            info = FRAMEWORKS[fw]
            entry = {"shoal_job": str(info["job"].relative_to(c.REPO_ROOT)),
                     "anchor": info["anchor_name"]}
            result["frameworks"][fw] = entry
            try:
                cmd = job_command(info["job"])
            except (OSError, ValueError) as e:
                entry["error"] = f"cannot read the job's command: {e}"
                continue
            if not Path(cmd[0]).exists():
                entry["error"] = f"{cmd[0]} (the job's interpreter) is missing"
                continue
            env = dict(base_env, SHOAL_BENCH_FIRST_STEP_SCRIPTS=info["script"],
                       SHOAL_BENCH_FIRST_STEP_KIND=info["kind"])
            entry["command"] = cmd
            entry["anchor_argv"] = anchor_argv(fw, cmd, Path("TMP"), "N")
            entry["shoal_argv"] = ["shoal", "--jobs-dir", "TMP", "run", "--quiet",
                                   entry["shoal_job"]]
            setup[fw] = {"cmd": cmd, "env": env, "cwd": info["job"].parent, "runs": [],
                         "last_error": {}, "failures": {"shoal": 0, "anchor": 0},
                         "unavailable": {}}
            if not shoal:
                setup[fw]["unavailable"]["shoal"] = shoal_err
            if fw == "horovod" and not Path(anchor_argv(fw, cmd, tmp, 0)[0]).exists():
                setup[fw]["unavailable"]["anchor"] = "horovodrun not found next to the job's python"

        counter = 0
        for rnd in range(-1, args.reps):
            for fw in fws:
                if fw not in setup:
                    continue
                st = setup[fw]
                order = ["anchor", "shoal"] if rnd % 2 == 0 else ["shoal", "anchor"]
                for launcher in order:
                    if launcher in st["unavailable"] or st["failures"][launcher] >= 2:
                        continue
                    counter += 1
                    if launcher == "shoal":
                        jobs_dir = tmp / f"jobs-{counter}"
                        jobs_dir.mkdir()
                        argv = [shoal, "--jobs-dir", str(jobs_dir), "run", "--quiet",
                                str(FRAMEWORKS[fw]["job"])]
                    else:
                        argv = anchor_argv(fw, st["cmd"], tmp, counter)
                    tag = "warmup" if rnd < 0 else f"round {rnd + 1}/{args.reps}"
                    c.log(f"framework_launch: {fw} {launcher} ({tag}) ...")
                    r = run_once(argv, st["cwd"], st["env"], tmp / f"stamps-{counter}",
                                 args.timeout)
                    if launcher == "shoal":
                        shutil.rmtree(jobs_dir, ignore_errors=True)
                    elif fw == "tensorflow":
                        shutil.rmtree(tmp / f"model-{counter}", ignore_errors=True)
                    r = {"launcher": launcher, "round": rnd + 1, "warmup": rnd < 0,
                         "first_in_pair": launcher == order[0], **r}
                    st["runs"].append(r)
                    c.log(f"framework_launch: {fw} {launcher}: rc {r['rc']}, wall "
                          f"{r['wall_ms']} ms, mean_step_ms {r.get('mean_step_ms')}, "
                          f"first step {r.get('first_step_ms')} ms"
                          + (f", ERROR {r['error']}" if "error" in r else ""))
                    if "error" in r:
                        st["failures"][launcher] += 1
                        st["last_error"][launcher] = r["error"]
                        if st["failures"][launcher] >= 2:
                            c.log(f"framework_launch: {fw} {launcher} failed twice; dropped")

        for fw, st in setup.items():
            errors = dict(st["unavailable"])
            for k, n in st["failures"].items():
                if n >= 2:
                    errors[k] = f"failed twice, dropped; last error: {st['last_error'][k]}"
                elif n == 1:
                    errors[k + "_failed_once"] = st["last_error"][k]
            entry = result["frameworks"][fw]
            entry.update(summarize(fw, FRAMEWORKS[fw], st["runs"], errors))
            entry["all_runs"] = st["runs"]

    result["summary"] = {
        fw: {"step_ratio_shoal_anchor": e.get("step_time", {}).get("ratio_shoal_anchor"),
             "step_diff_pct": e.get("step_time", {}).get("diff_pct"),
             "step_within_1_percent": e.get("step_time", {}).get("within_1_percent"),
             "first_step_shoal_ms": e.get("first_step", {}).get("shoal_median_ms"),
             "first_step_anchor_ms": e.get("first_step", {}).get("anchor_median_ms"),
             "first_step_diff_ms": e.get("first_step", {}).get("diff_ms"),
             "first_step_shoal_not_slower": e.get("first_step", {}).get("shoal_not_slower")}
        for fw, e in result["frameworks"].items()}
    result["machine"]["loadavg_1m_end"] = c.machine_info().get("loadavg_1m")
    result["total_wall_s"] = round(time.perf_counter() - t_start, 1)
    c.emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
