#!/usr/bin/env python3
"""Serving peers benchmark (issue 27): `shoal serve` against the servers a user would compare it
with, on the same TorchScript models, cores and load generator, one server at a time.

    python3 bench/serving_peers.py [--shoal PATH] [--models identity,mlp,lstm]
        [--servers shoal,fastapi,torchserve,mlserver,kserve,ray,litserve,shoal_aa]
        [--p99-limit-ms 50] [--duration 3] [--warmup 1]

Per model, each server is started alone (pinned to --server-cpus, the load generator to
--load-cpu), its answers to a few rows sent at once are checked against shoal's (a server whose
answers differ is refused, not measured), then closed loops of serve_load at growing
concurrency find the highest throughput whose p99 stays within --p99-limit-ms without errors;
each run's CPU per request is read from /proc over the server's whole process tree. `shoal_aa`
is shoal again, last: the A/A pair that says how far this run can resolve a ratio. serve_floor
(a server that only answers) runs right after each of shoal's two runs, and the bare libtorch
loop (serve_libtorch_loop) at the batch size shoal ran at after all of them: together they give
the CPU a request cannot go below. One JSON object on stdout
(docs/benchmarks/serving.md, "Peers", describes it); progress on stderr.

The peers run from the virtual environments `./setup.sh --serving-peers` makes
(/var/cache/shoal/venvs/peer-<name>, from bench/serving/peers/requirements-<name>.txt); a peer
whose environment is missing is reported as such and the others are still measured.
"""

import argparse
import contextlib
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as c  # noqa: E402
import serving_bench as sb  # noqa: E402

PEERS_DIR = c.REPO_ROOT / "bench" / "serving" / "peers"
VENV_ROOT = Path("/var/cache/shoal/venvs")
MODELS = sb.MODELS
ALL_SERVERS = ("shoal", "fastapi", "torchserve", "mlserver", "kserve", "ray", "litserve",
               "shoal_aa")

# Per server: its protocol ("v2": KServe v2 JSON at /v2/models/M/infer; "native": POST
# {"data": row} -> {"output": row} at the path), the path, the venv (None: Debian's python3 or
# the shoal binary), the launcher under bench/serving/peers, and the PyPI distribution whose
# version is reported.
SERVERS = {
    "shoal": {"protocol": "v2", "path": "/v2/models/{m}/infer"},
    "shoal_aa": {"protocol": "v2", "path": "/v2/models/{m}/infer"},
    "fastapi": {"protocol": "v2", "path": "/v2/models/{m}/infer"},
    "torchserve": {"protocol": "native", "path": "/predictions/{m}", "venv": "peer-torchserve",
                   "launcher": "torchserve_server.py", "dist": "torchserve"},
    "mlserver": {"protocol": "v2", "path": "/v2/models/{m}/infer", "venv": "peer-mlserver",
                 "launcher": "mlserver_server.py", "dist": "mlserver"},
    "kserve": {"protocol": "v2", "path": "/v2/models/{m}/infer", "venv": "peer-kserve",
               "launcher": "kserve_server.py", "dist": "kserve"},
    "ray": {"protocol": "native", "path": "/{m}", "venv": "peer-ray",
            "launcher": "ray_server.py", "dist": "ray"},
    "litserve": {"protocol": "native", "path": "/predict", "venv": "peer-litserve",
                 "launcher": "litserve_server.py", "dist": "litserve"},
}
# The issue's "Python v2 servers" (the tiny models' 20x target): the model servers that speak
# the v2 protocol, MLServer and KServe. The sentence names the minimal FastAPI app
# apart, with a target of its own (5x less CPU per request): were it one of them, 20x its
# throughput on one core would imply 20x less CPU, and the 5x target would say nothing. Its
# throughput ratio is still reported (ratios.throughput_shoal_over.fastapi). The peers the
# LSTM's 2.5x target takes the best of: every peer (each runs the model in Python workers).
PYTHON_V2 = ("mlserver", "kserve")
PEERS = ("fastapi", "torchserve", "mlserver", "kserve", "ray", "litserve")
TINY = ("identity", "mlp")

# The targets.
LSTM_OVER_BEST_PEER = 2.5
LSTM_OVER_FASTAPI = 10.0
LSTM_CPU_OVER_LOOP_PLUS_FLOOR = 1.3
TINY_OVER_PYTHON_V2 = 20.0
TINY_FASTAPI_CPU_OVER_SHOAL = 5.0
TINY_CPU_OVER_FLOOR = 1.5

ANSWER_RTOL = 1e-4
ANSWER_ATOL = 1e-4


# ------------------------------------------------------------------------------- requests

def row(model, seed):
    """One input row of the model (flat), fixed per seed."""
    (_, idt, idims), _ = MODELS[model]
    rng = random.Random(seed)
    n = math.prod(idims)
    if idt == "INT64":
        return [rng.randrange(sb.VOCAB_SIZE) for _ in range(n)]
    return [round(rng.random(), 6) for _ in range(n)]


def body(model, protocol, data):
    if protocol == "native":
        return json.dumps({"data": data}).encode()
    (iname, idt, idims), _ = MODELS[model]
    return json.dumps({"inputs": [{"name": iname, "shape": [1] + idims, "datatype": idt,
                                   "data": data}]}).encode()


def answer_row(protocol, answer):
    """The flat output row of an answer's bytes; ValueError when it has none."""
    try:
        doc = json.loads(answer)
        data = doc["output"] if protocol == "native" else doc["outputs"][0]["data"]
    except (ValueError, KeyError, IndexError, TypeError) as e:
        raise ValueError(f"no output in the answer ({type(e).__name__}: {e}): "
                         f"{bytes(answer[:200])!r}") from None
    if not isinstance(data, list) or not all(isinstance(v, (int, float)) for v in data):
        raise ValueError(f"the output is not a flat list of numbers: {str(data)[:200]}")
    return data


def compare_rows(got, want):
    """None when got equals want within the tolerance, else what differs."""
    if len(got) != len(want):
        return f"{len(got)} values, shoal's answer has {len(want)}"
    for i, (a, b) in enumerate(zip(got, want)):
        if not abs(a - b) <= ANSWER_ATOL + ANSWER_RTOL * abs(b):
            return f"value {i} is {a}, shoal's is {b}"
    return None


def http_post(url, data, timeout=60):
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (urllib.error.URLError, OSError) as e:
        return None, str(e).encode()


def ask_rows(url, model, protocol, rows):
    """Sends every row at once (one thread each, so that a batching server batches them):
    [(status, answer bytes)] in the rows' order."""
    out = [None] * len(rows)

    def one(i):
        out[i] = http_post(url, body(model, protocol, rows[i]))
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(rows))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def check_answers(url, model, protocol, rows, expected):
    """None when the server at url answers every row as `expected` (shoal's rows), else why
    not. The rows go at once, so that a server that batches them answers a batch."""
    for i, (status, answer) in enumerate(ask_rows(url, model, protocol, rows)):
        if status != 200:
            return f"row {i}: answered {status}: {bytes(answer[:300])!r}"
        try:
            got = answer_row(protocol, answer)
        except ValueError as e:
            return f"row {i}: {e}"
        diff = compare_rows(got, expected[i])
        if diff:
            return f"row {i} differs from shoal's answer: {diff}"
    return None


# ------------------------------------------------------------------------------- processes

def proc_table():
    """{pid: (ppid, session id, utime + stime in clock ticks)} of every process."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            table[int(entry)] = (int(fields[1]), int(fields[3]),
                                 int(fields[11]) + int(fields[12]))
    return table


def tree_pids(root, table=None):
    """root and every descendant (by parent), plus whatever else is in root's session."""
    table = table if table is not None else proc_table()
    pids = {root}
    grew = True
    while grew:
        grew = False
        for pid, (ppid, sid, _) in table.items():
            if pid not in pids and (ppid in pids or sid == root):
                pids.add(pid)
                grew = True
    return {p for p in pids if p in table}


def tree_cpu_seconds(root):
    """CPU time (user + system, every thread) of root's process tree, from /proc."""
    table = proc_table()
    if root not in table:
        return None
    ticks = sum(table[p][2] for p in tree_pids(root, table))
    return ticks / os.sysconf("SC_CLK_TCK")


class Server:
    """A server process tree in its own session, pinned to `cpus`, ready once `probe` (a
    request) is answered 200."""

    def __init__(self, name, argv, cpus, log_dir, env=None):
        self.name, self.argv, self.cpus, self.env = name, argv, cpus, env
        self.stdout_path = log_dir / f"{name}.stdout"
        self.stderr_path = log_dir / f"{name}.stderr"
        self.proc = None

    def start(self, probe_url, probe_body, timeout):
        """None, or why the server did not come up answering."""
        cpus = self.cpus
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            try:
                self.proc = subprocess.Popen(
                    self.argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                    start_new_session=True, env=self.env,
                    preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
            except OSError as e:
                return f"cannot start {self.argv[0]}: {e}"
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return f"exited with status {self.proc.returncode}: {self.tail()}"
            status, answer = http_post(probe_url, probe_body, timeout=10)
            if status == 200:
                return None
            last = f"{status}: {bytes(answer[:200])!r}"
            time.sleep(0.5)
        return f"no answer 200 within {timeout} s (last: {last}): {self.tail()}"

    def tail(self, n=5):
        lines = []
        for p in (self.stderr_path, self.stdout_path):
            with contextlib.suppress(OSError):
                lines += [ln for ln in p.read_text(errors="replace").strip().splitlines()
                          if ln.strip()][-n:]
        return " / ".join(lines[-n:])

    def stop(self):
        if self.proc is None:
            return
        pids = tree_pids(self.proc.pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pass
        time.sleep(0.5)
        # Whatever of the tree is left (processes of their own session or group, as Ray's).
        for pid in pids | tree_pids(self.proc.pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)


# ------------------------------------------------------------------------------- the servers

def shoal_config(model, args):
    """shoal's config.yaml: batching, `workers` instances of one intra-op thread each."""
    return (sb.config_yaml(model, True, args.shoal_max_batch_size, args.shoal_batch_delay_us)
            + f"instances: {args.workers}\nthreads_per_instance: 1\n")


def server_argv(name, model, port, args, repos, tmp):
    """(argv, env) of a server, or a string saying why it cannot run."""
    dtype = MODELS[model][0][1]
    model_file = repos["plain"] / model / "1" / "model.pt"
    if name in ("shoal", "shoal_aa"):
        if args.shoal_error:
            return args.shoal_error
        return [args.shoal, "serve", "--model-repository", str(repos["shoal"]),
                "--http-port", str(port), "--grpc-port", "0"], None
    if name == "fastapi":
        return [args.python, str(sb.BASELINE), "--model-repository", str(repos["plain"]),
                "--port", str(port), "--workers", str(args.workers)], None
    spec = SERVERS[name]
    python = args.venv_root / spec["venv"] / "bin" / "python"
    if not python.is_file():
        return (f"{spec['venv']} is not installed ({python} missing): run "
                f"./setup.sh --serving-peers")
    work = tmp / f"{name}-{model}"
    work.mkdir(parents=True, exist_ok=True)
    argv = [str(python), str(PEERS_DIR / spec["launcher"]), "--model", model,
            "--model-file", str(model_file), "--dtype", dtype, "--port", str(port),
            "--workers", str(args.workers), "--max-batch-size", str(args.peer_max_batch_size),
            "--batch-delay-ms", str(args.peer_batch_delay_ms), "--work-dir", str(work)]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return argv, env


def peer_versions(args, names):
    out = {}
    for name in names:
        spec = SERVERS.get(name, {})
        if "venv" not in spec:
            continue
        python = args.venv_root / spec["venv"] / "bin" / "python"
        r = c.run_timed([str(python), "-c", "import importlib.metadata as m, sys; "
                         "print(m.version(sys.argv[1]), m.version('numpy'), "
                         "m.version('torch'))", spec["dist"]], timeout=60)
        if r.ok:
            v, np_v, torch_v = r.stdout.split()
            out[name] = {spec["dist"]: v, "numpy": np_v, "torch": torch_v}
        else:
            out[name] = {"error": r.describe()}
    return out


# ------------------------------------------------------------------------------- the load

def closed_loop(url, body_file, n, args, during=None):
    """serve_load's JSON for a closed loop of n connections, or {"error": ...}. during(t0), if
    given, runs in this thread once serve_load has said it starts (t0: time.monotonic() then),
    so that what it samples lines up with serve_load's clock, however long serve_load took to
    start on a loaded machine."""
    argv = [args.serve_load, "--url", url, "--body", str(body_file), "--closed", str(n),
            "--duration", str(args.duration), "--warmup", str(args.warmup),
            "--drain", str(args.drain)]
    cpu = args.load_cpu
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True,
                                preexec_fn=(lambda: os.sched_setaffinity(0, {cpu}))
                                if cpu is not None else None)
    except OSError as e:
        return {"error": f"cannot run serve_load: {e}"}
    err_lines = []
    started = threading.Event()

    def read_stderr():
        for line in proc.stderr:
            err_lines.append(line.rstrip())
            if "closed loop over" in line:
                started.set()
        started.set()
    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    timeout = args.duration + args.warmup + args.drain + 60
    try:
        if during is not None and started.wait(timeout) and proc.poll() is None:
            during(time.monotonic())
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return {"error": f"serve_load timed out after {timeout:g} s"}
    reader.join(timeout=5)
    if proc.returncode != 0:
        return {"error": f"serve_load: exit status {proc.returncode}: "
                         + " / ".join(err_lines[-3:])}
    try:
        return json.loads(out)
    except ValueError:
        return {"error": f"serve_load printed no JSON: {out[-200:]!r}"}


def measure_point(server, url, body_file, n, args, stats_url=None):
    """One closed loop of n connections: serve_load's figures, the server tree's CPU per
    request over the middle of the measured window, and (shoal) the mean batch size."""
    before = sb.model_stats(*stats_url) if stats_url else None
    margin = min(0.5, args.duration / 4)
    cpu = {}

    def sample(t_start):
        time.sleep(max(0.0, t_start + args.warmup + margin - time.monotonic()))
        cpu["t0"], cpu["c0"] = time.monotonic(), tree_cpu_seconds(server.proc.pid)
        time.sleep(max(0.1, args.duration - 2 * margin))
        cpu["t1"], cpu["c1"] = time.monotonic(), tree_cpu_seconds(server.proc.pid)
    fig = sb.brief(closed_loop(url, body_file, n, args, during=sample))
    if "error" in fig:
        return fig
    fig["concurrency"] = n
    if cpu.get("c0") is not None and cpu.get("c1") is not None and fig["throughput_rps"] > 0:
        busy = (cpu["c1"] - cpu["c0"]) / (cpu["t1"] - cpu["t0"])
        fig["cpu_cores"] = round(busy, 3)
        fig["cpu_us_per_request"] = round(busy / fig["throughput_rps"] * 1e6, 2)
    after = sb.model_stats(*stats_url) if stats_url else None
    if before and after and after[1] > before[1]:
        fig["mean_batch_size"] = round((after[0] - before[0]) / (after[1] - before[1]), 2)
    return fig


def within_limit(fig, args):
    return ("error" not in fig and fig["errors"] == 0 and fig["requests"] > 0
            and fig["p99_ms"] <= args.p99_limit_ms)


def search(measure, args):
    """The highest throughput at p99 <= the limit: a closed loop at --start-concurrency, halved
    down to 1 while beyond the limit; from there doubling while the p99 holds, the throughput
    still grows (two runs without a new best end it) and --max-concurrency is not passed; then
    --refine geometric midpoints between the last concurrency within the limit and the first
    beyond it. {"points": [every run, in order], "best": the best run within the limit, or
    None}."""
    points = []

    def run(n):
        points.append(measure(n))
        return within_limit(points[-1], args)

    n, bad = args.start_concurrency, None
    ok = run(n)
    while not ok and n > 1:
        bad, n = n, n // 2
        ok = run(n)
    if not ok:
        return {"points": points, "best": None}
    good, best = n, points[-1]
    if bad is None:
        stale = 0
        while n * 2 <= args.max_concurrency:
            n *= 2
            if not run(n):
                bad = n
                break
            good = n
            if points[-1]["throughput_rps"] > best["throughput_rps"]:
                best, stale = points[-1], 0
            else:
                stale += 1
                if stale >= 2:
                    break
    for _ in range(args.refine if bad is not None else 0):
        mid = round(math.sqrt(good * bad))
        if mid in (good, bad):
            break
        if run(mid):
            good = mid
            if points[-1]["throughput_rps"] > best["throughput_rps"]:
                best = points[-1]
        else:
            bad = mid
    return {"points": points, "best": best}


def describe(fig):
    if fig is None:
        return "nothing within the limit"
    if "error" in fig:
        return "error: " + fig["error"]
    s = (f"c={fig.get('concurrency')} {fig['throughput_rps']:.0f} req/s, p99 "
         f"{fig['p99_ms']:.1f} ms, {fig['errors']} errors, "
         f"{fig.get('cpu_us_per_request')} us CPU/req")
    if "mean_batch_size" in fig:
        s += f", mean batch {fig['mean_batch_size']}"
    return s


def run_server(name, model, args, repos, tmp, rows, expected):
    """Starts `name` for `model`, checks its answers, searches; its figures or {"error"}."""
    spec = SERVERS[name]
    port = c.free_port()
    made = server_argv(name, model, port, args, repos, tmp)
    if isinstance(made, str):
        return {"error": made}
    argv, env = made
    base = f"http://127.0.0.1:{port}"
    url = base + spec["path"].format(m=model)
    protocol = spec["protocol"]
    server = Server(f"{name}-{model}", argv, args.server_cpus, tmp, env)
    c.log(f"serving_peers: {model}: starting {name}")
    try:
        t0 = time.monotonic()
        err = server.start(url, body(model, protocol, rows[0]), args.start_timeout)
        if err:
            c.log(f"  {name} did not start: {err}")
            return {"error": f"did not start: {err}"}
        out = {"protocol": protocol, "url": url, "start_s": round(time.monotonic() - t0, 1)}
        if name in ("shoal", "shoal_aa"):  # which libtorch and OpenBLAS kernels it runs
            status, raw = sb.http_get(base + "/v2")
            with contextlib.suppress(ValueError, AttributeError):
                out["backend"] = json.loads(raw).get("backend") if status == 200 else None
        if expected is None:  # shoal, first: its answers are the reference
            answers = ask_rows(url, model, protocol, rows)
            try:
                out["answers"] = [answer_row(protocol, a) if s == 200 else None
                                  for s, a in answers]
            except ValueError as e:
                return {"error": f"shoal's answer: {e}"}
            if any(a is None for a in out["answers"]):
                return {"error": f"shoal did not answer every row: {answers}"}
            out["reply"] = answers[0][1]
        else:
            err = check_answers(url, model, protocol, rows, expected)
            if err:
                c.log(f"  {name}: answers differ, not measured: {err}")
                return {"error": f"answers differ from shoal's, not measured: {err}"}
            out["answers_match_shoal"] = True
        body_file = tmp / f"{name}-{model}.body"
        body_file.write_bytes(body(model, protocol, rows[0]))
        stats_url = (base, model) if name.startswith("shoal") else None

        def measure(n):
            fig = measure_point(server, url, body_file, n, args, stats_url)
            c.log(f"  {name} {model}: {describe(fig)}")
            return fig
        if args.server_warmup > 0:
            # JIT compilers (TorchServe's JVM, TorchScript's profiling executor) and lazily
            # made pools: a closed loop that is not counted.
            warm = argparse.Namespace(duration=args.server_warmup, warmup=0, drain=args.drain,
                                      load_cpu=args.load_cpu)
            sb.run_load(args.serve_load, url, body_file, ["--closed", args.start_concurrency],
                        warm)
        out.update(search(measure, args))
        c.log(f"  {name} {model} best: {describe(out['best'])}")
        return out
    finally:
        server.stop()
        # Ray's session directory, which its launcher could not keep under the work directory
        # (socket paths are limited to 107 bytes) and may not have removed when stopped.
        marker = tmp / f"{name}-{model}" / "ray-temp-dir"
        with contextlib.suppress(OSError):
            ray_dir = Path(marker.read_text().strip())
            if ray_dir.parent == Path("/tmp") and ray_dir.name.startswith("ray-"):
                shutil.rmtree(ray_dir, ignore_errors=True)


# ------------------------------------------------------------------------------- the anchors

def bare_loop(model, batch, args, repos, tmp):
    """The bare loop at one batch size, pinned to the server's first CPU: its rows per second
    and its CPU per row. The loop never waits, but on a shared machine its core also runs
    others, so its wall time per row is not its CPU time: the CPU per row is the wall time per
    row times the share of the core the loop's process got over its life (its rusage over
    its wall clock, model loading included)."""
    (iname, idt, idims), _ = MODELS[model]
    argv = [args.loop_tool, "--model", str(repos["plain"] / model / "1" / "model.pt"),
            "--input", f"{iname}:{idt}:" + "x".join(map(str, idims)),
            "--batch-sizes", str(batch), "--duration", str(args.libtorch_duration)]
    cpu = min(args.server_cpus) if args.server_cpus else None
    err_path = tmp / f"loop-{model}-{batch}.stderr"
    t0 = time.monotonic()
    with open(err_path, "wb") as err:
        try:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err,
                                    preexec_fn=(lambda: os.sched_setaffinity(0, {cpu}))
                                    if cpu is not None else None)
        except OSError as e:
            return {"error": f"cannot run serve_libtorch_loop: {e}"}
        out = proc.stdout.read()
        proc.stdout.close()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        return {"error": f"serve_libtorch_loop: exit status {proc.returncode}: "
                         f"{err_path.read_text(errors='replace').strip()[-300:]}"}
    try:
        fig = json.loads(out)["batch_sizes"][str(batch)]
    except (ValueError, KeyError):
        return {"error": f"serve_libtorch_loop printed no figure for batch size {batch}"}
    share = min(1.0, (usage.ru_utime + usage.ru_stime) / wall)
    return {"inferences_per_s": round(fig["inferences_per_s"], 1),
            "median_call_ms": round(fig["median_call_ms"], 4), "cpu_share": round(share, 3),
            "cpu_us_per_row": round(1e6 / fig["inferences_per_s"] * share, 4)}


def run_floor(model, reply, args, tmp):
    """One serve_floor run for `model`, answering with shoal's `reply`: sb.measure_floor's
    figures with this run's settings (or {"error"})."""
    if args.floor_tool is None:
        return {"error": args.floor_error}
    if reply is None:
        return {"error": "shoal did not answer, so there is no reply to send"}
    floor_args = argparse.Namespace(
        duration=args.duration, warmup=args.warmup, drain=args.drain,
        floor_concurrency=args.floor_concurrency, open_fraction=args.open_fraction,
        open_connections=args.floor_concurrency,
        server_cpu=min(args.server_cpus) if args.server_cpus else None,
        load_cpu=args.load_cpu)
    body_file = tmp / f"floor-{model}.body"
    body_file.write_bytes(body(model, "v2", row(model, 0)))
    return sb.measure_floor(args.floor_tool, model, body_file, reply, args.serve_load,
                            floor_args, tmp)


def anchors(model, shoal_fig, reply, args, repos, tmp, floors):
    """The bare loop's CPU per row at batch 1 and at shoal's mean batch size, and serve_floor's
    CPU per request: `floors` holds the floor run right after shoal ("floor") and right after
    shoal_aa ("floor_aa"); one not run yet is run now."""
    out = {}
    batch = max(1, round((shoal_fig or {}).get("mean_batch_size") or 1))
    out["batch_size"] = batch
    out["server_cpus"] = len(args.server_cpus) if args.server_cpus else os.cpu_count()
    if args.loop_tool is None:
        out["libtorch_loop"] = {"error": args.loop_error}
    else:
        loop = {}
        for b in sorted({1, batch}):
            loop[str(b)] = bare_loop(model, b, args, repos, tmp)
        errors = [f["error"] for f in loop.values() if "error" in f]
        out["libtorch_loop"] = {"error": errors[0]} if errors else loop
        c.log(f"  libtorch loop {model}: {out['libtorch_loop']}")
    # Twice: the floor moved by ~10 % between runs on this machine, as much as the gap a tiny
    # model's CPU target leaves, so its own A/A pair says how far it can be trusted.
    for key in ("floor", "floor_aa"):
        out[key] = floors.get(key) or run_floor(model, reply, args, tmp)
    return out


def paired_cpu_over_floor(best, anchor):
    """(the mean of shoal/floor and shoal_aa/floor_aa, each floor run right after its shoal
    run; the pair's |r/r' - 1|), or (None, None) where either run lacks its figure. The floor
    drifted by up to 30 % within an hour on this machine, so a ratio of runs minutes apart
    says more about the drift than about shoal."""
    ratios = []
    for server, key in (("shoal", "floor"), ("shoal_aa", "floor_aa")):
        cpu = (best.get(server) or {}).get("cpu_us_per_request")
        floor = (((anchor or {}).get(key) or {}).get("closed") or {}).get("cpu_us_per_request")
        if not cpu or not floor:
            return None, None
        ratios.append(cpu / floor)
    return round(sum(ratios) / 2, 4), round(abs(ratios[0] / ratios[1] - 1.0), 4)


def floor_figures(anchor):
    """(the floor's CPU per request, the mean of its A/A pair where both ran; the pair's
    |A/A' - 1|, or None)."""
    cpus = [(((anchor or {}).get(key) or {}).get("closed") or {}).get("cpu_us_per_request")
            for key in ("floor", "floor_aa")]
    cpus = [x for x in cpus if x]
    if not cpus:
        return None, None
    if len(cpus) == 1:
        return cpus[0], None
    return sum(cpus) / 2, round(abs(cpus[0] / cpus[1] - 1.0), 4)


# ------------------------------------------------------------------------------- the targets

def verdict(value, threshold, at_least, resolution, ceiling=None):
    """"met", "not met", "not resolvable" (value within the A/A resolution of the threshold),
    "beyond the bare loop" (a ratio of throughputs that even the bare libtorch loop, paying
    for each request only what serve_floor pays, stays under on this machine: `ceiling`, that
    loop's ratio, is below the threshold, so no server can meet it here) or "not measured"."""
    if value is None:
        return "not measured"
    if at_least and ceiling is not None and ceiling < threshold and value < threshold:
        return "beyond the bare loop"
    if resolution is None:
        return "not resolvable"
    if abs(value / threshold - 1.0) <= resolution:
        return "not resolvable"
    return "met" if (value >= threshold if at_least else value <= threshold) else "not met"


def aa_resolution(shoal, aa):
    """{throughput, cpu}: |A/A' - 1| of shoal's two runs (None where either is missing)."""
    out = {"throughput": None, "cpu_per_request": None}
    if not shoal or not aa:
        return out
    for key, fig_key in (("throughput", "throughput_rps"), ("cpu_per_request",
                                                             "cpu_us_per_request")):
        a, b = shoal.get(fig_key), aa.get(fig_key)
        if a and b:
            out[key] = round(abs(a / b - 1.0), 4)
    return out


def derive(model, best, anchor):
    """(ratios, targets) of one model. best: {server: its best figure or None}."""
    ratios, targets = {}, {}
    shoal, aa = best.get("shoal"), best.get("shoal_aa")
    res = aa_resolution(shoal, aa)
    ratios["aa_resolution"] = res
    tput = lambda name: (best.get(name) or {}).get("throughput_rps")  # noqa: E731
    cpu = lambda name: (best.get(name) or {}).get("cpu_us_per_request")  # noqa: E731
    if shoal is None:
        return ratios, {"shoal_measured": "not measured"}
    per_peer = {p: c.ratio(tput("shoal"), tput(p)) for p in PEERS if tput(p)}
    ratios["throughput_shoal_over"] = per_peer
    ratios["cpu_per_request_over_shoal"] = {p: c.ratio(cpu(p), cpu("shoal"))
                                            for p in PEERS if cpu(p) and cpu("shoal")}
    missing = [p for p in PEERS if not tput(p)]
    if missing:
        ratios["peers_not_measured"] = missing
    ahead = min(per_peer.values()) if per_peer else None
    ratios["throughput_shoal_over_best_peer"] = ahead
    targets["ahead_of_every_peer"] = verdict(ahead, 1.0, True, res["throughput"])

    loop = (anchor or {}).get("libtorch_loop") or {}
    floor_cpu, floor_res = floor_figures(anchor)
    ratios["floor_aa_resolution"] = floor_res
    loop_fig = loop.get(str(anchor.get("batch_size"))) if isinstance(loop, dict) else None
    loop_cpu = (loop_fig or {}).get("cpu_us_per_row")
    if model == "lstm":
        # What the bare loop would do on the server's cores at shoal's batch size, over each
        # peer; and the same loop paying serve_floor's CPU for each request, which any HTTP
        # server pays: the most any server running this model here could reach.
        cpus = anchor.get("server_cpus") or 1
        loop_rps = (1e6 / loop_cpu * cpus) if loop_cpu else None
        ratios["bare_loop_over"] = {p: c.ratio(loop_rps, tput(p))
                                    for p in PEERS if tput(p) and loop_rps}
        server_rps = (1e6 / (loop_cpu + floor_cpu) * cpus) if loop_cpu and floor_cpu else None
        ratios["loop_plus_floor_over"] = {p: c.ratio(server_rps, tput(p))
                                          for p in PEERS if tput(p) and server_rps}
        ceiling = ratios["loop_plus_floor_over"] if server_rps else ratios["bare_loop_over"]
        best_peer = max((p for p in PEERS if tput(p)), key=tput, default=None)
        ratios["lstm_over_best_peer"] = ahead
        targets["lstm_at_least_2_5x_best_peer"] = verdict(ahead, LSTM_OVER_BEST_PEER, True,
                                                          res["throughput"],
                                                          ceiling.get(best_peer))
        r = per_peer.get("fastapi")
        targets["lstm_at_least_10x_fastapi"] = verdict(r, LSTM_OVER_FASTAPI, True,
                                                       res["throughput"], ceiling.get("fastapi"))
        limit = loop_cpu + floor_cpu if loop_cpu is not None and floor_cpu is not None else None
        ratios["cpu_limit_us_per_request"] = round(limit, 3) if limit is not None else None
        ratios["cpu_limit_parts"] = {"loop_us_per_row": loop_cpu, "floor_us_per_request":
                                     floor_cpu, "batch_size": anchor.get("batch_size")}
        r = c.ratio(cpu("shoal"), limit) if limit else None
        ratios["cpu_shoal_over_loop_plus_floor"] = r
        targets["lstm_cpu_within_1_3x_loop_plus_floor"] = verdict(
            r, LSTM_CPU_OVER_LOOP_PLUS_FLOOR, False, res["cpu_per_request"])
    elif model in TINY:
        v2 = {p: per_peer[p] for p in PYTHON_V2 if p in per_peer}
        r = min(v2.values()) if v2 and len(v2) == len(PYTHON_V2) else None
        ratios["throughput_shoal_over_best_python_v2"] = min(v2.values()) if v2 else None
        targets["tiny_at_least_20x_every_python_v2"] = verdict(r, TINY_OVER_PYTHON_V2, True,
                                                               res["throughput"])
        r = ratios["cpu_per_request_over_shoal"].get("fastapi")
        targets["tiny_5x_less_cpu_than_fastapi"] = verdict(r, TINY_FASTAPI_CPU_OVER_SHOAL, True,
                                                           res["cpu_per_request"])
        r, both = paired_cpu_over_floor(best, anchor)
        if r is None:
            r = c.ratio(cpu("shoal"), floor_cpu) if floor_cpu else None
            # A ratio of two noisy figures: resolved only past both pairs' spreads.
            both = (None if res["cpu_per_request"] is None or floor_res is None
                    else round((1 + res["cpu_per_request"]) * (1 + floor_res) - 1, 4))
        ratios["cpu_shoal_over_floor"] = r
        ratios["cpu_over_floor_resolution"] = both
        targets["tiny_cpu_within_1_5x_floor"] = verdict(r, TINY_CPU_OVER_FLOOR, False, both)
    return ratios, targets


def table_rows(result):
    """One line per model and server: the figures the docs' table shows."""
    lines = []
    for m, entry in result["models"].items():
        for name, s in entry.get("servers", {}).items():
            b = s.get("best") if isinstance(s, dict) else None
            if "error" in s:
                lines.append(f"{m:9s} {name:11s} error: {s['error'][:100]}")
            elif b is None:
                lines.append(f"{m:9s} {name:11s} nothing within the p99 limit")
            else:
                lines.append(f"{m:9s} {name:11s} {b['throughput_rps']:9.0f} req/s  "
                             f"c={b['concurrency']:<4d} p99 {b['p99_ms']:6.1f} ms  "
                             f"{b.get('cpu_us_per_request')} us CPU/req")
    return lines


# ------------------------------------------------------------------------------- main

def default_cpus():
    """(server CPUs, load CPU): the first two CPUs for the server and the next for the load
    where there are three or more; else the first for the server, the last for the load."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) >= 3:
        return cpus[:2], cpus[2]
    if len(cpus) == 2:
        return cpus[:1], cpus[1]
    return cpus, None


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    c.add_shoal_arg(p)
    p.add_argument("--serve-load", metavar="PATH", help="default: next to shoal's build tree")
    p.add_argument("--libtorch-loop", metavar="PATH", help="serve_libtorch_loop (same default)")
    p.add_argument("--serve-floor", metavar="PATH", help="serve_floor (same default)")
    p.add_argument("--python", default=c.DEFAULT_PYTHON,
                   help="the Python with torch and FastAPI (default /usr/bin/python3)")
    p.add_argument("--venv-root", default=str(VENV_ROOT),
                   help="where ./setup.sh --serving-peers made the peer-<name> venvs")
    p.add_argument("--models", default="identity,mlp,lstm")
    p.add_argument("--servers", default=",".join(ALL_SERVERS),
                   help="in the order measured; shoal first (its answers are the reference)")
    p.add_argument("--workers", type=int, default=2, help="worker processes / instances")
    p.add_argument("--p99-limit-ms", type=float, default=50.0)
    p.add_argument("--start-concurrency", type=int, default=4)
    p.add_argument("--max-concurrency", type=int, default=512)
    p.add_argument("--refine", type=int, default=2,
                   help="midpoints tried between the last concurrency within the limit and "
                        "the first beyond it")
    p.add_argument("--duration", type=float, default=3.0, help="seconds measured per run")
    p.add_argument("--warmup", type=float, default=1.0, help="seconds before each run")
    p.add_argument("--drain", type=float, default=5.0)
    p.add_argument("--server-warmup", type=float, default=5.0,
                   help="seconds of load, not counted, before a server's first run")
    p.add_argument("--check-rows", type=int, default=8,
                   help="rows sent at once to check a server's answers against shoal's")
    p.add_argument("--shoal-max-batch-size", type=int, default=128)
    p.add_argument("--shoal-batch-delay-us", type=int, default=0)
    p.add_argument("--peer-max-batch-size", type=int, default=64)
    p.add_argument("--peer-batch-delay-ms", type=float, default=5.0)
    p.add_argument("--libtorch-duration", type=float, default=3.0)
    p.add_argument("--floor-concurrency", type=int, default=64)
    p.add_argument("--open-fraction", type=float, default=0.7)
    p.add_argument("--start-timeout", type=float, default=300.0)
    p.add_argument("--server-cpus", help="comma-separated (default: see default_cpus)")
    p.add_argument("--load-cpu", type=int)
    p.add_argument("--keep", action="store_true", help="keep the temporary files and logs")
    p.add_argument("--openblas-coretype", default="shoal",
                   help="OpenBLAS kernels for every server and the bare loop: 'shoal' (those "
                        "shoal serve picks for this CPU), a name such as Haswell, or '' "
                        "(OpenBLAS's own choice for the others); an OPENBLAS_CORETYPE in the "
                        "environment wins")
    p.add_argument("--aten-cpu-capability", default="shoal",
                   help="the instruction set of libtorch's own kernels for every server and the "
                        "bare loop: 'shoal' (what shoal serve picks for this CPU), avx2, avx512, "
                        "or '' (libtorch's default for the others); an ATEN_CPU_CAPABILITY in the "
                        "environment wins")
    args = p.parse_args(argv)
    args.models = [m for m in args.models.split(",") if m]
    args.servers = [s for s in args.servers.split(",") if s]
    for m in args.models:
        if m not in MODELS:
            p.error(f"unknown model {m}; known: {', '.join(MODELS)}")
    for s in args.servers:
        if s not in SERVERS:
            p.error(f"unknown server {s}; known: {', '.join(ALL_SERVERS)}")
    if not args.servers or args.servers[0] != "shoal":
        p.error("--servers must start with shoal: its answers are what the others are "
                "checked against")
    for name in ("workers", "start_concurrency", "max_concurrency", "check_rows"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.p99_limit_ms <= 0 or args.duration <= 0:
        p.error("--p99-limit-ms and --duration must be > 0")
    server_cpus, load_cpu = default_cpus()
    if args.server_cpus:
        try:
            server_cpus = [int(x) for x in args.server_cpus.split(",") if x]
        except ValueError:
            p.error(f"--server-cpus must list CPU numbers, got {args.server_cpus!r}")
    allowed = os.sched_getaffinity(0)
    for cpu in server_cpus:
        if cpu not in allowed:
            p.error(f"--server-cpus: CPU {cpu} is not available to this process")
    if args.load_cpu is not None:
        if args.load_cpu not in allowed:
            p.error(f"--load-cpu: CPU {args.load_cpu} is not available to this process")
        load_cpu = args.load_cpu
    args.server_cpus, args.load_cpu = set(server_cpus), load_cpu
    args.venv_root = Path(args.venv_root)
    return args


def main(argv=None):
    args = parse_args(argv)
    result = {"benchmark": "serving_peers", "machine": c.machine_info(),
              "load_average_at_start": list(os.getloadavg()), "models": {}}
    result["settings"] = {k: getattr(args, k) for k in (
        "models", "servers", "workers", "p99_limit_ms", "start_concurrency", "max_concurrency",
        "refine", "duration", "warmup", "server_warmup", "check_rows", "shoal_max_batch_size",
        "shoal_batch_delay_us", "peer_max_batch_size", "peer_batch_delay_ms",
        "libtorch_duration", "floor_concurrency", "load_cpu")}
    result["settings"]["server_cpus"] = sorted(args.server_cpus)
    result["settings"]["openblas_coretype"] = c.same_openblas_kernels(args.openblas_coretype)
    result["settings"]["aten_cpu_capability"] = c.same_aten_kernels(args.aten_cpu_capability)

    args.shoal, args.shoal_error = c.find_shoal(args.shoal)
    if args.shoal and not args.shoal_error:
        args.shoal_error = sb.shoal_supports_serve(args.shoal)
    result["shoal_binary"] = args.shoal
    args.serve_load, err = sb.find_build_tool(args.serve_load, "serve_load", args.shoal)
    if args.serve_load is None:
        result["error"] = err
        c.emit(result)
        return 0
    args.loop_tool, args.loop_error = sb.find_build_tool(args.libtorch_loop,
                                                         "serve_libtorch_loop", args.shoal)
    args.floor_tool, args.floor_error = sb.find_build_tool(args.serve_floor, "serve_floor",
                                                           args.shoal)
    result["versions"] = peer_versions(args, args.servers)

    with c.temp_dir("shoal-serving-peers-", keep=args.keep) as tmp:
        repos = {"plain": tmp / "repo-plain", "shoal": tmp / "repo-shoal"}
        c.log(f"serving_peers: exporting {', '.join(args.models)} to {tmp}")
        err = sb.write_repository(repos["plain"], args.models, args.python, False, 0, 0)
        if err:
            result["error"] = err
            c.emit(result)
            return 0
        sb.write_repository(repos["shoal"], args.models, args.python, True,
                            args.shoal_max_batch_size, args.shoal_batch_delay_us,
                            exported=repos["plain"])
        for m in args.models:
            (repos["shoal"] / m / "config.yaml").write_text(shoal_config(m, args))

        for m in args.models:
            entry = result["models"].setdefault(m, {"servers": {}})
            rows = [row(m, seed) for seed in range(args.check_rows)]
            expected, reply, floors = None, None, {}
            for name in args.servers:
                if name != "shoal" and expected is None:
                    entry["servers"][name] = {"error": "shoal gave no reference answers"}
                    continue
                fig = run_server(name, m, args, repos, tmp, rows,
                                 expected if name != "shoal" else None)
                if name == "shoal" and "error" not in fig:
                    expected = fig.pop("answers")
                    reply = fig.pop("reply")
                entry["servers"][name] = fig
                # The floor right after each of shoal's runs, so that the CPU target compares
                # runs a minute apart, not a quarter of an hour.
                if name in ("shoal", "shoal_aa") and "error" not in fig:
                    key = "floor" if name == "shoal" else "floor_aa"
                    c.log(f"serving_peers: {m}: serve_floor after {name}")
                    floors[key] = run_floor(m, reply, args, tmp)
            best = {n: s.get("best") for n, s in entry["servers"].items() if "error" not in s}
            c.log(f"serving_peers: {m}: the anchors")
            anchor = anchors(m, best.get("shoal"), reply, args, repos, tmp, floors)
            entry["anchors"] = anchor
            entry["ratios"], entry["targets"] = derive(m, best, anchor)
            c.log(f"serving_peers: {m}: {entry['targets']}")
    result["load_average_at_end"] = list(os.getloadavg())
    result["targets"] = {m: e.get("targets") for m, e in result["models"].items()}
    result["table"] = table_rows(result)
    for line in result["table"]:
        c.log(line)
    c.emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
