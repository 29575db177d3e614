#!/usr/bin/env python3
"""Log follow latency of the dashboard (issue 26): a real job's task prints lines that carry
the time they were printed; a client follows them through `shoal ui`'s server-sent events
(/api/jobs/<id>/logs/follow, what the page's EventSource reads) and records when each arrives.
Latency = arrival - print, on one machine's clock. Two phases, one job each:
  - latency: the task prints --rate lines/s (default 20) for --seconds; p50/p90/p99;
  - load: the task prints --flood lines/s (default 10,000) for --seconds; the UI server's
    CPU (from /proc/<pid>/stat) while it follows, as % of one core and CPU-ms per 1,000
    lines, next to the master's own CPU for the same lines (the anchor that every line
    already costs), and the latency under that load.
With --browser (Playwright: run with /var/cache/shoal/venvs/browser/bin/python) the latency
phase is also read in Debian's chromium: the job page follows the log, and a MutationObserver
stamps each line as it enters the page.
Target: p99 <= 250 ms.

Usage: bench/ui_follow.py [--seconds 20] [--rate 20] [--flood 10000] [--browser] [--shoal PATH]
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as c  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")

PRINTER = """
import sys, time
rate, seconds = float(sys.argv[1]), float(sys.argv[2])
batch = max(1, int(rate / 100))          # lines per 10 ms tick at high rates
interval = batch / rate
n = 0
start = time.time()
next_t = start
while time.time() - start < seconds:
    for _ in range(batch):
        print(f"t={time.time():.6f} n={n}", flush=False)
        n += 1
    sys.stdout.flush()
    next_t += interval
    delay = next_t - time.time()
    if delay > 0:
        time.sleep(delay)
print(f"done n={n}", flush=True)
"""


def cpu_ticks(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def start_ui(shoal, jobs_dir):
    port = c.free_port()
    p = subprocess.Popen([shoal, "--jobs-dir", str(jobs_dir), "ui", "--listen", f"127.0.0.1:{port}"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    p.stdout.readline()
    return p, port


def follow(port, job_id, arrivals, stop):
    """Reads the event stream; appends (arrival_s, text) per line until `end` or stop."""
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(f"GET /api/jobs/{job_id}/logs/follow?from=0 HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    buf = b""
    s.settimeout(1.0)
    while not stop.is_set():
        try:
            chunk = s.recv(1 << 16)
        except socket.timeout:
            continue
        if not chunk:
            break
        now = time.time()
        buf += chunk
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            lines = event.decode().split("\n")
            kind = next((l[7:] for l in lines if l.startswith("event: ")), "")
            data = next((l[6:] for l in lines if l.startswith("data: ")), "")
            if kind == "lines":
                for line in json.loads(data)["lines"]:
                    arrivals.append((now, line["text"]))
            elif kind == "end":
                stop.set()
    s.close()


OBSERVER = """() => {
  window.__arrivals = [];
  const seen = new Set();
  new MutationObserver(() => {
    const now = Date.now() / 1000;
    for (const el of document.querySelectorAll('.log-line')) {
      if (seen.has(el)) continue;
      seen.add(el);
      window.__arrivals.push([now, el.textContent]);
    }
  }).observe(document.body, {childList: true, subtree: true});
}"""


def browser_follow(port, job_id, seconds):
    """(arrival_s, text) of each line as it entered the job page in chromium."""
    from playwright.sync_api import sync_playwright  # the browser venv's
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        page = browser.new_page()
        page.goto(f"http://127.0.0.1:{port}/jobs/{job_id}")
        page.evaluate(OBSERVER)
        time.sleep(seconds + 3)
        arrivals = page.evaluate("window.__arrivals")
        browser.close()
    return [(a, t) for a, t in arrivals]


def latencies_of(arrivals, started_s):
    out = []
    for arrival, text in arrivals:
        at = text.find("t=")
        if at >= 0:
            printed = float(text[at + 2:].split()[0])
            if printed >= started_s:  # lines printed before the page was watching are history
                out.append((arrival - printed) * 1000.0)
    return out


def run_phase(shoal, root, rate, seconds, browser=False):
    script = root / f"printer_{int(rate)}.py"
    script.write_text(PRINTER)
    job = root / f"print_{int(rate)}.yaml"
    job.write_text(f"name: print-{int(rate)}\nroles:\n  worker:\n    instances: 1\n"
                   f"    command: [\"/usr/bin/python3\", \"-u\", \"{script}\", \"{rate}\", \"{seconds}\"]\n")
    ui, port = start_ui(shoal, root / "jobs")
    try:
        t = c.run_timed([shoal, "--jobs-dir", str(root / "jobs"), "run", "--detach", str(job)], timeout=120)
        if not t.ok:
            return {"error": "shoal run: " + t.describe()}
        job_id = t.stdout.strip()
        master_pid = json.loads((root / "jobs" / job_id / "master.json").read_text())["pid"]
        arrivals, stop = [], threading.Event()
        reader = threading.Thread(target=follow, args=(port, job_id, arrivals, stop))
        ui0, m0, w0 = cpu_ticks(ui.pid), cpu_ticks(master_pid), time.time()
        reader.start()
        browser_result = None
        if browser:
            try:
                watching = time.time() + 1.5  # the page's load, then its follow stream
                b = latencies_of(browser_follow(port, job_id, seconds), watching)
                browser_result = {"lines_seen": len(b), "latency": c.summary_ms(b)}
            except Exception as e:  # noqa: BLE001 - reported, not raised
                browser_result = {"error": f"{type(e).__name__}: {e}"}
        reader.join(timeout=seconds + 120)
        stop.set()
        ui_ms = (cpu_ticks(ui.pid) - ui0) * 1000.0 / CLK_TCK
        try:
            master_ms = (cpu_ticks(master_pid) - m0) * 1000.0 / CLK_TCK
        except OSError:
            master_ms = None  # it ended before we read it
        wall = time.time() - w0
    finally:
        ui.terminate()
        ui.wait()
    latencies = []
    for arrival, text in arrivals:
        if text.startswith("t="):
            latencies.append((arrival - float(text.split()[0][2:])) * 1000.0)
    n = len(latencies)
    result = {"rate_lines_per_s": rate, "lines_received": n, "wall_s": round(wall, 2),
            "latency": c.summary_ms(latencies),
            "ui_server_cpu_ms": round(ui_ms, 1),
            "ui_server_cpu_percent_of_core": round(100.0 * ui_ms / 1000.0 / wall, 2) if wall else None,
            "ui_server_cpu_ms_per_1000_lines": round(1000.0 * ui_ms / n, 3) if n else None,
            "master_cpu_ms_per_1000_lines": round(1000.0 * master_ms / n, 3) if n and master_ms is not None else None}
    if browser_result is not None:
        result["in_chromium"] = browser_result
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--rate", type=float, default=20)
    ap.add_argument("--flood", type=float, default=10_000)
    ap.add_argument("--browser", action="store_true")
    c.add_shoal_arg(ap)
    args = ap.parse_args()
    shoal, why = c.find_shoal(args.shoal)
    result = {"benchmark": "ui_follow", "machine": c.machine_info(), "target_p99_ms": 250}
    if not shoal:
        result["error"] = why
        c.emit(result)
        return 1
    with c.temp_dir("shoal-ui-follow-") as root:
        (root / "jobs").mkdir()
        c.log(f"ui_follow: {args.rate:g} lines/s for {args.seconds:g} s")
        result["latency_phase"] = run_phase(shoal, root, args.rate, args.seconds, args.browser)
        c.log(f"ui_follow: {args.flood:g} lines/s for {args.seconds:g} s")
        result["load_phase"] = run_phase(shoal, root, args.flood, args.seconds)
    c.emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
