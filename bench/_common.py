"""Helpers shared by Shoal's benchmark drivers (bench/*.py).

Conventions every driver follows: progress goes to stderr, and exactly one JSON object
goes to stdout at the end; nothing asserts, failures become "error" fields; anchors run
side by side in the same invocation; figures are medians over repetitions, plus ratios.
"""

import contextlib
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# bench/_common.py -> the repository root is one level above bench/.
REPO_ROOT = Path(__file__).resolve().parent.parent
BUILD_SHOAL = REPO_ROOT / "build" / "src" / "cli" / "shoal"
DEMO_DIR = REPO_ROOT / "examples" / "pytorch-ddp"
DEFAULT_PYTHON = "/usr/bin/python3"  # Debian's, the one with python3-torch


def log(msg):
    """Progress line on stderr."""
    print(msg, file=sys.stderr, flush=True)


def emit(result):
    """The driver's single JSON object on stdout."""
    print(json.dumps(result, indent=2, sort_keys=False), flush=True)


def add_shoal_arg(parser):
    parser.add_argument(
        "--shoal", metavar="PATH",
        help="the shoal binary (default: $SHOAL_BIN, else `shoal` on PATH, else "
             "build/src/cli/shoal under the repository root)")


def find_shoal(explicit=None):
    """Returns (path, None) or (None, reason). Order: --shoal, $SHOAL_BIN (as the e2e tests
    take it; bench/ab.py points every driver at one build this way), PATH, the build tree."""
    for source, given in (("--shoal", explicit), ("SHOAL_BIN", os.environ.get("SHOAL_BIN"))):
        if given:
            p = Path(given)
            if p.is_file() and os.access(p, os.X_OK):
                return str(p.resolve()), None
            return None, f"{source} {given}: not an executable file"
    on_path = shutil.which("shoal")
    if on_path:
        return on_path, None
    if BUILD_SHOAL.is_file() and os.access(BUILD_SHOAL, os.X_OK):
        return str(BUILD_SHOAL), None
    return None, (f"shoal binary not found: pass --shoal PATH, put `shoal` on PATH, or "
                  f"build it to {BUILD_SHOAL}")


@contextlib.contextmanager
def temp_dir(prefix, keep=False):
    """A temporary directory (e.g. for shoal's --jobs-dir), removed afterwards unless keep."""
    d = tempfile.mkdtemp(prefix=prefix)
    try:
        yield Path(d)
    finally:
        if keep:
            log(f"kept {d}")
        else:
            shutil.rmtree(d, ignore_errors=True)


def free_port():
    """A TCP port that was free on 127.0.0.1 a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Timed:
    """Result of one timed command: wall ms, exit status, captured output."""

    def __init__(self, ms, rc, stdout, stderr, error=None):
        self.ms, self.rc, self.stdout, self.stderr, self.error = ms, rc, stdout, stderr, error

    @property
    def ok(self):
        return self.error is None and self.rc == 0

    def describe(self):
        if self.error:
            return self.error
        tail = (self.stderr or self.stdout or "").strip().splitlines()[-5:]
        return f"exit status {self.rc}" + (": " + " / ".join(tail) if tail else "")


def run_timed(argv, timeout=300, **kwargs):
    """Runs argv to completion; wall time measured with perf_counter around the whole run
    (fork, exec, wait). Output is captured (pipes), never echoed. The command runs in its
    own session so that a timeout kills it and everything it started."""
    t0 = time.perf_counter()
    try:
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, start_new_session=True, **kwargs)
    except OSError as e:
        return Timed(None, None, "", "", error=f"cannot run {argv[0]}: {e}")
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()  # not communicate(): something outside the group may hold the pipes
        p.stdout.close()
        p.stderr.close()
        return Timed(None, None, "", "", error=f"timed out after {timeout:g} s: "
                     + " ".join(str(a) for a in argv))
    except BaseException:  # Ctrl-C: take the command's session down with us
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        raise
    ms = (time.perf_counter() - t0) * 1000.0
    return Timed(ms, p.returncode, out, err)


def percentile(values, p):
    """Linear-interpolated percentile (p in 0..100) of a non-empty list."""
    xs = sorted(values)
    if not xs:
        return None
    k = (len(xs) - 1) * p / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def median(values):
    return percentile(values, 50)


def p90(values):
    return percentile(values, 90)


def p99(values):
    return percentile(values, 99)


def summary_ms(values):
    """Median / p90 / p99 / min / max of a list of milliseconds, rounded; None if empty."""
    if not values:
        return None
    r = lambda x: round(x, 3)
    return {"median_ms": r(median(values)), "p90_ms": r(p90(values)),
            "p99_ms": r(p99(values)), "min_ms": r(min(values)), "max_ms": r(max(values)),
            "n": len(values)}


def ratio(a, b):
    if a is None or b is None or b == 0:
        return None
    return round(a / b, 4)


def cpu_vendor_and_flags():
    """(vendor_id, set of flags) of the first CPU in /proc/cpuinfo; ("", set()) without it."""
    vendor, flags = "", set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("vendor_id") and not vendor:
                vendor = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
            if vendor and flags:
                break
    return vendor, flags


AVX512_FOR_KERNELS = {"avx512f", "avx512bw", "avx512vl", "avx512dq"}


def shoal_openblas_coretype():
    """The OPENBLAS_CORETYPE `shoal serve` sets on this CPU (src/serve/runtime/cpu_kernels.h:
    on Intel, SkylakeX with AVX-512 F/BW/VL/DQ, Haswell with AVX2 and FMA, Sandybridge with
    AVX), or None where it leaves the choice to OpenBLAS."""
    vendor, flags = cpu_vendor_and_flags()
    if vendor != "GenuineIntel":
        return None
    if AVX512_FOR_KERNELS | {"avx2", "fma"} <= flags:
        return "SkylakeX"
    if {"avx2", "fma"} <= flags:
        return "Haswell"
    if "avx" in flags:
        return "Sandybridge"
    return None


def shoal_aten_capability():
    """The ATEN_CPU_CAPABILITY `shoal serve` sets on this CPU (cpu_kernels.h: avx512 on an AMD
    CPU with AVX-512 F/BW/VL/DQ and FMA), or None where it keeps libtorch's default."""
    vendor, flags = cpu_vendor_and_flags()
    if vendor == "AuthenticAMD" and AVX512_FOR_KERNELS | {"avx2", "fma"} <= flags:
        return "avx512"
    return None


def same_kernels(variable, choice, shoal_choice):
    """Puts `choice` ("shoal": what `shoal serve` picks for itself, shoal_choice(); "": the
    library's own choice, which shoal serve then overrides; else a value) in `variable` for
    every process the benchmark starts; a value already in the environment wins. Returns what
    is set, recorded with the figures."""
    if os.environ.get(variable):
        return os.environ[variable]
    value = shoal_choice() if choice == "shoal" else (choice or None)
    if value:
        os.environ[variable] = value
    return value


def same_openblas_kernels(choice):
    """Makes every process the benchmark starts (servers, peers, the bare loop) run OpenBLAS's
    `choice` of kernels (see same_kernels). Without this the peers and the bare loop would run
    Debian's OpenBLAS fallback on a CPU it does not know while shoal does not, and the ratios
    would measure the BLAS, not the servers."""
    return same_kernels("OPENBLAS_CORETYPE", choice, shoal_openblas_coretype)


def same_aten_kernels(choice):
    """The same for the instruction set of libtorch's own kernels (ATEN_CPU_CAPABILITY): on a
    CPU where shoal serve runs AVX-512 kernels, the peers, the FastAPI app and the bare loop run
    them too."""
    return same_kernels("ATEN_CPU_CAPABILITY", choice, shoal_aten_capability)


def machine_info():
    info = {"cpus": os.cpu_count()}
    with contextlib.suppress(OSError):
        info["loadavg_1m"] = round(os.getloadavg()[0], 2)
    return info


# ------------------------------------------------------------------ fault-injection helpers
# Used by fault_detection.py, recovery_time.py, elastic_membership.py and lost_work.py: a job
# started with `shoal run --detach`, its journal read as it grows, its processes found in /proc.

SDK_PYTHON = REPO_ROOT / "sdk" / "python"
BENCH_DIR = REPO_ROOT / "bench"

# Documented (not measured here) failure-detection figures of other systems, quoted as anchors.
DOCUMENTED_ANCHORS = {
    "torchrun_lost_node_s": {
        "value": 15, "kind": "documented",
        "what": "torchrun (torch.distributed.elastic) noticing a lost node: about 15 s"},
    "tony_s": {
        "value": 25, "kind": "documented",
        "what": "TonY (TensorFlow on YARN) noticing a failed task: about 25 s"},
}


def now_us():
    """Wall-clock microseconds, the clock of the journal's ts_us."""
    return time.time() * 1e6


def record_us(rec):
    """A journal record's time in microseconds: ts_us, else ts (ms) * 1000."""
    if "ts_us" in rec:
        return float(rec["ts_us"])
    if "ts" in rec:
        return float(rec["ts"]) * 1000.0
    return None


class Journal:
    """Reads <job_dir>/events.jsonl incrementally: poll() appends the complete lines written
    since the last call to self.records; a partial last line waits for its newline."""

    def __init__(self, path):
        self.path = Path(path)
        self.records = []
        self._pos = 0
        self._partial = b""

    def poll(self):
        try:
            with open(self.path, "rb") as f:
                f.seek(self._pos)
                data = f.read()
        except FileNotFoundError:
            return 0
        if not data:
            return 0
        self._pos += len(data)
        data = self._partial + data
        lines = data.split(b"\n")
        self._partial = lines.pop()
        n = 0
        for line in lines:
            if not line.strip():
                continue
            try:
                self.records.append(json.loads(line))
                n += 1
            except ValueError:
                pass
        return n

    def wait_for(self, pred, timeout, start=0, poll_s=0.001):
        """The first record at index >= start for which pred(record) holds, as (index, record),
        or (None, None) after timeout seconds."""
        deadline = time.monotonic() + timeout
        i = start
        while True:
            while i < len(self.records):
                if pred(self.records[i]):
                    return i, self.records[i]
                i += 1
            if time.monotonic() > deadline:
                return None, None
            if self.poll() == 0:
                time.sleep(poll_s)

    def find(self, pred, start=0):
        """Every (index, record) at index >= start for which pred holds, without waiting."""
        self.poll()
        return [(i, r) for i, r in enumerate(self.records[start:], start) if pred(r)]


def is_task_state(rec, task=None, to=None):
    return (rec.get("type") == "task_state" and (task is None or rec.get("task") == task)
            and (to is None or rec.get("to") == to))


def proc_alive(pid):
    """True when pid exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def proc_environ(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    env = {}
    for item in raw.split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep:
            env[k.decode(errors="replace")] = v.decode(errors="replace")
    return env


def proc_cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return None


def all_pids():
    return [int(d) for d in os.listdir("/proc") if d.isdigit()]


def job_task_processes(job_id):
    """{pid: environ} of live (non-zombie) processes whose environment carries
    SHOAL_JOB_ID=job_id and SHOAL_GENERATION: the job's tasks and whatever they started,
    including any that escaped their agent."""
    found = {}
    for pid in all_pids():
        env = proc_environ(pid)
        if env and env.get("SHOAL_JOB_ID") == job_id and "SHOAL_GENERATION" in env \
                and proc_alive(pid):
            found[pid] = env
    return found


def find_agent_pids(job_dir):
    """Live `shoal agent` processes whose command line mentions job_dir."""
    job_dir = str(job_dir)
    pids = []
    for pid in all_pids():
        argv = proc_cmdline(pid)
        if argv and len(argv) > 1 and argv[1] == "agent" and any(job_dir in a for a in argv) \
                and proc_alive(pid):
            pids.append(pid)
    return pids


def kill_quietly(pid, sig=signal.SIGKILL):
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


class ShoalJob:
    """One job started with `shoal run --detach` into jobs_dir; its journal, status and
    processes. stop() kills it (shoal kill, then SIGKILL to anything of it left) and says
    what it had to clean up."""

    def __init__(self, shoal, jobs_dir, job_file):
        self.shoal, self.jobs_dir, self.job_file = shoal, Path(jobs_dir), Path(job_file)
        self.job_id = self.job_dir = self.journal = None
        self.master_pid = None

    def _env(self):
        return dict(os.environ, SHOAL_JOBS_DIR=str(self.jobs_dir))

    def start(self, timeout=60):
        """Returns None, or an error string."""
        self.jobs_dir.mkdir(parents=True, exist_ok=True)
        t = run_timed([self.shoal, "--jobs-dir", str(self.jobs_dir), "run", "--detach",
                       str(self.job_file)], timeout=timeout)
        if not t.ok:
            return "shoal run --detach: " + t.describe()
        words = t.stdout.split()
        if not words:
            return "shoal run --detach printed no job id"
        self.job_id = words[-1]
        self.job_dir = self.jobs_dir / self.job_id
        self.journal = Journal(self.job_dir / "events.jsonl")
        with contextlib.suppress(OSError, ValueError):
            self.master_pid = json.loads((self.job_dir / "master.json").read_text())["pid"]
        return None

    def status(self, timeout=30):
        """`shoal status JOB --json` as a dict, or None."""
        t = run_timed([self.shoal, "--jobs-dir", str(self.jobs_dir), "status", self.job_id,
                       "--json"], timeout=timeout)
        if not t.ok:
            return None
        try:
            return json.loads(t.stdout)
        except ValueError:
            return None

    def tasks(self, timeout=30):
        st = self.status(timeout)
        return None if st is None else {t["task"]: t for t in st.get("tasks", [])}

    def wait_running(self, n_tasks, timeout=60):
        """Waits until status shows n_tasks tasks running with a pid; returns {task: status}
        or None."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            tasks = self.tasks()
            if tasks:
                run = {k: v for k, v in tasks.items() if v["state"] == "running" and v["pid"]}
                if len(run) >= n_tasks:
                    return run
            time.sleep(0.05)
        return None

    def finished(self):
        self.journal.poll()
        return any(r.get("type") == "job_finished" for r in self.journal.records)

    def outcome(self):
        self.journal.poll()
        for r in reversed(self.journal.records):
            if r.get("type") == "job_finished":
                return r
        return None

    def wait_finished(self, timeout):
        _, rec = self.journal.wait_for(lambda r: r.get("type") == "job_finished", timeout,
                                       poll_s=0.01)
        return rec

    def stop(self, timeout=20):
        """Kills the job if it still runs and waits for its master to exit. Returns a dict:
        leftover pids that had to be SIGKILLed (task processes, agents, the master)."""
        left = {"tasks": [], "agents": [], "master": None}
        if self.job_id is None:
            return left
        if not self.finished():
            run_timed([self.shoal, "--jobs-dir", str(self.jobs_dir), "kill", self.job_id],
                      timeout=timeout)
            self.wait_finished(timeout)
        deadline = time.monotonic() + timeout
        while self.master_pid and proc_alive(self.master_pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        if self.master_pid and proc_alive(self.master_pid):
            left["master"] = self.master_pid
            kill_quietly(self.master_pid)
        for pid in find_agent_pids(self.job_dir):
            left["agents"].append(pid)
            kill_quietly(pid, signal.SIGCONT)
            kill_quietly(pid)
        for pid in job_task_processes(self.job_id):
            left["tasks"].append(pid)
            kill_quietly(pid, signal.SIGCONT)
            kill_quietly(pid)
        return left


def torchrun_argv(python, nproc, max_restarts, monitor_interval, rdzv_port, script_argv):
    """Debian's torch elastic launcher, through bench/_torchrun.py (which works around the
    Python 3.11 bug in `torchrun`'s --redirects/--tee parsing and timestamps its log)."""
    argv = [python, str(BENCH_DIR / "_torchrun.py"), "--nproc_per_node", str(nproc),
            "--max_restarts", str(max_restarts), "--rdzv_backend", "c10d",
            "--rdzv_endpoint", f"127.0.0.1:{rdzv_port}"]
    if monitor_interval is not None:
        argv += ["--monitor_interval", str(monitor_interval)]
    return argv + list(script_argv)


class TorchrunLog:
    """torchrun's stderr, redirected to a file by the driver, read incrementally; each line
    starts with the wall-clock time (bench/_torchrun.py's log format)."""

    def __init__(self, path):
        self.path = Path(path)
        self.lines = []  # (ts_us or None, text)
        self._pos = 0
        self._partial = b""

    def poll(self):
        try:
            with open(self.path, "rb") as f:
                f.seek(self._pos)
                data = f.read()
        except FileNotFoundError:
            return 0
        self._pos += len(data)
        data = self._partial + data
        parts = data.split(b"\n")
        self._partial = parts.pop()
        for raw in parts:
            text = raw.decode(errors="replace")
            head, _, _ = text.partition(" ")
            try:
                ts = float(head) * 1e6
            except ValueError:
                ts = None
            self.lines.append((ts, text))
        return len(parts)

    def first_after(self, t_us, needles, start=0):
        """(index, ts_us, text) of the first timestamped line at index >= start, later than
        t_us, containing any of needles; else (None, None, None)."""
        self.poll()
        for i in range(start, len(self.lines)):
            ts, text = self.lines[i]
            if ts is not None and ts >= t_us and any(n in text for n in needles):
                return i, ts, text
        return None, None, None


def read_json_file(path):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def ms_from_us(values_us):
    return [v / 1000.0 for v in values_us]


def read_generation(out_dir, gen):
    """{rank: info} from the w-g<gen>-r<rank>.json files the bench workers write."""
    found = {}
    for p in Path(out_dir).glob(f"w-g{gen}-r*.json"):
        info = read_json_file(p)
        if info is not None:
            found[int(info["rank"])] = info
    return found


def wait_generation(out_dir, gen, n, timeout, poll_s=0.002, alive=None):
    """Waits until n ranks of generation gen wrote their file; {rank: info} or None (also as
    soon as alive(), when given, returns False)."""
    deadline = time.monotonic() + timeout
    while True:
        found = read_generation(out_dir, gen)
        if len(found) >= n:
            return found
        if time.monotonic() > deadline or (alive is not None and not alive()):
            return None
        time.sleep(poll_s)


# torchrun's log lines that show its elastic agent has seen a worker fail: it first closes
# the other workers ("Sending process N closing signal SIGTERM"), then logs the failure.
TORCHRUN_FAILURE_NEEDLES = ("closing signal", "failed (exitcode", "Worker group FAILED",
                            "Worker group UNHEALTHY")
TORCHRUN_RESTART_NEEDLES = ("Starting worker group",)


class TorchrunRun:
    """One torchrun (bench/_torchrun.py) of nproc bench workers that write
    w-g<restart>-r<rank>.json into out_dir; fault() kills one and times its recovery.
    script_argv is the training script and its arguments (torchrun adds the interpreter)."""

    def __init__(self, python, nproc, max_restarts, monitor_interval, script_argv, out_dir,
                 log_path, env=None):
        self.nproc, self.out_dir = nproc, Path(out_dir)
        self.argv = torchrun_argv(python, nproc, max_restarts, monitor_interval, free_port(),
                                  script_argv)
        self.log = TorchrunLog(log_path)
        self.log_path = Path(log_path)
        self.env = env
        self.proc = None
        self.gen = 0
        self.error = None

    def start(self, timeout=120):
        self.out_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as logf:
            self.proc = subprocess.Popen(self.argv, stdout=logf, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True,
                                         env=self.env)
        if wait_generation(self.out_dir, 0, self.nproc, timeout, alive=self.alive) is None:
            self.error = (f"torchrun's workers did not start within {timeout:g} s"
                          + ("" if self.alive() else " (torchrun exited)") + ": " + self.tail())
        return self.error

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def tail(self, n=5):
        self.log.poll()
        return " / ".join(t for _, t in self.log.lines[-n:])

    def fault(self, rank, timeout=120):
        """SIGKILLs rank `rank` of the current generation; returns a dict of latencies in ms
        from just before the kill: detect (the first log line showing the failure), restart
        ("Starting worker group"), and from each new worker's own files: start_max (the last
        new worker's first line) and, when the worker writes it, first_step_max. None values
        where something did not show; "error" when the new generation never came."""
        current = read_generation(self.out_dir, self.gen)
        if rank not in current:
            return {"error": f"no rank {rank} in generation {self.gen}"}
        self.log.poll()
        mark = len(self.log.lines)
        t0 = now_us()
        kill_quietly(current[rank]["pid"])
        new = wait_generation(self.out_dir, self.gen + 1, self.nproc, timeout,
                              alive=self.alive)
        if new is None:
            self.error = (f"torchrun did not bring generation {self.gen + 1} up within "
                          f"{timeout:g} s" + ("" if self.alive() else " (torchrun exited)")
                          + ": " + self.tail())
            return {"error": self.error}
        self.gen += 1
        _, t_det, _ = self.log.first_after(t0, TORCHRUN_FAILURE_NEEDLES, start=mark)
        _, t_rst, _ = self.log.first_after(t0, TORCHRUN_RESTART_NEEDLES, start=mark)
        out = {
            "detect_ms": None if t_det is None else (t_det - t0) / 1000.0,
            "restart_ms": None if t_rst is None else (t_rst - t0) / 1000.0,
            "start_max_ms": (max(i["t_start"] for i in new.values()) * 1e6 - t0) / 1000.0,
        }
        if all("t_first_step" in i for i in new.values()):
            out["first_step_max_ms"] = (
                max(i["t_first_step"] for i in new.values()) * 1e6 - t0) / 1000.0
        out["t0_us"], out["new"] = t0, new
        return out

    def stop(self):
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        # Workers are in torchrun's session; anything left of it goes too.
        for pid in all_pids():
            with contextlib.suppress(OSError):
                if os.getsid(pid) == self.proc.pid:
                    kill_quietly(pid)


def worker_phases_ms(t0_us, infos):
    """The critical path of a start of bench/_ddp_worker.py ranks (infos: {rank: info}), in
    ms, summing to the last rank's first step - t0_us: to_script_start (t0 -> the first line
    of the rank that was last to finish `import torch`), import_torch (that rank's import),
    process_group (-> the last rank's process group up: the rendezvous through rank 0's
    TCPStore, after every rank has torch), first_step (-> the last rank's first step)."""
    slow = max(infos.values(), key=lambda i: i["t_torch"])
    pg = max(i["t_pg"] for i in infos.values())
    first = max(i["t_first_step"] for i in infos.values())
    return {"to_script_start_ms": (slow["t_start"] * 1e6 - t0_us) / 1000.0,
            "import_torch_ms": (slow["t_torch"] - slow["t_start"]) * 1000.0,
            "process_group_ms": (pg - slow["t_torch"]) * 1000.0,
            "first_step_ms": (first - pg) * 1000.0}


def median_phases(phases):
    """Median of each key over a list of worker_phases_ms dicts, rounded; None if empty."""
    if not phases:
        return None
    return {k: round(median([p[k] for p in phases]), 1) for k in phases[0]}


def python_startup_ms(python, reps=5):
    """Median ms from just before Popen to the first line of a script (time.time()), for
    python: the interpreter's own start-up, to subtract from a worker's first timestamp."""
    times = []
    for _ in range(reps):
        t0 = time.time()
        out = subprocess.run([python, "-c", "import time; print(repr(time.time()))"],
                             capture_output=True, text=True)
        with contextlib.suppress(ValueError):
            times.append((float(out.stdout.strip()) - t0) * 1000.0)
    return None if not times else round(median(times), 3)
