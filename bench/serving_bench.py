#!/usr/bin/env python3
"""Serving benchmark (issue 6): `shoal serve` against the FastAPI baseline and a bare libtorch
loop, on the same TorchScript models, server and load generator each pinned to a core.

    python3 bench/serving_bench.py [--shoal PATH] [--models identity,lstm,mlp]
        [--concurrency 1,8,32,64,128] [--duration 5] [--warmup 1] [--reps 1]

The three servers (the FastAPI baseline; shoal serve with batching; shoal serve without) are up
at once, all pinned to the server CPU; every measurement point runs each of them back to back, so
that the figures compared are seconds apart. Per model: closed-loop throughput and latency at
each concurrency (serve_load --closed N), then an open loop (serve_load --open) at
--open-fraction (70 %) of each server's peak for that model. Then the bare libtorch loop
(serve_libtorch_loop) at batch size 1 and at the mean batch sizes shoal ran at, and the floor
(serve_floor: a server that only answers) that sets the most any server could reach here. One
JSON object on stdout (docs/benchmarks/serving.md describes it); progress on stderr.
"""

import argparse
import contextlib
import json
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

BASELINE = c.REPO_ROOT / "bench" / "serving" / "fastapi_baseline.py"
EXPORTER = c.REPO_ROOT / "examples" / "serving" / "lstm_classifier.py"

# Model signatures, as examples/serving/lstm_classifier.py exports them: (input name,
# datatype, dims without the batch dimension), (output name, datatype, dims).
MODELS = {
    "identity": (("x", "FP32", [16]), ("output", "FP32", [16])),
    "lstm": (("tokens", "INT64", [32]), ("logits", "FP32", [10])),
    "mlp": (("x", "FP32", [64]), ("scores", "FP32", [10])),
}
VOCAB_SIZE = 50_000

# The targets.
TARGET_SPEEDUP = 10.0           # x the baseline's throughput, identity and LSTM
TARGET_SPEEDUP_MODELS = ("identity", "lstm")
TARGET_LSTM_PER_CORE = 2500.0   # inferences/s per core
TARGET_P99_OVER_P50 = 2.0       # at 70 % of peak, open loop
TARGET_BATCHING_FLOOR = 0.95    # batched throughput >= 95 % of unbatched, every concurrency
TARGET_LIBTORCH_FRACTION = 0.9  # saturated throughput vs the bare loop


# ------------------------------------------------------------------------------- the setup

def find_build_tool(explicit, name, shoal_path):
    """(path, None) or (None, reason): --flag, next to shoal's build tree, next to shoal itself
    (a flat copy of a build, as bench/ab.py's /work/baseline), build/bench/."""
    candidates = []
    if explicit:
        candidates = [Path(explicit)]
    else:
        if shoal_path:
            # build/src/cli/shoal -> build/bench/NAME
            candidates.append(Path(shoal_path).resolve().parents[2] / "bench" / name)
            candidates.append(Path(shoal_path).resolve().parent / name)
        candidates.append(c.REPO_ROOT / "build" / "bench" / name)
    for p in candidates:
        if p.is_file() and os.access(p, os.X_OK):
            return str(p), None
    return None, (f"{name} not found (looked at {', '.join(map(str, candidates))}); build it: "
                  f"ninja -C build {name}")


def config_yaml(model, batching, max_batch_size, batch_delay_us):
    (iname, idt, idims), (oname, odt, odims) = MODELS[model]
    if batching:
        head = (f"max_batch_size: {max_batch_size}\nbatch_delay_us: {batch_delay_us}\n")
        in_dims, out_dims = idims, odims
    else:
        head = ""
        in_dims, out_dims = [-1] + idims, [-1] + odims
    return (f"inputs:\n  - {{name: {iname}, datatype: {idt}, dims: {in_dims}}}\n"
            f"outputs:\n  - {{name: {oname}, datatype: {odt}, dims: {out_dims}}}\n"
            + head +
            "warmup:\n  - count: 3\n    inputs:\n"
            f"      {iname}: {{dims: {[1] + idims}, fill: random}}\n")


def write_repository(root, models, python, batching, max_batch_size, batch_delay_us,
                     exported=None):
    """root/<model>/1/model.pt (exported once, then copied) and root/<model>/config.yaml."""
    root.mkdir(parents=True, exist_ok=True)
    if exported is None:
        r = c.run_timed([python, str(EXPORTER), "--repository", str(root)], timeout=300)
        if not r.ok:
            return f"exporting the models failed: {r.describe()}"
    else:
        for m in models:
            (root / m / "1").mkdir(parents=True, exist_ok=True)
            (root / m / "1" / "model.pt").write_bytes((exported / m / "1" / "model.pt")
                                                      .read_bytes())
    for m in list(p.name for p in root.iterdir()):
        if m not in models:  # exported but not measured: not served either
            shutil.rmtree(root / m, ignore_errors=True)
            continue
        (root / m / "config.yaml").write_text(
            config_yaml(m, batching, max_batch_size, batch_delay_us))
    return None


def request_body(model, seed=0):
    """One batch-1 request in the v2 JSON form; fixed per model."""
    (iname, idt, idims), _ = MODELS[model]
    rng = random.Random(seed)
    n = 1
    for d in idims:
        n *= d
    if idt == "INT64":
        data = [rng.randrange(VOCAB_SIZE) for _ in range(n)]
    else:
        data = [round(rng.random(), 6) for _ in range(n)]
    return json.dumps({"inputs": [{"name": iname, "shape": [1] + idims, "datatype": idt,
                                   "data": data}]}).encode()


def pin(cpu):
    if cpu is None:
        return None
    return lambda: os.sched_setaffinity(0, {cpu})


# ------------------------------------------------------------------------------- a server

def http_get(url, timeout=5):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (urllib.error.URLError, OSError) as e:
        return None, str(e).encode()


def http_post(url, body, timeout=30):
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (urllib.error.URLError, OSError) as e:
        return None, str(e).encode()


class Server:
    """A server process (its own session), pinned to cpu, that prints
    `...: listening on http://HOST:PORT` on stdout when its port is bound."""

    def __init__(self, name, argv, cpu, log_dir, env=None):
        self.name, self.argv, self.cpu = name, argv, cpu
        self.stdout_path = log_dir / f"{name}.stdout"
        self.stderr_path = log_dir / f"{name}.stderr"
        self.env = env
        self.proc = None
        self.url = None

    def start(self, timeout=180):
        """None, or why the server did not come up ready."""
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            try:
                self.proc = subprocess.Popen(self.argv, stdout=out, stderr=err,
                                             stdin=subprocess.DEVNULL, start_new_session=True,
                                             preexec_fn=pin(self.cpu), env=self.env)
            except OSError as e:
                return f"cannot start {self.argv[0]}: {e}"
        deadline = time.monotonic() + timeout
        while self.url is None:
            text = self.stdout_path.read_text(errors="replace")
            if "listening on " in text:
                self.url = text.split("listening on ", 1)[1].split()[0].rstrip("/")
                break
            if self.proc.poll() is not None:
                return f"exited with status {self.proc.returncode}: {self.tail()}"
            if time.monotonic() > deadline:
                return f"did not listen within {timeout} s: {self.tail()}"
            time.sleep(0.05)
        while True:
            status, _ = http_get(self.url + "/v2/health/ready")
            if status == 200:
                return None
            if self.proc.poll() is not None:
                return f"exited with status {self.proc.returncode}: {self.tail()}"
            if time.monotonic() > deadline:
                return f"not ready within {timeout} s: {self.tail()}"
            time.sleep(0.1)

    def tail(self, n=5):
        with contextlib.suppress(OSError):
            lines = self.stderr_path.read_text(errors="replace").strip().splitlines()
            return " / ".join(lines[-n:])
        return ""

    def rss_mb(self):
        with contextlib.suppress(OSError, ValueError, IndexError):
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return round(int(line.split()[1]) / 1024.0, 1)
        return None

    def stop(self):
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def shoal_supports_serve(shoal):
    r = c.run_timed([shoal, "serve", "--help"], timeout=30)
    if r.ok and "--model-repository" in (r.stdout + r.stderr):
        return None
    return f"`{shoal} serve` is not available ({r.describe()})"


# ------------------------------------------------------------------------------- the load

def run_load(serve_load, url, body_file, mode_args, args):
    """serve_load's JSON, or {"error": ...}."""
    argv = [serve_load, "--url", url, "--body", str(body_file), *map(str, mode_args),
            "--duration", str(args.duration), "--warmup", str(args.warmup),
            "--drain", str(args.drain)]
    timeout = args.duration + args.warmup + args.drain + 60
    r = c.run_timed(argv, timeout=timeout, preexec_fn=pin(args.load_cpu))
    if not r.ok:
        return {"error": f"serve_load: {r.describe()}"}
    try:
        return json.loads(r.stdout)
    except ValueError:
        return {"error": f"serve_load printed no JSON: {r.stdout[-200:]!r}"}


def brief(load):
    """The figures kept from one serve_load run."""
    if "error" in load:
        return {"error": load["error"]}
    lat = load["latency_ms"]
    out = {"throughput_rps": round(load["throughput_rps"], 1),
           "p50_ms": round(lat["p50"], 3), "p90_ms": round(lat["p90"], 3),
           "p99_ms": round(lat["p99"], 3), "p999_ms": round(lat["p999"], 3),
           "max_ms": round(lat["max"], 3), "requests": load["requests"],
           "errors": load["errors"]}
    if load["mode"] == "open":
        out["target_rps"] = round(load["target_rps"], 1)
        out["achieved_rps"] = round(load["achieved_rps"], 1)
        out["max_backlog"] = load["max_backlog"]
    return out


def model_stats(url, model):
    """(inference_count, execution_count, compute ns) from shoal's /stats, or None."""
    status, body = http_get(f"{url}/v2/models/{model}/stats")
    if status != 200:
        return None
    with contextlib.suppress(ValueError, KeyError, IndexError, TypeError):
        stats = json.loads(body)["model_stats"]
        return (sum(s["inference_count"] for s in stats),
                sum(s["execution_count"] for s in stats),
                sum(s["inference_stats"]["compute_infer"]["ns"] for s in stats))
    return None


def first_answer(server, model, bodies, expected, replies=None):
    """(match, error) of one request: error is None or why it failed; match is None for the
    first server to answer (its outputs become the ones the others are compared with), else
    whether its outputs equal them. replies[model] keeps an answer's bytes (shoal's when it
    answers) for the floor server to send."""
    url = f"{server.url}/v2/models/{model}/infer"
    status, answer = http_post(url, bodies[model].read_bytes())
    if status != 200:
        return None, f"infer answered {status}: {answer[:300]!r}"
    if replies is not None and (server.name == "shoal" or model not in replies):
        replies[model] = answer
    match = None
    with contextlib.suppress(ValueError, KeyError, IndexError, TypeError):
        data = json.loads(answer)["outputs"][0]["data"]
        if model in expected:
            match = len(data) == len(expected[model]) and all(
                abs(a - b) <= 1e-4 + 1e-4 * abs(b) for a, b in zip(data, expected[model]))
        else:
            expected[model] = data
    return match, None


def closed_point(server, model, n, bodies, serve_load, args):
    """One closed-loop run of `n` connections, with shoal's mean batch size."""
    url = f"{server.url}/v2/models/{model}/infer"
    before = model_stats(server.url, model)
    load = run_load(serve_load, url, bodies[model], ["--closed", n], args)
    after = model_stats(server.url, model)
    fig = brief(load)
    if before and after and after[1] > before[1]:
        fig["mean_batch_size"] = round((after[0] - before[0]) / (after[1] - before[1]), 2)
        if after[2] > before[2]:
            # Rows per second of the model's own execution inside the server (its batches'
            # compute time only): the server's runtime against the bare loop, without the
            # requests' network and HTTP path.
            fig["compute_rows_per_s"] = round((after[0] - before[0]) * 1e9 /
                                              (after[2] - before[2]), 1)
    c.log(f"  {server.name} {model} closed {n}: " + describe(fig))
    return fig


def measure_round(servers, models, bodies, expected, serve_load, args, order, replies=None,
                  after_model=None):
    """One round: {server: {model: {...}}}. Every server is up at once (each pinned to the
    server CPU, idle while another is loaded); each measurement point runs every server back to
    back, in `order`, so that the figures compared with each other are seconds apart, not minutes."""
    results = {s.name: {} for s in servers}
    live = {s.name: s for s in servers}
    for m in models:
        ready = []
        for s in servers:
            match, err = first_answer(s, m, bodies, expected, replies)
            if err:
                results[s.name][m] = {"error": err}
                c.log(f"  {s.name} {m}: {err}")
                continue
            results[s.name][m] = {"closed": {}}
            if match is not None:
                results[s.name][m]["outputs_match_baseline"] = match
            ready.append(s.name)
        for n in args.concurrency:
            for name in [o for o in order if o in ready]:
                results[name][m]["closed"][str(n)] = closed_point(live[name], m, n, bodies,
                                                                  serve_load, args)
        for name in [o for o in order if o in ready]:
            res = results[name][m]
            ok = {k: v for k, v in res["closed"].items() if "error" not in v}
            if not ok:
                continue
            peak_c = max(ok, key=lambda k: ok[k]["throughput_rps"])
            res["peak_rps"] = ok[peak_c]["throughput_rps"]
            res["peak_concurrency"] = int(peak_c)
            rate = args.open_fraction * res["peak_rps"]
            if rate > 0:
                load = run_load(serve_load, f"{live[name].url}/v2/models/{m}/infer", bodies[m],
                                ["--open", round(rate, 3), "--connections", args.open_connections],
                                args)
                res["open"] = brief(load)
                c.log(f"  {name} {m} open {rate:.0f}/s: " + describe(res["open"]))
        if after_model is not None:
            # The anchors of this model, seconds after its servers ran: this machine's speed
            # drifts by tens of percent over minutes, so anchors measured at the end of the
            # whole sweep were compared with servers measured in another phase.
            after_model(m, results)
    for s in servers:
        for m in results[s.name]:
            results[s.name][m]["rss_mb_after"] = s.rss_mb()
    return results


def paired_ratios(rounds, num, den, model):
    """Per concurrency: the median over rounds of num's throughput over den's in the same round
    (the two ran seconds apart). A round where either server or either run failed is left out;
    {} when no round has both."""
    per_n = {}
    for r in rounds:
        a = (r.get(num) or {}).get(model) or {}
        b = (r.get(den) or {}).get(model) or {}
        if "error" in a or "error" in b:
            continue
        for n, fa in a.get("closed", {}).items():
            fb = b.get("closed", {}).get(n)
            if fb and "error" not in fa and "error" not in fb and fb["throughput_rps"] > 0:
                per_n.setdefault(n, []).append(fa["throughput_rps"] / fb["throughput_rps"])
    return {n: round(c.median(v), 4) for n, v in per_n.items()}


def describe(fig):
    if "error" in fig:
        return "error: " + fig["error"]
    s = (f"{fig['throughput_rps']:.0f} req/s, p50 {fig['p50_ms']:.3f} ms, "
         f"p99 {fig['p99_ms']:.3f} ms, {fig['errors']} errors")
    if "mean_batch_size" in fig:
        s += f", mean batch {fig['mean_batch_size']}"
    return s


# ------------------------------------------------------------------------------- the anchor

def libtorch_loop(tool, model_pt, model, batch_sizes, args):
    (iname, idt, idims), _ = MODELS[model]
    spec = f"{iname}:{idt}:" + "x".join(map(str, idims))
    argv = [tool, "--model", str(model_pt), "--input", spec, "--batch-sizes",
            ",".join(map(str, batch_sizes)), "--duration", str(args.libtorch_duration)]
    r = c.run_timed(argv, timeout=args.libtorch_duration * len(batch_sizes) + 120,
                    preexec_fn=pin(args.server_cpu))
    if not r.ok:
        return {"error": f"serve_libtorch_loop: {r.describe()}"}
    try:
        out = json.loads(r.stdout)
    except ValueError:
        return {"error": "serve_libtorch_loop printed no JSON"}
    return {b: {"inferences_per_s": round(v["inferences_per_s"], 1),
                "median_call_ms": round(v["median_call_ms"], 4)}
            for b, v in out["batch_sizes"].items()}


# ------------------------------------------------------------------------------- the floor

def cpu_seconds(pid):
    """CPU time of a single-threaded process: /proc/PID/schedstat (ns), else /proc/PID/stat."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9
    with contextlib.suppress(OSError, ValueError, IndexError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return None


def measure_floor(tool, model, body_file, reply, serve_load, args, tmp):
    """serve_floor (bench/serve_floor.cc) answering the model's request with `reply`, pinned
    to the server CPU: a closed loop of --floor-concurrency connections, with the floor's CPU
    time per request over the middle of the measured window, then an open loop at
    --open-fraction of that throughput. What the kernel's TCP path costs any server per
    request on this machine, and the latency jitter it leaves when nothing else runs."""
    reply_file = tmp / f"{model}.floor-reply"
    reply_file.write_bytes(reply)
    server = Server(f"floor-{model}", [tool, "--reply", str(reply_file), "--port", "0"],
                    args.server_cpu, tmp)
    err = server.start(timeout=30)
    if err:
        server.stop()
        return {"error": f"serve_floor did not start: {err}"}
    try:
        url = f"{server.url}/v2/models/{model}/infer"
        done = {}
        runner = threading.Thread(target=lambda: done.update(load=run_load(
            serve_load, url, body_file, ["--closed", args.floor_concurrency], args)))
        runner.start()
        # The middle of the measured window: past the warmup, before the end.
        margin = min(0.5, args.duration / 4)
        time.sleep(args.warmup + margin)
        cpu0, t0 = cpu_seconds(server.proc.pid), time.monotonic()
        time.sleep(max(0.1, args.duration - 2 * margin))
        cpu1, t1 = cpu_seconds(server.proc.pid), time.monotonic()
        runner.join()
        closed = brief(done["load"])
        if "error" in closed:
            return {"error": closed["error"]}
        if cpu0 is not None and cpu1 is not None and closed["throughput_rps"] > 0:
            busy = (cpu1 - cpu0) / (t1 - t0)
            closed["cpu_fraction"] = round(busy, 3)
            closed["cpu_us_per_request"] = round(busy / closed["throughput_rps"] * 1e6, 3)
        c.log(f"  floor {model} closed {args.floor_concurrency}: " + describe(closed) +
              f", {closed.get('cpu_us_per_request')} us of CPU a request")
        out = {"concurrency": args.floor_concurrency, "closed": closed}
        rate = args.open_fraction * closed["throughput_rps"]
        if rate > 0:
            out["open"] = brief(run_load(serve_load, url, body_file,
                                         ["--open", round(rate, 3), "--connections",
                                          args.open_connections], args))
            c.log(f"  floor {model} open {rate:.0f}/s: " + describe(out["open"]))
        return out
    finally:
        server.stop()


def ceilings(model, shoal, base, libtorch, floor, batch):
    """The most any one-core server could reach here: each request costs the floor's CPU plus
    the model's compute per row at `batch` in the bare loop. (ratios, reachable) where
    reachable says per throughput target whether that ceiling clears it at all."""
    ratios, reachable = {}, {}
    per_request = ((floor or {}).get("closed") or {}).get("cpu_us_per_request")
    anchor = (libtorch or {}).get(str(batch)) if isinstance(libtorch, dict) else None
    if per_request is None or not anchor or not anchor.get("inferences_per_s"):
        return ratios, reachable
    compute_us = 1e6 / anchor["inferences_per_s"]
    ceiling = 1e6 / (compute_us + per_request)
    ratios["ceiling_rps"] = round(ceiling, 1)
    ratios["ceiling_floor_us_per_request"] = per_request
    ratios["ceiling_compute_us_per_row"] = round(compute_us, 3)
    ratios["ceiling_over_libtorch"] = c.ratio(ceiling, anchor["inferences_per_s"])
    reachable["saturated_at_least_90pct_of_libtorch"] = (
        ratios["ceiling_over_libtorch"] >= TARGET_LIBTORCH_FRACTION)
    consistent = True
    if shoal and shoal.get("peak_rps"):
        ratios["shoal_over_ceiling"] = c.ratio(shoal["peak_rps"], ceiling)
        # No server beats the ceiling: above it, the machine ran faster while shoal was
        # measured than while the anchors were, and no reachability can be read from them.
        consistent = ratios["shoal_over_ceiling"] <= 1.0
        ratios["ceiling_consistent"] = consistent
    if base and base.get("peak_rps"):
        ratios["ceiling_over_fastapi"] = c.ratio(ceiling, base["peak_rps"])
        if model in TARGET_SPEEDUP_MODELS:
            reachable["throughput_at_least_10x_baseline"] = (
                ratios["ceiling_over_fastapi"] >= TARGET_SPEEDUP)
    fo = (floor or {}).get("open") or {}
    if fo and "error" not in fo and fo.get("p50_ms"):
        ratios["floor_open_p99_over_p50"] = c.ratio(fo["p99_ms"], fo["p50_ms"])
    if not consistent:
        reachable = {k: None for k in reachable}
    return ratios, reachable


# ------------------------------------------------------------------------------- aggregation

def median_of(values):
    values = [v for v in values if v is not None]
    if not values:
        return None
    m = c.median(values)
    if all(isinstance(v, int) for v in values) and m == int(m):
        return int(m)
    return round(m, 3)


def merge_rounds(rounds):
    """Per server and model: the medians over rounds of every figure."""
    merged = {}
    for server in {s for r in rounds for s in r}:
        merged[server] = {}
        per_round = [r[server] for r in rounds if server in r]
        if all("error" in r for r in per_round):
            merged[server] = {"error": per_round[0]["error"]}
            continue
        per_round = [r for r in per_round if "error" not in r]
        for m in {m for r in per_round for m in r}:
            figs = [r[m] for r in per_round if m in r]
            good = [f for f in figs if "error" not in f]
            if not good:
                merged[server][m] = {"error": figs[0]["error"]}
                continue
            out = {"closed": {}}
            for n in good[0]["closed"]:
                runs = [f["closed"].get(n, {}) for f in good]
                runs = [x for x in runs if "error" not in x and x]
                if not runs:
                    out["closed"][n] = good[0]["closed"][n]
                    continue
                out["closed"][n] = {k: median_of([x.get(k) for x in runs]) for k in runs[0]}
            for key in ("peak_rps", "rss_mb_after"):
                out[key] = median_of([f.get(key) for f in good])
            out["peak_concurrency"] = good[0].get("peak_concurrency")
            opens = [f["open"] for f in good if "open" in f and "error" not in f["open"]]
            if opens:
                out["open"] = {k: median_of([o.get(k) for o in opens]) for k in opens[0]}
            elif any("open" in f for f in good):
                out["open"] = next(f["open"] for f in good if "open" in f)
            matches = [f["outputs_match_baseline"] for f in good if "outputs_match_baseline" in f]
            if matches:
                out["outputs_match_baseline"] = all(matches)
            if len(good) > 1:
                out["rounds"] = len(good)
            merged[server][m] = out
    return merged


def merge_libtorch(per_round):
    """The bare loop's figures per batch size: medians over the rounds that ran that size."""
    good = [r for r in per_round if isinstance(r, dict) and "error" not in r]
    if not good:
        errors = [r for r in per_round if isinstance(r, dict)]
        return errors[0] if errors else {"error": "not measured"}
    out = {}
    for b in sorted({b for r in good for b in r}, key=int):
        runs = [r[b] for r in good if b in r]
        out[b] = {k: median_of([x.get(k) for x in runs]) for k in runs[0]}
    return out


def merge_floors(per_round):
    """The floor's figures: medians over rounds; None when the floor was not run."""
    runs = [r for r in per_round if isinstance(r, dict)]
    if not runs:
        return None
    good = [r for r in runs if "error" not in r]
    if not good:
        return runs[0]
    out = {"concurrency": good[0].get("concurrency")}
    for part in ("closed", "open"):
        parts = [r[part] for r in good if isinstance(r.get(part), dict) and "error" not in r[part]]
        if parts:
            out[part] = {k: median_of([x.get(k) for x in parts]) for k in parts[0]}
    if len(good) > 1:
        out["rounds"] = len(good)
    return out


def nearest_batch(libtorch, batch):
    """The bare loop's entry at `batch`, else at the nearest batch size it ran (the rounds'
    mean batch sizes differ a little, and the median peak's may match none of them)."""
    sizes = [int(b) for b in libtorch if str(b).isdigit() and b != "1"] if libtorch else []
    if str(batch) in (libtorch or {}):
        return batch
    if not sizes or batch == 1:
        return None
    return min(sizes, key=lambda b: abs(b - batch))


def derive(model, servers, libtorch, cores, paired_batching=None, floor=None):
    """Ratios and targets for one model. servers: {name: merged figures or error}."""
    base = servers.get("fastapi", {}).get(model) if "error" not in servers.get("fastapi", {}) \
        else None
    shoal = servers.get("shoal", {}).get(model) if "error" not in servers.get("shoal", {}) \
        else None
    unb = servers.get("shoal_unbatched", {}).get(model) \
        if "error" not in servers.get("shoal_unbatched", {}) else None
    good = lambda f: f is not None and "error" not in f  # noqa: E731
    ratios, targets = {}, {}

    for name, f in (("fastapi", base), ("shoal", shoal), ("shoal_unbatched", unb)):
        if good(f) and f.get("peak_rps") is not None:
            f["inferences_per_s_per_core"] = round(f["peak_rps"] / cores, 1)

    if good(base) and good(shoal):
        ratios["throughput_peak_shoal_over_fastapi"] = c.ratio(shoal["peak_rps"], base["peak_rps"])
        per_c = {}
        for n, fs in shoal["closed"].items():
            fb = base["closed"].get(n, {})
            if "error" in fs or "error" in fb or not fb:
                continue
            per_c[n] = {"throughput": c.ratio(fs["throughput_rps"], fb["throughput_rps"]),
                        "p50": c.ratio(fs["p50_ms"], fb["p50_ms"]),
                        "p99": c.ratio(fs["p99_ms"], fb["p99_ms"])}
        ratios["closed_shoal_over_fastapi"] = per_c
        so, bo = shoal.get("open", {}), base.get("open", {})
        if so and bo and "error" not in so and "error" not in bo:
            ratios["open_p50_shoal_over_fastapi"] = c.ratio(so["p50_ms"], bo["p50_ms"])
            ratios["open_p99_shoal_over_fastapi"] = c.ratio(so["p99_ms"], bo["p99_ms"])

    if model in TARGET_SPEEDUP_MODELS:
        r = ratios.get("throughput_peak_shoal_over_fastapi")
        targets["throughput_at_least_10x_baseline"] = None if r is None else r >= TARGET_SPEEDUP
    if model == "lstm":
        per_core = shoal.get("inferences_per_s_per_core") if good(shoal) else None
        targets["lstm_at_least_2500_per_core"] = (None if per_core is None
                                                  else per_core >= TARGET_LSTM_PER_CORE)

    def p99_ok(f):
        o = (f or {}).get("open") if good(f) else None
        if not o or "error" in o or not o.get("p50_ms"):
            return None
        # Met only when the server also kept up with the rate, without errors.
        kept_up = o.get("achieved_rps", 0) >= 0.95 * o.get("target_rps", 0)
        return (o["p99_ms"] <= TARGET_P99_OVER_P50 * o["p50_ms"] and o.get("errors", 0) == 0
                and kept_up)

    targets["p99_at_most_2x_p50_at_70pct_peak"] = p99_ok(shoal)
    ratios["open_p99_over_p50"] = {
        n: (c.ratio(f["open"]["p99_ms"], f["open"]["p50_ms"])
            if good(f) and f.get("open") and "error" not in f["open"] else None)
        for n, f in (("fastapi", base), ("shoal", shoal), ("shoal_unbatched", unb))}

    if good(shoal) and good(unb):
        per_c = {}
        for n, fs in shoal["closed"].items():
            fu = unb["closed"].get(n, {})
            if "error" in fs or "error" in fu or not fu:
                continue
            per_c[n] = c.ratio(fs["throughput_rps"], fu["throughput_rps"])
        ratios["batched_over_unbatched_throughput_of_medians"] = per_c
        # The target reads the paired figure: each round's two runs were seconds apart.
        if paired_batching:
            per_c = paired_batching
        ratios["batched_over_unbatched_throughput"] = per_c
        targets["batching_never_worse_than_unbatched"] = (
            None if not per_c or any(v is None for v in per_c.values())
            else all(v >= TARGET_BATCHING_FLOOR for v in per_c.values()))
    else:
        targets["batching_never_worse_than_unbatched"] = None

    # Saturated throughput against the bare loop at the batch size shoal ran at.
    sat = None
    if good(shoal) and isinstance(libtorch, dict) and "error" not in libtorch:
        peak = shoal["closed"].get(str(shoal.get("peak_concurrency")), {})
        batch = nearest_batch(libtorch, max(1, round(peak.get("mean_batch_size") or 1)))
        anchor = libtorch.get(str(batch)) if batch is not None else None
        if anchor:
            sat = c.ratio(shoal["peak_rps"], anchor["inferences_per_s"])
            ratios["saturated_shoal_over_libtorch"] = sat
            ratios["saturated_libtorch_batch_size"] = batch
            if peak.get("compute_rows_per_s"):
                ratios["compute_shoal_over_libtorch"] = c.ratio(peak["compute_rows_per_s"],
                                                                anchor["inferences_per_s"])
    if good(unb) and isinstance(libtorch, dict) and "1" in libtorch:
        ratios["saturated_shoal_unbatched_over_libtorch_batch_1"] = c.ratio(
            unb["peak_rps"], libtorch["1"]["inferences_per_s"])
    # Above 1 the bare loop ran in a slower phase of the machine than the server: not a
    # measurement of the target.
    if sat is not None:
        ratios["saturated_consistent"] = sat <= 1.0
    targets["saturated_at_least_90pct_of_libtorch"] = (
        None if sat is None or sat > 1.0 else sat >= TARGET_LIBTORCH_FRACTION)
    reachable = {}
    if good(shoal):
        extra, reachable = ceilings(model, shoal, base if good(base) else None, libtorch, floor,
                                    ratios.get("saturated_libtorch_batch_size", 1))
        ratios.update(extra)
    return ratios, targets, reachable


# ------------------------------------------------------------------------------- main

def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    c.add_shoal_arg(p)
    p.add_argument("--serve-load", metavar="PATH", help="default: next to shoal's build tree")
    p.add_argument("--libtorch-loop", metavar="PATH", help="serve_libtorch_loop (same default)")
    p.add_argument("--python", default=c.DEFAULT_PYTHON,
                   help="the Python with torch and FastAPI (default /usr/bin/python3)")
    p.add_argument("--models", default="identity,lstm,mlp")
    p.add_argument("--servers", default="fastapi,shoal,shoal_unbatched")
    p.add_argument("--concurrency", default="1,8,32,64,128", help="closed-loop connections")
    p.add_argument("--duration", type=float, default=5.0, help="seconds measured per run")
    p.add_argument("--warmup", type=float, default=1.0, help="seconds before each run")
    p.add_argument("--drain", type=float, default=5.0)
    p.add_argument("--open-fraction", type=float, default=0.7)
    p.add_argument("--open-connections", type=int, default=128)
    p.add_argument("--reps", type=int, default=1, help="rounds of every server (medians)")
    p.add_argument("--max-batch-size", type=int, default=128)
    p.add_argument("--batch-delay-us", type=int, default=0)
    p.add_argument("--baseline-workers", type=int, default=1)
    p.add_argument("--libtorch-duration", type=float, default=3.0)
    p.add_argument("--serve-floor", metavar="PATH", help="serve_floor (same default)")
    p.add_argument("--floor-concurrency", type=int, default=64,
                   help="connections of the floor's closed loop (0: no floor)")
    p.add_argument("--server-cpu", type=int, default=0)
    p.add_argument("--load-cpu", type=int, default=1)
    p.add_argument("--keep", action="store_true", help="keep the temporary repository and logs")
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
    args.concurrency = [int(x) for x in args.concurrency.split(",") if x]
    for m in args.models:
        if m not in MODELS:
            p.error(f"unknown model {m}; known: {', '.join(MODELS)}")
    for s in args.servers:
        if s not in ("fastapi", "shoal", "shoal_unbatched"):
            p.error(f"unknown server {s}")
    return args


def main(argv=None):
    args = parse_args(argv)
    result = {"benchmark": "serving", "machine": c.machine_info(), "models": {}}
    allowed = os.sched_getaffinity(0)
    notes = []
    for attr in ("server_cpu", "load_cpu"):
        if getattr(args, attr) not in allowed:
            notes.append(f"cpu {getattr(args, attr)} is not available ({attr}); not pinned")
            setattr(args, attr, None)
    result["settings"] = {k: getattr(args, k) for k in (
        "models", "servers", "concurrency", "duration", "warmup", "open_fraction",
        "open_connections", "reps", "max_batch_size", "batch_delay_us", "baseline_workers",
        "libtorch_duration", "floor_concurrency", "server_cpu", "load_cpu")}
    result["settings"]["openblas_coretype"] = c.same_openblas_kernels(args.openblas_coretype)
    result["settings"]["aten_cpu_capability"] = c.same_aten_kernels(args.aten_cpu_capability)
    cores = 1  # every server is pinned to one core; figures per core divide by this

    shoal, shoal_err = c.find_shoal(args.shoal)
    serve_load, err = find_build_tool(args.serve_load, "serve_load", shoal)
    if serve_load is None:
        result["error"] = err
        c.emit(result)
        return 0
    loop_tool, loop_err = find_build_tool(args.libtorch_loop, "serve_libtorch_loop", shoal)
    floor_tool, floor_err = find_build_tool(args.serve_floor, "serve_floor", shoal)
    if shoal and not shoal_err:
        shoal_err = shoal_supports_serve(shoal)
    result["shoal_binary"] = shoal

    with c.temp_dir("shoal-serving-bench-", keep=args.keep) as tmp:
        c.log(f"serving_bench: exporting {', '.join(args.models)} to {tmp}")
        repo_plain = tmp / "repo-unbatched"
        err = write_repository(repo_plain, args.models, args.python, False, 0, 0)
        if err:
            result["error"] = err
            c.emit(result)
            return 0
        repo_batched = tmp / "repo-batched"
        write_repository(repo_batched, args.models, args.python, True, args.max_batch_size,
                         args.batch_delay_us, exported=repo_plain)
        bodies = {}
        for m in args.models:
            bodies[m] = tmp / f"{m}.json"
            bodies[m].write_bytes(request_body(m))
            result["models"][m] = {"request_body_bytes": bodies[m].stat().st_size}

        def make(name):
            if name == "fastapi":
                return Server(name, [args.python, str(BASELINE), "--model-repository",
                                     str(repo_plain), "--port", "0", "--workers",
                                     str(args.baseline_workers)], args.server_cpu, tmp)
            if shoal_err:
                return shoal_err
            repo = repo_batched if name == "shoal" else repo_plain
            return Server(name, [shoal, "serve", "--model-repository", str(repo),
                                 "--http-port", "0", "--grpc-port", "0"],
                          args.server_cpu, tmp)

        rounds = []
        expected = {}  # the baseline's first answer per model, to compare the others with
        replies = {}  # an answer's bytes per model, for the floor server
        anchor_rounds = []  # per round: {model: {"libtorch": {...}, "floor": {...}}}

        def anchors(m, results):
            """The bare loop (batch 1 and every mean batch size shoal reached in this round)
            and the floor, for model m, right after its servers."""
            out = anchor_rounds[-1].setdefault(m, {})
            if loop_tool is None:
                out["libtorch"] = {"error": loop_err}
            else:
                sizes = {1}
                for f in ((results.get("shoal") or {}).get(m) or {}).get("closed", {}).values():
                    if isinstance(f, dict) and f.get("mean_batch_size"):
                        sizes.add(max(1, round(f["mean_batch_size"])))
                c.log(f"  libtorch loop {m} at batch sizes {sorted(sizes)}")
                out["libtorch"] = libtorch_loop(loop_tool, repo_plain / m / "1" / "model.pt",
                                                m, sorted(sizes), args)
            if args.floor_concurrency <= 0:
                return
            if floor_tool is None:
                out["floor"] = {"error": floor_err}
            elif m not in replies:
                out["floor"] = {"error": "no server answered this model, so there is no reply"}
            else:
                out["floor"] = measure_floor(floor_tool, m, bodies[m], replies[m], serve_load,
                                             args, tmp)
        started, failed = [], {}
        try:
            for name in args.servers:
                server = make(name)
                if isinstance(server, str):
                    failed[name] = {"error": server}
                    continue
                c.log(f"serving_bench: starting {name}")
                err = server.start()
                if err:
                    failed[name] = {"error": f"{name} did not start: {err}"}
                    c.log(f"  {failed[name]['error']}")
                    server.stop()
                    continue
                started.append(server)
            order = [s.name for s in started]
            for rep in range(args.reps):
                c.log(f"serving_bench: round {rep + 1}/{args.reps}, order {', '.join(order)}")
                this_round = dict(failed)
                anchor_rounds.append({})
                this_round.update(measure_round(started, args.models, bodies, expected,
                                                serve_load, args, order, replies, anchors))
                rounds.append(this_round)
                order = order[1:] + order[:1]  # the next round starts with another server
        finally:
            for server in started:
                server.stop()
        merged = merge_rounds(rounds)
        for name in args.servers:
            if "error" in merged.get(name, {}):
                result[name] = {"error": merged[name]["error"]}

        libtorch = {m: merge_libtorch([r.get(m, {}).get("libtorch") for r in anchor_rounds])
                    for m in args.models}
        floors = {m: merge_floors([r.get(m, {}).get("floor") for r in anchor_rounds])
                  for m in args.models}
        floors = {m: f for m, f in floors.items() if f is not None}

        summary, reachable_summary = {}, {}
        for m in args.models:
            servers = {n: (merged.get(n, {}) if "error" in merged.get(n, {})
                           else merged.get(n, {}).get(m)) for n in args.servers}
            servers = {n: f for n, f in servers.items() if f is not None}
            ratios, targets, reachable = derive(
                m, {n: ({"error": merged[n]["error"]} if "error" in merged.get(n, {})
                        else {m: servers[n]}) for n in servers}, libtorch[m], cores,
                paired_ratios(rounds, "shoal", "shoal_unbatched", m), floors.get(m))
            entry = result["models"][m]
            entry["servers"] = servers
            entry["libtorch_loop"] = libtorch[m]
            if m in floors:
                entry["floor"] = floors[m]
            entry["ratios"] = ratios
            entry["targets"] = targets
            entry["reachable_here"] = reachable
            summary[m] = targets
            reachable_summary[m] = reachable
        result["targets"] = summary
        result["reachable_here"] = reachable_summary
        if notes:
            result["notes"] = notes
    c.emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
