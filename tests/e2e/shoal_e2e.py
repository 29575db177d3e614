"""Plain helpers for Shoal's end-to-end tests (the fixtures live in conftest.py).

Everything here synchronises by polling a condition against a deadline; nothing sleeps a
fixed time and hopes.
"""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

REPO_ROOT = Path(os.environ.get("SHOAL_SOURCE_DIR") or Path(__file__).resolve().parents[2])
# The YARN test cluster (tests/yarn/cluster.sh): its state directory and control script.
YARN_DIR = Path(os.environ.get("SHOAL_YARN_DIR", "/tmp/shoal-yarn"))
YARN_CLUSTER_SH = REPO_ROOT / "tests" / "yarn" / "cluster.sh"
YARN_CLUSTER_KEYS = ("SHOAL_YARN_RM", "SHOAL_YARN_RM_WEB", "SHOAL_HDFS", "SHOAL_WEBHDFS",
                     "HADOOP_CONF_DIR", "SHOAL_YARN_NODEMANAGERS")
SHOAL_BIN = os.environ.get("SHOAL_BIN") or str(REPO_ROOT / "build" / "src" / "cli" / "shoal")
PYTHON = "/usr/bin/python3"  # Debian's, the one with torch and scikit-learn

TERMINAL_JOB_STATES = {"succeeded", "failed", "killed"}
TERMINAL_TASK_STATES = {"succeeded", "failed", "killed"}

# Variables that must reach a task only from Shoal, never from the test runner's environment.
SCRUBBED_ENV = (
    "SHOAL_JOBS_DIR", "SHOAL_AGENT_MASTER_GRACE_MS", "MASTER_ADDR", "MASTER_PORT", "RANK",
    "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "ROLE_NAME", "ROLE_RANK", "ROLE_WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "CUDA_VISIBLE_DEVICES",
    "OMP_NUM_THREADS", "OPENBLAS_CORETYPE",
)


def base_env(extra=None):
    env = {k: v for k, v in os.environ.items()
           if k not in SCRUBBED_ENV and not k.startswith("SHOAL_")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    if extra:
        env.update(extra)
    return env


def wait_until(predicate, timeout, what, interval=0.05):
    """Polls `predicate` until it returns something truthy (returned) or `timeout` passes."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


# ---------------------------------------------------------------------------------------------
# /proc scanning

def _read(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def _stat(pid):
    """(state, ppid, pgid) of a process, or None when it is gone."""
    raw = _read(f"/proc/{pid}/stat")
    if raw is None:
        return None
    # comm may hold spaces and parentheses: the fields after it start past the last ')'.
    rest = raw[raw.rfind(b")") + 2:].split()
    return rest[0].decode(), int(rest[1]), int(rest[2])


class Proc:
    def __init__(self, pid, pgid, state, ppid, cmdline):
        self.pid, self.pgid, self.state, self.ppid, self.cmdline = pid, pgid, state, ppid, cmdline

    def __repr__(self):
        return f"Proc(pid={self.pid}, pgid={self.pgid}, state={self.state}, cmd={self.cmdline!r})"


def _all_processes():
    me = os.getpid()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        pid = int(name)
        st = _stat(pid)
        if st is None:
            continue
        state, ppid, pgid = st
        environ = _read(f"/proc/{pid}/environ") or b""
        cmdline = _read(f"/proc/{pid}/cmdline") or b""
        yield (Proc(pid, pgid, state, ppid, cmdline.replace(b"\0", b" ").decode(errors="replace")),
               environ.split(b"\0"), cmdline.split(b"\0"))


def job_processes(job_id, job_dir):
    """Every live (non-zombie) process of a job: tasks (and their children) by
    SHOAL_JOB_ID=<id> in /proc/PID/environ, master and agent by the job directory in their
    command line."""
    want_env = f"SHOAL_JOB_ID={job_id}".encode()
    want_dir = str(job_dir).encode()
    found = []
    for proc, environ, argv in _all_processes():
        if proc.state == "Z":
            continue
        if want_env in environ or any(want_dir in a for a in argv):
            found.append(proc)
    return found


def task_processes(job_id):
    """Live processes started as tasks of a job (and their children): SHOAL_JOB_ID=<id>."""
    want_env = f"SHOAL_JOB_ID={job_id}".encode()
    return [proc for proc, environ, _ in _all_processes()
            if proc.state != "Z" and want_env in environ]


def processes_under(jobs_dir):
    """Every process (zombies included) started for any job under `jobs_dir`: for cleanup."""
    prefix = f"SHOAL_JOB_DIR={jobs_dir}/".encode()
    want_dir = (str(jobs_dir) + "/").encode()
    found = []
    for proc, environ, argv in _all_processes():
        if any(e.startswith(prefix) for e in environ) or any(want_dir in a for a in argv):
            found.append(proc)
    return found


def pgroup_gone(pgid):
    """True when no process of group `pgid` is left. os.killpg(pgid, 0) raising
    ProcessLookupError is the answer; the only tolerated survivors are zombies already
    orphaned to PID 1, i.e. dead processes waiting for this machine's init to reap them
    (outside Shoal's control)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        st = _stat(int(name))
        if st is None:
            continue
        state, ppid, group = st
        if group == pgid and not (state == "Z" and ppid == 1):
            return False
    return True


def kill_pgroup_or_pid(pid, pgid):
    """SIGKILL a process's whole group, or only the process when its group is ours."""
    try:
        if pgid > 1 and pgid != os.getpgrp():
            os.killpg(pgid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# ---------------------------------------------------------------------------------------------
# Job directory readers

def read_events(job_dir):
    path = Path(job_dir) / "events.jsonl"
    if not path.exists():
        return []
    events = []
    for line in path.read_text().splitlines():
        if line.strip():
            events.append(json.loads(line))
    return events


def task_transitions(events, task):
    return [e for e in events if e.get("type") == "task_state" and e.get("task") == task]


def job_dirs(jobs_dir):
    """Job directories (not hidden ones such as the ledger) under `jobs_dir`."""
    p = Path(jobs_dir)
    if not p.exists():
        return []
    return sorted(d for d in p.iterdir() if d.is_dir() and not d.name.startswith("."))


def only_job_dir(jobs_dir):
    """The one job directory under jobs_dir; fails naming them all when there are more."""
    dirs = job_dirs(jobs_dir)
    assert len(dirs) == 1, dirs
    return dirs[0]


def fail_message(r, tail=4000):
    """A finished `shoal` run for an assertion message: exit status, then the last `tail`
    characters of its stdout and stderr."""
    return f"rc={r.returncode}\n--- stdout\n{r.stdout[-tail:]}\n--- stderr\n{r.stderr[-tail:]}"


def wait_for_job(jobs_dir, name=None, timeout=30):
    """The directory of the job (named `name`, if given) started in the background under
    `jobs_dir`, once its master is up (master.json written): from then on `shoal status` knows
    it. Fails when there is none in time, or more than one."""
    def find():
        dirs = [d for d in job_dirs(jobs_dir)
                if (name is None or d.name.startswith(name + "-")) and (d / "master.json").exists()]
        assert len(dirs) <= 1, f"more than one job named {name!r}: {dirs}"
        return dirs[0] if dirs else None
    return wait_until(find, timeout, f"job {name or ''} to start under {jobs_dir}")


# ---------------------------------------------------------------------------------------------
# Fault-tolerance helpers: the example, killing a task of a job, reading the journal

EXAMPLE_DIR = REPO_ROOT / "examples" / "pytorch-ddp"


def is_task_of(pid, job_id):
    """True when `pid` is a live (non-zombie) process started for job `job_id`: guards a kill
    against a pid that was reused."""
    st = _stat(pid)
    if st is None or st[0] == "Z":
        return False
    environ = _read(f"/proc/{pid}/environ") or b""
    return f"SHOAL_JOB_ID={job_id}".encode() in environ.split(b"\0")


def kill_task(pid, job_id, sig=signal.SIGKILL):
    """Sends `sig` to one task process of the job; False when it is gone (or not the job's)."""
    if not is_task_of(pid, job_id):
        return False
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return False
    return True


def events_of(events, *types):
    return [e for e in events if e.get("type") in types]


def event_seconds(event):
    """The journal timestamp of an event in seconds since the epoch (ts_us when present)."""
    if "ts_us" in event:
        return event["ts_us"] / 1e6
    return event["ts"] / 1e3


def yarn_cluster_env():
    """The running YARN test cluster's env file (KEY=value lines) as a dict. Fails the test,
    saying how to start the cluster, when it is not up, lacks a key, or is not healthy."""
    import subprocess
    env_file = YARN_DIR / "env"
    assert env_file.is_file(), (
        f"no {env_file}: the YARN test cluster is not up. Run these tests through ctest (its "
        f"yarn_cluster fixture starts the cluster), or start it first: {YARN_CLUSTER_SH} up")
    env = dict(line.split("=", 1) for line in env_file.read_text().splitlines() if "=" in line)
    for key in YARN_CLUSTER_KEYS:
        assert env.get(key), f"{env_file} lacks {key}:\n{env_file.read_text()}"
    r = subprocess.run(["bash", str(YARN_CLUSTER_SH), "status"], capture_output=True, text=True,
                       timeout=60, env={**os.environ, "SHOAL_YARN_DIR": str(YARN_DIR)})
    assert r.returncode == 0, f"cluster.sh status: {r.stdout}{r.stderr}"
    return env


# ---------------------------------------------------------------------------------------------
# The Kubernetes test cluster (tests/kubernetes/cluster.sh)

KUBERNETES_CLUSTER_SH = REPO_ROOT / "tests" / "kubernetes" / "cluster.sh"


def kubectl(*args, stdin=None, check=True, kubeconfig=None, timeout=120):
    """The test cluster's own kubectl (cluster.sh kubectl; /usr/bin/kubectl may be another
    version) on $KUBECONFIG or `kubeconfig`. With check, a failure fails the test."""
    r = subprocess.run(["bash", str(KUBERNETES_CLUSTER_SH), "kubectl", "--kubeconfig",
                        str(kubeconfig or os.environ["KUBECONFIG"]), *map(str, args)],
                       input=stdin, capture_output=True, text=True, timeout=timeout)
    if check:
        assert r.returncode == 0, f"kubectl {' '.join(map(str, args))}: rc={r.returncode}\n{r.stderr}"
    return r


def kubernetes_cluster(command, timeout=180):
    """Runs `cluster.sh COMMAND` (node-down, node-up, status); a failure fails the test."""
    r = subprocess.run(["bash", str(KUBERNETES_CLUSTER_SH), command], capture_output=True,
                       text=True, timeout=timeout)
    assert r.returncode == 0, f"cluster.sh {command}: rc={r.returncode}\n{r.stdout}{r.stderr}"
    return r


def require_kubernetes_cluster():
    """Fails loudly, saying how to start it, unless $KUBECONFIG names a test cluster that answers."""
    config = os.environ.get("KUBECONFIG")
    assert config and os.path.exists(config), (
        "KUBECONFIG does not name the test cluster's kubeconfig: run these through ctest (its "
        "kubernetes_cluster fixture starts the cluster) or run tests/kubernetes/cluster.sh up "
        "and export the KUBECONFIG=... line it prints")
    r = kubectl("get", "--raw", "/readyz", check=False)
    assert r.returncode == 0, f"the test cluster's apiserver does not answer: {r.stderr}"


def agent_processes(job_dir):
    """pids of live `shoal agent` processes dialling the job's master (whatever started them)."""
    master = json.loads((Path(job_dir) / "master.json").read_text())["address"].encode()
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
            stat = open(f"/proc/{pid}/stat", "rb").read()
        except OSError:
            continue
        if b") Z" not in stat and b"agent" in argv and master in argv:
            found.append(int(pid))
    return found


def processes_of_application(app_id):
    """Live processes of a cluster manager's application on this machine: those with its id on
    their command line (executor or container JVMs) and everything running in a directory
    named after it (Python workers, agents, tasks). (pid, command line) pairs."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = open(f"/proc/{pid}/cmdline", "rb").read()
            stat = open(f"/proc/{pid}/stat", "rb").read()
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if b") Z" in stat:
            continue
        if app_id.encode() in argv or f"/{app_id}/" in cwd + "/":
            found.append((int(pid), argv.replace(b"\0", b" ")[:200]))
    return found
