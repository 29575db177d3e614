#!/usr/bin/env python3
"""Recovery time: from killing one rank to every rank of the new generation running again,
under on_failure: restart-group, next to torchrun's elastic agent (measured in the same run).

Two parts (each Shoal job a `shoal run --detach` in a fresh jobs dir; latencies from
time.time() just before the SIGKILL):

  trivial   --ranks (8) `sleep` tasks, restart-group, backoff 0s, max_restarts 1000000. A random
            task is killed; recovery = the last task_state `to: running` record of the new
            generation (after its group_restarted record) minus the kill; --faults (200).
            Also: kill -> failure recorded, kill -> group_restarted. Anchor: torchrun
            --nproc_per_node RANKS --monitor_interval 0.1 of bench/_sleep_worker.py, faults
            spread among Shoal's (--anchor-faults); its figure is kill -> the last new worker's
            first line minus the interpreter's start-up (python_startup_ms), and kill -> its
            "Starting worker group" log line.
  pytorch   bench/_ddp_worker.py (a self-contained DDP script: gloo, CPU, 2 ranks, synthetic
            data; it sleeps --step-sleep between steps so that idle jobs leave the CPUs to the
            one recovering) as a Shoal job (framework pytorch, restart-group, backoff 0s), and
            under torchrun with --monitor_interval 0.1 and with its default (5 s). Per round,
            in turn: one fault in each, then one failure-free start of the same two ranks by
            hand (MASTER_ADDR/PORT, RANK, WORLD_SIZE set directly, --steps 1), for --torch-faults
            rounds (10). Recovery = the later new rank's first completed training step minus the
            kill. Start-up = the same figure for the failure-free start by hand: from just
            before starting the two processes to the later one's first step (interpreter,
            import torch, process group, first step). For each mode the phases of the rank
            that was last to its first step are reported too (kill or launch -> its first line,
            import torch, process group, first step): the process-group phase varies by up to
            ~1 s from run to run whoever starts the ranks, since torch 1.13's TCPStore client
            retries its connection with a delay of up to about a second when it comes up before
            rank 0's store.

Prints one JSON object on stdout. Targets: trivial p99 < 100 ms; pytorch: Shoal's recovery
(median) <= start-up (median) + 50 ms (target_met). Because that start-up varies by up to ~1 s
between runs, also shoal_own_part_median_ms: median(kill -> the later new rank's first line)
minus median(fresh start by hand -> the later rank's first line), i.e. how much later than in
a fresh start the scripts begin, the part of the recovery Shoal controls (<= 50 ms:
shoal_own_part_within_50_ms).
"""

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as c  # noqa: E402

TRIVIAL_TARGET_MS = 100.0
TORCH_SLACK_MS = 50.0
DDP_WORKER = c.BENCH_DIR / "_ddp_worker.py"


def spread(k, n):
    slots = {}
    for j in range(k):
        i = min(n - 1, int((j + 0.5) * n / k)) if n > 0 else 0
        slots[i] = slots.get(i, 0) + 1
    return slots


# ------------------------------------------------------------------------- trivial ranks

def trivial_job_yaml(n):
    return ("name: rt-trivial\n"
            "on_failure: restart-group\n"
            "max_restarts: 1000000\n"
            "backoff: {initial: 0s}\n"
            "roles:\n"
            "  task:\n"
            f"    instances: {n}\n"
            '    command: ["sleep", "1000000"]\n'
            "    resources: {cpus: 0.01}\n")


def run_trivial(args, shoal, tmp, rng):
    res = {"ranks": args.ranks, "faults_requested": args.faults,
           "policy": "restart-group, backoff 0s"}
    job_file = tmp / "trivial.yaml"
    job_file.write_text(trivial_job_yaml(args.ranks))
    job = c.ShoalJob(shoal, tmp / "jobs-trivial", job_file)
    detect, regrouped, recovered, errors = [], [], [], []
    anchor = None
    if not args.no_torchrun and args.anchor_faults > 0:
        out = tmp / "torchrun-trivial"
        run = c.TorchrunRun(args.python, args.ranks, args.anchor_faults + 2, 0.1,
                            [str(c.BENCH_DIR / "_sleep_worker.py"), str(out)], out,
                            tmp / "torchrun-trivial.log")
        anchor = {"run": run, "start": [], "restart": [], "errors": []}
        c.log("recovery_time: starting torchrun (trivial anchor)")
        err = run.start()
        if err:
            anchor["errors"].append(err)
    slots = spread(args.anchor_faults, args.faults) if anchor else {}
    t_begin = time.monotonic()
    try:
        err = job.start()
        if err:
            res["error"] = err
            return res
        running = job.wait_running(args.ranks)
        if running is None:
            res["error"] = "the tasks did not all start within 60 s"
            return res
        pids = {k: v["pid"] for k, v in running.items()}
        names = sorted(pids)
        gen = 0
        for i in range(args.faults):
            task = rng.choice(names)
            job.journal.poll()
            mark = len(job.journal.records)
            t0 = c.now_us()
            c.kill_quietly(pids[task])
            _, rec = job.journal.wait_for(lambda r: c.is_task_state(r, task, "failed"), 10,
                                          start=mark)
            g_idx, g_rec = job.journal.wait_for(
                lambda r: r.get("type") == "group_restarted" and r.get("generation", 0) > gen,
                20, start=mark)
            if rec is None or g_rec is None:
                errors.append(f"fault {i}: no failure or no group_restarted within 20 s")
                break
            gen = g_rec["generation"]
            seen, new_pids = {}, {}
            deadline = time.monotonic() + 20
            idx = g_idx + 1
            while len(seen) < args.ranks and time.monotonic() < deadline:
                idx2, r2 = job.journal.wait_for(
                    lambda r: c.is_task_state(r, None, "running") and r["task"] not in seen,
                    max(0.0, deadline - time.monotonic()), start=idx)
                if r2 is None:
                    break
                seen[r2["task"]] = c.record_us(r2)
                new_pids[r2["task"]] = r2.get("pid")
                idx = idx2 + 1
            if len(seen) < args.ranks:
                errors.append(f"fault {i}: only {len(seen)} of {args.ranks} running again")
                break
            detect.append((c.record_us(rec) - t0) / 1000.0)
            regrouped.append((c.record_us(g_rec) - t0) / 1000.0)
            recovered.append((max(seen.values()) - t0) / 1000.0)
            old = set(pids.values())
            deadline = time.monotonic() + 10
            if all(new_pids.get(t) and new_pids[t] not in old for t in names):
                pids = dict(new_pids)  # newer journals carry the pid in `running` records
                deadline = 0
            while time.monotonic() < deadline:
                tasks = job.tasks() or {}
                if len(tasks) == args.ranks and all(
                        t["state"] == "running" and t["pid"] and t["pid"] not in old
                        for t in tasks.values()):
                    pids = {k: v["pid"] for k, v in tasks.items()}
                    break
                time.sleep(0.005)
            else:
                if deadline:
                    errors.append(f"fault {i}: shoal status never showed the new pids")
                    break
            for _ in range(slots.get(i, 0)):
                r = anchor["run"].fault(rng.randrange(args.ranks)) if not anchor["run"].error \
                    else {"error": anchor["run"].error}
                if "error" in r:
                    anchor["errors"].append(r["error"])
                    continue
                anchor["start"].append(r["start_max_ms"])
                if r.get("restart_ms") is not None:
                    anchor["restart"].append(r["restart_ms"])
                c.log(f"  torchrun: restart {r['restart_ms']} ms, workers up "
                      f"{r['start_max_ms']:.1f} ms")
            if (i + 1) % 50 == 0:
                c.log(f"  trivial: {i + 1}/{args.faults} faults, median "
                      f"{c.median(recovered):.1f} ms")
    finally:
        left = job.stop()
        if anchor:
            anchor["run"].stop()
    res["faults"] = len(recovered)
    res["seconds"] = round(time.monotonic() - t_begin, 1)
    res["kill_to_failure_recorded"] = c.summary_ms(detect)
    res["kill_to_group_restarted"] = c.summary_ms(regrouped)
    res["kill_to_all_running"] = c.summary_ms(recovered)
    res["leftover_after_stop"] = left
    if errors:
        res["errors"] = errors
    res["target"] = f"kill_to_all_running p99 < {TRIVIAL_TARGET_MS:g} ms"
    res["target_met"] = None if not recovered else c.p99(recovered) < TRIVIAL_TARGET_MS
    if anchor:
        startup = c.python_startup_ms(args.python)
        spawned = [s - startup for s in anchor["start"]] if startup is not None else []
        a = {"monitor_interval_s": 0.1, "faults": len(anchor["start"]),
             "python_startup_ms": startup,
             "kill_to_starting_worker_group_log": c.summary_ms(anchor["restart"]),
             "kill_to_all_new_workers_first_line": c.summary_ms(anchor["start"]),
             "kill_to_all_new_workers_spawned_est": c.summary_ms(spawned),
             "note": "spawned_est = first line minus the median python start-up"}
        if anchor["errors"]:
            a["errors"] = anchor["errors"]
        res["torchrun"] = a
        res["ratio_torchrun_over_shoal_median"] = c.ratio(
            (a["kill_to_all_new_workers_spawned_est"] or {}).get("median_ms"),
            (res["kill_to_all_running"] or {}).get("median_ms"))
    return res


# ------------------------------------------------------------------------- pytorch

def ddp_argv(args, out, steps=0):
    argv = [args.python, str(DDP_WORKER), "--out", str(out), "--step-sleep",
            str(args.step_sleep)]
    if steps:
        argv += ["--steps", str(steps)]
    return argv


def torch_job_yaml(args, out):
    return ("name: rt-ddp\n"
            "framework: pytorch\n"
            "on_failure: restart-group\n"
            "max_restarts: 1000\n"
            "backoff: {initial: 0s}\n"
            "roles:\n"
            "  worker:\n"
            "    instances: 2\n"
            f"    command: {json.dumps(ddp_argv(args, out))}\n"
            f"    env: {{OMP_NUM_THREADS: \"1\", PYTHONPATH: {json.dumps(str(c.SDK_PYTHON))}}}\n"
            "    resources: {cpus: 0.5}\n")


def hand_startup(args, out, timeout=120):
    """Two ranks started by hand with --steps 1; ms from before the first Popen to the later
    first step, plus the phases of the later rank. None on failure."""
    port = c.free_port()
    for p in out.glob("w-g0-r*.json"):
        p.unlink()
    procs = []
    t0 = time.time()
    for rank in range(2):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                   WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                   OMP_NUM_THREADS="1")
        env.pop("SHOAL_GENERATION", None)
        env.pop("TORCHELASTIC_RESTART_COUNT", None)
        procs.append(subprocess.Popen(ddp_argv(args, out, steps=1), env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                      start_new_session=True))
    try:
        for p in procs:
            p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        for p in procs:
            c.kill_quietly(p.pid)
            p.wait()
        return None
    found = c.read_generation(out, 0)
    if len(found) < 2:
        return None
    last = max(found.values(), key=lambda i: i["t_first_step"])
    return {"startup_ms": (last["t_first_step"] - t0) * 1000.0,
            "script_start_ms": (max(i["t_start"] for i in found.values()) - t0) * 1000.0,
            "phases": c.worker_phases_ms(t0 * 1e6, found)}


def shoal_torch_fault(job, out, gen, rng, timeout=120):
    cur = c.read_generation(out, gen)
    if len(cur) < 2:
        return {"error": f"generation {gen} incomplete: ranks {sorted(cur)}"}
    rank = rng.randrange(2)
    job.journal.poll()
    mark = len(job.journal.records)
    t0 = c.now_us()
    c.kill_quietly(cur[rank]["pid"])
    new = c.wait_generation(out, gen + 1, 2, timeout)
    if new is None:
        return {"error": f"generation {gen + 1} did not reach its first step within {timeout} s"}
    recs = job.journal.find(lambda r: True, start=mark)
    fail = next((r for _, r in recs if c.is_task_state(r, None, "failed")), None)
    grp = next((r for _, r in recs if r.get("type") == "group_restarted"), None)
    last_first = max(i["t_first_step"] for i in new.values())
    return {"t0_us": t0, "new": new,
            "detect_ms": None if fail is None else (c.record_us(fail) - t0) / 1000.0,
            "group_restarted_ms": None if grp is None else (c.record_us(grp) - t0) / 1000.0,
            "first_step_max_ms": (last_first * 1e6 - t0) / 1000.0,
            "start_max_ms": (max(i["t_start"] for i in new.values()) * 1e6 - t0) / 1000.0}


def run_torch(args, shoal, tmp, rng):
    res = {"faults_requested": args.torch_faults, "world_size": 2, "python": args.python,
           "worker": str(DDP_WORKER), "step_sleep_s": args.step_sleep,
           "policy": "restart-group, backoff 0s"}
    modes = {}
    if shoal:
        out = tmp / "ddp-shoal"
        out.mkdir()
        job_file = tmp / "ddp.yaml"
        job_file.write_text(torch_job_yaml(args, out))
        modes["shoal"] = {"out": out, "job": c.ShoalJob(shoal, tmp / "jobs-ddp", job_file),
                          "gen": 0}
    if not args.no_torchrun:
        for name, interval in (("torchrun_fast_interval", 0.1),
                               ("torchrun_default_interval", None)):
            out = tmp / f"ddp-{name}"
            run = c.TorchrunRun(args.python, 2, args.torch_faults + 2, interval,
                                ddp_argv(args, out)[1:], out, tmp / f"ddp-{name}.log",
                                env=dict(os.environ, OMP_NUM_THREADS="1"))
            modes[name] = {"out": out, "run": run,
                           "monitor_interval_s": 5.0 if interval is None else interval}
    for m in modes.values():
        m.update({"first_step": [], "detect": [], "restart": [], "start": [], "errors": [],
                  "phases": []})
    hand_out = tmp / "ddp-hand"
    hand_out.mkdir()
    hand = []
    t_begin = time.monotonic()
    try:
        if "shoal" in modes:
            m = modes["shoal"]
            c.log("recovery_time: starting the Shoal DDP job")
            t0 = time.time()
            err = m["job"].start()
            first = None if err else c.wait_generation(m["out"], 0, 2, 120)
            if err or first is None:
                m["errors"].append(err or "the job's ranks did not reach a first step in 120 s")
                del modes["shoal"]
                res["shoal_error"] = m["errors"][-1]
            else:
                res["shoal_initial_launch_ms"] = round(
                    (max(i["t_first_step"] for i in first.values()) - t0) * 1000.0, 1)
        for name in [n for n in modes if n != "shoal"]:
            c.log(f"recovery_time: starting {name}")
            err = modes[name]["run"].start()
            if err:
                modes[name]["errors"].append(err)
        for i in range(args.torch_faults):
            for name, m in modes.items():
                if name == "shoal":
                    r = shoal_torch_fault(m["job"], m["out"], m["gen"], rng)
                    if "error" not in r:
                        m["gen"] += 1
                elif m["run"].error:
                    continue
                else:
                    r = m["run"].fault(rng.randrange(2))
                if "error" in r:
                    m["errors"].append(r["error"])
                    c.log(f"  {name}: {r['error']}")
                    continue
                m["first_step"].append(r["first_step_max_ms"])
                m["phases"].append(c.worker_phases_ms(r["t0_us"], r["new"]))
                m["start"].append(r["start_max_ms"])
                if r.get("detect_ms") is not None:
                    m["detect"].append(r["detect_ms"])
                rk = "group_restarted_ms" if name == "shoal" else "restart_ms"
                if r.get(rk) is not None:
                    m["restart"].append(r[rk])
                c.log(f"  round {i + 1}: {name}: all ranks at first step "
                      f"{r['first_step_max_ms']:.0f} ms after the kill")
            h = hand_startup(args, hand_out)
            if h is None:
                c.log("  hand start-up failed")
            else:
                hand.append(h)
                c.log(f"  round {i + 1}: by hand: start-up {h['startup_ms']:.0f} ms")
    finally:
        if "shoal" in modes:
            res["shoal_leftover_after_stop"] = modes["shoal"]["job"].stop()
        for name, m in modes.items():
            if name != "shoal":
                m["run"].stop()
    res["seconds"] = round(time.monotonic() - t_begin, 1)
    startup = [h["startup_ms"] for h in hand]
    res["startup_by_hand"] = c.summary_ms(startup)
    res["startup_by_hand_phases_median_ms"] = c.median_phases([h["phases"] for h in hand])
    res["startup_by_hand_to_all_scripts_started"] = c.summary_ms(
        [h["script_start_ms"] for h in hand])
    st_med = c.median(startup) if startup else None
    for name, m in modes.items():
        e = {"faults": len(m["first_step"]),
             "kill_to_all_ranks_first_step": c.summary_ms(m["first_step"]),
             "kill_to_all_ranks_script_start": c.summary_ms(m["start"]),
             "kill_to_failure_seen": c.summary_ms(m["detect"]),
             "later_rank_phases_median_ms": c.median_phases(m["phases"]),
             ("kill_to_group_restarted" if name == "shoal" else
              "kill_to_starting_worker_group_log"): c.summary_ms(m["restart"])}
        if name != "shoal":
            e["monitor_interval_s"] = m["monitor_interval_s"]
        if st_med is not None and m["first_step"]:
            e["recovery_minus_startup_median_ms"] = round(c.median(m["first_step"]) - st_med, 1)
        if m["errors"]:
            e["errors"] = m["errors"]
        res[name] = e
    sh = (res.get("shoal") or {}).get("kill_to_all_ranks_first_step") or {}
    for name in modes:
        if name != "shoal":
            tr = (res[name].get("kill_to_all_ranks_first_step") or {})
            res[f"ratio_{name}_over_shoal_median"] = c.ratio(tr.get("median_ms"),
                                                             sh.get("median_ms"))
    res["target"] = (f"Shoal's kill_to_all_ranks_first_step median <= start-up median + "
                     f"{TORCH_SLACK_MS:g} ms")
    res["target_met"] = None if (st_med is None or not sh) else \
        sh["median_ms"] <= st_med + TORCH_SLACK_MS
    # The part Shoal controls: how much later than in a fresh start the new ranks' scripts
    # begin (detection, stopping the survivor, relaunch; the interpreter's own start-up is in
    # both). The rest of the recovery is the script's own start-up, which varies by up to ~1 s
    # here (see the TCPStore note in the docstring).
    sh_start = (res.get("shoal") or {}).get("kill_to_all_ranks_script_start") or {}
    hd_start = res.get("startup_by_hand_to_all_scripts_started") or {}
    if sh_start and hd_start:
        own = round(sh_start["median_ms"] - hd_start["median_ms"], 1)
        res["shoal_own_part_median_ms"] = own
        res["shoal_own_part_within_50_ms"] = own <= TORCH_SLACK_MS
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    c.add_shoal_arg(ap)
    ap.add_argument("--parts", default="trivial,pytorch", help="trivial,pytorch (both)")
    ap.add_argument("--ranks", type=int, default=8, help="trivial ranks (8)")
    ap.add_argument("--faults", type=int, default=200, help="trivial faults (200)")
    ap.add_argument("--anchor-faults", type=int, default=20,
                    help="torchrun faults for the trivial part (20)")
    ap.add_argument("--torch-faults", type=int, default=10, help="pytorch rounds (10)")
    ap.add_argument("--step-sleep", type=float, default=0.2,
                    help="seconds the DDP worker sleeps after each step (0.2)")
    ap.add_argument("--no-torchrun", action="store_true", help="skip the torchrun anchors")
    ap.add_argument("--python", default=c.DEFAULT_PYTHON,
                    help=f"interpreter with torch (default {c.DEFAULT_PYTHON})")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = ap.parse_args()
    parts = [x.strip() for x in args.parts.split(",") if x.strip()]
    if any(p not in ("trivial", "pytorch") for p in parts):
        ap.error("--parts takes trivial and pytorch")
    rng = random.Random(args.seed)
    shoal, shoal_err = c.find_shoal(args.shoal)
    result = {"benchmark": "recovery_time", "shoal": shoal, "machine": c.machine_info(),
              "seed": args.seed}
    if shoal_err:
        result["shoal_error"] = shoal_err
    t_all = time.monotonic()
    with c.temp_dir("shoal-bench-rt-", keep=args.keep) as tmp:
        if shoal and "trivial" in parts:
            c.log(f"recovery_time: trivial, {args.ranks} ranks, {args.faults} faults")
            result["trivial"] = run_trivial(args, shoal, tmp, rng)
        if "pytorch" in parts:
            c.log(f"recovery_time: pytorch, {args.torch_faults} rounds")
            result["pytorch"] = run_torch(args, shoal, tmp, rng)
    result["seconds"] = round(time.monotonic() - t_all, 1)
    c.emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
