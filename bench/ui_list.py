#!/usr/bin/env python3
"""The dashboard's jobs list on a large jobs directory (issue 26): server time for the first
page of `shoal ui`'s /api/jobs with N job directories, next to `shoal list --json` on the same
directory, side by side in one run.

The directory is filled with N finished jobs shaped like real ones (spec.yaml, submit.json,
status.json with 2-8 tasks, master.json naming a dead master, events.jsonl, logs.txt), a few
of them failed or killed. Figures:
  - cold: the first request after `shoal ui` started (it builds its index then), over
    --starts fresh servers (the A/A spread of the cold figure is its min..max);
  - refresh: the first page when the index is older than its 1 s refresh interval (one
    stat per job directory, no file read for an unchanged job), --repeat times;
  - cached: the first page within the refresh interval;
  - filtered: state=failed plus a text filter, refreshed;
  - anchor: `shoal list --json` (reads every job's status), --anchor-runs times.
The server's CPU time per request is read from /proc/<pid>/stat around each request.

Usage: bench/ui_list.py [--jobs 10000] [--starts 3] [--repeat 20] [--shoal PATH]
"""

import argparse
import json
import os
import random
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as c  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")


def make_jobs(root, n):
    rng = random.Random(26)
    dead_pid = 2 ** 22 - 7  # beyond pid_max's default: never a running process
    base = 1_790_000_000_000
    for i in range(n):
        name = rng.choice(["digits-ddp", "bert-ft", "resnet", "hello", "etl"])
        job_id = f"{name}-{i:06d}-{i % 65536:04x}"
        d = root / job_id
        d.mkdir()
        state = "succeeded" if i % 10 else rng.choice(["failed", "killed"])
        ntasks = rng.choice([2, 2, 4, 8])
        created = base + i * 60_000
        tasks = [{"task": f"worker:{t}", "role": "worker", "index": t, "rank": t,
                  "state": state, "node": "local", "pid": 1000 + t, "exit_code": 0 if state == "succeeded" else 1,
                  "signal": 0, "restarts": rng.choice([0, 0, 0, 1]), "in_world": True,
                  "reason": "", "step": 112} for t in range(ntasks)]
        status = {"job_id": job_id, "name": name, "state": state,
                  "reason": "every task of the success roles exited 0" if state == "succeeded"
                  else "worker:1 exited with code 1", "created_unix_ms": created,
                  "finished_unix_ms": created + rng.randint(5_000, 900_000), "failures": [],
                  "failures_total": 0, "generation": 0, "group_restarts": 0, "master_pid": dead_pid,
                  "shards": None, "tasks": tasks, "world_size": ntasks}
        (d / "status.json").write_text(json.dumps(status, indent=2))
        (d / "spec.yaml").write_text(f"name: {name}\nroles:\n  worker:\n    instances: {ntasks}\n"
                                     "    command: python3 train.py\n")
        (d / "submit.json").write_text(json.dumps({"backend": "local", "job_id": job_id,
                                                   "base_dir": "/tmp", "source_path": "/tmp/job.yaml"}))
        (d / "master.json").write_text(json.dumps({"address": "127.0.0.1:1", "pid": dead_pid}))
        (d / "events.jsonl").write_text("".join(
            json.dumps({"type": "task_state", "task": f"worker:{t}", "to": "pending", "ts": created}) + "\n"
            for t in range(ntasks)))
        (d / "logs.txt").write_text("".join(f"worker:{t} | epoch 1/1 loss 0.1\n" for t in range(ntasks)))


def cpu_ticks(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def get(url):
    t0 = time.perf_counter()
    with urllib.request.urlopen(url, timeout=120) as r:
        body = r.read()
    return (time.perf_counter() - t0) * 1000.0, json.loads(body)


def start_ui(shoal, jobs_dir):
    port = c.free_port()
    p = subprocess.Popen([shoal, "--jobs-dir", str(jobs_dir), "ui", "--listen", f"127.0.0.1:{port}"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    p.stdout.readline()  # its address: it listens from here on
    for _ in range(100):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.05)
    return p, f"http://127.0.0.1:{port}"


def timed_requests(p, url, n, gap_s):
    times, cpu = [], []
    for _ in range(n):
        time.sleep(gap_s)
        t0 = cpu_ticks(p.pid)
        ms, body = get(url)
        cpu.append((cpu_ticks(p.pid) - t0) * 1000.0 / CLK_TCK)
        times.append(ms)
    return times, cpu, body


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--starts", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--anchor-runs", type=int, default=3)
    c.add_shoal_arg(ap)
    args = ap.parse_args()
    shoal, why = c.find_shoal(args.shoal)
    result = {"benchmark": "ui_list", "jobs": args.jobs, "machine": c.machine_info()}
    if not shoal:
        result["error"] = why
        c.emit(result)
        return 1
    with c.temp_dir("shoal-ui-list-") as root:
        c.log(f"ui_list: writing {args.jobs} job directories")
        make_jobs(root, args.jobs)
        first_page = "/api/jobs?page=1&per_page=50"
        cold = []
        for i in range(args.starts):
            # Drop the kernel's cached dentries? Not without root on every machine: "cold" here
            # is a cold server on a warm page cache, as after a restart of `shoal ui`.
            p, base = start_ui(shoal, root)
            try:
                ms, body = get(base + first_page)
                cold.append(ms)
                if i == 0:
                    result["total_listed"] = body["total"]
                    refresh, refresh_cpu, _ = timed_requests(p, base + first_page, args.repeat, 1.05)
                    cached, cached_cpu, _ = timed_requests(p, base + first_page, args.repeat, 0.0)
                    filtered, filtered_cpu, fbody = timed_requests(
                        p, base + "/api/jobs?state=failed&q=bert&page=1&per_page=50", args.repeat, 1.05)
                    result["filtered_total"] = fbody["total"]
            finally:
                p.terminate()
                p.wait()
        anchor = []
        anchor_rows = None
        for _ in range(args.anchor_runs):
            t = c.run_timed([shoal, "--jobs-dir", str(root), "list", "--json"], timeout=600)
            if not t.ok:
                result["anchor_error"] = t.describe()
                break
            anchor.append(t.ms)
            anchor_rows = len(json.loads(t.stdout))
        result["anchor_rows"] = anchor_rows
    result["first_page_cold"] = c.summary_ms(cold)
    result["first_page_refreshed"] = c.summary_ms(refresh)
    result["first_page_refreshed_server_cpu_ms"] = c.summary_ms(refresh_cpu)
    result["first_page_cached"] = c.summary_ms(cached)
    result["first_page_cached_server_cpu_ms"] = c.summary_ms(cached_cpu)
    result["filtered_refreshed"] = c.summary_ms(filtered)
    result["filtered_server_cpu_ms"] = c.summary_ms(filtered_cpu)
    result["shoal_list_json"] = c.summary_ms(anchor)
    result["target_first_page_ms"] = 300
    result["cold_over_shoal_list"] = c.ratio(c.median(cold), c.median(anchor) if anchor else None)
    result["refreshed_over_shoal_list"] = c.ratio(c.median(refresh), c.median(anchor) if anchor else None)
    c.emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
