#!/usr/bin/env python3
"""Fault detection: how long Shoal takes to record a failure, for three kinds of fault, next
to torchrun's elastic agent noticing a dead worker (measured in the same run).

Cases (each a `shoal run --detach` job in a fresh jobs dir; latencies from the journal's ts_us
against time.time() just before the fault is injected):

  process   --tasks trivial tasks (`sleep`) under on_failure: restart-task, backoff 0s,
            max_restarts 1000000. A random task's process is SIGKILLed; detection = the
            journal's task_state `to: failed` record of that task minus the kill. The next
            fault waits until the task is running again (its new pid in the `running` record,
            or in `shoal status` when the journal does not carry it).
            Also reported: kill -> the task_state `to: running` of the new attempt.
  hung      --hung-tasks tasks that call shoal.progress() every --progress-period (10 ms)
            under progress_timeout (500 ms); a random one is SIGSTOPped. Latency = the
            task_hung record minus (last progress + progress_timeout). The last progress time is
            taken two ways: the SIGSTOP time (the task reports every 10 ms, so that is at most
            one period late), and exactly, from the task_hung record's last_step (the worker
            reports the wall-clock time of each report, in microseconds, as its step).
  silent    one task per job, heartbeat {interval: --hb-interval-ms, misses: --hb-misses}; the
            job's `shoal agent` process is SIGSTOPped at a random phase of its heartbeat;
            latency = the agent_silent record - the stop - interval x misses. One job per
            fault (the master terminates a silent agent); afterwards the job must fail and no
            task process of it may be left (checked in /proc).

Anchor (process case): torchrun (torch.distributed.run, Debian's python3-torch, through
bench/_torchrun.py) with --nproc_per_node 2 of bench/_sleep_worker.py, once with its default
--monitor_interval (5 s) and once with 0.1 s, started alongside the Shoal job; their faults are
spread evenly among Shoal's. Detection = the first log line of torchrun's elastic agent that
shows the failure; restart = its "Starting worker group" line; start = the new workers' first
line. Documented figures for lost nodes (torchrun ~15 s, TonY 25 s) are quoted as constants.

Prints one JSON object on stdout. Targets: process p99 < 10 ms; hung and silent p99 < one
heartbeat interval + 50 ms.
"""

import argparse
import json
import random
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as c  # noqa: E402

PROCESS_TARGET_MS = 10.0
SLACK_MS = 50.0


def summary(values):
    return c.summary_ms(values)


# ------------------------------------------------------------------------- process exit

def process_job_yaml(n):
    return ("name: fd-process\n"
            "on_failure: restart-task\n"
            "max_restarts: 1000000\n"
            "backoff: {initial: 0s}\n"
            "roles:\n"
            "  task:\n"
            f"    instances: {n}\n"
            '    command: ["sleep", "1000000"]\n'
            "    resources: {cpus: 0.01}\n")


def spread(k, n):
    """k fault slots spread evenly over n Shoal faults: {shoal index: count}."""
    slots = {}
    for j in range(k):
        i = min(n - 1, int((j + 0.5) * n / k)) if n > 0 else 0
        slots[i] = slots.get(i, 0) + 1
    return slots


def run_process_case(args, shoal, tmp, rng, anchors):
    res = {"faults_requested": args.faults, "tasks": args.tasks,
           "policy": "restart-task, backoff 0s"}
    job_file = tmp / "process.yaml"
    job_file.write_text(process_job_yaml(args.tasks))
    job = c.ShoalJob(shoal, tmp / "jobs-process", job_file)
    detect, restart, errors = [], [], []
    bad_signal = 0
    anchor_slots = {name: spread(a["faults"], args.faults) for name, a in anchors.items()}
    t_begin = time.monotonic()
    try:
        err = job.start()
        if err:
            res["error"] = err
            return res
        running = job.wait_running(args.tasks)
        if running is None:
            res["error"] = "the tasks did not all start within 60 s"
            return res
        pids = {k: v["pid"] for k, v in running.items()}
        names = sorted(pids)
        for i in range(args.faults):
            task = rng.choice(names)
            old = pids[task]
            job.journal.poll()
            mark = len(job.journal.records)
            t0 = c.now_us()
            c.kill_quietly(old, signal.SIGKILL)
            idx, rec = job.journal.wait_for(lambda r: c.is_task_state(r, task, "failed"), 10,
                                            start=mark)
            if rec is None:
                errors.append(f"fault {i}: no failure of {task} recorded within 10 s")
                break
            detect.append((c.record_us(rec) - t0) / 1000.0)
            if rec.get("signal") != 9:
                bad_signal += 1
            _, rec2 = job.journal.wait_for(lambda r: c.is_task_state(r, task, "running"), 10,
                                           start=idx + 1)
            if rec2 is None:
                errors.append(f"fault {i}: {task} not running again within 10 s")
                break
            restart.append((c.record_us(rec2) - t0) / 1000.0)
            deadline = time.monotonic() + 10
            new = rec2.get("pid") if rec2.get("pid") != old else None  # newer journals have it
            while new is None and time.monotonic() < deadline:
                tasks = job.tasks()
                t = (tasks or {}).get(task)
                if t and t["state"] == "running" and t["pid"] and t["pid"] != old:
                    new = t["pid"]
                    break
                time.sleep(0.005)
            if new is None:
                errors.append(f"fault {i}: shoal status never showed a new pid for {task}")
                break
            pids[task] = new
            for name, a in anchors.items():
                for _ in range(anchor_slots[name].get(i, 0)):
                    run_anchor_fault(a, rng)
            if (i + 1) % 100 == 0:
                c.log(f"  process: {i + 1}/{args.faults} faults, median detect "
                      f"{c.median(detect):.2f} ms")
    finally:
        left = job.stop()
    res["faults"] = len(detect)
    res["seconds"] = round(time.monotonic() - t_begin, 1)
    res["detect"] = summary(detect)
    res["kill_to_running_again"] = summary(restart)
    res["failed_records_without_sigkill"] = bad_signal
    res["leftover_after_stop"] = left
    if errors:
        res["errors"] = errors
    res["target"] = f"detect p99 < {PROCESS_TARGET_MS:g} ms"
    res["target_met"] = None if not detect else c.p99(detect) < PROCESS_TARGET_MS
    return res


def run_anchor_fault(a, rng):
    run = a["run"]
    if run.error:
        return
    r = run.fault(rng.randrange(run.nproc))
    if "error" in r:
        a["errors"].append(r["error"])
        c.log(f"  anchor {a['name']}: {r['error']}")
        return
    for k in ("detect_ms", "restart_ms", "start_max_ms"):
        if r.get(k) is not None:
            a[k].append(r[k])
    c.log(f"  anchor {a['name']}: detect {r['detect_ms']} ms, restart {r['restart_ms']} ms")


# ------------------------------------------------------------------------- hung task

def hung_job_yaml(args, out_dir):
    argv = [args.task_python, str(c.BENCH_DIR / "_progress_worker.py"), str(out_dir),
            str(args.progress_period)]
    return ("name: fd-hung\n"
            "on_failure: restart-task\n"
            "max_restarts: 1000000\n"
            "backoff: {initial: 0s}\n"
            f"progress_timeout: {args.progress_timeout_ms}ms\n"
            f"heartbeat: {{interval: {args.hung_hb_interval_ms}ms, misses: 3}}\n"
            "roles:\n"
            "  task:\n"
            f"    instances: {args.hung_tasks}\n"
            f"    command: {json.dumps(argv)}\n"
            f"    env: {{PYTHONPATH: {json.dumps(str(c.SDK_PYTHON))}}}\n"
            "    resources: {cpus: 0.01}\n")


def wait_ready(out_dir, index, not_pid, timeout=20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = c.read_json_file(out_dir / f"ready-{index}.json")
        if info and info["pid"] != not_pid and c.proc_alive(info["pid"]):
            return info
        time.sleep(0.005)
    return None


def run_hung_case(args, shoal, tmp, rng):
    timeout_us = args.progress_timeout_ms * 1000.0
    res = {"faults_requested": args.hung_faults, "tasks": args.hung_tasks,
           "progress_timeout_ms": args.progress_timeout_ms,
           "progress_period_ms": args.progress_period * 1000.0,
           "heartbeat_interval_ms": args.hung_hb_interval_ms,
           "note": ("latency_from_stop takes the SIGSTOP time as the last progress: the task "
                    "reports every progress_period_ms, so its last report was at most that much "
                    "earlier and this figure is too high by up to that much. "
                    "latency_from_last_progress uses the exact time of the last report "
                    "(the worker's step is its wall-clock time in microseconds).")}
    out_dir = tmp / "hung-out"
    out_dir.mkdir()
    job_file = tmp / "hung.yaml"
    job_file.write_text(hung_job_yaml(args, out_dir))
    job = c.ShoalJob(shoal, tmp / "jobs-hung", job_file)
    from_stop, exact, errors = [], [], []
    leftover_stopped = 0
    t_begin = time.monotonic()
    try:
        err = job.start()
        if err:
            res["error"] = err
            return res
        if job.wait_running(args.hung_tasks) is None:
            res["error"] = "the tasks did not all start within 60 s"
            return res
        ready = {}
        for i in range(args.hung_tasks):
            info = wait_ready(out_dir, i, None)
            if info is None:
                res["error"] = f"task:{i} never reported progress"
                return res
            ready[i] = info
        for n in range(args.hung_faults):
            i = rng.randrange(args.hung_tasks)
            task = f"task:{i}"
            pid = ready[i]["pid"]
            job.journal.poll()
            mark = len(job.journal.records)
            t_stop = c.now_us()
            c.kill_quietly(pid, signal.SIGSTOP)
            idx, rec = job.journal.wait_for(
                lambda r: r.get("type") == "task_hung" and r.get("task") == task,
                args.progress_timeout_ms / 1000.0 + 10, start=mark)
            if rec is None:
                errors.append(f"fault {n}: no task_hung for {task} within timeout + 10 s")
                c.kill_quietly(pid, signal.SIGCONT)
                break
            ts = c.record_us(rec)
            from_stop.append((ts - t_stop - timeout_us) / 1000.0)
            last = rec.get("last_step")
            if isinstance(last, (int, float)) and last > 1e15:
                exact.append((ts - last - timeout_us) / 1000.0)
            _, rec2 = job.journal.wait_for(lambda r: c.is_task_state(r, task, "running"), 10,
                                           start=idx + 1)
            if rec2 is None:
                errors.append(f"fault {n}: {task} not running again within 10 s")
                break
            info = wait_ready(out_dir, i, pid)
            if info is None:
                errors.append(f"fault {n}: {task}'s new process never reported progress")
                break
            if c.proc_alive(pid):  # the hung process must have been killed
                leftover_stopped += 1
                c.kill_quietly(pid)
            ready[i] = info
            if (n + 1) % 10 == 0:
                c.log(f"  hung: {n + 1}/{args.hung_faults} faults, median "
                      f"{c.median(exact or from_stop):.1f} ms")
    finally:
        left = job.stop()
    res["faults"] = len(from_stop)
    res["seconds"] = round(time.monotonic() - t_begin, 1)
    res["latency_from_stop"] = summary(from_stop)
    res["latency_from_last_progress"] = summary(exact)
    res["hung_processes_left_running"] = leftover_stopped
    res["leftover_after_stop"] = left
    if errors:
        res["errors"] = errors
    bound = args.hung_hb_interval_ms + SLACK_MS
    res["target"] = f"p99 < heartbeat interval + {SLACK_MS:g} ms = {bound:g} ms"
    basis = exact or from_stop
    res["target_met"] = None if not basis else c.p99(basis) < bound
    return res


# ------------------------------------------------------------------------- silent agent

def silent_job_yaml(args):
    return ("name: fd-silent\n"
            f"heartbeat: {{interval: {args.hb_interval_ms}ms, misses: {args.hb_misses}}}\n"
            "roles:\n"
            "  task:\n"
            '    command: ["sleep", "1000000"]\n'
            "    resources: {cpus: 0.01}\n")


def run_silent_case(args, shoal, tmp, rng):
    limit_us = args.hb_interval_ms * args.hb_misses * 1000.0
    res = {"faults_requested": args.silent_faults,
           "heartbeat": {"interval_ms": args.hb_interval_ms, "misses": args.hb_misses}}
    job_file = tmp / "silent.yaml"
    job_file.write_text(silent_job_yaml(args))
    lat, errors, outcomes = [], [], {}
    orphans, agents_left = [], 0
    t_begin = time.monotonic()
    for n in range(args.silent_faults):
        job = c.ShoalJob(shoal, tmp / f"jobs-silent-{n}", job_file)
        try:
            err = job.start()
            if err:
                errors.append(f"fault {n}: {err}")
                break
            running = job.wait_running(1)
            if running is None:
                errors.append(f"fault {n}: the task did not start within 60 s")
                continue
            task_pid = next(iter(running.values()))["pid"]
            agents = c.find_agent_pids(job.job_dir)
            if len(agents) != 1:
                errors.append(f"fault {n}: found {len(agents)} agent processes for the job")
                continue
            time.sleep(rng.uniform(0, args.hb_interval_ms / 1000.0))  # a random phase
            job.journal.poll()
            mark = len(job.journal.records)
            t_stop = c.now_us()
            c.kill_quietly(agents[0], signal.SIGSTOP)
            _, rec = job.journal.wait_for(lambda r: r.get("type") == "agent_silent",
                                          limit_us / 1e6 + 10, start=mark)
            if rec is None:
                errors.append(f"fault {n}: no agent_silent record within the limit + 10 s")
                continue
            lat.append((c.record_us(rec) - t_stop - limit_us) / 1000.0)
            fin = job.wait_finished(30)
            key = fin.get("outcome") if fin else "not finished within 30 s"
            outcomes[key] = outcomes.get(key, 0) + 1
            if fin:
                time.sleep(0.2)
                left = c.job_task_processes(job.job_id)
                if c.proc_alive(task_pid) and task_pid not in left:
                    left[task_pid] = {}
                if left:
                    orphans.append({"fault": n, "pids": sorted(left)})
                if c.proc_alive(agents[0]):
                    agents_left += 1
        finally:
            job.stop()
    res["faults"] = len(lat)
    res["seconds"] = round(time.monotonic() - t_begin, 1)
    res["latency_after_limit"] = summary(lat)
    res["note"] = ("latency = agent_silent - SIGSTOP - interval x misses; the agent's last "
                   "heartbeat came up to one interval before the stop, so values range over "
                   "about (-interval, +interval]")
    res["job_outcomes"] = outcomes
    res["task_processes_left_after_job_end"] = orphans
    res["agents_left_after_job_end"] = agents_left
    if errors:
        res["errors"] = errors
    bound = args.hb_interval_ms + SLACK_MS
    res["target"] = f"p99 < heartbeat interval + {SLACK_MS:g} ms = {bound:g} ms"
    res["target_met"] = None if not lat else c.p99(lat) < bound
    return res


# ------------------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    c.add_shoal_arg(ap)
    ap.add_argument("--cases", default="process,hung,silent",
                    help="comma-separated subset of process,hung,silent (all)")
    ap.add_argument("--faults", type=int, default=1000, help="process-exit faults (1000)")
    ap.add_argument("--tasks", type=int, default=8, help="tasks of the process-exit job (8)")
    ap.add_argument("--hung-faults", type=int, default=50, help="hung-task faults (50)")
    ap.add_argument("--hung-tasks", type=int, default=4, help="tasks of the hang job (4)")
    ap.add_argument("--progress-timeout-ms", type=int, default=500)
    ap.add_argument("--progress-period", type=float, default=0.01,
                    help="seconds between a hang-job task's progress reports (0.01)")
    ap.add_argument("--hung-hb-interval-ms", type=int, default=1000,
                    help="heartbeat interval of the hang job (1000, the default)")
    ap.add_argument("--silent-faults", type=int, default=20, help="silent-agent faults (20)")
    ap.add_argument("--hb-interval-ms", type=int, default=200)
    ap.add_argument("--hb-misses", type=int, default=3)
    ap.add_argument("--anchor-faults", type=int, default=5,
                    help="torchrun faults at its default monitor interval (5)")
    ap.add_argument("--anchor-fast-faults", type=int, default=20,
                    help="torchrun faults at --fast-interval (20)")
    ap.add_argument("--fast-interval", type=float, default=0.1)
    ap.add_argument("--no-torchrun", action="store_true", help="skip the torchrun anchor")
    ap.add_argument("--python", default=c.DEFAULT_PYTHON,
                    help=f"interpreter with torch, for torchrun (default {c.DEFAULT_PYTHON})")
    ap.add_argument("--task-python", default=sys.executable,
                    help="interpreter for the hang job's tasks (this one)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = ap.parse_args()
    cases = [x.strip() for x in args.cases.split(",") if x.strip()]
    if any(x not in ("process", "hung", "silent") for x in cases):
        ap.error("--cases takes process, hung and silent")
    if args.faults < 1 or args.tasks < 1:
        ap.error("--faults and --tasks must be >= 1")

    rng = random.Random(args.seed)
    shoal, shoal_err = c.find_shoal(args.shoal)
    result = {"benchmark": "fault_detection", "shoal": shoal, "machine": c.machine_info(),
              "seed": args.seed, "documented_anchors": c.DOCUMENTED_ANCHORS}
    if shoal_err:
        result["shoal_error"] = shoal_err
    t_all = time.monotonic()
    with c.temp_dir("shoal-bench-fd-", keep=args.keep) as tmp:
        anchors = {}
        if "process" in cases and not args.no_torchrun:
            for name, interval, k in (("torchrun_default_interval", None, args.anchor_faults),
                                      ("torchrun_fast_interval", args.fast_interval,
                                       args.anchor_fast_faults)):
                if k < 1:
                    continue
                out = tmp / name
                run = c.TorchrunRun(args.python, 2, k + 2, interval,
                                    [str(c.BENCH_DIR / "_sleep_worker.py"), str(out)], out,
                                    tmp / f"{name}.log")
                anchors[name] = {"name": name, "run": run, "faults": k,
                                 "monitor_interval_s": 5.0 if interval is None else interval,
                                 "detect_ms": [], "restart_ms": [], "start_max_ms": [],
                                 "errors": []}
            for a in anchors.values():
                c.log(f"fault_detection: starting {a['name']}")
                err = a["run"].start()
                if err:
                    a["errors"].append(err)
                    c.log(f"  {err}")
        try:
            if shoal and "process" in cases:
                c.log(f"fault_detection: process exit, {args.faults} faults")
                result["process_exit"] = run_process_case(args, shoal, tmp, rng, anchors)
            if shoal and "hung" in cases:
                c.log(f"fault_detection: hung task, {args.hung_faults} faults")
                result["hung_task"] = run_hung_case(args, shoal, tmp, rng)
            if shoal and "silent" in cases:
                c.log(f"fault_detection: silent agent, {args.silent_faults} faults")
                result["silent_agent"] = run_silent_case(args, shoal, tmp, rng)
        finally:
            for a in anchors.values():
                a["run"].stop()
        if anchors:
            result["python_startup_ms"] = c.python_startup_ms(args.python)
            anch = {}
            for name, a in anchors.items():
                entry = {"monitor_interval_s": a["monitor_interval_s"],
                         "faults": len(a["detect_ms"]),
                         "detect": summary(a["detect_ms"]),
                         "restart": summary(a["restart_ms"]),
                         "new_workers_started": summary(a["start_max_ms"])}
                if a["errors"]:
                    entry["errors"] = a["errors"]
                anch[name] = entry
            result["torchrun"] = anch
            pe = result.get("process_exit") or {}
            s_det = (pe.get("detect") or {}).get("median_ms")
            s_rst = (pe.get("kill_to_running_again") or {}).get("median_ms")
            result["ratios"] = {
                f"{name}_over_shoal_detect_median": c.ratio(
                    (e["detect"] or {}).get("median_ms"), s_det) for name, e in anch.items()}
            result["ratios"].update({
                f"{name}_over_shoal_restart_median": c.ratio(
                    (e["restart"] or {}).get("median_ms"), s_rst) for name, e in anch.items()})
            result["torchrun_note"] = (
                "torchrun detect = first elastic-agent log line showing the failure "
                "('Sending process N closing signal' / 'failed (exitcode'); restart = its "
                "'Starting worker group' line (it restarts the whole group: it has no "
                "per-task restart); new_workers_started = the later new worker's first "
                "line, which includes python_startup_ms. Shoal's restart = the task_state "
                "running record of the new attempt (process spawned).")
    result["seconds"] = round(time.monotonic() - t_all, 1)
    c.emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
