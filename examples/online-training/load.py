#!/usr/bin/python3
"""Load generator of the online-training example: sends inference requests to `shoal serve`
throughout, and says how many failed and which model versions answered.

    python3 load.py [--url http://127.0.0.1:8000] [--model online] [--rate 100] [--duration 40]

Waits (up to --wait seconds) for the model's first version to be ready, then sends --rate
requests/s in all over --connections keep-alive connections (a batch-1 request of 16 random
features each) until --duration seconds have passed, or until SIGINT / SIGTERM, saying on
stderr when a version answers for the first time (`load: version 3 answering`). Every answer
other than a 200 whose body names a model_version is a failure. At the end one line on stdout:

    load: 3004 requests, 0 failed, 8 versions seen (1..8), 28 switches, 0 went back, 99.8 req/s

`switches`: how often a connection's next answer came from another version than its last
(every connection counts its own: 4 connections see 7 new versions as 28 switches);
`went back`: how often that other version was an older one (never, under the server's default
`version_policy: latest`). With --json the line is a JSON object instead (also listing the
first failures). Exit status 0 after a run (whatever the server answered), 1 when the model
never became ready, 2 for bad arguments. Use shoal's `bench/serve_load` for higher rates.
"""

import argparse
import http.client
import json
import random
import signal
import sys
import threading
import time
import urllib.parse

FEATURES = 16


class Tally:
    def __init__(self):
        self.lock = threading.Lock()
        self.requests = self.failed = self.switches = self.went_back = 0
        self.versions = {}  # version -> answers
        self.failures = []  # the first few, for the report

    def answer(self, version, previous):
        with self.lock:
            self.requests += 1
            if version not in self.versions:
                print(f"load: version {version} answering", file=sys.stderr, flush=True)
            self.versions[version] = self.versions.get(version, 0) + 1
            if previous is not None and version != previous:
                self.switches += 1
                if int(version) < int(previous):
                    self.went_back += 1

    def failure(self, why):
        with self.lock:
            self.requests += 1
            self.failed += 1
            if len(self.failures) < 5:
                self.failures.append(why)


def request_body(rng):
    return json.dumps({"inputs": [{"name": "x", "shape": [1, FEATURES], "datatype": "FP32",
                                   "data": [round(rng.gauss(0, 1), 4) for _ in range(FEATURES)]}]})


def infer(conn, path, body):
    """(status, model_version or None, detail)."""
    conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    data = response.read()
    if response.status != 200:
        return response.status, None, data[:200].decode(errors="replace")
    try:
        return 200, str(json.loads(data)["model_version"]), ""
    except (ValueError, KeyError) as e:
        return 200, None, f"no model_version in the answer: {e}"


def wait_ready(host, port, model, timeout, stop):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not stop.is_set():
        try:
            conn = http.client.HTTPConnection(host, port, timeout=5)
            conn.request("GET", f"/v2/models/{model}/ready")
            status = conn.getresponse().status
            conn.close()
            if status == 200:
                return True
        except OSError:
            pass
        time.sleep(0.2)
    return False


def connection_loop(host, port, path, interval, deadline, stop, tally, seed):
    rng = random.Random(seed)
    conn, previous = None, None
    next_send = time.monotonic()
    while not stop.is_set() and (deadline is None or time.monotonic() < deadline):
        if interval:
            delay = next_send - time.monotonic()
            if delay > 0:
                stop.wait(delay)
                if stop.is_set():
                    break
            next_send += interval
        try:
            if conn is None:
                conn = http.client.HTTPConnection(host, port, timeout=30)
            status, version, detail = infer(conn, path, request_body(rng))
        except (OSError, http.client.HTTPException) as e:
            tally.failure(f"{type(e).__name__}: {e}")
            if conn is not None:
                conn.close()
            conn = None
            continue
        if version is None:
            tally.failure(f"HTTP {status}: {detail}")
            continue
        tally.answer(version, previous)
        previous = version
    if conn is not None:
        conn.close()


def summary_line(tally, seconds):
    versions = sorted(tally.versions, key=int)
    span = f"{versions[0]}..{versions[-1]}" if versions else "none"
    return (f"load: {tally.requests} requests, {tally.failed} failed, {len(versions)} versions "
            f"seen ({span}), {tally.switches} switches, {tally.went_back} went back, "
            f"{tally.requests / seconds if seconds else 0:.1f} req/s")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the server's HTTP address")
    parser.add_argument("--model", default="online")
    parser.add_argument("--rate", type=float, default=100,
                        help="requests/s in all (0: as fast as the connections go)")
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--duration", type=float, default=0,
                        help="seconds of load once the model is ready (0: until SIGINT/SIGTERM)")
    parser.add_argument("--wait", type=float, default=120,
                        help="seconds to wait for the model's first version")
    parser.add_argument("--json", action="store_true", help="the summary as a JSON object")
    args = parser.parse_args()
    url = urllib.parse.urlsplit(args.url)
    if url.scheme != "http" or not url.hostname or args.connections < 1 or args.rate < 0 \
            or args.duration < 0:
        print("load.py: --url must be http://HOST[:PORT], --connections >= 1, --rate >= 0, "
              "--duration >= 0", file=sys.stderr)
        return 2
    host, port = url.hostname, url.port or 80

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    if not wait_ready(host, port, args.model, args.wait, stop):
        print(f"load.py: model '{args.model}' not ready at {args.url} after {args.wait:g} s "
              "(is the trainer publishing, and shoal serve following its repository?)",
              file=sys.stderr)
        return 1
    print(f"load: model '{args.model}' ready; sending {args.rate:g} requests/s"
          if args.rate else f"load: model '{args.model}' ready; closed loop", file=sys.stderr,
          flush=True)

    tally = Tally()
    interval = args.connections / args.rate if args.rate else 0
    start = time.monotonic()
    deadline = start + args.duration if args.duration else None
    path = f"/v2/models/{urllib.parse.quote(args.model)}/infer"
    threads = [threading.Thread(target=connection_loop, daemon=True,
                                args=(host, port, path, interval, deadline, stop, tally, i))
               for i in range(args.connections)]
    for t in threads:
        t.start()
    # The main thread waits on the event so that the signal handlers run promptly.
    while any(t.is_alive() for t in threads):
        stop.wait(0.2)
    for t in threads:
        t.join()
    seconds = time.monotonic() - start
    if args.json:
        print(json.dumps({"requests": tally.requests, "failed": tally.failed,
                          "versions": {v: tally.versions[v] for v in sorted(tally.versions, key=int)},
                          "switches": tally.switches, "went_back": tally.went_back,
                          "seconds": round(seconds, 2), "failures": tally.failures}), flush=True)
    else:
        print(summary_line(tally, seconds), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
