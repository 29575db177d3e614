#!/usr/bin/env python3
"""The dashboard's job page on a big job (issue 26): a 64-task job whose logs.txt holds 1 million
lines (~45 MB). Measured side by side in one run:
  - the server's answer for the log panel's first page (the last 200 lines), for one task's
    last 200 lines (a filtered scan), and for the job (status of 64 tasks) and its timeline;
  - the UI server's memory (VmRSS and its peak VmHWM from /proc) after serving them: the log
    is read in bounded pieces, never whole;
  - with --browser (needs Playwright: run with /var/cache/shoal/venvs/browser/bin/python):
    time to first paint of log lines in Debian's chromium, from navigation to the first line
    in the page;
  - the anchor: `tail -n 1000` of the same file.

Usage: bench/ui_logs.py [--lines 1000000] [--tasks 64] [--repeat 10] [--browser] [--shoal PATH]
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


def make_job(jobs, tasks, lines):
    job_id = f"big-20261205-000000-{tasks:04x}"
    d = jobs / job_id
    d.mkdir(parents=True)
    created = int(time.time() * 1000) - 3_600_000
    status = {"job_id": job_id, "name": "big", "state": "succeeded", "reason": "every task exited 0",
              "created_unix_ms": created, "finished_unix_ms": created + 3_000_000,
              "group_restarts": 0, "world_size": tasks,
              "tasks": [{"task": f"worker:{i}", "role": "worker", "index": i, "rank": i, "state": "succeeded",
                         "node": f"node{i // 8}", "pid": 1000 + i, "exit_code": 0, "signal": 0,
                         "restarts": 0, "step": 5000, "reason": ""} for i in range(tasks)]}
    (d / "status.json").write_text(json.dumps(status))
    (d / "spec.yaml").write_text(f"name: big\nroles:\n  worker:\n    instances: {tasks}\n    command: train\n")
    (d / "submit.json").write_text(json.dumps({"backend": "local", "job_id": job_id}))
    events = [{"type": "job_submitted", "ts": created}]
    for i in range(tasks):
        events.append({"type": "task_state", "task": f"worker:{i}", "attempt": 0, "from": "pending",
                       "to": "running", "pid": 1000 + i, "ts": created + 100})
        events.append({"type": "task_state", "task": f"worker:{i}", "attempt": 0, "from": "running",
                       "to": "succeeded", "exit_code": 0, "signal": 0, "ts": created + 3_000_000})
    events.append({"type": "job_finished", "outcome": "succeeded", "ts": created + 3_000_000})
    (d / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    with open(d / "logs.txt", "w") as f:
        chunk = []
        for n in range(lines):
            chunk.append(f"worker:{n % tasks} | step {n // tasks} loss {1.0 / (1 + n % 997):.5f} lr 0.001\n")
            if len(chunk) == 10000:
                f.write("".join(chunk))
                chunk = []
        f.write("".join(chunk))
    return job_id, d


def proc_status(pid, key):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return None


def timed_get(url):
    t0 = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as r:
        body = r.read()
    return (time.perf_counter() - t0) * 1000.0, body


def browser_first_paint(base, job_id, repeat):
    from playwright.sync_api import sync_playwright  # the browser venv's
    times = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        for _ in range(repeat):
            page = browser.new_page()
            t0 = time.perf_counter()
            page.goto(f"{base}/jobs/{job_id}")
            page.wait_for_selector(".log-line", timeout=30000)
            times.append((time.perf_counter() - t0) * 1000.0)
            page.close()
        browser.close()
    return times


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--tasks", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--browser", action="store_true")
    c.add_shoal_arg(ap)
    args = ap.parse_args()
    shoal, why = c.find_shoal(args.shoal)
    result = {"benchmark": "ui_logs", "lines": args.lines, "tasks": args.tasks, "machine": c.machine_info()}
    if not shoal:
        result["error"] = why
        c.emit(result)
        return 1
    with c.temp_dir("shoal-ui-logs-") as root:
        c.log(f"ui_logs: writing a {args.tasks}-task job with {args.lines} log lines")
        job_id, d = make_job(root / "jobs", args.tasks, args.lines)
        result["log_bytes"] = (d / "logs.txt").stat().st_size
        port = c.free_port()
        ui = subprocess.Popen([shoal, "--jobs-dir", str(root / "jobs"), "ui", "--listen", f"127.0.0.1:{port}"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        ui.stdout.readline()
        base = f"http://127.0.0.1:{port}"
        try:
            rss_start = proc_status(ui.pid, "VmRSS")
            for name, target in [("last_200_lines", f"/api/jobs/{job_id}/logs?limit=200"),
                                 ("one_task_last_200_lines", f"/api/jobs/{job_id}/logs?limit=200&task=worker:37"),
                                 ("job_detail_64_tasks", f"/api/jobs/{job_id}"),
                                 ("timeline", f"/api/jobs/{job_id}/timeline")]:
                times = []
                for _ in range(args.repeat):
                    ms, body = timed_get(base + target)
                    times.append(ms)
                result[name] = c.summary_ms(times)
                if name == "one_task_last_200_lines":
                    result[name]["lines_returned"] = len(json.loads(body)["lines"])
            if args.browser:
                try:
                    result["browser_first_paint_of_logs"] = c.summary_ms(browser_first_paint(base, job_id, args.repeat))
                except Exception as e:  # noqa: BLE001 - reported, not raised
                    result["browser_error"] = f"{type(e).__name__}: {e}"
            result["ui_server_rss_bytes_start"] = rss_start
            result["ui_server_rss_bytes_after"] = proc_status(ui.pid, "VmRSS")
            result["ui_server_peak_rss_bytes"] = proc_status(ui.pid, "VmHWM")
        finally:
            ui.terminate()
            ui.wait()
        tails = []
        for _ in range(args.repeat):
            t = c.run_timed(["tail", "-n", "1000", str(d / "logs.txt")])
            tails.append(t.ms)
        result["anchor_tail_n_1000"] = c.summary_ms(tails)
        result["last_200_over_tail"] = c.ratio(result["last_200_lines"]["median_ms"], c.median(tails))
    c.emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
