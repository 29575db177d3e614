"""A task over its memory limit is killed (SIGKILL) and the job fails."""

import os
import re

import pytest

import shoal_e2e as e2e

HOG = """
import time
b = bytearray(300 * 1024 * 1024)
for i in range(0, len(b), 4096):
    b[i] = 1
print("allocated 300MB", flush=True)
time.sleep(2)
"""


@pytest.mark.skipif(not os.path.isdir("/sys/fs/cgroup") or os.geteuid() != 0,
                    reason="needs cgroups and root")
def test_memory_hog_is_killed(write_file, write_job, run_shoal, jobs_dir, shoal_status):
    write_file("hog.py", HOG)
    job = write_job("""
        name: hog
        roles:
          worker:
            instances: 1
            command: ["/usr/bin/python3", "hog.py"]
            resources: {cpus: 1, memory: 64MiB}
        """)
    r = run_shoal("run", job, timeout=60)
    assert r.returncode == 1, f"rc={r.returncode}\n{r.stdout}\n{r.stderr}"
    assert "allocated 300MB" not in r.stdout
    last = [l for l in r.stderr.splitlines() if l.strip()][-1]
    # The final line says why, not only the signal.
    assert ("failed: worker:0 was killed by signal 9 (SIGKILL) for exceeding its memory limit "
            "(memory: 64MiB)") in last, r.stderr
    # docs/configuration.md: the kill is reported as such...
    notice = "worker:0 was killed for exceeding its memory limit"
    assert notice in r.stdout + r.stderr, r.stdout + r.stderr
    # ...as one of shoal's own messages: on stderr, prefixed "shoal | "; stdout carries only
    # task output ("role:index | text").
    assert not [l for l in r.stdout.splitlines() if not re.match(r"^\w[\w-]*:\d+ \| ", l)], (
        f"non-task lines on stdout:\n{r.stdout}")
    assert any(l.startswith("shoal | ") and notice in l for l in r.stderr.splitlines()), r.stderr
    (job_dir,) = e2e.job_dirs(jobs_dir)
    task = shoal_status(job_dir.name)["tasks"][0]
    assert task["state"] == "failed" and task["signal"] == 9
    e2e.wait_until(lambda: not e2e.job_processes(job_dir.name, job_dir), 10,
                   "every process of the job to exit")


def test_within_memory_limit_succeeds(write_job, run_shoal):
    job = write_job("""
        name: small
        roles:
          worker:
            command: ["/usr/bin/python3", "-c", "b = bytearray(16 * 1024 * 1024); print('ok')"]
            resources: {cpus: 1, memory: 256MiB}
        """)
    r = run_shoal("run", "-q", job, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "worker:0 | ok" in r.stdout.splitlines()
