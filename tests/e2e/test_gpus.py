"""GPU assignment with --fake-gpus: each task gets its own devices in CUDA_VISIBLE_DEVICES."""

import re

import shoal_e2e as e2e

JOB = """
    name: gpus
    roles:
      trainer:
        instances: 1
        command: ["/bin/sh", "-c", "echo cvd=$CUDA_VISIBLE_DEVICES"]
        resources: {cpus: 0.5, gpus: 2}
      worker:
        instances: 2
        command: ["/bin/sh", "-c", "echo cvd=$CUDA_VISIBLE_DEVICES"]
        resources: {cpus: 0.5, gpus: 1}
    """


def test_fake_gpus_are_distinct_per_task(write_job, run_shoal, jobs_dir):
    r = run_shoal("run", "--fake-gpus", "4", write_job(JOB), timeout=60)
    assert r.returncode == 0, f"rc={r.returncode}\n{r.stderr}"
    seen = {}
    for line in r.stdout.splitlines():
        m = re.fullmatch(r"(\w+:\d) \| cvd=(.*)", line)
        if m:
            seen[m.group(1)] = m.group(2).split(",") if m.group(2) else []
    assert set(seen) == {"trainer:0", "worker:0", "worker:1"}, r.stdout
    assert len(seen["trainer:0"]) == 2
    assert len(seen["worker:0"]) == 1 and len(seen["worker:1"]) == 1
    devices = [d for ds in seen.values() for d in ds]
    assert len(devices) == len(set(devices)) == 4, seen
    assert set(devices) <= {"0", "1", "2", "3"}


def test_task_without_gpus_gets_none(write_job, run_shoal):
    job = write_job("""
        name: nogpu
        roles:
          worker:
            command: ["/bin/sh", "-c", "echo cvd=${CUDA_VISIBLE_DEVICES-unset}"]
            resources: {cpus: 0.5}
        """)
    r = run_shoal("run", "-q", "--fake-gpus", "2", job, timeout=60)
    assert r.returncode == 0, r.stderr
    (line,) = [l for l in r.stdout.splitlines() if l.startswith("worker:0 | cvd=")]
    # Either not set or set to no device: never one of the GPUs.
    assert line in ("worker:0 | cvd=unset", "worker:0 | cvd="), line


def test_more_gpus_than_declared_is_refused(write_job, run_shoal, jobs_dir):
    job = write_job(JOB)
    r = run_shoal("run", "--fake-gpus", "3", job, timeout=30)
    assert r.returncode == 2, r.stderr
    assert re.search(r"job\.yaml:\d+: roles\.\w+\.resources\.gpus", r.stderr), r.stderr
    assert e2e.job_dirs(jobs_dir) == []
    # no GPUs on this machine without --fake-gpus (nvidia-smi absent) -> refused as well
    r = run_shoal("run", job, timeout=30)
    assert r.returncode == 2, r.stderr
    assert e2e.job_dirs(jobs_dir) == []
