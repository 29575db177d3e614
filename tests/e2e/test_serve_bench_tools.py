"""The serving benchmark's tools (bench/serving_bench.py): the load generator serve_load against
a tiny HTTP server of this file, and the FastAPI baseline against the models run directly in
torch. Counts and answers only; no timing is asserted.

serve_load is found next to the shoal binary's build tree (SHOAL_BIN is build/src/cli/shoal,
serve_load is build/bench/serve_load); a missing one fails the tests.
"""

import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import shoal_e2e as e2e

BASELINE = e2e.REPO_ROOT / "bench" / "serving" / "fastapi_baseline.py"
EXAMPLES = e2e.REPO_ROOT / "examples" / "serving"


def bench_tool(name):
    """A benchmark binary of the build tree SHOAL_BIN is in (build/bench/NAME); missing fails."""
    path = Path(e2e.SHOAL_BIN).resolve().parents[2] / "bench" / name
    assert path.is_file() and os.access(path, os.X_OK), (
        f"no {name} at {path} (next to SHOAL_BIN={e2e.SHOAL_BIN}); build it: "
        f"ninja -C build {name}")
    return str(path)


@pytest.fixture(scope="module")
def serve_load():
    return bench_tool("serve_load")


class CountingServer:
    """An HTTP/1.1 keep-alive server on a free loopback port, in threads of this process.
    status_for(n) gives the status of the n-th request (from 1); chunked_for(n) whether that
    answer uses chunked transfer coding; close_for(n) whether the server closes the connection
    after it. Counts requests and answers by status, and keeps the bodies it saw."""

    def __init__(self, status_for=lambda n: 200, chunked_for=lambda n: False,
                 close_for=lambda n: False):
        self.lock = threading.Lock()
        self.count = 0
        self.by_status = {}
        self.bodies = set()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with outer.lock:
                    outer.count += 1
                    n = outer.count
                    status = status_for(n)
                    outer.by_status[status] = outer.by_status.get(status, 0) + 1
                    outer.bodies.add(body)
                payload = json.dumps({"n": n}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                if close_for(n):
                    self.send_header("Connection", "close")
                    self.close_connection = True
                if chunked_for(n):
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    half = len(payload) // 2
                    for part in (payload[:half], payload[half:]):
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
                    self.wfile.write(b"0\r\n\r\n")
                else:
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path="/v2/models/m/infer"):
        return f"http://127.0.0.1:{self.port}{path}"

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def body_file(tmp_path):
    path = tmp_path / "body.json"
    path.write_bytes(b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}]}')
    return path


def run_load(serve_load, *args, timeout=60):
    proc = subprocess.run([serve_load, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)
    return proc


def run_load_json(serve_load, *args):
    proc = run_load(serve_load, *args)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_closed_loop_counts_every_request(serve_load, body_file):
    server = CountingServer()
    try:
        out = run_load_json(serve_load, "--url", server.url(), "--body", body_file,
                            "--closed", 3, "--duration", 1, "--warmup", 0)
    finally:
        server.stop()
    assert out["mode"] == "closed" and out["connections"] == 3
    assert out["requests"] > 0
    # With no warmup every request sent is counted, and the outstanding ones are drained.
    assert out["requests"] == server.count == out["ok"]
    assert out["errors"] == 0 and out["status_counts"] == {"200": server.count}
    assert out["latency_ms"]["count"] == out["requests"]
    assert 0 < out["latency_ms"]["p50"] <= out["latency_ms"]["p99"] <= out["latency_ms"]["max"]
    assert server.bodies == {body_file.read_bytes()}


def test_warmup_requests_are_sent_but_not_counted(serve_load, body_file):
    server = CountingServer()
    try:
        out = run_load_json(serve_load, "--url", server.url(), "--body", body_file,
                            "--closed", 1, "--duration", 0.5, "--warmup", 0.5)
    finally:
        server.stop()
    assert 0 < out["requests"] < server.count
    assert out["errors"] == 0


def test_non_2xx_answers_are_errors(serve_load, body_file):
    server = CountingServer(status_for=lambda n: 500)
    try:
        out = run_load_json(serve_load, "--url", server.url(), "--body", body_file,
                            "--closed", 2, "--duration", 0.5, "--warmup", 0)
    finally:
        server.stop()
    assert out["requests"] == server.count > 0
    assert out["ok"] == 0 and out["errors"] == out["requests"]
    assert out["error_kinds"] == {"status": out["requests"], "connection": 0, "timeout": 0}
    assert out["status_counts"] == {"500": out["requests"]}
    assert out["throughput_rps"] == 0


def test_mixed_answers_chunked_bodies_and_closed_connections(serve_load, body_file):
    # Every third answer is a 500, every other one chunked, every fifth closes the connection:
    # serve_load reconnects and counts exactly the server's 500s as errors.
    server = CountingServer(status_for=lambda n: 500 if n % 3 == 0 else 200,
                            chunked_for=lambda n: n % 2 == 0, close_for=lambda n: n % 5 == 0)
    try:
        out = run_load_json(serve_load, "--url", server.url(), "--body", body_file,
                            "--closed", 4, "--duration", 1, "--warmup", 0)
    finally:
        server.stop()
    assert out["requests"] == server.count > 10
    assert out["errors"] == out["error_kinds"]["status"] == server.by_status.get(500, 0)
    assert out["ok"] == server.by_status.get(200, 0)
    assert out["reconnects"] >= server.count // 5 - 4


def test_open_loop_sends_the_scheduled_requests(serve_load, body_file):
    server = CountingServer()
    try:
        out = run_load_json(serve_load, "--url", server.url(), "--body", body_file,
                            "--open", 200, "--duration", 1, "--warmup", 0,
                            "--connections", 4)
    finally:
        server.stop()
    assert out["mode"] == "open" and out["target_rps"] == 200
    # Requests i = 0..199 are scheduled at i / 200 s, all inside the 1 s window.
    assert out["requests"] == 200 == server.count
    assert out["ok"] == 200 and out["errors"] == 0
    assert out["latency_ms"]["count"] == 200


@pytest.mark.parametrize("args", [
    [],
    ["--body", "B"],  # no --url
    ["--url", "U", "--body", "B", "--closed", "1"],
    ["--url", "URL", "--body", "B"],  # neither mode
    ["--url", "URL", "--body", "B", "--closed", "2", "--open", "10"],
    ["--url", "URL", "--body", "B", "--closed", "0"],
    ["--url", "URL", "--body", "B", "--open", "-5"],
    ["--url", "URL", "--body", "B", "--closed", "1", "--duration", "x"],
    ["--url", "URL", "--body", "B", "--closed", "1", "--bogus", "1"],
    ["--url", "http://127.0.0.1:99999/p", "--body", "B", "--closed", "1"],
])
def test_bad_arguments_exit_2(serve_load, body_file, args):
    args = [str(body_file) if a == "B" else "http://127.0.0.1:1/p" if a == "URL" else a
            for a in args]
    proc = run_load(serve_load, *args)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "usage:" in proc.stderr
    assert proc.stdout == ""


def test_unreachable_server_exits_1_with_a_clear_message(serve_load, body_file):
    import socket
    with socket.socket() as s:  # a port that is bound but not listening: refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        proc = run_load(serve_load, "--url", f"http://127.0.0.1:{port}/x", "--body", body_file,
                        "--closed", 1, "--duration", 1)
    assert proc.returncode == 1
    assert f"cannot connect to 127.0.0.1:{port}" in proc.stderr
    assert proc.stdout == ""


def test_missing_body_file_exits_1(serve_load, tmp_path):
    proc = run_load(serve_load, "--url", "http://127.0.0.1:1/x", "--body", tmp_path / "none",
                    "--closed", 1)
    assert proc.returncode == 1 and "cannot read --body" in proc.stderr


# ------------------------------------------------------------------------------------------
# serve_floor: the server that only answers


@pytest.fixture(scope="module")
def serve_floor():
    return bench_tool("serve_floor")


class Floor:
    """serve_floor on a free loopback port, answering with `reply`."""

    def __init__(self, tool, tmp_path, reply):
        self.reply_file = tmp_path / "reply.json"
        self.reply_file.write_bytes(reply)
        self.proc = subprocess.Popen([tool, "--reply", str(self.reply_file), "--port", "0"],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        assert line.startswith("serve_floor: listening on http://127.0.0.1:"), (
            line, self.proc.stderr.read() if self.proc.poll() is not None else "")
        self.port = int(line.rsplit(":", 1)[1])

    def stop(self):
        self.proc.kill()
        self.proc.wait()


def read_answer(sock_file):
    """(status, headers, body) of one HTTP/1.1 answer read from a socket's file."""
    status = int(sock_file.readline().split()[1])
    headers = {}
    while (line := sock_file.readline().strip()):
        name, value = line.decode().split(":", 1)
        headers[name.strip().lower()] = value.strip()
    return status, headers, sock_file.read(int(headers["content-length"]))


def test_floor_answers_every_request_of_a_connection_with_its_reply(serve_floor, tmp_path):
    import socket
    reply = b'{"outputs": [{"name": "y", "data": [1.5]}]}'
    floor = Floor(serve_floor, tmp_path, reply)
    try:
        with socket.create_connection(("127.0.0.1", floor.port), timeout=10) as sock:
            post = (b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\n"
                    b"content-length: 5\r\n\r\nhello")
            get = b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n"
            # Two requests in one send (pipelined), then one split mid-header and mid-body.
            sock.sendall(post + get)
            f = sock.makefile("rb")
            for _ in range(2):
                status, headers, body = read_answer(f)
                assert (status, body) == (200, reply)
                assert headers["content-type"] == "application/json"
            sock.sendall(post[:20])
            time.sleep(0.1)
            sock.sendall(post[20:-2])
            # The header is whole but two bytes of the body are missing: no answer yet.
            sock.settimeout(0.3)
            with pytest.raises(socket.timeout):
                sock.recv(1, socket.MSG_PEEK)
            sock.settimeout(10)
            sock.sendall(post[-2:])
            assert read_answer(f)[2] == reply
    finally:
        floor.stop()


def test_floor_serves_a_closed_loop_without_errors(serve_floor, serve_load, body_file, tmp_path):
    floor = Floor(serve_floor, tmp_path, b'{"ok": true}')
    try:
        out = run_load_json(serve_load, "--url", f"http://127.0.0.1:{floor.port}/x", "--body",
                            body_file, "--closed", 4, "--duration", 0.5, "--warmup", 0)
    finally:
        floor.stop()
    assert out["requests"] > 0 and out["errors"] == 0 and out["ok"] == out["requests"]


@pytest.mark.parametrize("args,message", [
    ([], "--reply is required"),
    (["--reply"], "--reply needs a value"),
    (["--reply", "R", "--port", "70000"], "--port needs a number from 0 to 65535"),
    (["--reply", "R", "--host", "localhost"], "--host needs an IPv4 address"),
    (["--reply", "R", "--bogus", "1"], "unknown argument '--bogus'"),
])
def test_floor_bad_arguments_exit_2(serve_floor, tmp_path, args, message):
    reply = tmp_path / "r.json"
    reply.write_bytes(b"{}")
    proc = subprocess.run([serve_floor, *[str(reply) if a == "R" else a for a in args]],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert message in proc.stderr and "usage:" in proc.stderr
    assert proc.stdout == ""


@pytest.mark.parametrize("reply", ["none", "."])
def test_floor_unreadable_reply_exits_1(serve_floor, tmp_path, reply):
    # A missing file, and a directory (which opens, and would serve an empty reply).
    proc = subprocess.run([serve_floor, "--reply", str(tmp_path / reply)], capture_output=True,
                          text=True, timeout=30)
    assert proc.returncode == 1 and "cannot read the reply file" in proc.stderr, proc.stderr
    assert proc.stdout == ""


# ------------------------------------------------------------------------------------------
# The FastAPI baseline


def _torch():
    try:
        import torch  # noqa: F401
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        pytest.fail(f"the FastAPI baseline needs Debian's python3-torch, python3-fastapi, "
                    f"python3-uvicorn, python3-uvloop, python3-httptools ({e}); run ./setup.sh")
    import torch
    return torch


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    torch = _torch()
    repo = tmp_path_factory.mktemp("models")
    sys.path.insert(0, str(EXAMPLES))
    try:
        import lstm_classifier
    finally:
        sys.path.remove(str(EXAMPLES))
    lstm_classifier.export_repository(repo)
    (repo / "lstm" / "config.yaml").write_text(
        "inputs:\n  - {name: tokens, datatype: INT64, dims: [32]}\n"
        "outputs:\n  - {name: logits, datatype: FP32, dims: [10]}\n"
        "max_batch_size: 8\n")
    log = tmp_path_factory.mktemp("baseline-log")
    with open(log / "stdout", "wb") as out, open(log / "stderr", "wb") as err:
        proc = subprocess.Popen([e2e.PYTHON, str(BASELINE), "--model-repository", str(repo)],
                                stdout=out, stderr=err, start_new_session=True)
    try:
        def listening():
            assert proc.poll() is None, (
                f"fastapi_baseline exited {proc.returncode}: {(log / 'stderr').read_text()}")
            return "listening on" in (log / "stdout").read_text()
        e2e.wait_until(listening, 120, "fastapi_baseline to listen")
        url = (log / "stdout").read_text().split("listening on ")[1].split()[0]
        yield {"url": url, "repo": repo, "torch": torch}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def post(url, body: bytes):
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.mark.parametrize("model,name,datatype,shape", [
    ("lstm", "tokens", "INT64", [3, 32]),
    ("mlp", "x", "FP32", [2, 64]),
    ("identity", "x", "FP32", [2, 16]),
])
def test_baseline_answers_like_the_model_run_in_torch(baseline, model, name, datatype, shape):
    torch = baseline["torch"]
    gen = torch.Generator().manual_seed(7)
    if datatype == "INT64":
        tensor = torch.randint(0, 50_000, shape, generator=gen)
    else:
        tensor = torch.rand(shape, generator=gen)
    request = {"id": "r1", "inputs": [{"name": name, "shape": shape, "datatype": datatype,
                                       "data": tensor.reshape(-1).tolist()}]}
    status, answer = post(f"{baseline['url']}/v2/models/{model}/infer",
                          json.dumps(request).encode())
    assert status == 200, answer
    assert answer["model_name"] == model and answer["model_version"] == "1"
    assert answer["id"] == "r1"
    [out] = answer["outputs"]
    expected = torch.jit.load(str(baseline["repo"] / model / "1" / "model.pt"))(tensor)
    assert out["datatype"] == "FP32" and out["shape"] == list(expected.shape)
    if model == "lstm":
        assert out["name"] == "logits"  # named by config.yaml
    got = torch.tensor(out["data"], dtype=torch.float32).reshape(out["shape"])
    assert torch.allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_baseline_unknown_model_is_404(baseline):
    status, answer = post(f"{baseline['url']}/v2/models/nope/infer", b'{"inputs": []}')
    assert status == 404 and "unknown model 'nope'" in answer["error"]
    status, answer = post(f"{baseline['url']}/v2/models/mlp/versions/9/infer", b"{}")
    assert status == 404 and "no version '9'" in answer["error"]


def test_baseline_malformed_json_is_400(baseline):
    status, answer = post(f"{baseline['url']}/v2/models/mlp/infer", b'{"inputs": [')
    assert status == 400 and answer["error"].startswith("malformed JSON")


@pytest.mark.parametrize("inputs,message", [
    ([{"name": "y", "shape": [1, 64], "datatype": "FP32", "data": [0] * 64}], "has no input 'y'"),
    ([{"name": "x", "shape": [1, 64], "datatype": "FP32", "data": [0] * 3}], "needs 64 values"),
    ([{"name": "x", "shape": [1, 64], "datatype": "FP17", "data": [0] * 64}], "not supported"),
])
def test_baseline_bad_requests_are_400(baseline, inputs, message):
    status, answer = post(f"{baseline['url']}/v2/models/mlp/infer",
                          json.dumps({"inputs": inputs}).encode())
    assert status == 400 and message in answer["error"], answer


def test_baseline_declared_shape_is_checked(baseline):
    inputs = [{"name": "tokens", "shape": [1, 31], "datatype": "INT64", "data": [0] * 31}]
    status, answer = post(f"{baseline['url']}/v2/models/lstm/infer",
                          json.dumps({"inputs": inputs}).encode())
    assert status == 400 and "does not match" in answer["error"], answer


def test_baseline_metadata_and_health(baseline):
    with urllib.request.urlopen(f"{baseline['url']}/v2/health/ready", timeout=10) as resp:
        assert resp.status == 200
    with urllib.request.urlopen(f"{baseline['url']}/v2/models/lstm", timeout=10) as resp:
        meta = json.loads(resp.read())
    assert meta["name"] == "lstm" and meta["versions"] == ["1"]
    assert meta["inputs"] == [{"name": "tokens", "datatype": "INT64", "shape": [-1, 32]}]


def test_batched_over_unbatched_pairs_the_runs_of_one_round():
    """The batching target reads each round's ratio of two runs taken back to back, not the
    ratio of medians taken minutes apart; a round where either run failed is left out."""
    bench = _bench_module()

    def server(**rps):
        return {"m": {"closed": {n.lstrip("c"): ({"error": "x"} if v is None else
                                                 {"throughput_rps": v})
                                 for n, v in rps.items()}}}

    rounds = [
        {"shoal": server(c1=90, c8=200), "shoal_unbatched": server(c1=100, c8=100)},
        {"shoal": server(c1=120, c8=None), "shoal_unbatched": server(c1=100, c8=50)},
        {"shoal": {"error": "did not start"}, "shoal_unbatched": server(c1=1, c8=1)},
        {"shoal": server(c1=100, c8=300), "shoal_unbatched": server(c1=100, c8=100)},
    ]
    assert bench.paired_ratios(rounds, "shoal", "shoal_unbatched", "m") == {"1": 1.0, "8": 2.5}


def _bench_module():
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "serving_bench", e2e.REPO_ROOT / "bench" / "serving_bench.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_ceilings_add_the_floor_to_the_bare_loop_per_row():
    """A request costs the floor's CPU plus a row of the bare loop; whether that ceiling clears
    each throughput target at all is `reachable`."""
    bench = _bench_module()
    floor = {"closed": {"cpu_us_per_request": 5.0},
             "open": {"p50_ms": 0.1, "p99_ms": 1.5}}
    libtorch = {"1": {"inferences_per_s": 100_000.0}, "64": {"inferences_per_s": 20_000.0}}
    ratios, reachable = bench.ceilings("lstm", {"peak_rps": 15_000.0}, {"peak_rps": 2_000.0},
                                       libtorch, floor, 64)
    assert ratios["ceiling_rps"] == pytest.approx(1e6 / 55.0, abs=0.1)
    assert ratios["ceiling_over_libtorch"] == pytest.approx(50 / 55, abs=1e-4)
    assert ratios["ceiling_over_fastapi"] == pytest.approx(1e6 / 55 / 2000, abs=1e-4)
    assert ratios["shoal_over_ceiling"] == pytest.approx(15_000 * 55 / 1e6, abs=1e-4)
    assert ratios["floor_open_p99_over_p50"] == pytest.approx(15.0)
    assert reachable == {"saturated_at_least_90pct_of_libtorch": True,
                         "throughput_at_least_10x_baseline": False}
    # A slower floor puts 90 % of the bare loop out of reach; the MLP has no 10x target.
    ratios, reachable = bench.ceilings("mlp", {"peak_rps": 1.0}, {"peak_rps": 1.0}, libtorch,
                                       {"closed": {"cpu_us_per_request": 6.0}}, 64)
    assert reachable == {"saturated_at_least_90pct_of_libtorch": False}
    # No floor figure, or no bare loop at that batch size: nothing is claimed.
    assert bench.ceilings("lstm", None, None, libtorch, {"error": "x"}, 64) == ({}, {})
    assert bench.ceilings("lstm", None, None, libtorch, floor, 32) == ({}, {})


def test_derive_compares_the_server_and_its_model_time_with_the_bare_loop():
    """At shoal's peak: its requests/s against the bare loop at the batch size it ran at, and its
    model's own compute rate (from /stats) against the same anchor; with a floor, the ceiling."""
    bench = _bench_module()
    shoal = {"peak_rps": 15_000.0, "peak_concurrency": 64,
             "closed": {"64": {"throughput_rps": 15_000.0, "p50_ms": 4.0, "p99_ms": 6.0,
                               "errors": 0, "mean_batch_size": 60.4,
                               "compute_rows_per_s": 19_000.0}}}
    libtorch = {"1": {"inferences_per_s": 3_000.0}, "60": {"inferences_per_s": 20_000.0}}
    floor = {"closed": {"cpu_us_per_request": 5.0}}
    ratios, targets, reachable = bench.derive("lstm", {"shoal": {"lstm": shoal}}, libtorch, 1,
                                              floor=floor)
    assert ratios["saturated_libtorch_batch_size"] == 60
    assert ratios["saturated_shoal_over_libtorch"] == pytest.approx(0.75)
    assert ratios["compute_shoal_over_libtorch"] == pytest.approx(0.95)
    assert targets["saturated_at_least_90pct_of_libtorch"] is False
    assert ratios["ceiling_rps"] == pytest.approx(1e6 / 55.0, abs=0.1)
    assert reachable["saturated_at_least_90pct_of_libtorch"] is True
    # Without the baseline there is no 10x figure, met or reachable.
    assert targets["throughput_at_least_10x_baseline"] is None
    assert "throughput_at_least_10x_baseline" not in reachable


def test_anchors_from_another_phase_of_the_machine_are_not_read_as_targets():
    """A server above its ceiling, or above the bare loop at its batch size, was measured while
    the machine ran faster than during the anchors: neither target nor reachability is read."""
    bench = _bench_module()
    shoal = {"peak_rps": 21_000.0, "peak_concurrency": 64,
             "closed": {"64": {"throughput_rps": 21_000.0, "p50_ms": 4.0, "p99_ms": 6.0,
                               "errors": 0, "mean_batch_size": 61.4}}}
    libtorch = {"1": {"inferences_per_s": 3_000.0}, "60": {"inferences_per_s": 20_000.0}}
    ratios, targets, reachable = bench.derive("lstm", {"shoal": {"lstm": shoal}}, libtorch, 1,
                                              floor={"closed": {"cpu_us_per_request": 5.0}})
    assert ratios["saturated_libtorch_batch_size"] == 60  # the nearest size the loop ran
    assert ratios["saturated_consistent"] is False
    assert targets["saturated_at_least_90pct_of_libtorch"] is None
    assert ratios["ceiling_consistent"] is False
    assert reachable == {"saturated_at_least_90pct_of_libtorch": None}


def test_rounds_of_anchors_merge_by_medians():
    bench = _bench_module()
    merged = bench.merge_libtorch([{"1": {"inferences_per_s": 10.0}, "60": {"inferences_per_s": 1.0}},
                                   {"error": "x"},
                                   {"1": {"inferences_per_s": 30.0}, "58": {"inferences_per_s": 2.0}},
                                   {"1": {"inferences_per_s": 20.0}}])
    assert merged == {"1": {"inferences_per_s": 20}, "58": {"inferences_per_s": 2},
                      "60": {"inferences_per_s": 1}}
    assert bench.merge_libtorch([{"error": "no tool"}]) == {"error": "no tool"}
    floors = bench.merge_floors([
        {"concurrency": 64, "closed": {"cpu_us_per_request": 6.0}, "open": {"p50_ms": 0.1}},
        {"concurrency": 64, "closed": {"cpu_us_per_request": 8.0}, "open": {"error": "x"}},
        {"error": "did not start"}])
    assert floors == {"concurrency": 64, "closed": {"cpu_us_per_request": 7.0},
                      "open": {"p50_ms": 0.1}, "rounds": 2}
    assert bench.merge_floors([None, None]) is None


# ------------------------------------------------------------------------------- the peers
# bench/serving_peers.py without any peer installed: its answer check against a real server
# (serve_floor) that answers wrongly, its p99-limited search on shoal alone, and what it says
# of a peer whose environment is missing.

PEERS_BENCH = e2e.REPO_ROOT / "bench" / "serving_peers.py"


def _peers_module():
    import importlib.util
    sys.path.insert(0, str(e2e.REPO_ROOT / "bench"))
    spec = importlib.util.spec_from_file_location("serving_peers", PEERS_BENCH)
    peers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(peers)
    return peers


@pytest.mark.parametrize("protocol", ["v2", "native"])
def test_peers_answer_check_refuses_a_server_whose_answers_differ(serve_floor, tmp_path,
                                                                   protocol):
    """Every row is sent at once and each answer compared with shoal's: a server that answers
    every row like the first (as a batch envelope that reads only its first request would)
    is refused, with the row and value that differ; the same server is accepted when that is
    the right answer."""
    peers = _peers_module()
    rows = [peers.row("identity", seed) for seed in range(4)]
    first = rows[0]
    reply = (json.dumps({"output": first}) if protocol == "native" else
             json.dumps({"outputs": [{"name": "output", "datatype": "FP32", "shape": [1, 16],
                                      "data": first}]})).encode()
    floor = Floor(serve_floor, tmp_path, reply)
    try:
        url = f"http://127.0.0.1:{floor.port}/v2/models/identity/infer"
        err = peers.check_answers(url, "identity", protocol, rows, rows)
        assert err is not None and err.startswith("row 1 differs from shoal's answer: value 0 is")
        assert peers.check_answers(url, "identity", protocol, rows, [first] * 4) is None
        # A value off by more than the tolerance, and one within it.
        off = [first[0] + 1e-3] + first[1:]
        assert "value 0 is" in peers.check_answers(url, "identity", protocol, rows[:1], [off])
        close = [first[0] + 1e-6] + first[1:]
        assert peers.check_answers(url, "identity", protocol, rows[:1], [close]) is None
        # Fewer values than shoal's answer.
        assert "16 values, shoal's answer has 17" in peers.check_answers(
            url, "identity", protocol, rows[:1], [first + [0.0]])
    finally:
        floor.stop()
    # An answer without outputs, and a server that is not there.
    with pytest.raises(ValueError, match="no output in the answer"):
        peers.answer_row("v2", b'{"error": "boom"}')
    assert peers.check_answers(f"http://127.0.0.1:{floor.port}/x", "identity", "v2", rows[:1],
                               rows[:1]).startswith("row 0: answered None")


def test_peers_verdicts_leave_what_the_aa_pair_cannot_resolve():
    peers = _peers_module()
    assert peers.verdict(2.6, 2.5, True, 0.02) == "met"
    assert peers.verdict(2.4, 2.5, True, 0.02) == "not met"
    assert peers.verdict(2.52, 2.5, True, 0.02) == "not resolvable"
    assert peers.verdict(1.2, 1.3, False, 0.05) == "met"
    assert peers.verdict(1.4, 1.3, False, 0.05) == "not met"
    assert peers.verdict(None, 1.3, False, 0.05) == "not measured"
    assert peers.verdict(2.0, 1.3, False, None) == "not resolvable"
    # Under a target that even the bare loop misses on this machine: no server can meet it.
    assert peers.verdict(1.7, 2.5, True, 0.01, ceiling=2.0) == "beyond the bare loop"
    assert peers.verdict(1.7, 2.5, True, 0.01, ceiling=3.0) == "not met"
    assert peers.verdict(2.6, 2.5, True, 0.01, ceiling=3.0) == "met"
    assert peers.aa_resolution({"throughput_rps": 110.0, "cpu_us_per_request": 10.0},
                               {"throughput_rps": 100.0, "cpu_us_per_request": 10.0}) == {
        "throughput": 0.1, "cpu_per_request": 0.0}


def _fig(rps, cpu_us):
    return {"throughput_rps": rps, "cpu_us_per_request": cpu_us}


def test_peers_lstm_targets_past_the_bare_loop_say_so():
    """The LSTM's ratios to the peers are bounded by the bare loop's own, paying for each
    request what serve_floor pays: with the loop at 100 us per row and the floor at 5 us, one
    core answers at most 9,524 requests/s. 2.5x a 5,000 req/s peer is out of reach of any
    server, and said to be; 10x a 900 req/s app is not (10.6x), and shoal's 9.4x misses it."""
    peers = _peers_module()
    best = {"shoal": _fig(8500, 117), "shoal_aa": _fig(8520, 117), "torchserve": _fig(5000, 200),
            "fastapi": _fig(900, 1000)}
    anchor = {"batch_size": 107, "server_cpus": 1,
              "libtorch_loop": {"107": {"cpu_us_per_row": 100.0}},
              "floor": {"closed": {"cpu_us_per_request": 5.0}}}
    ratios, targets = peers.derive("lstm", best, anchor)
    assert ratios["bare_loop_over"] == {"torchserve": 2.0, "fastapi": 11.1111}
    assert ratios["loop_plus_floor_over"] == {"torchserve": 1.9048, "fastapi": 10.582}
    assert targets["lstm_at_least_2_5x_best_peer"] == "beyond the bare loop"
    assert targets["lstm_at_least_10x_fastapi"] == "not met"
    # A dearer floor puts the 10x out of reach too (1e6 / 115 = 8,696 a second, 9.7x), though
    # the loop alone would clear it.
    anchor["floor"] = {"closed": {"cpu_us_per_request": 15.0}}
    ratios, targets = peers.derive("lstm", best, anchor)
    assert ratios["bare_loop_over"]["fastapi"] == 11.1111
    assert targets["lstm_at_least_10x_fastapi"] == "beyond the bare loop"
    # On two server CPUs the ceiling doubles: then the 2.5x is shoal's to miss.
    anchor["server_cpus"] = 2
    ratios, targets = peers.derive("lstm", best, anchor)
    assert ratios["loop_plus_floor_over"]["torchserve"] == 3.4783
    assert targets["lstm_at_least_2_5x_best_peer"] == "not met"
    # Without a floor figure the loop alone bounds it.
    del anchor["floor"]
    ratios, targets = peers.derive("lstm", best, dict(anchor, server_cpus=1))
    assert ratios["loop_plus_floor_over"] == {}
    assert targets["lstm_at_least_10x_fastapi"] == "not met"


def test_peers_tiny_20x_target_is_over_the_python_v2_servers_and_fastapi_has_its_own():
    peers = _peers_module()
    best = {"shoal": _fig(100000, 10.0), "shoal_aa": _fig(100500, 10.0),
            "fastapi": _fig(7000, 140.0), "mlserver": _fig(1500, 660.0),
            "kserve": _fig(2000, 500.0)}
    anchor = {"batch_size": 64, "server_cpus": 1, "libtorch_loop": {},
              "floor": {"closed": {"cpu_us_per_request": 5.0}}}
    ratios, targets = peers.derive("identity", best, anchor)
    assert targets["tiny_at_least_20x_every_python_v2"] == "met"  # 50x KServe, 66.7x MLServer
    assert ratios["throughput_shoal_over_best_python_v2"] == 50.0
    assert ratios["throughput_shoal_over"]["fastapi"] == 14.2857  # reported, not in the 20x
    assert targets["tiny_5x_less_cpu_than_fastapi"] == "met"
    best["kserve"] = _fig(6000, 160.0)
    _, targets = peers.derive("identity", best, anchor)
    assert targets["tiny_at_least_20x_every_python_v2"] == "not met"


def test_peers_tiny_cpu_target_pairs_each_shoal_run_with_the_floor_run_right_after_it():
    """shoal's CPU per request over serve_floor's: two noisy figures that drift apart over the
    quarter of an hour the peers take. Each of shoal's two runs is read against the floor run
    right after it, the target reads the mean of the two ratios, and its verdict is left open
    while that mean is within the pair's spread of the target."""
    peers = _peers_module()
    best = {"shoal": _fig(100000, 7.0), "shoal_aa": _fig(100000, 7.07)}
    anchor = {"batch_size": 64, "server_cpus": 1, "libtorch_loop": {},
              "floor": {"closed": {"cpu_us_per_request": 4.5}},
              "floor_aa": {"closed": {"cpu_us_per_request": 5.0}}}
    ratios, targets = peers.derive("identity", best, anchor)
    assert ratios["floor_aa_resolution"] == 0.1
    # 7.0 / 4.5 = 1.556 and 7.07 / 5.0 = 1.414: 1.485, and the pair 10 % apart.
    assert ratios["cpu_shoal_over_floor"] == pytest.approx((7.0 / 4.5 + 7.07 / 5.0) / 2,
                                                           abs=1e-3)
    assert ratios["cpu_over_floor_resolution"] == pytest.approx(0.1, abs=1e-3)
    assert targets["tiny_cpu_within_1_5x_floor"] == "not resolvable"
    # Pairs that agree resolve it: 7.0 / 4.5 and 7.07 / 4.55, 1.55 and 1.1 % apart.
    anchor["floor_aa"] = {"closed": {"cpu_us_per_request": 4.55}}
    ratios, targets = peers.derive("identity", best, anchor)
    assert targets["tiny_cpu_within_1_5x_floor"] == "not met"
    best = {"shoal": _fig(100000, 6.0), "shoal_aa": _fig(100000, 6.0)}
    _, targets = peers.derive("identity", best, anchor)
    assert targets["tiny_cpu_within_1_5x_floor"] == "met"
    # A mean of ratios, not a ratio of means: shoal 12 over 8 and 10 over 6 is 1.583 where
    # 11 over 7 would read 1.571.
    best = {"shoal": _fig(100000, 12.0), "shoal_aa": _fig(100000, 10.0)}
    anchor.update(floor={"closed": {"cpu_us_per_request": 8.0}},
                  floor_aa={"closed": {"cpu_us_per_request": 6.0}})
    assert peers.paired_cpu_over_floor(best, anchor) == (1.5833, 0.1)
    # Without shoal_aa: shoal over the mean of the floors, resolved only past both A/A
    # pairs' spreads, and with one floor run there is no spread to go by.
    del best["shoal_aa"]
    assert peers.paired_cpu_over_floor(best, anchor) == (None, None)
    ratios, targets = peers.derive("identity", best, anchor)
    assert ratios["cpu_shoal_over_floor"] == pytest.approx(12.0 / 7.0, abs=1e-3)
    assert targets["tiny_cpu_within_1_5x_floor"] == "not resolvable"
    del anchor["floor_aa"]
    ratios, targets = peers.derive("identity", best, anchor)
    assert ratios["floor_aa_resolution"] is None
    assert targets["tiny_cpu_within_1_5x_floor"] == "not resolvable"


def run_peers(*args, timeout=600):
    return subprocess.run([sys.executable, str(PEERS_BENCH), "--shoal", e2e.SHOAL_BIN, *args],
                          capture_output=True, text=True, timeout=timeout)


QUICK = ["--models", "identity", "--duration", "0.3", "--warmup", "0.1", "--drain", "2",
         "--libtorch-duration", "0.2", "--floor-concurrency", "4", "--start-concurrency", "2",
         "--max-concurrency", "8", "--refine", "1",
         "--server-warmup", "0.2"]


def test_peers_search_on_shoal_alone_and_a_missing_peer(tmp_path):
    """Shoal alone, twice (the A/A pair): each run's closed loops double from
    --start-concurrency while the p99 holds; the best is one of them, with its CPU per request;
    the anchors are measured at shoal's batch size. A peer whose venv is missing is an error
    that says how to install it, and nothing else is affected."""
    r = run_peers(*QUICK, "--servers", "shoal,mlserver,shoal_aa", "--venv-root", str(tmp_path))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    entry = out["models"]["identity"]
    for name in ("shoal", "shoal_aa"):
        s = entry["servers"][name]
        assert "error" not in s, s
        points = s["points"]
        assert [p["concurrency"] for p in points][:1] == [2]
        assert all(p["errors"] == 0 for p in points)
        assert s["best"] in points and s["best"]["p99_ms"] <= 50
        assert s["best"]["cpu_us_per_request"] > 0 and "mean_batch_size" in s["best"]
    assert "./setup.sh --serving-peers" in entry["servers"]["mlserver"]["error"]
    anchors = entry["anchors"]
    assert str(anchors["batch_size"]) in anchors["libtorch_loop"]
    assert anchors["floor"]["closed"]["cpu_us_per_request"] >= 0
    assert entry["ratios"]["aa_resolution"]["throughput"] is not None
    # Every process runs the OpenBLAS and ATen kernels shoal serve picks for itself, and shoal
    # says so.
    coretype = out["settings"]["openblas_coretype"]
    if coretype:
        assert f"OpenBLAS {coretype} kernels" in entry["servers"]["shoal"]["backend"]
    capability = out["settings"]["aten_cpu_capability"]
    sys.path.insert(0, str(e2e.REPO_ROOT / "bench"))
    import _common  # noqa: E402  (bench/, not a package)
    assert capability == _common.shoal_aten_capability()
    if capability:
        assert f"ATen {capability.upper()} kernels" in entry["servers"]["shoal"]["backend"]
    # No peer measured: every peer target says so.
    assert entry["targets"]["ahead_of_every_peer"] == "not measured"
    assert entry["targets"]["tiny_at_least_20x_every_python_v2"] == "not measured"
    assert entry["targets"]["tiny_cpu_within_1_5x_floor"] in ("met", "not met",
                                                              "not resolvable")


def test_peers_search_stops_at_the_first_run_beyond_the_p99_limit():
    r = run_peers(*QUICK, "--servers", "shoal", "--p99-limit-ms", "0.001")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)["models"]["identity"]["servers"]["shoal"]
    # Beyond the limit at --start-concurrency, then at half that, down to 1: nothing within.
    assert [p["concurrency"] for p in s["points"]] == [2, 1]
    assert s["best"] is None


@pytest.mark.parametrize("args,message", [
    (["--servers", "fastapi,shoal"], "--servers must start with shoal"),
    (["--servers", "shoal,nginx"], "unknown server nginx"),
    (["--models", "resnet"], "unknown model resnet"),
    (["--p99-limit-ms", "0"], "--p99-limit-ms and --duration must be > 0"),
    (["--server-cpus", "4096"], "CPU 4096 is not available"),
])
def test_peers_bad_options_exit_2_before_anything_runs(args, message):
    r = run_peers(*args, timeout=60)
    assert r.returncode == 2 and message in r.stderr, r.stderr
    assert r.stdout == ""
