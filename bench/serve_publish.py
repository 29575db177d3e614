#!/usr/bin/env python3
"""Publishing under load (issue 27): `shoal serve` follows a model repository while
shoal.publish_model writes new versions into it and a steady load runs against the model.

    python3 bench/serve_publish.py [--shoal PATH] [--publications 200] [--measured 100]
        [--rate 200] [--poll-ms 1000] [--settle-ms 2000] [--defaults-publications 0]
        [--also POLL_MS:SETTLE_MS:N ...]

The targets: 0 failed requests across `--measured` (100) publications; publication -> first
response from the new version, p99 <= 1 s; the server's RSS after `--publications` (200)
publications within +5 % of its RSS after warm-up.

How it measures, per server configuration (`measured`: --poll-ms / --settle-ms, by default the
server's own defaults, the figures for the targets; `defaults`: the server started without the
two flags, --defaults-publications of them (default 0: skipped, as `measured` already is that);
--also adds others):

- the load: bench/serve_load in an open loop (--rate requests/s over 8 connections) in
  back-to-back 5 s runs from warm-up to the end; every non-2xx answer, connection failure or
  timeout counts as a failed request.
- the probe: one keep-alive connection in a thread of the driver, sending the next request as
  soon as the last was answered and noting when each answer with a new model_version arrived;
  its failures count too, from version 1's first answer on.
  Publication latency = the first probe answer from version v - the moment publish_model(v)
  returned. Its resolution is one probe round trip (probe_round_trip_ms in the output). The
  next publication starts once the probe has seen the last one (and --gap-s later), so every
  version is seen on its own; --gap-s plus a random pause of up to --jitter-s (1 s), so that
  the publications fall at every phase of the server's poll interval.
- RSS (/proc/PID/status VmRSS, with RssAnon and RssFile) of the server after warm-up (the
  first version serving, --warmup-publications publications, --warmup-s of load), after
  `--measured` and after `--publications` publications. The A/A figure: the RSS change over
  --warmup-s more seconds of the same load with no publication, right after warm-up.
  Latency's repeat figure: the p99 of publications 1..measured next to that of the rest.

The published model is an MLP (16 -> --hidden -> --hidden -> 4; 4.1 MiB of parameters by
default, so that a version kept in memory after its unload would show: 200 of them would be
800 MiB), max_batch_size 32 and a warmup of 2 runs, as examples/online-training publishes,
with new weights each time; SHOAL_MODEL_KEEP=3.
One JSON object on stdout; progress on stderr. Nothing asserts: targets are reported as met or
not, with the figures.
"""

import argparse
import contextlib
import http.client
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as c  # noqa: E402
from serving_bench import find_build_tool  # noqa: E402

sys.path.insert(0, str(c.SDK_PYTHON))

MODEL = "published"
FEATURES = 16
TARGET_FAILED = 0
TARGET_LATENCY_P99_MS = 1000.0
TARGET_RSS_GROWTH = 0.05
LOAD_SEGMENT_S = 5
LOAD_CONNECTIONS = 8


def rss_kib(pid):
    """{"VmRSS": KiB, "RssAnon": KiB, "RssFile": KiB} of pid, or None."""
    out = {}
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key = line.split(":", 1)[0]
            if key in ("VmRSS", "RssAnon", "RssFile"):
                out[key] = int(line.split()[1])
        return out
    return None


def mib(kib):
    return None if kib is None else round(kib / 1024.0, 1)


def rss_mib(pid):
    r = rss_kib(pid)
    return None if r is None else {k: mib(v) for k, v in r.items()}


class Publisher:
    """publish_model of a fresh MLP into the repository, in this process."""

    def __init__(self, repository, hidden):
        import torch
        import shoal
        self.torch, self.shoal, self.repository = torch, shoal, repository
        torch.set_num_threads(1)

        class Mlp(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.first = torch.nn.Linear(FEATURES, hidden)
                self.second = torch.nn.Linear(hidden, hidden)
                self.out = torch.nn.Linear(hidden, 4)

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return self.out(torch.relu(self.second(torch.relu(self.first(x)))))
        self.make = Mlp
        self.parameter_bytes = sum(p.numel() * 4 for p in Mlp().parameters())
        self.config = {"max_batch_size": 32, "warmup": [
            {"count": 2, "inputs": {"x": {"dims": [1, FEATURES], "fill": "random"}}}]}

    def publish(self, seed):
        self.torch.manual_seed(seed)
        version = self.shoal.publish_model(self.make(), MODEL, repository=str(self.repository),
                                           example_inputs=self.torch.zeros(1, FEATURES),
                                           config=self.config)
        return version, time.monotonic()


class Probe:
    """One connection, closed loop: when each model_version was first answered."""

    def __init__(self, port):
        self.port = port
        self.first_seen = {}  # version -> monotonic time of its first answer
        self.round_trips = []
        self.failures = []
        self.answers = 0
        self.went_back = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.body = json.dumps({"inputs": [{"name": "x", "shape": [1, FEATURES],
                                            "datatype": "FP32", "data": [0.5] * FEATURES}]})

    def run(self):
        conn, newest = None, 0
        while not self.stop.is_set():
            t0 = time.monotonic()
            try:
                if conn is None:
                    conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
                conn.request("POST", f"/v2/models/{MODEL}/infer", body=self.body,
                             headers={"Content-Type": "application/json"})
                response = conn.getresponse()
                data = response.read()
                t1 = time.monotonic()
                if response.status != 200:
                    # Before version 1 first answers the server is still loading it (503):
                    # start-up, not a publication's doing.
                    if self.first_seen:
                        self.failures.append(f"HTTP {response.status}: {data[:120]!r}")
                    else:
                        time.sleep(0.01)
                    continue
                version = int(json.loads(data)["model_version"])
            except (OSError, http.client.HTTPException, ValueError, KeyError) as e:
                if self.first_seen:
                    self.failures.append(f"{type(e).__name__}: {e}")
                if conn is not None:
                    conn.close()
                conn = None
                time.sleep(0.01)
                continue
            self.answers += 1
            if len(self.round_trips) < 100_000:
                self.round_trips.append((t1 - t0) * 1000.0)
            self.first_seen.setdefault(version, t1)
            if version < newest:
                self.went_back += 1
            newest = max(newest, version)

    def wait_for(self, version, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if version in self.first_seen:
                return self.first_seen[version]
            time.sleep(0.002)
        return None


class SteadyLoad:
    """serve_load --open RATE in back-to-back LOAD_SEGMENT_S runs until stopped."""

    def __init__(self, serve_load, url, body_file, rate):
        self.argv = [serve_load, "--url", url, "--body", str(body_file), "--open", str(rate),
                     "--connections", str(LOAD_CONNECTIONS), "--warmup", "0",
                     "--duration", str(LOAD_SEGMENT_S), "--drain", "5"]
        self.segments = []  # (start s, end s, requests, errors dict or error string)
        self.stop = threading.Event()
        self.t0 = time.monotonic()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        while not self.stop.is_set():
            start = time.monotonic() - self.t0
            r = c.run_timed(self.argv, timeout=LOAD_SEGMENT_S + 60)
            end = time.monotonic() - self.t0
            if not r.ok:
                self.segments.append((start, end, 0, f"serve_load: {r.describe()}"))
                time.sleep(0.5)
                continue
            try:
                out = json.loads(r.stdout)
            except ValueError:
                self.segments.append((start, end, 0, "serve_load printed no JSON"))
                continue
            self.segments.append((start, end, out["requests"],
                                  {"total": out["errors"], **out.get("error_kinds", {})}))

    def totals(self, since=0.0):
        requests = failed = 0
        bad = []
        for start, end, n, errors in self.segments:
            if start < since:
                continue
            requests += n
            count = errors if isinstance(errors, str) else errors.get("total", 0)
            if isinstance(errors, str):
                bad.append({"at_s": round(start, 1), "error": errors})
            elif count:
                failed += count
                bad.append({"at_s": round(start, 1), "errors": errors})
        return requests, failed, bad


def start_server(shoal, repository, log_dir, name, poll_ms, settle_ms):
    argv = [shoal, "serve", "--model-repository", str(repository), "--http-port", "0",
            "--grpc-port", "0"]
    if poll_ms is not None:
        argv += ["--repository-poll-ms", str(poll_ms)]
    if settle_ms is not None:
        argv += ["--repository-settle-ms", str(settle_ms)]
    out = open(log_dir / f"{name}.out", "wb")
    proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    out.close()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        text = (log_dir / f"{name}.out").read_text(errors="replace")
        if "listening on http://" in text:
            port = int(text.split("listening on http://", 1)[1].split()[0].rsplit(":", 1)[1])
            return proc, port, None
        if proc.poll() is not None:
            return None, None, f"shoal serve exited with {proc.returncode}: {text[-300:]}"
        time.sleep(0.05)
    stop_server(proc)
    return None, None, "shoal serve did not listen within 120 s"


def stop_server(proc):
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def latency_summary(latencies_ms):
    return c.summary_ms(latencies_ms)


def run_configuration(name, args, shoal, serve_load, poll_ms, settle_ms, publications, measured):
    log(f"[{name}] poll {poll_ms if poll_ms is not None else 'default'} ms, settle "
        f"{settle_ms if settle_ms is not None else 'default'} ms, {publications} publications")
    result = {"poll_ms": poll_ms, "settle_ms": settle_ms, "publications": publications}
    with c.temp_dir(f"shoal-publish-{name}-", keep=args.keep) as tmp:
        repository = tmp / "models"
        repository.mkdir()
        os.environ["SHOAL_MODEL_KEEP"] = "3"
        publisher = Publisher(repository, args.hidden)
        result["model_parameter_mib"] = round(publisher.parameter_bytes / 2**20, 2)
        publisher.publish(seed=0)  # version 1, served from the start
        proc, port, error = start_server(shoal, repository, tmp, name, poll_ms, settle_ms)
        if error:
            result["error"] = error
            return result
        body = tmp / "request.json"
        body.write_text(json.dumps({"inputs": [{"name": "x", "shape": [1, FEATURES],
                                                "datatype": "FP32", "data": [0.25] * FEATURES}]}))
        probe = Probe(port)
        load = SteadyLoad(serve_load, f"http://127.0.0.1:{port}/v2/models/{MODEL}/infer", body,
                          args.rate)
        try:
            probe.thread.start()
            if probe.wait_for(1, 120) is None:
                result["error"] = "version 1 never answered: " + "; ".join(probe.failures[:3])
                return result
            load.thread.start()
            latencies, missing = [], []
            seed = 1
            pause_rng = random.Random(0)

            def publish_and_time(count):
                nonlocal seed
                out = []
                for _ in range(count):
                    version, returned = publisher.publish(seed)
                    seed += 1
                    seen = probe.wait_for(version, args.version_timeout_s)
                    if seen is None:
                        missing.append(version)
                    else:
                        out.append((seen - returned) * 1000.0)
                    # A random pause: publications at a fixed rhythm would lock onto the
                    # server's poll phase and always wait the same part of the interval.
                    time.sleep(args.gap_s + pause_rng.uniform(0, args.jitter_s))
                return out

            publish_and_time(args.warmup_publications)
            time.sleep(args.warmup_s)
            rss_warm = rss_mib(proc.pid)
            time.sleep(args.warmup_s)
            rss_aa = rss_mib(proc.pid)  # the same load, no publication: the A/A figure
            load_mark = time.monotonic() - load.t0
            log(f"[{name}] warm: RSS {rss_warm}, {args.warmup_s:g} s later {rss_aa}")
            first = publish_and_time(measured)
            rss_measured = rss_mib(proc.pid)
            log(f"[{name}] {measured} publications: p99 "
                f"{c.p99(first) if first else None} ms, RSS {rss_measured}")
            rest = publish_and_time(max(0, publications - measured))
            rss_end = rss_mib(proc.pid)
            log(f"[{name}] {publications} publications: RSS {rss_end}")
        finally:
            load.stop.set()
            load.thread.join(timeout=LOAD_SEGMENT_S + 90)
            probe.stop.set()
            probe.thread.join(timeout=60)
            rss_final = rss_mib(proc.pid)
            stop_server(proc)
        requests, failed, bad = load.totals()
        requests_measured, failed_measured, _ = load.totals(since=load_mark)
        latencies = first + rest
        result.update({
            "load": {"rate_rps": args.rate, "requests": requests, "failed": failed,
                     "requests_during_publications": requests_measured,
                     "failed_during_publications": failed_measured, "failed_segments": bad[:10]},
            "probe": {"answers": probe.answers, "failed": len(probe.failures),
                      "failures": probe.failures[:5], "went_back": probe.went_back,
                      "round_trip_ms": latency_summary(probe.round_trips)},
            "publication_to_first_response": {
                "first_measured": latency_summary(first),
                "rest_repeat": latency_summary(rest),
                "all": latency_summary(latencies),
                "versions_never_seen": missing},
            "rss_mib": {"after_warmup": rss_warm, "aa_no_publication": rss_aa,
                        f"after_{measured}": rss_measured, f"after_{publications}": rss_end,
                        "at_stop": rss_final},
        })
        if rss_warm and rss_end:
            result["rss_growth"] = round(rss_end["VmRSS"] / rss_warm["VmRSS"] - 1.0, 4)
            result["rss_growth_aa"] = round(rss_aa["VmRSS"] / rss_warm["VmRSS"] - 1.0, 4)
    return result


def log(msg):
    c.log(msg)


def also_config(text):
    try:
        poll_ms, settle_ms, n = (int(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected POLL_MS:SETTLE_MS:N, got {text!r}") from None
    if poll_ms < 1 or settle_ms < 0 or n < 1:
        raise argparse.ArgumentTypeError(f"POLL_MS >= 1, SETTLE_MS >= 0, N >= 1: {text!r}")
    return poll_ms, settle_ms, n


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    c.add_shoal_arg(p)
    p.add_argument("--serve-load", metavar="PATH", help="default: next to shoal's build")
    p.add_argument("--publications", type=int, default=200)
    p.add_argument("--measured", type=int, default=100,
                   help="publications the failure and latency targets are judged on")
    p.add_argument("--warmup-publications", type=int, default=10)
    p.add_argument("--warmup-s", type=float, default=5.0)
    p.add_argument("--rate", type=float, default=200.0, help="steady load, requests/s")
    p.add_argument("--hidden", type=int, default=1024,
                   help="width of the published MLP's two hidden layers (1024: 4.1 MiB of "
                        "parameters, so that a version left in memory would show in the RSS)")
    p.add_argument("--poll-ms", type=int, default=1000,
                   help="the `measured` server's poll (default: shoal serve's)")
    p.add_argument("--settle-ms", type=int, default=2000,
                   help="the `measured` server's settle time (default: shoal serve's)")
    p.add_argument("--defaults-publications", type=int, default=0,
                   help="publications against a server with its default poll and settle "
                        "(0: skip)")
    p.add_argument("--also", metavar="POLL_MS:SETTLE_MS:N", type=also_config, action="append",
                   default=[], help="one more server configuration, N publications "
                                    "(repeatable), e.g. 1000:0:20")
    p.add_argument("--gap-s", type=float, default=0.2,
                   help="pause after a version was seen, before the next publication")
    p.add_argument("--jitter-s", type=float, default=1.0,
                   help="plus a uniformly random pause of up to this much (covers the default "
                        "1 s poll interval, so that publications sample every poll phase)")
    p.add_argument("--version-timeout-s", type=float, default=30.0)
    p.add_argument("--keep", action="store_true", help="keep the temporary directories")
    args = p.parse_args(argv)
    if args.hidden < 1 or args.publications < 1 or not 1 <= args.measured <= args.publications \
            or args.rate <= 0 or args.warmup_publications < 0 or args.warmup_s < 0 \
            or args.gap_s < 0 or args.jitter_s < 0:
        p.error("--hidden, --publications and --rate must be > 0, --measured from 1 to "
                "--publications, --warmup-publications, --warmup-s, --gap-s and --jitter-s >= 0")
    return args


def main(argv=None):
    args = parse_args(argv)
    out = {"benchmark": "serve_publish", "machine": c.machine_info(),
           "targets": {"failed_requests": TARGET_FAILED,
                       "publication_to_first_response_p99_ms": TARGET_LATENCY_P99_MS,
                       "rss_growth_max": TARGET_RSS_GROWTH}}
    shoal, error = c.find_shoal(args.shoal)
    serve_load, error2 = (None, None) if error else find_build_tool(args.serve_load,
                                                                    "serve_load", shoal)
    if error or error2:
        out["error"] = error or error2
        c.emit(out)
        return 0
    try:
        import torch  # noqa: F401
    except ImportError:
        out["error"] = "this driver publishes with torch: run it with Debian's /usr/bin/python3"
        c.emit(out)
        return 0
    configs = {}
    configs["measured"] = run_configuration("measured", args, shoal, serve_load, args.poll_ms,
                                            args.settle_ms, args.publications, args.measured)
    if args.defaults_publications > 0:
        n = args.defaults_publications
        configs["defaults"] = run_configuration("defaults", args, shoal, serve_load, None, None,
                                                n, n)
    for poll_ms, settle_ms, n in args.also:
        configs[f"poll{poll_ms}_settle{settle_ms}"] = run_configuration(
            f"poll{poll_ms}_settle{settle_ms}", args, shoal, serve_load, poll_ms, settle_ms, n, n)
    out["configurations"] = configs
    fast = configs["measured"]
    if "error" not in fast:
        lat = fast["publication_to_first_response"]["first_measured"]
        out["met"] = {
            "failed_requests": fast["load"]["failed_during_publications"]
                               + fast["probe"]["failed"] == TARGET_FAILED,
            "publication_to_first_response_p99": bool(lat) and lat["p99_ms"]
                                                 <= TARGET_LATENCY_P99_MS,
            "rss_growth": fast.get("rss_growth") is not None
                          and fast["rss_growth"] <= TARGET_RSS_GROWTH,
        }
    out["machine"]["loadavg_1m_end"] = round(os.getloadavg()[0], 2)
    c.emit(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
