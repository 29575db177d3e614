"""`shoal status`, `list`, `kill` and `run --detach`."""

import json
import os
import re
import time

import pytest

import shoal_e2e as e2e

ID_RE = r"{name}-\d{{8}}-\d{{6}}-[0-9a-f]{{4}}"
TASK_KEYS = {"task", "role", "index", "rank", "state", "node", "pid", "exit_code", "signal",
             "reason"}
JOB_STATES = {"queued", "starting", "running", "stopping", "succeeded", "failed", "killed",
              "lost"}
TASK_STATES = {"pending", "starting", "running", "succeeded", "failed", "killed"}

SLEEPER = """
    name: sleeper
    roles:
      ps:
        instances: 1
        command: ["/bin/sh", "-c", "trap 'exit 0' TERM; while true; do sleep 0.05; done"]
        resources: {cpus: 0.5}
      worker:
        instances: 2
        command: ["/usr/bin/python3", "-c", "import signal, time\\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\\nwhile True: time.sleep(0.1)"]
        resources: {cpus: 0.5}
    """


def check_status_shape(s):
    for key in ("job_id", "name", "state", "reason", "tasks"):
        assert key in s, f"status has no {key}: {s}"
    assert s["state"] in JOB_STATES
    assert isinstance(s["reason"], str)
    for t in s["tasks"]:
        assert TASK_KEYS <= set(t), f"task lacks {TASK_KEYS - set(t)}: {t}"
        assert t["state"] in TASK_STATES
        assert t["task"] == f"{t['role']}:{t['index']}"
        for k in ("index", "rank", "pid", "exit_code", "signal"):
            assert isinstance(t[k], int), (k, t)


def test_detach_status_list_kill(write_job, detach_job, run_shoal, jobs_dir, wait_for_state,
                                 shoal_status):
    job = write_job(SLEEPER)
    t0_ms = time.time() * 1000
    job_id = detach_job(job)
    assert re.fullmatch(ID_RE.format(name="sleeper"), job_id), job_id
    job_dir = jobs_dir / job_id
    assert job_dir.is_dir()
    # --detach returns once the master is up
    master_pid = json.loads((job_dir / "master.json").read_text())["pid"]
    os.kill(master_pid, 0)
    assert f"master --job-dir {job_dir}" in open(f"/proc/{master_pid}/cmdline").read().replace("\0", " ")

    s = wait_for_state(job_id, lambda s: s["state"] == "running"
                       and all(t["state"] == "running" for t in s["tasks"]), 60, "all running")
    check_status_shape(s)
    assert s["job_id"] == job_id and s["name"] == "sleeper"
    tasks = {t["task"]: t for t in s["tasks"]}
    assert set(tasks) == {"ps:0", "worker:0", "worker:1"}
    assert sorted(t["rank"] for t in s["tasks"]) == [0, 1, 2]
    assert tasks["worker:1"]["role"] == "worker" and tasks["worker:1"]["index"] == 1
    for t in s["tasks"]:
        assert t["node"], t
        # the pid is the live task process, and it belongs to this job
        environ = open(f"/proc/{t['pid']}/environ", "rb").read().split(b"\0")
        assert f"SHOAL_JOB_ID={job_id}".encode() in environ
        assert f"SHOAL_ROLE={t['role']}".encode() in environ
        assert f"SHOAL_INDEX={t['index']}".encode() in environ
        assert f"SHOAL_RANK={t['rank']}".encode() in environ

    # a unique prefix names the job too
    assert shoal_status(job_id[: len("sleeper-") + 8])["job_id"] == job_id
    # the human form names the tasks
    human = run_shoal("status", job_id, timeout=30)
    assert human.returncode == 0 and "worker:1" in human.stdout and job_id in human.stdout

    r = run_shoal("list", "--json", timeout=30)
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert isinstance(rows, list) and len(rows) == 1
    row = rows[0]
    for key in ("job_id", "name", "state", "reason", "tasks", "created_unix_ms", "job_dir"):
        assert key in row, f"list row has no {key}: {row}"
    assert row["job_id"] == job_id and row["name"] == "sleeper" and row["state"] == "running"
    assert row["tasks"] == 3
    assert os.path.samefile(row["job_dir"], job_dir)
    assert t0_ms - 60_000 <= row["created_unix_ms"] <= time.time() * 1000 + 60_000
    human = run_shoal("list", timeout=30)
    assert human.returncode == 0 and job_id in human.stdout

    pgids = [os.getpgid(t["pid"]) for t in s["tasks"]]
    k = run_shoal("kill", job_id, timeout=60)
    assert k.returncode == 0, k.stderr
    assert k.stdout.strip() == f"job {job_id} killed"
    e2e.wait_until(lambda: not e2e.job_processes(job_id, job_dir)
                   and all(e2e.pgroup_gone(g) for g in pgids), 10,
                   "every process of the killed job to exit")

    final = shoal_status(job_id)
    check_status_shape(final)
    assert final["state"] == "killed"
    assert final["reason"], final
    assert all(t["state"] == "killed" for t in final["tasks"]), final
    assert json.loads((job_dir / "status.json").read_text())["state"] == "killed"
    r = run_shoal("list", "--json", timeout=30)
    assert json.loads(r.stdout)[0]["state"] == "killed"
    # Killing it again, once its master is gone (reaped), is harmless. (Before it is reaped,
    # see test_kill_of_a_just_finished_job.)
    e2e.wait_until(lambda: not os.path.exists(f"/proc/{master_pid}"), 30,
                   "the master's pid to be reaped")
    again = run_shoal("kill", job_id, timeout=30)
    assert again.returncode == 0, again.stderr
    assert job_id in again.stdout


def test_list_orders_jobs_and_reports_outcomes(write_job, run_shoal):
    ok = write_job("""
        name: first-ok
        roles:
          worker: {command: ["/bin/true"], resources: {cpus: 0.5}}
        """, name="ok.yaml")
    bad = write_job("""
        name: second-bad
        roles:
          worker: {command: ["/bin/sh", "-c", "exit 4"], resources: {cpus: 0.5}}
        """, name="bad.yaml")
    assert run_shoal("run", "-q", ok, timeout=60).returncode == 0
    assert run_shoal("run", "-q", bad, timeout=60).returncode == 1
    r = run_shoal("list", "--json", timeout=30)
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert [row["name"] for row in rows] == ["first-ok", "second-bad"]
    assert [row["state"] for row in rows] == ["succeeded", "failed"]
    assert "exited with code 4" in rows[1]["reason"]
    assert rows[0]["created_unix_ms"] <= rows[1]["created_unix_ms"]


def test_list_of_empty_jobs_dir(run_shoal):
    r = run_shoal("list", "--json", timeout=30)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == []


@pytest.mark.parametrize("command", [["status"], ["status", "--json"], ["logs"], ["kill"],
                                     ["logs", "--follow"]])
def test_unknown_job_is_exit_2(command, run_shoal, write_job):
    # with one real job present, so that "unknown" is not just "no jobs dir"
    job = write_job("""
        name: known
        roles:
          worker: {command: ["/bin/true"], resources: {cpus: 0.5}}
        """)
    assert run_shoal("run", "-q", job, timeout=60).returncode == 0
    args = [command[0], "no-such-job-20000101-000000-abcd", *command[1:]]
    r = run_shoal(*args, timeout=30)
    assert r.returncode == 2, f"{args}: rc={r.returncode}\n{r.stdout}\n{r.stderr}"
    assert "no-such-job" in r.stderr


def test_ambiguous_prefix_is_refused(write_job, run_shoal):
    job = write_job("""
        name: twin
        roles:
          worker: {command: ["/bin/true"], resources: {cpus: 0.5}}
        """)
    assert run_shoal("run", "-q", job, timeout=60).returncode == 0
    assert run_shoal("run", "-q", job, timeout=60).returncode == 0
    r = run_shoal("status", "twin-", timeout=30)
    assert r.returncode == 2, r.stdout


def test_kill_of_a_just_finished_job(write_job, run_shoal):
    """`shoal kill` on a job that has just ended is harmless: exit 0, saying it has ended."""
    job = write_job("""
        name: justdone
        roles:
          worker: {command: ["/bin/true"], resources: {cpus: 0.5}}
        """)
    assert run_shoal("run", "-q", job, timeout=60).returncode == 0
    r = run_shoal("kill", "justdone", timeout=30)
    assert r.returncode == 0, f"rc={r.returncode}\n{r.stdout}\n{r.stderr}"
    assert "justdone-" in r.stdout
