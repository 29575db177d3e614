"""examples/mpi and framework: mpi. An mpi4py program runs under mpirun, which Shoal's launcher
task points at a hostfile of the worker tasks and at `shoal mpi-rsh`, so that every rank runs
inside a worker task. Also the pieces on their own: `shoal mpi-worker` refuses callers without
the job's secret and stops a command whose caller went away."""

import json
import os
import signal
import socket
import subprocess
import time

import framework_examples as fx
import shoal_e2e as e2e

ROOT_OK = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def require_mpi():
    assert os.access("/usr/bin/mpirun", os.X_OK), "mpirun is missing: run ./setup.sh (openmpi-bin)"
    r = subprocess.run([e2e.PYTHON, "-c", "import mpi4py"], capture_output=True, text=True)
    assert r.returncode == 0, f"mpi4py is missing: run ./setup.sh (python3-mpi4py)\n{r.stderr}"


def lines_of(stdout, task):
    return [l[len(task) + 3:] for l in stdout.splitlines() if l.startswith(f"{task} | ")]


def write_mpi_job(write_job, name, command, workers=2, slots=1, worker_env=None):
    """A launcher running `command` (a list) and `workers` worker tasks of `slots` slots."""
    return write_job(f"""
        name: {name}
        framework: mpi
        mpi: {{slots_per_worker: {slots}}}
        roles:
          launcher:
            command: {json.dumps(command)}
            resources: {{cpus: 0.1}}
            env: {json.dumps(ROOT_OK)}
          worker:
            instances: {workers}
            resources: {{cpus: 0.5}}
            env: {json.dumps({**ROOT_OK, **(worker_env or {})})}
        """)


def test_mpi_example_trains_with_one_rank_in_each_worker_task(run_shoal, repo_root):
    require_mpi()
    r = run_shoal("run", repo_root / "examples" / "mpi" / "job.yaml", timeout=180, env=ROOT_OK)
    metrics = fx.check_trained(r, "launcher:0", 0.85)
    assert metrics["world_size"] == 2 and metrics["weights_identical"] is True, metrics
    # Each rank ran in its own worker task (it inherited that task's SHOAL_ROLE/SHOAL_INDEX).
    assert sorted(h["shoal_task"] for h in metrics["hosts"]) == ["worker:0", "worker:1"], metrics
    for w in ("worker:0", "worker:1"):
        assert any("hosting MPI ranks" in l for l in lines_of(r.stdout, w)), r.stdout
    assert any("running: mpirun -np 2 --bind-to none" in l
               for l in lines_of(r.stdout, "launcher:0")), r.stdout


RANKS_PROGRAM = (
    "from mpi4py import MPI; import os; c = MPI.COMM_WORLD; "
    "t = c.gather(os.environ['SHOAL_ROLE'] + ':' + os.environ['SHOAL_INDEX'], root=0); "
    "s = c.allreduce(c.rank + 1); "
    "c.rank == 0 and print('ranks', c.size, 'sum', s, 'tasks', ','.join(sorted(t)), flush=True)")


def test_a_launcher_command_that_runs_mpirun_itself_gets_the_hostfile(run_shoal, write_job):
    require_mpi()
    job = write_mpi_job(write_job, "mpi-own-mpirun", [
        "mpirun", "-np", "3", "--bind-to", "none", "/usr/bin/python3", "-c", RANKS_PROGRAM],
        slots=2)
    r = run_shoal("run", job, timeout=120)
    assert r.returncode == 0, f"rc={r.returncode}\n{r.stdout}\n{r.stderr}"
    out = lines_of(r.stdout, "launcher:0")
    # Three ranks over 2 workers x 2 slots: Open MPI fills worker 0 first.
    assert "ranks 3 sum 6 tasks worker:0,worker:0,worker:1" in out, r.stdout
    assert any("running: mpirun -np 3" in l for l in out), r.stdout


# Each rank reports its task, and for both of Open MPI's per-machine directories the directory
# it was given and what Open MPI keeps there: the daemons' session files (ompi.*) and the
# ranks' shared-memory segments (vader_segment.*).
DIRECTORIES_PROGRAM = (
    "from mpi4py import MPI; import os, json; c = MPI.COMM_WORLD; c.Barrier(); "
    "d = [os.environ.get(v, '') for v in "
    "('OMPI_MCA_orte_tmpdir_base', 'OMPI_MCA_btl_vader_backing_directory')]; "
    "k = [sorted({n.split('.')[0] for n in os.listdir(p)}) if os.path.isdir(p) else [] "
    "for p in d]; "
    "t = c.gather([os.environ['SHOAL_ROLE'] + ':' + os.environ['SHOAL_INDEX'], d, k], root=0); "
    "s = c.allreduce(c.rank + 1); c.Barrier(); "
    "c.rank == 0 and print('directories', s, json.dumps(sorted(t)), flush=True)")


def run_directories_job(run_shoal, write_job, tmp_path, worker_env, workers=2):
    """Workers of two slots each, so that each worker hosts two ranks that share memory."""
    require_mpi()
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    job = write_mpi_job(write_job, "mpi-directories",
                        ["/usr/bin/python3", "-c", DIRECTORIES_PROGRAM], workers=workers, slots=2,
                        worker_env=worker_env)
    r = run_shoal("run", job, timeout=120, env={"TMPDIR": str(tmp)})
    assert r.returncode == 0, f"rc={r.returncode}\n{r.stdout}\n{r.stderr}"
    (line,) = [l for l in lines_of(r.stdout, "launcher:0") if l.startswith("directories ")]
    _, total, ranks = line.split(" ", 2)
    assert int(total) == sum(range(1, 2 * workers + 1)), line  # every rank took part
    seen = {}
    for task, dirs, kept in json.loads(ranks):
        assert seen.setdefault(task, (dirs, kept)) == (dirs, kept), (
            f"two ranks of {task} were given different directories: {ranks}")
    assert sorted(seen) == [f"worker:{i}" for i in range(workers)], ranks
    return tmp, seen


def test_each_worker_gives_its_ranks_open_mpis_directories_of_their_own(
        run_shoal, write_job, tmp_path):
    # Shared between two workers on one machine, Open MPI 4.1 failed a daemon's start when two
    # created the session directory at once ("mkdir ... File exists"), and crashed ranks of
    # the same local rank in two workers, which opened one shared-memory segment (SIGSEGV in
    # mca_btl_vader_poll_handle_frag).
    tmp, seen = run_directories_job(run_shoal, write_job, tmp_path, {})
    for i, (parent, kind) in enumerate([(str(tmp), "ompi"), ("/dev/shm", "vader_segment")]):
        given = {task: dirs[i] for task, (dirs, _) in seen.items()}
        assert given["worker:0"] != given["worker:1"], seen
        for task, path in given.items():
            assert path.startswith(f"{parent}/shoal-mpi-{task.replace(':', '')}-"), seen
            assert kind in seen[task][1][i], f"Open MPI kept no {kind} in {path}: {seen}"
            assert not os.path.exists(path), f"{task} left {path} behind"
    assert list(tmp.iterdir()) == [], "the workers left directories behind"


def test_directories_the_role_chose_are_kept(run_shoal, write_job, tmp_path):
    # One worker: a role's value is every worker's, and two workers of two ranks on one machine
    # would share the segments again (docs/environment.md says so).
    chosen = {"OMPI_MCA_orte_tmpdir_base": tmp_path / "session",
              "OMPI_MCA_btl_vader_backing_directory": tmp_path / "shm"}
    for path in chosen.values():
        path.mkdir()
    _, seen = run_directories_job(run_shoal, write_job, tmp_path,
                                  {k: str(v) for k, v in chosen.items()}, workers=1)
    dirs, kept = seen["worker:0"]
    assert dirs == [str(chosen["OMPI_MCA_orte_tmpdir_base"]),
                    str(chosen["OMPI_MCA_btl_vader_backing_directory"])], seen
    assert "ompi" in kept[0] and "vader_segment" in kept[1], seen


def test_a_failing_rank_fails_the_job_and_leaves_no_process(run_shoal, write_job, jobs_dir):
    require_mpi()
    program = ("from mpi4py import MPI; import sys; c = MPI.COMM_WORLD; c.Barrier(); "
               "sys.exit(3 if c.rank == 1 else 0)")
    job = write_mpi_job(write_job, "mpi-failing-rank", ["/usr/bin/python3", "-c", program])
    r = run_shoal("run", job, timeout=120)
    assert r.returncode == 1, f"rc={r.returncode}\n{r.stdout}\n{r.stderr}"
    assert "launcher:0" in r.stderr and "failed" in r.stderr, r.stderr
    (job_dir,) = e2e.job_dirs(jobs_dir)
    e2e.wait_until(lambda: not e2e.job_processes(job_dir.name, job_dir), 15,
                   "every process of the failed MPI job (orted, ranks) to be gone")


def test_a_worker_role_with_a_command_is_refused_before_anything_starts(run_shoal, write_job,
                                                                       jobs_dir):
    job = write_job("""
        name: mpi-bad
        framework: mpi
        roles:
          launcher: {command: [/usr/bin/python3, train.py]}
          worker:
            instances: 2
            command: [/usr/bin/python3, train.py]
        """)
    r = run_shoal("run", job, timeout=30)
    assert r.returncode == 2, r
    assert "job.yaml:7: roles.worker.command: framework: mpi runs Shoal's MPI host" in r.stderr, r.stderr
    assert not jobs_dir.exists() or not list(jobs_dir.iterdir())


# --- mpi-worker and mpi-rsh on their own -----------------------------------------------------

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MpiWorker:
    """A real `shoal mpi-worker` serving as worker 0 of a hand-written cluster spec."""

    def __init__(self, shoal_bin, tmp_path, secret):
        self.port = free_port()
        self.spec = tmp_path / "cluster.json"
        self.spec.write_text(json.dumps({"job_id": "j", "restart_count": 0, "cluster": {},
                                         "tasks": [{"role": "worker", "index": 0, "rank": 0,
                                                    "node": "n", "address": "127.0.0.1",
                                                    "port": self.port}]}))
        self.log = tmp_path / "worker.log"
        self.shoal_bin = shoal_bin
        self.tmp = tmp_path / "tmp"  # where it makes Open MPI's session directory
        self.tmp.mkdir()
        # Given, so that it makes none in /dev/shm: stop() kills it without a chance to clean.
        (tmp_path / "shm").mkdir()
        env = e2e.base_env({"SHOAL_CLUSTER_SPEC_FILE": str(self.spec), "SHOAL_ROLE": "worker",
                            "SHOAL_INDEX": "0", "SHOAL_MPI_SECRET": secret,
                            "TMPDIR": str(self.tmp),
                            "OMPI_MCA_btl_vader_backing_directory": str(tmp_path / "shm")})
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen([shoal_bin, "mpi-worker"], env=env, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        e2e.wait_until(lambda: "hosting MPI ranks" in self.log.read_text(), 10,
                       "mpi-worker to listen")

    def rsh(self, secret, *words, wait=True):
        env = e2e.base_env({"SHOAL_CLUSTER_SPEC_FILE": str(self.spec), "SHOAL_MPI_SECRET": secret})
        p = subprocess.Popen([self.shoal_bin, "mpi-rsh", *words], env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        if not wait:
            return p
        out, err = p.communicate(timeout=30)
        return p.returncode, out, err

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


def process_with_argv(argv):
    want = "\0".join(argv).encode()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read().rstrip(b"\0") == want:
                    return int(pid)
        except OSError:
            pass
    return None


def test_mpi_rsh_runs_a_command_in_the_worker_and_returns_its_exit_code(shoal_bin, tmp_path):
    worker = MpiWorker(shoal_bin, tmp_path, "s3cret")
    try:
        marker = tmp_path / "ran"
        rc, _, err = worker.rsh("s3cret", "shoal-worker-0", "",
                                f"echo \"[$SHOAL_MPI_SECRET]\" > {marker}; exit 7")
        assert rc == 7, err
        # The command ran, and without the secret: the ranks have no use for it.
        assert marker.read_text() == "[]\n"
        rc, _, err = worker.rsh("s3cret", "shoal-worker-3", "true")
        assert rc == 255 and "unknown host 'shoal-worker-3'" in err, err
    finally:
        worker.stop()


def test_mpi_worker_refuses_a_caller_without_the_jobs_secret(shoal_bin, tmp_path):
    worker = MpiWorker(shoal_bin, tmp_path, "s3cret")
    try:
        marker = tmp_path / "must-not-exist"
        rc, _, err = worker.rsh("guess", "shoal-worker-0", f"touch {marker}")
        assert rc == 255 and "wrong secret" in err, err
        assert not marker.exists()
        assert "does not hold this job's secret" in worker.log.read_text()
        # A malformed request is refused too, and the worker keeps serving.
        with socket.create_connection(("127.0.0.1", worker.port)) as s:
            s.sendall(b"{not json\n")
            assert b"error" in s.makefile("rb").readline()
        rc, _, err = worker.rsh("s3cret", "shoal-worker-0", "exit 0")
        assert rc == 0, err
    finally:
        worker.stop()


def test_mpi_worker_that_cannot_make_its_directories_says_so_and_serves_nothing(shoal_bin,
                                                                                tmp_path):
    spec = tmp_path / "cluster.json"
    port = free_port()
    spec.write_text(json.dumps({"job_id": "j", "restart_count": 0, "cluster": {},
                                "tasks": [{"role": "worker", "index": 0, "rank": 0, "node": "n",
                                           "address": "127.0.0.1", "port": port}]}))
    missing = tmp_path / "no-such-dir"
    env = e2e.base_env({"SHOAL_CLUSTER_SPEC_FILE": str(spec), "SHOAL_ROLE": "worker",
                        "SHOAL_INDEX": "0", "SHOAL_MPI_SECRET": "s3cret", "TMPDIR": str(missing),
                        "OMPI_MCA_btl_vader_backing_directory": str(tmp_path)})
    r = subprocess.run([shoal_bin, "mpi-worker"], env=env, capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 1, r
    assert ("OMPI_MCA_orte_tmpdir_base: cannot create a directory "
            f"{missing}/shoal-mpi-worker0-XXXXXX: No such file or directory") in r.stderr, r.stderr
    assert "hosting MPI ranks" not in r.stderr, r.stderr
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0, "the worker left its port listening"


def test_mpi_worker_stops_the_command_when_its_caller_goes_away(shoal_bin, tmp_path):
    worker = MpiWorker(shoal_bin, tmp_path, "s3cret")
    try:
        rsh = worker.rsh("s3cret", "shoal-worker-0", "exec sleep 301", wait=False)
        pid = e2e.wait_until(lambda: process_with_argv(["sleep", "301"]), 10,
                             "the remote command to start")
        rsh.kill()  # as mpirun does to its remote shells when it aborts
        rsh.wait(timeout=10)
        e2e.wait_until(lambda: process_with_argv(["sleep", "301"]) != pid, 10,
                       "the worker to stop the command of the caller that went away")
        # SIGTERM ends the worker and whatever it still runs.
        rsh = worker.rsh("s3cret", "shoal-worker-0", "exec sleep 302", wait=False)
        e2e.wait_until(lambda: process_with_argv(["sleep", "302"]), 10, "the second command")
        assert [d.name[:len("shoal-mpi-worker0-")] for d in worker.tmp.iterdir()] == [
            "shoal-mpi-worker0-"]
        worker.proc.send_signal(signal.SIGTERM)
        assert worker.proc.wait(timeout=15) == 0
        assert process_with_argv(["sleep", "302"]) is None
        assert list(worker.tmp.iterdir()) == [], "the stopped worker left its session directory"
        rsh.wait(timeout=10)
        # The caller learns that the command did not finish: 143 (it died of SIGTERM) or 255
        # (the worker was gone before it could say so).
        assert rsh.returncode in (143, 255), rsh.returncode
    finally:
        worker.stop()
