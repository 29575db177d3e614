"""Resource enforcement (docs/configuration.md): CPU pinning for whole-CPU jobs, and the
tracking cgroup that catches processes escaping their process group with setsid."""

import json
import os
import re

import shoal_e2e as e2e

AFFINITY = ["/usr/bin/python3", "-c",
            "import os; print('cpus=' + ','.join(map(str, sorted(os.sched_getaffinity(0)))))"]


def affinities(stdout):
    got = {}
    for line in stdout.splitlines():
        m = re.fullmatch(r"(\w+:\d+) \| cpus=([\d,]+)", line)
        if m:
            got[m.group(1)] = set(map(int, m.group(2).split(",")))
    return got


def test_whole_cpu_job_is_pinned_to_the_cores_it_holds(write_job, run_shoal):
    machine = os.sched_getaffinity(0)
    assert len(machine) >= 2
    job = write_job(f"""
        name: pinned
        roles:
          worker:
            instances: 1
            command: {json.dumps(AFFINITY)}
            resources: {{cpus: 1}}
        """)
    r = run_shoal("run", "-q", job, timeout=60)
    assert r.returncode == 0, r.stderr
    got = affinities(r.stdout)
    assert set(got) == {"worker:0"}, r.stdout
    assert len(got["worker:0"]) == 1 and got["worker:0"] <= machine, got


def test_tasks_of_one_job_share_its_cores(write_job, run_shoal):
    machine = os.sched_getaffinity(0)
    job = write_job(f"""
        name: shared
        roles:
          worker:
            instances: 2
            command: {json.dumps(AFFINITY)}
            resources: {{cpus: 1}}
        """)
    r = run_shoal("run", "-q", job, timeout=60)
    assert r.returncode == 0, r.stderr
    got = affinities(r.stdout)
    assert set(got) == {"worker:0", "worker:1"}, r.stdout
    assert got["worker:0"] == got["worker:1"], got
    assert len(got["worker:0"]) == 2 and got["worker:0"] <= machine, got


def test_fractional_cpus_are_not_pinned(write_job, run_shoal):
    machine = os.sched_getaffinity(0)
    job = write_job(f"""
        name: unpinned
        roles:
          worker:
            instances: 2
            command: {json.dumps(AFFINITY)}
            resources: {{cpus: 0.5}}
        """)
    r = run_shoal("run", "-q", job, timeout=60)
    assert r.returncode == 0, r.stderr
    got = affinities(r.stdout)
    assert set(got) == {"worker:0", "worker:1"}, r.stdout
    assert all(c == machine for c in got.values()), (got, machine)


ESCAPE = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time\\nwhile True: time.sleep(0.1)"],
                         start_new_session=True)
print(f"escaped={child.pid}", flush=True)
while True:
    time.sleep(0.1)
"""


def test_setsid_escapee_is_killed_with_its_task(write_file, write_job, start_shoal, run_shoal,
                                                jobs_dir, wait_for_state):
    write_file("escape.py", ESCAPE)
    job = write_job("""
        name: escape
        roles:
          worker:
            command: ["/usr/bin/python3", "escape.py"]
            resources: {cpus: 0.5}
        """)
    client = start_shoal("run", job)
    job_dir = e2e.wait_for_job(jobs_dir, "escape")
    job_id = job_dir.name
    line = e2e.wait_until(
        lambda: next((l for l in client.stdout().splitlines() if "| escaped=" in l), None), 60,
        "the task to start its escaping child")
    escaped = int(line.split("escaped=")[1])
    task = wait_for_state(job_id, lambda s: s["tasks"][0]["state"] == "running", 30,
                          "running")["tasks"][0]
    assert os.getpgid(escaped) != os.getpgid(task["pid"]), "the child did not leave the group"

    k = run_shoal("kill", job_id, timeout=60)
    assert k.returncode == 0, k.stderr
    assert client.wait(30) == 1
    e2e.wait_until(lambda: not e2e.job_processes(job_id, job_dir), 10,
                   "the task and its setsid child to be killed")
