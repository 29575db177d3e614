"""The command line itself: help, usage errors."""

import pytest


def test_top_level_help(run_shoal):
    r = run_shoal("--help", timeout=30)
    assert r.returncode == 0, r.stderr
    for word in ("--jobs-dir", "run", "status", "list", "logs", "kill"):
        assert word in r.stdout, f"{word} not in --help:\n{r.stdout}"


def test_run_help(run_shoal):
    r = run_shoal("run", "--help", timeout=30)
    assert r.returncode == 0, r.stderr
    for flag in ("--detach", "-q", "--quiet", "--fake-gpus"):
        assert flag in r.stdout, f"{flag} not in run --help:\n{r.stdout}"


@pytest.mark.parametrize("sub,flags", [("status", ["--json"]), ("list", ["--json"]),
                                       ("logs", ["--task", "--follow"]), ("kill", [])])
def test_subcommand_help(sub, flags, run_shoal):
    r = run_shoal(sub, "--help", timeout=30)
    assert r.returncode == 0, r.stderr
    for flag in flags:
        assert flag in r.stdout


@pytest.mark.parametrize("args", [[], ["run"], ["no-such-command"], ["run", "--no-such-flag", "x.yaml"],
                                  ["status"], ["logs"], ["kill"]])
def test_usage_errors_exit_2(args, run_shoal):
    r = run_shoal(*args, timeout=30)
    assert r.returncode == 2, f"{args}: rc={r.returncode}"
    assert r.stderr.strip()


def test_an_unknown_command_is_named(run_shoal):
    r = run_shoal("frobnicate", timeout=30)
    assert r.returncode == 2, r.stderr
    assert "shoal: unknown command 'frobnicate'; the commands are: run, submit" in r.stderr, r.stderr
    assert "mpi-worker" not in r.stderr  # internal commands are not offered
    # Options before the command still work, and a command's own words are not judged.
    r = run_shoal("status", "no-such-job", timeout=30)
    assert "unknown command" not in r.stderr, r.stderr


# Checked before anything starts, with the job file's rules for the same keys, and named alone:
# the check once parsed generated YAML, and a bad flag came with "command line:1: name:
# required", or with a YAML syntax error for a value holding a quote.
@pytest.mark.parametrize("flags,message", [
    (["--backend", "slurm", "--listen", "127.0.0.1", "--time-limit", "10s"],
     "--time-limit: must be at least 1m (Slurm counts whole minutes), got '10s'"),
    (["--backend", "slurm", "--listen", "127.0.0.1", "--account", 'a"b'],
     "--account: must be a Slurm name (letters, digits, -_.,:=), got 'a\"b'"),
    (["--backend", "yarn", "--yarn-rm", "http://127.0.0.1:1", "--queue", "a;b"],
     "--queue: must be a YARN queue name (letters, digits, -_.), e.g. root.ml, got 'a;b'"),
    # Before the cluster is looked for: no --listen (Slurm's controller is not asked), no
    # ResourceManager named at all.
    (["--backend", "slurm", "--partition", 'a"b'],
     "--partition: must be a Slurm name (letters, digits, -_.,:=), got 'a\"b'"),
    (["--backend", "yarn", "--queue", "ml/prod"],
     "--queue: must be a YARN queue name (letters, digits, -_.), e.g. root.ml, got 'ml/prod'"),
])
def test_a_bad_backend_flag_is_named_alone_before_anything_starts(flags, message, run_shoal,
                                                                   write_job, jobs_dir):
    job = write_job("""
        name: flags
        roles:
          worker: {command: ["true"]}
        """)
    r = run_shoal("run", *flags, job, timeout=30)
    assert r.returncode == 2, r.stderr
    assert r.stderr == f"shoal: invalid flag: {message}\n", r.stderr
    assert not jobs_dir.exists() or not list(jobs_dir.iterdir())
