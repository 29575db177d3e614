"""Fixtures for Shoal's end-to-end tests: the binary, a private jobs directory per test, job
file writers, `shoal` runners with timeouts, and the /proc scan that finds a job's processes.

Every test cleans up what it started: the finalizer SIGKILLs the process group of every
client it launched and of every process that belongs to a job under the test's jobs dir.
"""

import json
import os
import signal
import subprocess
import textwrap
from pathlib import Path

import pytest

import shoal_e2e as e2e


@pytest.fixture(scope="session")
def shoal_bin():
    path = Path(e2e.SHOAL_BIN)
    assert path.is_file() and os.access(path, os.X_OK), (
        f"no shoal binary at {path}; build it (ninja -C build shoal) or set SHOAL_BIN")
    return str(path)


@pytest.fixture(scope="session")
def repo_root():
    return e2e.REPO_ROOT


class Client:
    """A `shoal` command running in the background, its output going to files."""

    def __init__(self, args, env, cwd, out_dir, tag):
        self.args = args
        self.stdout_path = out_dir / f"{tag}.stdout"
        self.stderr_path = out_dir / f"{tag}.stderr"
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            # A session of its own: a timeout can kill everything it started, and signals sent
            # to it here never reach pytest.
            self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                         env=env, cwd=cwd, start_new_session=True)
        self.pid = self.proc.pid

    def stdout(self):
        return self.stdout_path.read_text(errors="replace")

    def stderr(self):
        return self.stderr_path.read_text(errors="replace")

    def poll(self):
        return self.proc.poll()

    def wait(self, timeout):
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"`{' '.join(map(str, self.args))}` did not finish within {timeout}s\n"
                        f"--- stdout (tail)\n{self.stdout()[-3000:]}\n"
                        f"--- stderr (tail)\n{self.stderr()[-3000:]}")

    def kill(self):
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


class ShoalHarness:
    def __init__(self, shoal_bin, jobs_dir, tmp_path):
        self.shoal_bin = shoal_bin
        self.jobs_dir = jobs_dir
        self.tmp_path = tmp_path
        self.clients = []
        self.out_dir = tmp_path / "client-output"
        self.out_dir.mkdir(exist_ok=True)

    def command(self, args):
        return [self.shoal_bin, "--jobs-dir", str(self.jobs_dir), *map(str, args)]

    def run(self, *args, timeout=60, env=None, cwd=None):
        client = self.start(*args, env=env, cwd=cwd)
        rc = client.wait(timeout)
        return subprocess.CompletedProcess(client.args, rc, client.stdout(), client.stderr())

    def start(self, *args, env=None, cwd=None):
        tag = f"client-{len(self.clients)}"
        client = Client(self.command(args), e2e.base_env(env), cwd or self.tmp_path, self.out_dir,
                        tag)
        self.clients.append(client)
        return client

    def cleanup(self):
        for client in self.clients:
            if client.poll() is None:
                client.kill()
        leftovers = e2e.processes_under(self.jobs_dir)
        for proc in leftovers:
            e2e.kill_pgroup_or_pid(proc.pid, proc.pgid)
        # Let them go before the next test starts (zombies orphaned to init do not count).
        try:
            e2e.wait_until(lambda: all(p.state == "Z" for p in e2e.processes_under(self.jobs_dir)),
                           10, "the leftover processes of this test to exit")
        except AssertionError:
            pass
        for client in self.clients:
            if client.poll() is None:
                client.kill()


@pytest.fixture
def jobs_dir(tmp_path):
    """A jobs directory of this test's own (not created: shoal creates it)."""
    return tmp_path / "jobs"


@pytest.fixture
def harness(shoal_bin, jobs_dir, tmp_path):
    h = ShoalHarness(shoal_bin, jobs_dir, tmp_path)
    yield h
    h.cleanup()


@pytest.fixture
def run_shoal(harness):
    """run_shoal(*args, timeout=60, env=None, cwd=None) -> CompletedProcess (text stdout and
    stderr). `--jobs-dir <test's jobs dir>` is put first. On timeout the client's process group
    is killed and the test fails."""
    return harness.run


@pytest.fixture
def start_shoal(harness):
    """start_shoal(*args, env=None, cwd=None) -> Client, running in the background."""
    return harness.start


@pytest.fixture
def write_file(tmp_path):
    """write_file(name, text, directory=tmp_path) -> Path; the text is dedented."""
    def write(name, text, directory=None):
        path = Path(directory or tmp_path) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"))
        return path
    return write


@pytest.fixture
def write_job(write_file):
    """write_job(yaml_text, name="job.yaml", directory=tmp_path) -> Path of the job file."""
    def write(text, name="job.yaml", directory=None):
        return write_file(name, text, directory)
    return write


@pytest.fixture
def job_processes():
    """job_processes(job_id, job_dir) -> live processes of that job (see shoal_e2e)."""
    return e2e.job_processes


@pytest.fixture
def shoal_status(run_shoal):
    """shoal_status(job) -> the parsed `shoal status JOB --json`."""
    def status(job):
        r = run_shoal("status", job, "--json", timeout=30)
        assert r.returncode == 0, f"shoal status {job} --json: rc={r.returncode}\n{r.stderr}"
        return json.loads(r.stdout)
    return status


@pytest.fixture
def wait_for_state(shoal_status):
    """wait_for_state(job, predicate(status) -> bool, timeout, what) -> the status that
    satisfied it."""
    def wait(job, predicate, timeout=60, what="the job to reach a state"):
        last = {}

        def check():
            last["status"] = shoal_status(job)
            return predicate(last["status"])
        try:
            e2e.wait_until(check, timeout, what, interval=0.1)
        except AssertionError as e:
            raise AssertionError(f"{e}; last status: {json.dumps(last.get('status'), indent=1)}")
        return last["status"]
    return wait


@pytest.fixture
def detach_job(run_shoal):
    """detach_job(job_file, *extra_run_args, env=None) -> job id (asserts exit 0)."""
    def detach(job_file, *extra, env=None):
        r = run_shoal("run", "--detach", *extra, job_file, timeout=60, env=env)
        assert r.returncode == 0, f"run --detach failed: rc={r.returncode}\n{r.stderr}"
        job_id = r.stdout.strip()
        assert job_id and "\n" not in job_id, f"--detach printed {r.stdout!r}"
        return job_id
    return detach
