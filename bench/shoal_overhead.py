#!/usr/bin/env python3
"""Shoal's own cost while a job trains: the CPU time of Shoal's processes per second of
training, as a percentage of one core, next to the training processes' own CPU.

For each worker count (--workers, default 2,8), --reps times, `shoal run --jobs-dir DIR
job.yaml` runs the demo's training (examples/pytorch-ddp/train.py, unchanged) from a
generated job:
  2 workers  exactly the demo's job.yaml (framework pytorch, role `worker`, 2 instances,
             cpus 1, memory 2GiB) with --epochs E (--epochs, 300) instead of 10, so that the
             training lasts long enough for /proc's 10 ms ticks to resolve 0.1 %
  8 workers  the same training with 8 instances of cpus 0.25, memory 1GiB (8 x 0.25 fits a
             2-core machine; other counts share the cores alike), --epochs E8 (--epochs-8, 300)
The training window is read from the job's own output as the client prints it: from rank 0's
`epoch 1/E` line (the first epoch is train.py's warmup too) to its `epoch E/E` line, i.e. the
steps train.py averages its mean_step_ms over. The lines reach the client up to the agent's
output batching (SHOAL_AGENT_LOG_FLUSH_MS, 200 ms) late, alike at both ends, so the window's
length is known to about 0.25 s: ~1 % of the ~20 s windows of the defaults (a run whose window
is under 5 s says so in `warning`). At each end the driver reads
/proc/<pid>/stat of every process of the job once (nothing is sampled in between, so nothing
is perturbed but by the driver's own reading of the client's output, which someone always
does). Which processes are whose, found by walking /proc from the client, the master
(master.json) and the job's agents:
  Shoal    the client (`shoal run`), the master (`shoal master`), the agent(s)
           (`shoal agent`) and their helpers (`shoal agent-watchdog`): each process's
           utime+stime plus cutime+cstime (children it reaped within the window: a helper
           Shoal started and reaped then; the tasks do not exit inside the window, which is
           checked: `task_exited_in_window`).
  demo     the task processes (the environment carries SHOAL_JOB_ID and SHOAL_GENERATION)
           and anything they started, self + reaped children.
A Shoal process that appeared during the window is counted from its start (its whole CPU).
Two clocks, both reported:
  ticks    utime+stime(+cutime+cstime) of /proc/<pid>/stat: complete (threads that ended and
           children reaped in the window are in it) but in 1/SC_CLK_TCK s (10 ms) steps;
           `resolution_percent` is one tick per process over the window. The headline figure.
  ns       the sum over each process's threads of /proc/<pid>/task/<tid>/schedstat's runtime:
           exact, but a thread that ended inside the window is missing (`*_threads_ns` keys;
           `threads_ended_in_window` says whether any did: Shoal's processes end none in a
           steady window, the demo's torch does); a short window (a smoke run) resolves
           only with this one.

Also measured, in this process: the cost of one `shoal.progress(step)` call with a progress
board, which is what the demo pays per step inside its own loop (counted in the demo's CPU
above, not Shoal's).

What of Shoal runs in a task's data path (sdk/python/shoal; docs/sdk-protocol.md). The SDK
talks only to its node's agent over a Unix stream socket (SHOAL_AGENT_SOCKET), one connection
per process, opened on first use; the agent answers or relays to the master over gRPC:
  progress(step)          every step. With SHOAL_PROGRESS_FILE (the agent always makes one
                          unless it cannot) three stores into a shared 64-byte mmap: no
                          syscall, no socket, wakes no one; the agent reads it when it builds
                          its heartbeat (1/s) or a watchdog is due. Without a board: one
                          fire-and-forget `send` of ~60 bytes per call.
  Checkpointer.save       per checkpoint: the user's own storage I/O (local file + fsync, or
                          WebHDFS), then `checkpointed`: one fire-and-forget `send`.
  Checkpointer.load_latest  once per (re)start: `resumed`, one request/reply round trip
                          (the agent relays it to the master).
  shards()/lease(), Shard.done  per data shard: one round trip each (agent -> master ->
                          agent); `retry_ms` replies make the caller sleep and ask again.
  env.*                   reads environment variables only.
  task output             stdout/stderr are pipes the agent drains (a task writing faster
                          than the agent reads blocks on the full pipe; bench/output_flood.py).
The demo calls progress() every step and nothing else of the SDK (its job file has no
`checkpoint` section, so no Checkpointer is made).

Prints one JSON object on stdout. Target: Shoal's processes together <= 0.5 % of one core
(`target_met`, for every worker count's median).
"""

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as c  # noqa: E402

TRAIN = c.DEMO_DIR / "train.py"
TARGET_PERCENT = 0.5
MIN_WINDOW_S = 5.0
CLK_TCK = os.sysconf("SC_CLK_TCK")


def job_yaml(python, workers, epochs):
    """The demo's job (2 workers) or the same training with `workers` workers that share the
    machine's cores (8 x 0.25 on 2 cores)."""
    argv = json.dumps([python, str(TRAIN), "--epochs", str(epochs)])
    cpus = min(1.0, int(100 * len(os.sched_getaffinity(0)) / workers) / 100)
    resources = ("{cpus: 1, memory: 2GiB}" if workers == 2
                 else f"{{cpus: {cpus:g}, memory: 1GiB}}")
    return (f"name: overhead-{workers}w\n"
            "framework: pytorch\n"
            "roles:\n"
            "  worker:\n"
            f"    instances: {workers}\n"
            f"    command: {argv}\n"
            f"    resources: {resources}\n")


# ------------------------------------------------------------------------------- /proc

def read_stat(pid):
    """(ppid, starttime, utime+stime, cutime+cstime) in ticks, or None when gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    rest = text.rsplit(")", 1)[-1].split()
    # rest[0] is field 3 (state): utime is field 14, stime 15, cutime 16, cstime 17, start 22.
    if rest[0] == "Z":
        return None
    return (int(rest[1]), int(rest[19]), int(rest[11]) + int(rest[12]),
            int(rest[13]) + int(rest[14]))


def process_tree():
    """{pid: ppid} of every live process."""
    tree = {}
    for pid in c.all_pids():
        st = read_stat(pid)
        if st is not None:
            tree[pid] = st[0]
    return tree


def descendants(tree, roots):
    children = {}
    for pid, ppid in tree.items():
        children.setdefault(ppid, []).append(pid)
    seen, todo = set(), [r for r in roots if r in tree]
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        todo.extend(children.get(pid, []))
    return seen


def is_task(pid):
    env = c.proc_environ(pid) or {}
    return "SHOAL_JOB_ID" in env and "SHOAL_GENERATION" in env


def classify(client_pid, job_dir):
    """{pid: kind}: kind is "client", "master", "agent", another `shoal` subcommand's name
    (a helper such as agent-watchdog), or "demo" for the task processes and what they started.
    Roots: the client, the master of master.json and the job's agents, in case a build
    starts them outside the client's tree."""
    tree = process_tree()
    roots = [client_pid]
    master = c.read_json_file(Path(job_dir) / "master.json") if job_dir else None
    if master and master.get("pid"):
        roots.append(int(master["pid"]))
    if job_dir:
        roots += c.find_agent_pids(job_dir)
    job = descendants(tree, roots)
    tasks = {p for p in job if is_task(p)}
    demo = descendants(tree, tasks)
    kinds = {}
    for pid in job:
        if pid in demo:
            kinds[pid] = "demo"
        elif pid == client_pid:
            kinds[pid] = "client"
        else:
            argv = c.proc_cmdline(pid) or []
            kinds[pid] = argv[1] if len(argv) > 1 and not argv[1].startswith("-") else (
                Path(argv[0]).name if argv else "unknown")
    return kinds


def thread_ns(pid):
    """{tid: nanoseconds on a CPU} of the process's live threads (/proc/PID/task/*/schedstat,
    the scheduler's exact runtime; threads that already exited are not in it)."""
    out = {}
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    out[int(tid)] = int(f.read().split()[0])
    return out


def snapshot(pids):
    """{pid: (starttime, self ticks, children ticks, {tid: ns})} of those still alive."""
    out = {}
    for pid in pids:
        st = read_stat(pid)
        if st is not None:
            out[pid] = st[1:] + (thread_ns(pid),)
    return out


def window_cpu(kinds_start, snap_start, kinds_end, snap_end):
    """CPU ticks per kind over the window, {kind: {"self": t, "children": t}}, plus the
    set of demo pids that exited within it."""
    per_kind = {}
    for pid, kind in kinds_end.items():
        end = snap_end.get(pid)
        if end is None:
            continue
        start = snap_start.get(pid)
        if start is not None and start[0] != end[0]:
            start = None  # a reused pid: a new process
        d_self = end[1] - (start[1] if start else 0)
        d_children = end[2] - (start[2] if start else 0)
        threads_before = start[3] if start else {}
        d_ns = sum(ns - threads_before.get(tid, 0) for tid, ns in end[3].items())
        k = per_kind.setdefault(kind, {"self": 0, "children": 0, "ns": 0, "processes": 0,
                                       "threads_ended": 0})
        k["threads_ended"] += len(set(threads_before) - set(end[3]))
        k["self"] += d_self
        k["children"] += d_children
        k["ns"] += d_ns
        k["processes"] += 1
    # A Shoal process that exited within the window is in its (Shoal) parent's children ticks.
    exited_demo = [pid for pid, kind in kinds_start.items()
                   if kind == "demo" and pid in snap_start and pid not in snap_end]
    return per_kind, exited_demo


# ------------------------------------------------------------------------------- one run

def cleanup(jobs_dir):
    """After a run that did not end by itself: SIGKILL whatever of its job is left (the master
    and agents run in sessions of their own, out of reach of the client's group)."""
    for job_dir in Path(jobs_dir).glob("*/"):
        job_id = job_dir.name
        master = c.read_json_file(job_dir / "master.json") or {}
        pids = list(c.job_task_processes(job_id)) + c.find_agent_pids(job_dir)
        if master.get("pid") and c.proc_alive(master["pid"]):
            cmd = c.proc_cmdline(master["pid"]) or []
            if len(cmd) > 1 and cmd[1] == "master":
                pids.append(master["pid"])
        for pid in pids:
            c.kill_quietly(pid)


# Rank 0's lines as the client prints them (the prefix may be padded to the longest task name).
EPOCH_RE = re.compile(r"^worker:0 +\| epoch (\d+)/(\d+) ")
METRIC_RE = re.compile(r"^worker:0 +\| (\{.*\"metric\".*)$")


def run_once(shoal, python, workers, epochs, tmp, timeout):
    """One `shoal run`; returns the figures of its training window, or {"error": ...}."""
    jobs_dir = Path(tempfile.mkdtemp(prefix=f"jobs-{workers}w-", dir=tmp))
    job = jobs_dir.parent / f"overhead-{workers}w.yaml"
    job.write_text(job_yaml(python, workers, epochs))
    argv = [shoal, "--jobs-dir", str(jobs_dir), "run", str(job)]
    t_launch = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            bufsize=1, start_new_session=True)
    killer = threading.Timer(timeout, lambda: c.kill_quietly(-proc.pid))
    killer.start()
    start = end = None
    lines = []
    metric = None
    try:
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            m = EPOCH_RE.match(line)
            if m and start is None and int(m.group(1)) == 1:
                job_dirs = [p.parent for p in jobs_dir.glob("*/master.json")]
                kinds = classify(proc.pid, job_dirs[0] if job_dirs else None)
                t0 = time.monotonic()
                snap = snapshot(kinds)
                start = (t0 + time.monotonic()) / 2, kinds, snap, len(lines)
            elif m and start is not None and end is None and int(m.group(1)) == int(m.group(2)):
                t1 = time.monotonic()
                snap = snapshot(start[1])
                end_t = (t1 + time.monotonic()) / 2
                job_dirs = [p.parent for p in jobs_dir.glob("*/master.json")]
                kinds_end = classify(proc.pid, job_dirs[0] if job_dirs else None)
                # Processes that appeared during the window: read them now (counted whole).
                new = {p: k for p, k in kinds_end.items() if p not in start[1]}
                snap.update(snapshot(new))
                end = end_t, dict(start[1], **new), snap, len(lines)
            elif METRIC_RE.match(line):
                with contextlib.suppress(ValueError):
                    metric = json.loads(METRIC_RE.match(line).group(1))
        rc = proc.wait()
    finally:
        killer.cancel()
        c.kill_quietly(-proc.pid)
        cleanup(jobs_dir)
    wall_s = time.monotonic() - t_launch
    if rc != 0 or start is None or end is None:
        return {"error": f"shoal run exited {rc} after {wall_s:.1f} s"
                         + ("" if start else "; no `epoch 1/E` line from worker:0")
                         + ("" if end else "; no last epoch line")
                         + ": " + " / ".join(lines[-5:])}
    window_s = end[0] - start[0]
    ticks, exited = window_cpu(start[1], start[2], end[1], end[2])
    sec = lambda t: t / CLK_TCK
    pct = lambda t: round(100.0 * sec(t) / window_s, 4)
    shoal_kinds = {k: v for k, v in ticks.items() if k != "demo"}
    shoal_ticks = sum(v["self"] + v["children"] for v in shoal_kinds.values())
    shoal_ns = sum(v["ns"] for v in shoal_kinds.values())
    pct_ns = lambda ns: round(100.0 * ns / 1e9 / window_s, 4)
    demo = ticks.get("demo", {"self": 0, "children": 0, "processes": 0})
    demo_ticks = demo["self"] + demo["children"]
    steps = (metric or {}).get("steps")
    n_shoal_procs = sum(v["processes"] for v in shoal_kinds.values())
    out = {
        "window_s": round(window_s, 3),
        "run_wall_s": round(wall_s, 3),
        "shoal_percent_of_one_core": pct(shoal_ticks),
        "shoal_cpu_s": round(sec(shoal_ticks), 3),
        "shoal_percent_of_one_core_threads_ns": pct_ns(shoal_ns),
        "per_process_kind": {
            k: {"percent_of_one_core": pct(v["self"] + v["children"]),
                "percent_of_one_core_threads_ns": pct_ns(v["ns"]),
                "cpu_s": round(sec(v["self"] + v["children"]), 3),
                "reaped_children_cpu_s": round(sec(v["children"]), 3),
                "threads_ended_in_window": v["threads_ended"],
                "processes": v["processes"]}
            for k, v in sorted(shoal_kinds.items())},
        "demo_percent_of_one_core": pct(demo_ticks),
        "demo_percent_of_one_core_threads_ns": pct_ns(demo.get("ns", 0)),
        "demo_cpu_s": round(sec(demo_ticks), 3),
        "demo_processes": demo["processes"],
        "demo_threads_ended_in_window": demo.get("threads_ended", 0),
        "shoal_over_demo_cpu": c.ratio(shoal_ticks, demo_ticks),
        "resolution_percent": round(100.0 * n_shoal_procs / CLK_TCK / window_s, 4),
        "rank0_steps_in_window": steps,
        "rank0_mean_step_ms": (metric or {}).get("mean_step_ms"),
        "shoal_cpu_us_per_step": (None if not steps
                                  else round(1e6 * sec(shoal_ticks) / steps, 1)),
        "job_output_lines_per_s": round((end[3] - start[3]) / window_s, 1),
        "task_exited_in_window": exited,
    }
    if window_s < MIN_WINDOW_S:
        out["warning"] = (f"a window of {window_s:.2f} s: its ends are known to ~0.25 s (output "
                          f"batching), more --epochs make it longer")
    return out


def progress_call_us(reps=200000):
    """Microseconds of one shoal.progress(step) with a progress board (what the demo pays per
    step), measured here on a board made like the agent's; None when the SDK is missing."""
    sys.path.insert(0, str(c.SDK_PYTHON))
    try:
        import shoal
        from shoal import _client
    except ImportError:
        return None
    with tempfile.NamedTemporaryFile(prefix="shoal-board-") as f:
        f.write(b"SHOALPG1" + b"\0" * 56)
        f.flush()
        saved = os.environ.get("SHOAL_PROGRESS_FILE")
        os.environ["SHOAL_PROGRESS_FILE"] = f.name
        try:
            _client.reset()
            shoal.progress(0)
            t0 = time.perf_counter()
            for step in range(reps):
                shoal.progress(step)
            dt = time.perf_counter() - t0
        finally:
            if saved is None:
                os.environ.pop("SHOAL_PROGRESS_FILE", None)
            else:
                os.environ["SHOAL_PROGRESS_FILE"] = saved
            _client.reset()
    return round(1e6 * dt / reps, 3)


def describe_run(r):
    kinds = ", ".join(f"{k} {v['percent_of_one_core']:.3f}"
                      for k, v in r["per_process_kind"].items())
    return (f"window {r['window_s']:.1f} s: shoal {r['shoal_percent_of_one_core']:.3f} % of "
            f"one core ({kinds}; threads' ns: "
            f"{r['shoal_percent_of_one_core_threads_ns']:.3f} %), "
            f"demo {r['demo_percent_of_one_core']:.1f} %")


def summarize(runs):
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return {"runs": runs, "error": runs[-1]["error"] if runs else "no run"}
    med = lambda key: round(c.median([r[key] for r in ok]), 4)
    kinds = sorted({k for r in ok for k in r["per_process_kind"]})
    return {
        "shoal_percent_of_one_core_median": med("shoal_percent_of_one_core"),
        "shoal_percent_of_one_core_threads_ns_median":
            med("shoal_percent_of_one_core_threads_ns"),
        "demo_percent_of_one_core_median": med("demo_percent_of_one_core"),
        "per_process_kind_percent_median": {
            k: round(c.median([r["per_process_kind"].get(k, {}).get("percent_of_one_core", 0)
                               for r in ok]), 4) for k in kinds},
        "window_s_median": med("window_s"),
        "target_met": med("shoal_percent_of_one_core") <= TARGET_PERCENT,
        "runs": runs,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    c.add_shoal_arg(ap)
    ap.add_argument("--workers", default="2,8", help="comma-separated worker counts (2,8)")
    ap.add_argument("--epochs", type=int, default=300,
                    help="train.py --epochs for 2 workers (300: a window of ~15-30 s here)")
    ap.add_argument("--epochs-8", type=int, default=300,
                    help="train.py --epochs for any other worker count (300)")
    ap.add_argument("--reps", type=int, default=1, help="runs per worker count (1)")
    ap.add_argument("--python", default=c.DEFAULT_PYTHON,
                    help="the tasks' interpreter (Debian's, with python3-torch)")
    ap.add_argument("--timeout", type=float, default=300, help="per-run limit, s (300)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary jobs dirs")
    args = ap.parse_args()
    try:
        workers = [int(w) for w in args.workers.split(",") if w.strip()]
    except ValueError:
        ap.error(f"--workers wants a list like 2,8, got {args.workers!r}")
    if not workers or any(w < 1 for w in workers) or args.reps < 1:
        ap.error("--workers values and --reps must be >= 1")
    if args.epochs < 2 or args.epochs_8 < 2:
        ap.error("--epochs and --epochs-8 must be >= 2 (the window starts after epoch 1)")

    shoal, shoal_err = c.find_shoal(args.shoal)
    result = {
        "benchmark": "shoal_overhead",
        "shoal": shoal,
        "machine": c.machine_info(),
        "clock_ticks_per_s": CLK_TCK,
        "target": f"Shoal's processes (client, master, agents, helpers) <= "
                  f"{TARGET_PERCENT:g} % of one core while the job trains",
        "results": {},
        "target_met": None,
    }
    if shoal_err:
        result["error"] = shoal_err
        c.emit(result)
        return 1
    with c.temp_dir("shoal-bench-overhead-", keep=args.keep) as tmp:
        for w in workers:
            epochs = args.epochs if w == 2 else args.epochs_8
            runs = []
            for rep in range(args.reps):
                c.log(f"shoal_overhead: {w} workers, {epochs} epochs, run {rep + 1}/{args.reps}")
                r = run_once(shoal, args.python, w, epochs, tmp, args.timeout)
                runs.append(r)
                c.log("  " + (r["error"] if "error" in r else describe_run(r)))
            result["results"][str(w)] = dict(summarize(runs), workers=w, epochs=epochs)
    result["sdk_progress_call_us"] = progress_call_us()
    met = [r.get("target_met") for r in result["results"].values()]
    result["target_met"] = None if not met or None in met else all(met)
    result["data_path"] = {
        "progress": "every step: 3 stores into the mmap'd progress board (no syscall, no "
                    "socket); without a board one fire-and-forget send on the agent socket",
        "Checkpointer.save": "per checkpoint: the storage write, then one fire-and-forget "
                             "send (`checkpointed`)",
        "Checkpointer.load_latest": "per (re)start: one round trip (`resumed`, relayed to "
                                    "the master)",
        "lease/shards, Shard.done": "per data shard: one round trip each (agent relays to "
                                    "the master)",
        "task output": "stdout/stderr are pipes the agent drains",
        "demo_uses": "progress() every step only",
    }
    c.emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
