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


# Issue 23: job files that passed validation but could not run, and messages that did not say
# what was wrong. Generated, since some are large, hold tabs or escapes; written as is.
def _env_lines(count, size):
    return "".join(f"      V{i}: \"{'a' * size}\"\n" for i in range(count))


GENERATED = {
    # One variable over the kernel's limit for one string (MAX_ARG_STRLEN).
    "env_value_over_string_limit": (
        "name: bad\nroles:\n  worker:\n    command: [\"/bin/true\"]\n    env:\n"
        f"      BIG: \"{'a' * 200 * 1024}\"\n",
        ("BIG:", 1), "BIG", "MAX_ARG_STRLEN"),
    # 3 MiB of variables, each within that limit: over ARG_MAX in all.
    "env_over_arg_max": (
        "name: bad\nroles:\n  worker:\n    command: [\"/bin/true\"]\n    env:\n"
        + _env_lines(48, 64 * 1024),
        ("env:", 1), "env", "ARG_MAX"),
    # Failed after 4.7 s with "the agent on local reported too few free ports".
    "more_tasks_than_ports": (
        "name: bad\nroles:\n  worker:\n    instances: 100000\n    command: [\"/bin/true\"]\n"
        "    resources: {cpus: 0.00001}\n",
        ("instances:", 1), "instances", "can hand out at most"),
    "nul_in_working_dir": (
        "name: bad\nroles:\n  worker:\n    command: [\"/bin/true\"]\n"
        "    working_dir: \"/tmp\\0/x\"\n",
        ("working_dir:", 1), "working_dir", "NUL byte"),
    "nul_in_command": (
        "name: bad\nroles:\n  worker:\n    command: [\"/bin/tr\\0ue\"]\n",
        ("command:", 1), "command", "NUL byte"),
    "nul_in_env_value": (
        "name: bad\nroles:\n  worker:\n    command: [\"/bin/true\"]\n    env: {A: \"x\\0y\"}\n",
        ("env:", 1), "A", "NUL byte"),
    "fraction_of_a_byte": (
        "name: bad\nroles:\n  worker:\n    command: [\"/bin/true\"]\n"
        "    resources: {memory: 1.5B}\n",
        ("memory:", 1), "memory", "not a whole number of bytes"),
    "zero_memory": (
        "name: bad\nroles:\n  worker:\n    command: [\"/bin/true\"]\n"
        "    resources: {memory: 0}\n",
        ("memory:", 1), "memory", "leave the key out for no memory limit"),
    "checkpoint_uri_without_place": (
        "name: bad\ncheckpoint: {dir: \"hdfs://\"}\nroles:\n  worker:\n"
        "    command: [\"/bin/true\"]\n",
        ("checkpoint:", 1), "dir", "must name a place after hdfs://"),
    "blank_program": (
        "name: bad\nroles:\n  worker:\n    command: [\" \"]\n",
        ("command:", 1), "command", "must not be empty or blank"),
    # Was `roles.evaluator.<<: unknown key`; an error inside the merged map points at the merge.
    "error_inside_merged_map": (
        "name: bad\nroles:\n  worker: &common\n    command: [\"/bin/true\"]\n"
        "    resources: {cpus: lots}\n  evaluator:\n    <<: *common\n",
        ("<<: *common", 1), "cpus", "roles.evaluator.resources.cpus: must be a number"),
    "error_inside_alias": (
        "name: bad\nroles:\n  worker:\n    command: [\"/bin/true\"]\n"
        "    env: &env {A: [1]}\n"
        "  evaluator:\n    command: [\"/bin/true\"]\n    env: *env\n",
        ("env: *env", 1), "A", "roles.evaluator.env.A: must be a string"),
    # Issue 24: the agent set it after the role's env, so the value written here was dropped.
    "reserved_shoal_variable_in_env": (
        "name: bad\nroles:\n  worker:\n    command: [\"/bin/true\"]\n"
        "    env: {OMP_NUM_THREADS: 2, SHOAL_AGENT_SOCKET: /tmp/sock}\n",
        ("env:", 1), "SHOAL_AGENT_SOCKET",
        "roles.worker.env.SHOAL_AGENT_SOCKET: reserved: Shoal sets SHOAL_AGENT_SOCKET itself"),
    # Was "illegal map value".
    "tab_indentation": (
        "name: bad\nroles:\n  worker:\n\tcommand: [\"/bin/true\"]\n",
        ("\tcommand", 1), "invalid YAML", "a tab is used for indentation"),
    # Was "bad file".
    "deep_nesting": (
        "name: bad\nroles: " + "[" * 100000 + "]" * 100000 + "\n",
        ("roles:", 1), "invalid job file", "nest more than 100 levels"),
    "deeper_nesting": (
        "name: bad\nroles:\n" + "- " * 1000000 + "x\n",
        ("- - -", 1), "invalid job file", "nest more than 100 levels"),
    # A NUL was printed raw.
    "nul_in_name": (
        "name: \"a\\0b\\tc\"\nroles:\n  worker:\n    command: [\"/bin/true\"]\n",
        ("name:", 1), "name", "got 'a\\x00b\\tc'"),
}


def _assert_refused(job, line, key, run_shoal, jobs_dir, says=None):
    r = run_shoal("run", job, timeout=60)
    assert r.returncode == 2, f"rc={r.returncode}\n{r.stdout}\n{r.stderr[-3000:]}"
    # file:line and the key on one line of the message
    assert re.search(rf"{re.escape(job.name)}:{line}\b.*\b{re.escape(key)}\b", r.stderr), \
        r.stderr[-3000:]
    if says is not None:
        assert says in r.stderr, r.stderr[-3000:]
    assert "\0" not in r.stderr and "\t" not in r.stderr, "control bytes must be escaped"
    assert r.stdout == ""
    assert e2e.job_dirs(jobs_dir) == [], "a refused job must not get a job directory"
    assert e2e.processes_under(jobs_dir) == [], "a refused job must start no process"
    # also not detached: --detach must refuse the same way
    r = run_shoal("run", "--detach", job, timeout=60)
    assert r.returncode == 2 and r.stdout == ""
    assert e2e.job_dirs(jobs_dir) == []
    assert e2e.processes_under(jobs_dir) == []


@pytest.mark.parametrize("case", sorted(CASES))
def test_invalid_job_file_is_refused(case, write_job, run_shoal, jobs_dir):
    text, (marker, occurrence), key = CASES[case]
    job = write_job(text, name=f"{case}.yaml")
    lines = textwrap.dedent(text).lstrip("\n").splitlines()
    line = [i + 1 for i, l in enumerate(lines) if marker in l][occurrence - 1]
    _assert_refused(job, line, key, run_shoal, jobs_dir)


@pytest.mark.parametrize("case", sorted(GENERATED))
def test_job_file_that_could_not_run_is_refused(case, tmp_path, run_shoal, jobs_dir):
    text, (marker, occurrence), key, says = GENERATED[case]
    job = tmp_path / f"{case}.yaml"
    job.write_text(text)
    line = [i + 1 for i, l in enumerate(text.splitlines()) if marker in l][occurrence - 1]
    _assert_refused(job, line, key, run_shoal, jobs_dir, says)


def test_merge_keys_share_a_roles_settings(write_job, run_shoal, jobs_dir):
    """Issue 23: `<<: *common` gave `roles.evaluator.<<: unknown key`."""
    job = write_job("""
        name: merged
        roles:
          worker: &common
            command: ["/bin/sh", "-c", 'test "$SHARED" = yes && echo role=$SHOAL_ROLE']
            env: {SHARED: "yes"}
            resources: {cpus: 0.25}
          evaluator:
            <<: *common
            instances: 1
        """)
    r = run_shoal("run", job, timeout=120)
    assert r.returncode == 0, f"rc={r.returncode}\n{r.stdout}\n{r.stderr[-3000:]}"
    assert "role=worker" in r.stdout and "role=evaluator" in r.stdout, r.stdout


def test_environment_over_grpcs_default_message_size_reaches_the_task(
        tmp_path, run_shoal, jobs_dir):
    """Issue 23: a 3-10 MB env failed as "the agent on local disconnected": the task's launch
    was over gRPC's 4 MiB default for a message to the agent. With a stack limit that lets exec
    take 6 MiB, a 5 MB env passes validation and must reach the task."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_STACK)
    want = 64 << 20
    if hard != resource.RLIM_INFINITY and hard < want:
        pytest.skip(f"the hard stack limit ({hard}) cannot be raised to {want}")
    job = tmp_path / "big_env.yaml"
    job.write_text("name: bigenv\nroles:\n  worker:\n"
                   "    command: [\"/bin/sh\", \"-c\", \"echo length=${#V39}\"]\n"
                   "    resources: {cpus: 0.25}\n    env:\n" + _env_lines(40, 128000))
    resource.setrlimit(resource.RLIMIT_STACK, (want, hard))
    try:
        r = run_shoal("run", job, timeout=120)
    finally:
        resource.setrlimit(resource.RLIMIT_STACK, (soft, hard))
    assert "disconnected" not in r.stderr, r.stderr[-3000:]
    assert r.returncode == 0, f"rc={r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    assert "length=128000" in r.stdout, r.stdout[-2000:]


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


def test_task_that_still_cannot_exec_fails_with_its_start_error(tmp_path, run_shoal, jobs_dir):
    """Issue 23: what passes validation but still cannot be exec'd (here: a role env within
    ARG_MAX on top of a large environment inherited from where Shoal was started) must fail as
    the task's start error with the kernel's reason, never as a lost agent."""
    import os
    arg_max = os.sysconf("SC_ARG_MAX")
    piece = 100000
    inherited = {f"SHOAL_TEST_BIG{i}": "b" * piece
                 for i in range((arg_max - 150 * 1024) // (piece + 24))}
    job = tmp_path / "exec_fails.yaml"
    job.write_text("name: execfails\nroles:\n  worker:\n    command: [\"/bin/true\"]\n"
                   "    resources: {cpus: 0.25}\n    env:\n" + _env_lines(2, piece))
    r = run_shoal("run", job, timeout=120, env=inherited)
    assert r.returncode == 1, f"rc={r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    out = r.stdout + r.stderr
    assert "Argument list too long" in out, out[-3000:]
    assert "disconnected" not in out, out[-3000:]
