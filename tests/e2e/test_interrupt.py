"""Ctrl-C (and SIGTERM) to `shoal run`: exit 130 and every process of the job gone within 5 s,
even tasks that ignore SIGTERM and the children they started."""

import os
import signal
import time

import pytest

import shoal_e2e as e2e

# Each worker ignores SIGTERM, starts a child that ignores it too, prints "up" and spins.
TASK = """
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time\\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\\nwhile True: time.sleep(0.1)"])
print(f"up child={child.pid}", flush=True)
while True:
    time.sleep(0.1)
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupt_stops_every_process(sig, write_file, write_job, start_shoal, jobs_dir,
                                       wait_for_state):
    write_file("stubborn.py", TASK)
    job = write_job("""
        name: stubborn
        roles:
          worker:
            instances: 2
            command: ["/usr/bin/python3", "stubborn.py"]
            resources: {cpus: 0.5}
        """)
    client = start_shoal("run", job)
    job_dir = e2e.wait_for_job(jobs_dir, "stubborn")
    job_id = job_dir.name
    status = wait_for_state(
        job_id, lambda s: s["state"] == "running" and len(s["tasks"]) == 2
        and all(t["state"] == "running" for t in s["tasks"]), 60, "every task running")
    # Both tasks have started their child: the whole tree exists before the interrupt.
    e2e.wait_until(lambda: client.stdout().count(" | up child=") == 2, 60,
                   "both workers to report their child")
    pgids = []
    for t in status["tasks"]:
        assert t["pid"] > 0
        pgids.append(os.getpgid(t["pid"]))
    before = e2e.job_processes(job_id, job_dir)
    # master + agent + 2 tasks + 2 children at least
    assert len(before) >= 6, before
    assert {p.pgid for p in before if p.pid in {t["pid"] for t in status["tasks"]}} == set(pgids)

    sent = time.monotonic()
    os.kill(client.pid, sig)
    rc = client.wait(30)
    assert rc == 130, f"rc={rc}\n{client.stderr()}"

    # Everything of the job gone within 5 s of the signal (only the remainder of the 5 s budget
    # is granted here, counting the time the client took to return).
    remaining = max(0.0, 5.0 - (time.monotonic() - sent))
    try:
        e2e.wait_until(lambda: not e2e.job_processes(job_id, job_dir)
                       and all(e2e.pgroup_gone(g) for g in pgids), remaining,
                       "every process of the job to exit")
    except AssertionError:
        pytest.fail(f"5 s after {sig.name}, still alive: {e2e.job_processes(job_id, job_dir)}; "
                    f"task groups alive: {[g for g in pgids if not e2e.pgroup_gone(g)]}")
    # os.killpg(pgid, 0) -> ProcessLookupError for every task's group (pgroup_gone tolerates
    # only zombies already orphaned to init, which are this machine's init's to reap).
    assert all(e2e.pgroup_gone(g) for g in pgids)

    lines = [l for l in client.stderr().splitlines() if l.strip()]
    assert lines[-1].startswith(f"shoal | job {job_id} killed"), client.stderr()
    final = wait_for_state(job_id, lambda s: s["state"] in e2e.TERMINAL_JOB_STATES, 10,
                           "a terminal state")
    assert final["state"] == "killed"
    assert all(t["state"] == "killed" for t in final["tasks"]), final
