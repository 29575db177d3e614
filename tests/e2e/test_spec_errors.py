"""Invalid job files: exit 2, a message naming file:line and the key, and no job directory."""

import re
import textwrap

import pytest

import shoal_e2e as e2e

# Each case: job text, (a text on the offending line, which occurrence), the key to name.
CASES = {
    "unknown_key": ("""
        name: bad
        roles:
          worker:
            instnces: 2
            command: ["/bin/true"]
        """, ("instnces:", 1), "instnces"),
    "zero_instances": ("""
        name: bad
        roles:
          worker:
            instances: 0
            command: ["/bin/true"]
        """, ("instances: 0", 1), "instances"),
    "bad_memory": ("""
        name: bad
        roles:
          worker:
            command: ["/bin/true"]
            resources:
              cpus: 1
              memory: 2GB?
        """, ("memory: 2GB?", 1), "memory"),
    "missing_command": ("""
        name: bad
        roles:
          worker:
            instances: 1
            resources: {cpus: 1}
        """, ("worker:", 1), "command"),
    "duplicate_role": ("""
        name: bad
        roles:
          worker:
            command: ["/bin/true"]
            resources: {cpus: 0.5}
          worker:
            command: ["/bin/false"]
            resources: {cpus: 0.5}
        """, ("worker:", 2), "worker"),
    "too_many_cpus": ("""
        name: bad
        roles:
          worker:
            instances: 3
            command: ["/bin/true"]
            resources:
              cpus: 1
        """, ("cpus: 1", 1), "cpus"),
    "one_task_too_many_cpus": ("""
        name: bad
        roles:
          worker:
            instances: 1
            command: ["/bin/true"]
            resources: {cpus: 64}
        """, ("cpus: 64", 1), "cpus"),
    "unknown_depends_on": ("""
        name: bad
        roles:
          worker:
            command: ["/bin/true"]
            depends_on: [ps]
        """, ("depends_on:", 1), "depends_on"),
    "top_level_typo": ("""
        name: bad
        role:
          worker:
            command: ["/bin/true"]
        """, ("role:", 1), "role"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_invalid_job_file_is_refused(case, write_job, run_shoal, jobs_dir):
    text, (marker, occurrence), key = CASES[case]
    job = write_job(text, name=f"{case}.yaml")
    lines = textwrap.dedent(text).lstrip("\n").splitlines()
    line = [i + 1 for i, l in enumerate(lines) if marker in l][occurrence - 1]
    r = run_shoal("run", job, timeout=30)
    assert r.returncode == 2, f"rc={r.returncode}\n{r.stdout}\n{r.stderr}"
    # file:line and the key on one line of the message
    assert re.search(rf"{re.escape(job.name)}:{line}\b.*\b{re.escape(key)}\b", r.stderr), r.stderr
    assert r.stdout == ""
    assert e2e.job_dirs(jobs_dir) == [], "a refused job must not get a job directory"
    # also not detached: --detach must refuse the same way
    r = run_shoal("run", "--detach", job, timeout=30)
    assert r.returncode == 2 and r.stdout == ""
    assert e2e.job_dirs(jobs_dir) == []


def test_missing_job_file(run_shoal, tmp_path, jobs_dir):
    r = run_shoal("run", tmp_path / "no-such-job.yaml", timeout=30)
    assert r.returncode == 2, r.stderr
    assert "no-such-job.yaml" in r.stderr
    assert e2e.job_dirs(jobs_dir) == []


def test_invalid_yaml_syntax(write_job, run_shoal, jobs_dir):
    job = write_job("""
        name: bad
        roles:
          worker: {command: ["/bin/true"
        """, name="syntax.yaml")
    r = run_shoal("run", job, timeout=30)
    assert r.returncode == 2, r.stderr
    assert re.search(r"syntax\.yaml:\d+", r.stderr), r.stderr
    assert e2e.job_dirs(jobs_dir) == []
