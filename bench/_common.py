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
        help="the shoal binary (default: `shoal` on PATH, else "
             "build/src/cli/shoal under the repository root)")


def find_shoal(explicit=None):
    """Returns (path, None) or (None, reason). Order: --shoal, PATH, the build tree."""
    if explicit:
        p = Path(explicit)
        if p.is_file() and os.access(p, os.X_OK):
            return str(p.resolve()), None
        return None, f"--shoal {explicit}: not an executable file"
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


def machine_info():
    info = {"cpus": os.cpu_count()}
    with contextlib.suppress(OSError):
        info["loadavg_1m"] = round(os.getloadavg()[0], 2)
    return info
