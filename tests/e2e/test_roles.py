"""Role semantics: untracked roles, depends_on ordering, chief / success roles."""

import pytest

import shoal_e2e as e2e


def final_status(shoal_status, job_dir):
    s = shoal_status(job_dir.name)
    assert s["state"] in e2e.TERMINAL_JOB_STATES, s
    return s, {t["task"]: t for t in s["tasks"]}


def test_untracked_ps_is_stopped_when_workers_finish(write_job, run_shoal, jobs_dir,
                                                     shoal_status, tmp_path):
    # ps never exits by itself (it traps SIGTERM and exits 0 only when told to stop); the
    # workers finish only once ps has installed its trap (the ready file).
    ready = tmp_path / "ps-ready"
    job = write_job(f"""
        name: untracked
        roles:
          ps:
            instances: 1
            untracked: true
            command: ["/bin/sh", "-c", "trap 'echo ps-stopping; exit 0' TERM; echo ps-up; touch {ready}; while true; do sleep 0.05; done"]
            resources: {{cpus: 0.5}}
          worker:
            instances: 2
            depends_on: [ps]
            command: ["/bin/sh", "-c", "while [ ! -e {ready} ]; do sleep 0.02; done; echo worker-done $SHOAL_INDEX"]
            resources: {{cpus: 0.5}}
        """)
    r = run_shoal("run", job, timeout=60)
    assert r.returncode == 0, f"rc={r.returncode}\n{r.stderr}"
    out = r.stdout.splitlines()
    assert "ps:0 | ps-up" in out
    assert "worker:0 | worker-done 0" in out and "worker:1 | worker-done 1" in out
    # The ps got SIGTERM (its trap ran), it was not just SIGKILLed.
    assert "ps:0 | ps-stopping" in out

    job_dir = e2e.only_job_dir(jobs_dir)
    status, tasks = final_status(shoal_status, job_dir)
    assert status["state"] == "succeeded"
    assert tasks["worker:0"]["state"] == "succeeded" and tasks["worker:1"]["state"] == "succeeded"
    assert tasks["ps:0"]["state"] == "killed"
    # ps was stopped only after both workers had finished.
    events = e2e.read_events(job_dir)
    idx = {(e["task"], e["to"]): i for i, e in enumerate(events) if e["type"] == "task_state"}
    assert idx[("ps:0", "killed")] > idx[("worker:0", "succeeded")]
    assert idx[("ps:0", "killed")] > idx[("worker:1", "succeeded")]
    e2e.wait_until(lambda: not e2e.job_processes(job_dir.name, job_dir), 10,
                   "every process of the job to exit")


def test_depends_on_launches_workers_after_every_ps_runs(write_job, run_shoal, jobs_dir):
    job = write_job("""
        name: deps
        roles:
          worker:
            instances: 2
            depends_on: [ps]
            command: ["/bin/sh", "-c", "echo worker $SHOAL_INDEX"]
            resources: {cpus: 0.25}
          ps:
            instances: 2
            untracked: true
            command: ["/bin/sh", "-c", "exec sleep 120"]
            resources: {cpus: 0.25}
          evaluator:
            instances: 1
            depends_on: [worker]
            command: ["/bin/sh", "-c", "echo eval"]
            resources: {cpus: 0.25}
        """)
    r = run_shoal("run", job, timeout=60)
    assert r.returncode == 0, f"rc={r.returncode}\n{r.stderr}"
    events = [e for e in e2e.read_events(e2e.only_job_dir(jobs_dir)) if e["type"] == "task_state"]

    def positions(role, to):
        return [i for i, e in enumerate(events)
                if e["task"].startswith(role + ":") and e["to"] == to]

    ps_running = positions("ps", "running")
    worker_starting = positions("worker", "starting")
    assert len(ps_running) == 2 and len(worker_starting) == 2, events
    assert max(ps_running) < min(worker_starting), (
        "a worker was launched before every ps task was running:\n"
        + "\n".join(f"{e['task']} {e.get('from')} -> {e['to']}" for e in events))
    worker_running = positions("worker", "running")
    evaluator_starting = positions("evaluator", "starting")
    assert len(evaluator_starting) == 1
    assert max(worker_running) < evaluator_starting[0]


@pytest.mark.parametrize("success", ["default_chief", "explicit_roles"])
def test_success_role_exiting_0_ends_the_job(success, write_job, run_shoal, jobs_dir,
                                             shoal_status):
    leader = "chief" if success == "default_chief" else "driver"
    section = "" if success == "default_chief" else "success: {roles: [driver]}\n        "
    job = write_job(f"""
        name: leader
        {section}roles:
          {leader}:
            instances: 1
            depends_on: [worker]
            command: ["/bin/sh", "-c", "echo leader-done"]
            resources: {{cpus: 0.5}}
          worker:
            instances: 2
            command: ["/bin/sh", "-c", "echo worker-up; exec sleep 120"]
            resources: {{cpus: 0.5}}
        """)
    r = run_shoal("run", job, timeout=60)
    assert r.returncode == 0, f"rc={r.returncode}\n{r.stderr}"
    assert f"{leader}:0 | leader-done" in r.stdout.splitlines()
    job_dir = e2e.only_job_dir(jobs_dir)
    status, tasks = final_status(shoal_status, job_dir)
    assert status["state"] == "succeeded"
    assert tasks[f"{leader}:0"]["state"] == "succeeded"
    assert tasks["worker:0"]["state"] == "killed" and tasks["worker:1"]["state"] == "killed"
    e2e.wait_until(lambda: not e2e.job_processes(job_dir.name, job_dir), 10,
                   "the workers to be stopped")


def test_failing_chief_fails_the_job(write_job, run_shoal):
    job = write_job("""
        name: badchief
        roles:
          chief:
            instances: 1
            command: ["/bin/sh", "-c", "exit 7"]
            resources: {cpus: 0.5}
          worker:
            instances: 1
            command: ["/bin/sh", "-c", "exec sleep 120"]
            resources: {cpus: 0.5}
        """)
    r = run_shoal("run", job, timeout=60)
    assert r.returncode == 1, r.stderr
    assert "chief:0 exited with code 7" in r.stderr.splitlines()[-1]


def test_untracked_role_ignoring_sigterm_is_killed_and_job_succeeds(write_job, run_shoal,
                                                                    jobs_dir, shoal_status,
                                                                    tmp_path):
    ready = tmp_path / "ps-ready"
    job = write_job(f"""
        name: stubbornps
        roles:
          ps:
            untracked: true
            command: ["/usr/bin/python3", "-c", "import signal, time\\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\\nopen('{ready}', 'w').close()\\nwhile True: time.sleep(0.1)"]
            resources: {{cpus: 0.5}}
          worker:
            depends_on: [ps]
            command: ["/bin/sh", "-c", "while [ ! -e {ready} ]; do sleep 0.02; done; echo done"]
            resources: {{cpus: 0.5}}
        """)
    r = run_shoal("run", job, timeout=60)
    assert r.returncode == 0, f"rc={r.returncode}\n{r.stderr}"
    job_dir = e2e.only_job_dir(jobs_dir)
    status, tasks = final_status(shoal_status, job_dir)
    assert status["state"] == "succeeded"
    assert tasks["ps:0"]["state"] == "killed" and tasks["ps:0"]["signal"] == 9
    e2e.wait_until(lambda: not e2e.job_processes(job_dir.name, job_dir), 10,
                   "every process of the job to exit")
