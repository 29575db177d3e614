"""`shoal run` behind a slow or stopped reader (a pager, `| tee`, a slow ssh session): every
line of task output still arrives, in order, and the master's memory stays bounded, because the
job's logs.txt is the only buffer (the master sends output at the client's pace, and the client
reads what is left from the file once the master has gone)."""

import json
import os
import re
import signal
import subprocess
import threading
import time

import shoal_e2e as e2e

# One task writes `n` numbered lines of about 100 bytes as fast as it can.
FLOOD = """
import sys
n = int(sys.argv[1])
pad = "x" * 80
out = sys.stdout
for start in range(0, n, 10000):
    out.write("".join(f"line {i:07d} {pad}\\n" for i in range(start, min(n, start + 10000))))
out.flush()
"""

LINE = re.compile(rb"worker:0 \| line (\d{7}) x{80}")


def flood_job(write_file, write_job, lines):
    write_file("flood.py", FLOOD)
    return write_job(f"""
        name: flood
        roles:
          worker:
            instances: 1
            command: ["/usr/bin/python3", "flood.py", "{lines}"]
            resources: {{cpus: 1}}
        """)


def start_client(harness, *args):
    """`shoal run` with stdout on a pipe that this test reads (or does not, for a while)."""
    proc = subprocess.Popen(harness.command(["run", *args]), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=e2e.base_env(), cwd=harness.tmp_path, start_new_session=True)
    return proc


def check_every_line(stdout, lines):
    numbers = [int(m.group(1)) for m in map(LINE.fullmatch, stdout.splitlines()) if m]
    assert len(numbers) == lines, f"{len(numbers)} of {lines} lines arrived"
    assert numbers == list(range(lines)), "the lines arrived out of order or twice"
    others = [l for l in stdout.splitlines() if not LINE.fullmatch(l)]
    assert not others, f"unexpected lines on stdout: {others[:3]}"


def finish(proc, timeout):
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"shoal run did not finish in {timeout}s; stderr:\n"
                             f"{err.decode(errors='replace')[-3000:]}")


def test_a_reader_that_waits_gets_every_line(write_file, write_job, harness):
    lines = 500_000  # 50 MB in well under a second
    proc = start_client(harness, "-q", flood_job(write_file, write_job, lines))
    try:
        time.sleep(3)  # the reader is busy: `shoal run job.yaml | (sleep 3; grep -c ...)`
        out, err = finish(proc, 240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err.decode(errors="replace")
    check_every_line(out, lines)
    assert b"not shown" not in err and b"not received" not in err, err


def read_json(path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def vm_kib(pid, key):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def test_a_stopped_client_loses_nothing_and_the_master_stays_small(write_file, write_job,
                                                                     harness, jobs_dir):
    lines = 1_000_000  # 100 MB written while nobody reads
    proc = start_client(harness, "-q", flood_job(write_file, write_job, lines))
    received = []
    first_line = threading.Event()

    def read():
        first = proc.stdout.readline()
        received.append(first)
        first_line.set()
        received.append(proc.stdout.read())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert first_line.wait(120), "no output arrived"
        os.kill(proc.pid, signal.SIGSTOP)  # `shoal run` stopped (Ctrl-Z, a stalled terminal)
        job_dir = e2e.wait_for_job(jobs_dir, "flood")
        master_pid = e2e.wait_until(lambda: read_json(job_dir / "master.json"), 30,
                                    "master.json")["pid"]
        peak_kib = 0

        def job_ended():
            nonlocal peak_kib
            peak_kib = max(peak_kib, vm_kib(master_pid, "VmHWM") or 0)
            status = read_json(job_dir / "status.json") or {}
            return status.get("state") in e2e.TERMINAL_JOB_STATES
        e2e.wait_until(job_ended, 180, "the job to end while its client is stopped")
        # Past the time the master waits for a slow client: what is left now comes from the
        # file, read by the client itself.
        def master_gone():  # a zombie (its parent is stopped) has no VmHWM
            nonlocal peak_kib
            hwm = vm_kib(master_pid, "VmHWM")
            peak_kib = max(peak_kib, hwm or 0)
            return hwm is None
        e2e.wait_until(master_gone, 30, "the master to exit")
        os.kill(proc.pid, signal.SIGCONT)
        reader.join(240)
        assert not reader.is_alive(), "shoal run did not finish after it was continued"
        err = proc.stderr.read()
        proc.wait(30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGCONT)
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err.decode(errors="replace")
    check_every_line(b"".join(received), lines)
    # 100 MB went through while nobody read it; a master that kept it in memory would hold
    # more than that. Read back from the file, it needs what a master of an idle job needs.
    assert 0 < peak_kib < 80 * 1024, f"the master's peak RSS was {peak_kib} KiB"


SLEEPER = """
    name: sleeper
    roles:
      worker:
        instances: 1
        command: ["/bin/sh", "-c", "echo started; sleep 4; echo finished"]
        resources: {cpus: 0.5}
    """


def test_hangup_detaches_and_the_job_goes_on(write_job, start_shoal, jobs_dir, wait_for_state):
    client = start_shoal("run", write_job(SLEEPER))
    job_dir = e2e.wait_for_job(jobs_dir, "sleeper")
    e2e.wait_until(lambda: "worker:0 | started" in client.stdout(), 60, "the task to start")
    os.kill(client.pid, signal.SIGHUP)  # the terminal went away
    assert client.wait(30) == 129, client.stderr()
    assert f"hung up: detached from job {job_dir.name}, which keeps running" in client.stderr()
    status = wait_for_state(job_dir.name, lambda s: s["state"] in e2e.TERMINAL_JOB_STATES, 60,
                            "the job to end on its own")
    assert status["state"] == "succeeded", status
    assert "worker:0 | finished" in (job_dir / "logs.txt").read_text()


PIPED = """
    name: piped
    roles:
      worker:
        instances: 1
        command: ["/bin/sh", "-c", "echo one; echo two; sleep 1; echo three; sleep 2; echo finished"]
        resources: {cpus: 0.5}
    """


def test_a_closed_output_detaches_and_the_job_goes_on(write_job, harness, jobs_dir,
                                                       wait_for_state):
    job = write_job(PIPED)
    cmd = " ".join(f"'{a}'" for a in harness.command(["run", job]))
    # `shoal run job.yaml | head -1`: head leaves after the first line.
    r = subprocess.run(["/bin/bash", "-c", f"{cmd} | head -1; exit ${{PIPESTATUS[0]}}"],
                       capture_output=True, text=True, timeout=60, env=e2e.base_env(),
                       cwd=harness.tmp_path)
    assert r.stdout == "worker:0 | one\n", r.stdout
    assert r.returncode == 141, r.stderr
    (job_dir,) = e2e.job_dirs(jobs_dir)
    assert (f"the output was closed: detached from job {job_dir.name}, which keeps running"
            in r.stderr), r.stderr
    status = wait_for_state(job_dir.name, lambda s: s["state"] in e2e.TERMINAL_JOB_STATES, 60,
                            "the job to end on its own")
    assert status["state"] == "succeeded", status
    assert "worker:0 | finished" in (job_dir / "logs.txt").read_text()
