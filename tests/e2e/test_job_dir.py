"""The job directory: what `shoal run` leaves under --jobs-dir/<job id>/."""

import datetime
import json
import os
import re
import stat
import threading

import shoal_e2e as e2e


def test_job_directory_layout(write_job, run_shoal, jobs_dir, shoal_status):
    text = """\
# a comment, kept as submitted
name: layout
roles:
  worker:
    instances: 2
    command: ["/bin/sh", "-c", "echo out-$SHOAL_INDEX; echo err-$SHOAL_INDEX >&2"]
    resources: {cpus: 0.5}
"""
    job = write_job(text)
    r = run_shoal("run", job, timeout=60)
    assert r.returncode == 0, r.stderr
    (job_dir,) = e2e.job_dirs(jobs_dir)
    job_id = job_dir.name

    m = re.fullmatch(r"layout-(\d{8}-\d{6})-[0-9a-f]{4}", job_id)
    assert m, job_id
    datetime.datetime.strptime(m.group(1), "%Y%m%d-%H%M%S")
    assert f"job {job_id}" in r.stderr

    assert (job_dir / "spec.yaml").read_text() == text
    submit = json.loads((job_dir / "submit.json").read_text())
    assert isinstance(submit, dict) and submit.get("job_id", job_id) == job_id
    token = job_dir / "token"
    assert stat.S_IMODE(token.stat().st_mode) == 0o600
    assert token.read_text().strip()
    master = json.loads((job_dir / "master.json").read_text())
    assert isinstance(master, dict)

    events = e2e.read_events(job_dir)
    assert events and events[0]["type"] == "job_submitted"

    logs = (job_dir / "logs.txt").read_text().splitlines()
    assert sorted(logs) == sorted(["worker:0 | out-0", "worker:0 | err-0",
                                   "worker:1 | out-1", "worker:1 | err-1"])
    for i in (0, 1):
        task_dir = job_dir / "tasks" / f"worker-{i}"
        assert (task_dir / "stdout").read_text() == f"out-{i}\n"
        assert (task_dir / "stderr").read_text() == f"err-{i}\n"

    # agents/<node>/: the agent's own files, among them the cluster spec
    agent_dir = job_dir / "agents" / "local"
    assert agent_dir.is_dir()
    assert "cluster" in json.loads((agent_dir / "cluster.json").read_text())
    assert (job_dir / "master.log").is_file()

    # status.json has the form of `shoal status --json`, and the same content once it ended
    master_pid = master.get("pid")
    if master_pid:
        e2e.wait_until(lambda: not os.path.exists(f"/proc/{master_pid}"), 30,
                       "the master to exit")
    on_disk = json.loads((job_dir / "status.json").read_text())
    shown = shoal_status(job_id)
    for key in ("job_id", "name", "state", "reason", "tasks"):
        assert on_disk[key] == shown[key], key
    assert on_disk["state"] == "succeeded"


def test_job_file_is_read_once_and_stored_as_read(tmp_path, run_shoal, jobs_dir):
    """Issue 24: the client validated the job file, then read it again for spec.yaml, so what ran
    could differ from what was checked. A named pipe can be read only once: the job runs only if
    the bytes validated are the bytes stored, and spec.yaml holds exactly those."""
    text = (b"# from a pipe\r\nname: piped\r\nroles:\r\n  worker:\r\n"
            b"    command: [\"/bin/sh\", \"-c\", \"echo ran\"]\r\n    resources: {cpus: 0.25}")
    fifo = tmp_path / "job.yaml"
    os.mkfifo(fifo)

    def write_once():
        try:
            with open(fifo, "wb") as f:  # blocks until shoal opens it
                f.write(text)
        except BrokenPipeError:
            pass  # shoal closed it unread; the assertions below say so

    writer = threading.Thread(target=write_once, daemon=True)
    writer.start()
    try:
        r = run_shoal("run", "-q", fifo, timeout=60)
    finally:
        # Lets the writer go should shoal never have opened the pipe.
        os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
        writer.join(10)
    assert r.returncode == 0, f"rc={r.returncode}\n{r.stderr[-3000:]}"
    assert "worker:0 | ran" in r.stdout.splitlines(), r.stdout
    (job_dir,) = e2e.job_dirs(jobs_dir)
    assert (job_dir / "spec.yaml").read_bytes() == text


def test_relative_job_file_path(write_job, run_shoal, jobs_dir, tmp_path):
    """A job file named relative to the client's cwd: tasks start in its directory."""
    sub = tmp_path / "jobfiles"
    write_job("""
        name: relpath
        roles:
          worker: {command: ["/bin/sh", "-c", "pwd"], resources: {cpus: 0.5}}
        """, name="rel.yaml", directory=sub)
    r = run_shoal("run", "-q", "jobfiles/rel.yaml", cwd=tmp_path, timeout=60)
    assert r.returncode == 0, r.stderr
    assert f"worker:0 | {sub}" in r.stdout.splitlines()
    (job_dir,) = e2e.job_dirs(jobs_dir)
    assert job_dir.name.startswith("relpath-")


def test_a_master_that_cannot_start_is_reported_at_once(write_job, run_shoal, jobs_dir):
    # 192.0.2.1 (TEST-NET-1) is never an address of this machine: the master cannot listen
    # there and exits. `shoal run` learns it from the master's readiness pipe closing unwritten
    # and says why, from the master's log.
    job = write_job("""
        name: nolisten
        roles:
          worker:
            command: ["/bin/true"]
            resources: {cpus: 0.1}
        """)
    r = run_shoal("run", "--listen", "192.0.2.1", job)
    assert r.returncode == 1, r.stderr
    assert "the master exited before it was ready" in r.stderr, r.stderr
    assert "192.0.2.1" in r.stderr, r.stderr
    (job_dir,) = list(jobs_dir.glob("nolisten-*"))
    assert not (job_dir / "master.json").exists()
    assert "cannot start the master" in (job_dir / "master.log").read_text()
