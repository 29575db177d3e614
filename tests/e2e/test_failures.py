"""How a failing task fails the job: exit codes, signals, programs that cannot start."""

import re

import pytest

import shoal_e2e as e2e


def last_line(text):
    lines = [l for l in text.splitlines() if l.strip()]
    return lines[-1] if lines else ""


def assert_nothing_left(job_dir):
    e2e.wait_until(lambda: not e2e.job_processes(job_dir.name, job_dir), 10,
                   "every process of the ended job to exit")


def test_worker_exit_code_fails_the_job(write_job, run_shoal, jobs_dir, shoal_status):
    # worker:1 exits 3; worker:0 would sleep much longer and must be stopped.
    job = write_job(f"""
        name: exit3
        roles:
          worker:
            instances: 2
            command: ["/bin/sh", "-c", "if [ \\"$SHOAL_INDEX\\" = 1 ]; then echo bye; exit 3; fi; echo up; exec sleep 60"]
            resources: {{cpus: 0.5}}
        """)
    r = run_shoal("run", job, timeout=60)
    assert r.returncode == 1, f"rc={r.returncode}\n{r.stderr}"
    assert re.fullmatch(rf"shoal \| job exit3-\d{{8}}-\d{{6}}-[0-9a-f]{{4}} failed: worker:1 exited "
                        r"with code 3", last_line(r.stderr)), r.stderr
    assert "worker:1 | bye" in r.stdout.splitlines()

    job_dir = e2e.only_job_dir(jobs_dir)
    status = shoal_status(job_dir.name)
    assert status["state"] == "failed"
    assert "worker:1" in status["reason"] and "3" in status["reason"]
    tasks = {t["task"]: t for t in status["tasks"]}
    assert tasks["worker:1"]["state"] == "failed"
    assert tasks["worker:1"]["exit_code"] == 3
    assert tasks["worker:1"]["signal"] == 0
    # The other worker is stopped, not left running.
    assert tasks["worker:0"]["state"] in ("killed", "failed")
    assert_nothing_left(job_dir)


def test_worker_killed_by_sigkill(write_job, run_shoal, jobs_dir, shoal_status):
    job = write_job("""
        name: selfkill
        roles:
          worker:
            instances: 1
            command: ["/usr/bin/python3", "-c", "import os, signal; print('bye', flush=True); os.kill(os.getpid(), signal.SIGKILL)"]
            resources: {cpus: 0.5}
        """)
    r = run_shoal("run", job, timeout=60)
    assert r.returncode == 1, f"rc={r.returncode}\n{r.stderr}"
    assert re.fullmatch(r"shoal \| job selfkill-\S+ failed: worker:0 was killed by signal 9 "
                        r"\(SIGKILL\)", last_line(r.stderr)), r.stderr
    job_dir = e2e.only_job_dir(jobs_dir)
    task = shoal_status(job_dir.name)["tasks"][0]
    assert task["task"] == "worker:0"
    assert task["state"] == "failed"
    assert task["signal"] == 9
    assert_nothing_left(job_dir)


def test_missing_binary_could_not_start(write_job, run_shoal, jobs_dir, shoal_status):
    job = write_job("""
        name: nobinary
        roles:
          worker:
            instances: 1
            command: ["/nonexistent/shoal-e2e/no-such-program", "--flag"]
            resources: {cpus: 0.5}
        """)
    r = run_shoal("run", job, timeout=60)
    assert r.returncode == 1, f"rc={r.returncode}\n{r.stderr}"
    line = last_line(r.stderr)
    assert line.startswith("shoal | job nobinary-") and " failed: " in line, r.stderr
    assert "worker:0" in line and "could not start" in line, r.stderr
    job_dir = e2e.only_job_dir(jobs_dir)
    status = shoal_status(job_dir.name)
    assert status["state"] == "failed"
    assert "could not start" in status["reason"]
    assert status["tasks"][0]["state"] == "failed"
    assert_nothing_left(job_dir)


def test_missing_binary_among_running_tasks_stops_the_others(write_job, run_shoal, jobs_dir,
                                                              shoal_status):
    # ps keeps running; the worker's program is missing: the job fails and ps is stopped.
    job = write_job("""
        name: nobinary2
        roles:
          ps:
            instances: 1
            command: ["/bin/sh", "-c", "exec sleep 120"]
            resources: {cpus: 0.5}
          worker:
            instances: 1
            depends_on: [ps]
            command: ["/nonexistent/shoal-e2e/no-such-program"]
            resources: {cpus: 0.5}
        """)
    r = run_shoal("run", job, timeout=60)
    assert r.returncode == 1, f"rc={r.returncode}\n{r.stderr}"
    assert "worker:0" in last_line(r.stderr) and "could not start" in last_line(r.stderr)
    job_dir = e2e.only_job_dir(jobs_dir)
    tasks = {t["task"]: t for t in shoal_status(job_dir.name)["tasks"]}
    assert tasks["ps:0"]["state"] == "killed"
    assert_nothing_left(job_dir)


@pytest.mark.parametrize("command,expected", [
    ('"exit 255"', "worker:0 exited with code 255"),
    ('"nonexistent-shoal-e2e-command"', "worker:0 exited with code 127"),
    ('["/usr/bin/python3", "-c", "import os; os.abort()"]',
     "worker:0 was killed by signal 6 (SIGABRT)"),
    ('["/bin/sh", "-c", "kill -TERM $$"]', "worker:0 was killed by signal 15 (SIGTERM)"),
], ids=["exit255", "shell_not_found", "sigabrt", "sigterm"])
def test_failure_reasons(command, expected, write_job, run_shoal):
    job = write_job(f"""
        name: reasons
        roles:
          worker:
            command: {command}
            resources: {{cpus: 0.5}}
        """)
    r = run_shoal("run", "-q", job, timeout=60)
    assert r.returncode == 1, r.stderr
    assert last_line(r.stderr).endswith(f" failed: {expected}"), r.stderr


@pytest.mark.parametrize("role", ['command: ["/etc/hostname"]',
                                  'command: ["/bin/true"]\n            working_dir: /nonexistent/shoal-e2e'],
                         ids=["not_executable", "missing_working_dir"])
def test_other_start_failures(role, write_job, run_shoal, jobs_dir):
    job = write_job(f"""
        name: nostart
        roles:
          worker:
            {role}
            resources: {{cpus: 0.5}}
        """)
    r = run_shoal("run", "-q", job, timeout=60)
    assert r.returncode == 1, r.stderr
    assert "worker:0" in last_line(r.stderr) and "could not start" in last_line(r.stderr)
    assert_nothing_left(e2e.only_job_dir(jobs_dir))
