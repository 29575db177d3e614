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
