#!/usr/bin/env python3
"""Output floods behind a slow or stopped reader (issue 23, defects 1 and 2).

Two floods, each a one-task job writing numbered ~100-byte lines as fast as Python can:
  waiting_reader  --lines-waiting lines (default 500,000: 50 MB); the reader of `shoal run`'s
                  stdout starts reading only after --wait seconds (`| (sleep 3; grep -c ...)`)
  stopped_client  --lines-stopped lines (default 6,000,000: 600 MB); `shoal run` is stopped
                  (SIGSTOP) at its first line and continued --stop seconds later
For each it reports the lines that arrived (and whether they are all there, in order), the
client's exit code, the master's peak RSS (VmHWM, sampled until it exits) and the wall time.
With --compare BIN the same floods run with another shoal binary in the same invocation (for
example a build of the commit before the fix), alternating which goes first. Prints one JSON
object on stdout.
"""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

FLOOD = """
import sys
n = int(sys.argv[1])
pad = "x" * 80
out = sys.stdout
for start in range(0, n, 10000):
    out.write("".join(f"line {i:07d} {pad}\\n" for i in range(start, min(n, start + 10000))))
out.flush()
"""
LINE = re.compile(rb"^worker:0 \| line (\d{7}) ", re.M)


def vm_hwm_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def master_pid(jobs_dir):
    for d in Path(jobs_dir).glob("flood-*/master.json"):
        try:
            return json.loads(d.read_text())["pid"]
        except (OSError, ValueError, KeyError):
            pass
    return None


def run_flood(shoal, workdir, lines, wait_s=0.0, stop_s=0.0):
    workdir = Path(tempfile.mkdtemp(dir=workdir))
    (workdir / "flood.py").write_text(FLOOD)
    (workdir / "job.yaml").write_text(
        "name: flood\nroles:\n  worker:\n    instances: 1\n"
        f"    command: [\"/usr/bin/python3\", \"flood.py\", \"{lines}\"]\n"
        "    resources: {cpus: 1}\n")
    jobs = workdir / "jobs"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")}
    started = time.monotonic()
    proc = subprocess.Popen([shoal, "--jobs-dir", str(jobs), "run", "-q", "job.yaml"],
                            cwd=workdir, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, start_new_session=True)
    peak = {"kib": 0}
    done = threading.Event()

    def sample():
        pid = None
        while not done.is_set():
            pid = pid or master_pid(jobs)
            if pid:
                hwm = vm_hwm_kib(pid)
                if hwm is None and peak["kib"]:
                    return
                peak["kib"] = max(peak["kib"], hwm or 0)
            time.sleep(0.02)
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    chunks, errs = [], []
    first_line = threading.Event()

    def read_out():  # one buffered reader for all of stdout: nothing read ahead is lost
        chunks.append(proc.stdout.readline())
        first_line.set()
        chunks.append(proc.stdout.read())

    readers = [threading.Thread(target=read_out, daemon=True),
               threading.Thread(target=lambda: errs.append(proc.stderr.read()), daemon=True)]
    if stop_s:
        readers[0].start()
        first_line.wait(600)
        os.kill(proc.pid, signal.SIGSTOP)
        time.sleep(stop_s)
        os.kill(proc.pid, signal.SIGCONT)
    elif wait_s:
        time.sleep(wait_s)
        readers[0].start()
    else:
        readers[0].start()
    readers[1].start()
    for r in readers:
        r.join(1800)
    proc.wait(60)
    err = b"".join(errs)
    wall = time.monotonic() - started
    done.set()
    sampler.join(5)
    numbers = [int(m.group(1)) for m in LINE.finditer(b"".join(chunks))]
    return {
        "lines_written": lines,
        "lines_received": len(numbers),
        "all_in_order": numbers == list(range(lines)),
        "exit_code": proc.returncode,
        "master_peak_rss_mib": round(peak["kib"] / 1024, 1),
        "wall_s": round(wall, 2),
        "client_said": [l for l in err.decode(errors="replace").splitlines()
                        if "not shown" in l or "not received" in l][:2],
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    repo = Path(__file__).resolve().parents[1]
    p.add_argument("--shoal", default=str(repo / "build" / "src" / "cli" / "shoal"))
    p.add_argument("--compare", help="another shoal binary, run in the same invocation")
    p.add_argument("--lines-waiting", type=int, default=500_000)
    p.add_argument("--wait", type=float, default=3.0)
    p.add_argument("--lines-stopped", type=int, default=6_000_000)
    p.add_argument("--stop", type=float, default=10.0)
    a = p.parse_args()
    binaries = {"shoal": a.shoal}
    if a.compare:
        binaries["compare"] = a.compare
    results = {name: {} for name in binaries}
    with tempfile.TemporaryDirectory(prefix="shoal-flood-") as tmp:
        for flood in ("waiting_reader", "stopped_client"):
            order = list(binaries) if flood == "waiting_reader" else list(reversed(binaries))
            for name in order:
                if flood == "waiting_reader":
                    r = run_flood(binaries[name], tmp, a.lines_waiting, wait_s=a.wait)
                else:
                    r = run_flood(binaries[name], tmp, a.lines_stopped, stop_s=a.stop)
                results[name][flood] = r
                print(f"{name} {flood}: {r['lines_received']}/{r['lines_written']} lines, "
                      f"master peak {r['master_peak_rss_mib']} MiB", file=sys.stderr)
    json.dump({"benchmark": "output_flood", "binaries": binaries, "results": results,
               "params": vars(a)}, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
