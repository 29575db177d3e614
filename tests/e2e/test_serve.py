"""`shoal serve`: the KServe v2 REST endpoints on real TorchScript models.

The models are exported by examples/serving/export_models.py with Debian's python3-torch (the
same libtorch the server links), served by the real binary, and every output is compared with
the model run directly here. One server serves the whole module (loading libtorch takes a
second or two); tests that need their own start one.
"""

import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

import shoal_e2e as e2e

EXPORTER = e2e.REPO_ROOT / "examples" / "serving" / "export_models.py"
MAX_REQUEST_BYTES = 200_000


class Server:
    """A running `shoal serve`, its port read from the line it prints."""

    def __init__(self, shoal_bin, repository, out_dir, *extra, env=None):
        self.stdout_path = out_dir / "serve.stdout"
        self.stderr_path = out_dir / "serve.stderr"
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                [shoal_bin, "serve", "--model-repository", str(repository), "--http-port", "0",
                 "--grpc-port", "0", *map(str, extra)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                env=e2e.base_env(env), start_new_session=True)
        line = e2e.wait_until(self._listening_line, 60, "shoal serve to print its port")
        assert line.startswith("shoal serve: listening on http://127.0.0.1:"), line
        self.port = int(line.rsplit(":", 1)[1])

    def _listening_line(self):
        if self.proc.poll() is not None:
            raise AssertionError(f"shoal serve exited with {self.proc.returncode}:\n{self.stderr()}")
        lines = self.stdout_path.read_text().splitlines()
        return lines[0] if lines else None

    def stderr(self):
        return self.stderr_path.read_text(errors="replace")

    def request(self, method, path, body=None, headers=None):
        """(status, parsed JSON body) of one request on a connection of its own."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            if isinstance(body, (dict, list)):
                body = json.dumps(body)
            conn.request(method, path, body=body, headers=headers or {})
            response = conn.getresponse()
            raw = response.read()
            assert response.getheader("Content-Type") == "application/json", (path, raw[:200])
            return response.status, json.loads(raw)
        finally:
            conn.close()

    def get(self, path):
        return self.request("GET", path)

    def infer(self, model, inputs, version=None, outputs=None, **fields):
        path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"
        body = {"inputs": inputs, **fields}
        if outputs is not None:
            body["outputs"] = [{"name": n} for n in outputs]
        return self.request("POST", path, body)

    def wait_ready(self):
        e2e.wait_until(lambda: self.get("/v2/health/ready")[0] == 200, 120,
                       "the models to load (/v2/health/ready)")

    def stop(self, sig=signal.SIGTERM, timeout=30):
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            raise AssertionError(f"shoal serve did not stop within {timeout}s after {sig!r}")

    def kill(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


TORCH_DTYPES = {"BOOL": torch.bool, "UINT8": torch.uint8, "INT8": torch.int8,
                "INT16": torch.int16, "INT32": torch.int32, "INT64": torch.int64,
                "FP32": torch.float32, "FP64": torch.float64}


def tensor(name, values, datatype):
    t = torch.as_tensor(values, dtype=TORCH_DTYPES.get(datatype))
    return {"name": name, "shape": list(t.shape), "datatype": datatype,
            "data": t.flatten().tolist()}


def output(body, name):
    matches = [o for o in body["outputs"] if o["name"] == name]
    assert len(matches) == 1, body
    return matches[0]


def as_torch(out, dtype):
    return torch.tensor(out["data"], dtype=dtype).reshape(out["shape"])


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    repo = tmp_path_factory.mktemp("models")
    r = subprocess.run([e2e.PYTHON, str(EXPORTER), "--out", str(repo)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, f"export_models.py failed:\n{r.stderr}"
    # Broken models next to the good ones: each is refused, the others serve.
    (repo / "bad_config" / "1").mkdir(parents=True)
    (repo / "bad_config" / "1" / "model.pt").write_bytes((repo / "identity/1/model.pt").read_bytes())
    (repo / "bad_config" / "config.yaml").write_text("instances: 1\nmax_batch_size: -3\n")
    (repo / "corrupt" / "1").mkdir(parents=True)
    (repo / "corrupt" / "1" / "model.pt").write_bytes(b"not a TorchScript archive")
    # The MLP with a config whose warmup feeds it 8 features instead of 16: warmup fails.
    (repo / "bad_warmup" / "1").mkdir(parents=True)
    (repo / "bad_warmup" / "1" / "model.pt").write_bytes((repo / "mlp/1/model.pt").read_bytes())
    (repo / "bad_warmup" / "config.yaml").write_text(
        "inputs: [{name: x, datatype: FP32, dims: [8]}]\n"
        "max_batch_size: 4\n"
        "warmup:\n  - inputs: {x: {dims: [1, 8], fill: one}}\n")
    (repo / "no_versions").mkdir()
    return repo


@pytest.fixture(scope="module")
def server(shoal_bin, repository, tmp_path_factory):
    s = Server(shoal_bin, repository, tmp_path_factory.mktemp("serve"),
               "--max-request-bytes", MAX_REQUEST_BYTES)
    try:
        s.wait_ready()
        yield s
    finally:
        s.kill()


def load(repository, model, version=1):
    return torch.jit.load(str(repository / model / str(version) / "model.pt")).eval()


# ---------------------------------------------------------------------------------------------
# Health, metadata


def test_health_and_server_metadata(server):
    assert server.get("/v2/health/live") == (200, {"live": True})
    assert server.get("/v2/health/ready") == (200, {"ready": True})
    status, meta = server.get("/v2")
    assert status == 200
    assert meta["name"] == "shoal"
    assert meta["version"] == "0.1.0"
    assert "statistics" in meta["extensions"]
    assert meta["backend"].startswith("libtorch ")


def bench_common():
    bench = str(e2e.REPO_ROOT / "bench")
    if bench not in sys.path:
        sys.path.insert(0, bench)
    import _common  # noqa: E402  (bench/, not a package)
    return _common


def expected_openblas_kernels():
    """The kernels shoal serve should give OpenBLAS on this CPU (cpu_kernels.h), read from
    /proc/cpuinfo by the benchmarks' helper, which puts the same value in every peer's
    environment: None where shoal leaves the choice to OpenBLAS (not Intel, or no AVX)."""
    return bench_common().shoal_openblas_coretype()


def expected_aten_kernels():
    """The instruction set shoal serve should give ATen's kernels on this CPU (cpu_kernels.h),
    from the same helper: None where shoal keeps libtorch's default (not AMD, or no AVX-512)."""
    return bench_common().shoal_aten_capability()


def test_openblas_gets_the_kernels_this_cpu_runs_and_the_log_says_which(server):
    # Debian's OpenBLAS 0.3.21 gives Intel models newer than its table (these machines' Xeons)
    # its SSE3 Prescott kernels, which ran the LSTM 2.4x slower.
    expected = expected_openblas_kernels()
    _, meta = server.get("/v2")
    if expected is None:
        assert "OpenBLAS" in meta["backend"], meta["backend"]
        return
    assert f"OpenBLAS {expected} kernels" in meta["backend"], meta["backend"]
    assert (f"shoal serve: OpenBLAS kernels: {expected}, chosen from this CPU's features (set "
            "OPENBLAS_CORETYPE to choose others)") in server.stderr()


def test_aten_gets_the_kernels_this_cpu_runs_and_the_log_says_which(server):
    # libtorch 1.13 runs its AVX2 kernels where AVX-512 is there; on AMD's Zen 4 the AVX-512
    # ones ran the LSTM's element-wise work at half the cost.
    expected = expected_aten_kernels()
    _, meta = server.get("/v2")
    if expected is None:
        assert "ATen " in meta["backend"], meta["backend"]
        assert "ATen kernels:" not in server.stderr(), server.stderr()
        return
    assert f"ATen {expected.upper()} kernels" in meta["backend"], meta["backend"]
    assert (f"shoal serve: ATen kernels: {expected}, chosen from this CPU's features (set "
            "ATEN_CPU_CAPABILITY to choose others)") in server.stderr()


# (variable, the library's name in the log and in /v2's backend, how the backend spells a
# value, what shoal should choose on this CPU)
KERNEL_CHOICES = {
    "OPENBLAS_CORETYPE": ("OpenBLAS", str, expected_openblas_kernels),
    "ATEN_CPU_CAPABILITY": ("ATen", str.upper, expected_aten_kernels),
}


# Both libraries read an empty value too, and then pick by themselves.
@pytest.mark.parametrize("variable,value", [
    ("OPENBLAS_CORETYPE", "Prescott"), ("OPENBLAS_CORETYPE", ""),
    ("ATEN_CPU_CAPABILITY", "avx2"), ("ATEN_CPU_CAPABILITY", ""),
])
def test_kernels_the_caller_chose_are_kept_and_an_empty_choice_replaced(
        shoal_bin, repository, tmp_path, variable, value):
    library, spelled, expected_here = KERNEL_CHOICES[variable]
    repo = tmp_path / "models"
    (repo / "identity" / "1").mkdir(parents=True)
    shutil.copy(repository / "identity" / "1" / "model.pt", repo / "identity" / "1")
    s = Server(shoal_bin, repo, tmp_path, env={variable: value})
    try:
        s.wait_ready()
        _, meta = s.get("/v2")
        expected = value or expected_here()
        if expected is None:  # this CPU gets the library's own choice
            assert f"{library} " in meta["backend"], meta["backend"]
            assert f"{library} kernels: " not in s.stderr(), s.stderr()
            return
        assert f"{library} {spelled(expected)} kernels" in meta["backend"], meta["backend"]
        assert (f"{library} kernels: " in s.stderr()) == (value == ""), s.stderr()
    finally:
        s.kill()


def test_a_keep_alive_connection_serves_many_requests(server):
    # One connection for 50 requests: the server must not close it after a few (httplib's
    # default of 5 made busy clients reconnect every fifth request).
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.connect()
        local_port = conn.sock.getsockname()[1]
        body = json.dumps({"inputs": [tensor("x", [1, 2], "INT64")]})
        for i in range(50):
            conn.request("POST", "/v2/models/identity/infer", body=body)
            response = conn.getresponse()
            response.read()
            assert response.status == 200, i
            assert response.getheader("Connection", "").lower() != "close", i
            assert conn.sock is not None and conn.sock.getsockname()[1] == local_port, i
    finally:
        conn.close()


def test_model_metadata_from_the_config(server):
    status, meta = server.get("/v2/models/mlp")
    assert status == 200, meta
    assert meta["name"] == "mlp"
    assert meta["versions"] == ["1", "2"]
    assert meta["platform"] == "pytorch_libtorch"
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 16]}]
    assert meta["outputs"] == [{"name": "scores", "datatype": "FP32", "shape": [-1, 4]}]
    assert meta["parameters"]["version"] == "2"  # the newest answers unversioned requests
    assert meta["parameters"]["max_batch_size"] == 8
    status, meta = server.get("/v2/models/mlp/versions/1")
    assert status == 200 and meta["parameters"]["version"] == "1"


def test_model_metadata_without_a_config_names_the_forward_arguments(server):
    status, meta = server.get("/v2/models/add_sub")
    assert status == 200, meta
    assert [i["name"] for i in meta["inputs"]] == ["a", "b"]
    assert all(i["datatype"] == "" and i["shape"] == [] for i in meta["inputs"])  # any
    assert meta["outputs"] == []  # known from responses only
    assert meta["parameters"]["max_batch_size"] == 0


def test_model_and_version_readiness(server):
    assert server.get("/v2/models/mlp/ready") == (200, {"name": "mlp", "ready": True})
    assert server.get("/v2/models/mlp/versions/1/ready") == (200, {"name": "mlp", "ready": True})
    status, body = server.get("/v2/models/mlp/versions/7/ready")
    assert status == 404 and body == {"error": "model 'mlp' has no version '7'; ready versions: 1, 2"}
    status, body = server.get("/v2/models/nope/ready")
    assert status == 404 and body["error"].startswith("unknown model 'nope'")


# ---------------------------------------------------------------------------------------------
# Inference: outputs equal the model run here


def test_identity_returns_every_datatype_unchanged(server):
    cases = [([[1.5, -2.25], [3.0, 4.125]], "FP32"), ([1e300, -1e-300], "FP64"),
             ([[-9223372036854775808, 9223372036854775807]], "INT64"), ([-5, 7], "INT32"),
             ([-32768], "INT16"), ([-128, 127], "INT8"), ([0, 255], "UINT8"),
             ([[True, False], [False, True]], "BOOL")]
    for values, datatype in cases:
        status, body = server.infer("identity", [tensor("x", values, datatype)])
        assert status == 200, body
        out = output(body, "output__0")
        assert out["datatype"] == datatype
        assert out["shape"] == list(torch.as_tensor(values).shape)
        assert out["data"] == torch.as_tensor(values, dtype=TORCH_DTYPES[datatype]).flatten().tolist()
        assert body["model_name"] == "identity" and body["model_version"] == "1"


def test_mlp_outputs_equal_the_model_run_in_python(server, repository):
    torch.manual_seed(0)
    x = torch.randn(5, 16)
    for version in (1, 2):
        with torch.inference_mode():
            expected = load(repository, "mlp", version)(x)
        status, body = server.infer("mlp", [tensor("x", x, "FP32")], version=version)
        assert status == 200, body
        assert body["model_version"] == str(version)
        got = as_torch(output(body, "scores"), torch.float32)
        assert got.shape == (5, 4)
        assert torch.allclose(got, expected, rtol=1e-5, atol=1e-6), (got, expected)
    # Unversioned: the newest.
    status, body = server.infer("mlp", [tensor("x", x, "FP32")])
    assert status == 200 and body["model_version"] == "2"


def test_named_outputs_the_outputs_parameter_and_the_request_id(server, repository):
    a = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    b = torch.tensor([[0.5, 0.25], [-1.0, 8.0]])
    expected = load(repository, "add_sub")(a, b)
    status, body = server.infer("add_sub", [tensor("b", b, "FP32"), tensor("a", a, "FP32")],
                                id="req-7")
    assert status == 200, body
    assert body["id"] == "req-7"
    assert sorted(o["name"] for o in body["outputs"]) == ["difference", "sum"]
    for name in ("sum", "difference"):
        assert torch.equal(as_torch(output(body, name), torch.float32), expected[name])
    status, body = server.infer("add_sub", [tensor("a", a, "FP32"), tensor("b", b, "FP32")],
                                outputs=["difference"])
    assert status == 200, body
    assert [o["name"] for o in body["outputs"]] == ["difference"]


# ---------------------------------------------------------------------------------------------
# Errors: status and message


X16 = [tensor("x", [[0.0] * 16], "FP32")]


@pytest.mark.parametrize("method,path,body,status,message", [
    ("POST", "/v2/models/nope/infer", {"inputs": X16}, 404,
     "unknown model 'nope'; the repository has: add_sub, bad_config, bad_warmup, batch_probe, "
     "corrupt, identity, mlp, no_versions"),
    ("POST", "/v2/models/mlp/versions/3/infer", {"inputs": X16}, 404,
     "model 'mlp' has no version '3'; ready versions: 1, 2"),
    ("POST", "/v2/models/mlp/versions/latest/infer", {"inputs": X16}, 404,
     "model 'mlp' has no version 'latest'; ready versions: 1, 2"),
    ("GET", "/v2/models/nope", None, 404,
     "unknown model 'nope'; the repository has: add_sub, bad_config, bad_warmup, batch_probe, "
     "corrupt, identity, mlp, no_versions"),
    ("POST", "/v2/models/mlp/infer", {"inputs": [tensor("y", [[0.0] * 16], "FP32")]}, 400,
     "model 'mlp' has no input 'y'; its inputs are: x"),
    ("POST", "/v2/models/add_sub/infer", {"inputs": [tensor("a", [1.0], "FP32")]}, 400,
     "missing input 'b'; model 'add_sub' takes: a, b"),
    ("POST", "/v2/models/mlp/infer", {"inputs": [tensor("x", [[0.0] * 16], "FP64")]}, 400,
     "input 'x': datatype FP64, model 'mlp' expects FP32"),
    ("POST", "/v2/models/mlp/infer", {"inputs": [tensor("x", [[0.0] * 15], "FP32")]}, 400,
     "input 'x': shape [1,15] does not match [-1,16] (batch dimension first) (-1: any size)"),
    ("POST", "/v2/models/mlp/infer", {"inputs": [tensor("x", [[0.0] * 16] * 9, "FP32")]}, 400,
     "input 'x': batch size (dimension 0) must be 1 to 8 (max_batch_size), got [9,16]"),
    ("POST", "/v2/models/mlp/infer", {"inputs": [tensor("x", [0.0] * 16, "FP32")]}, 400,
     "input 'x': shape [16] does not match [-1,16] (batch dimension first) (-1: any size)"),
    ("POST", "/v2/models/mlp/infer",
     {"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32", "data": [1, 2]}]}, 400,
     "inputs[0] (x): shape [1,16] needs 16 values, data has 2"),
    ("POST", "/v2/models/mlp/infer",
     {"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FLOAT", "data": [1]}]}, 400,
     "inputs[0] (x): datatype 'FLOAT' is not supported; supported: BOOL, UINT8, INT8, INT16, "
     "INT32, INT64, FP32, FP64"),
    ("POST", "/v2/models/mlp/infer", {"inputs": X16, "outputs": [{"name": "probs"}]}, 400,
     "model 'mlp' has no output 'probs'; its outputs are: scores"),
    ("POST", "/v2/models/identity/infer",
     {"inputs": [tensor("x", [1], "INT64")], "outputs": [{"name": "probs"}]}, 400,
     "model 'identity' has no output 'probs'; its outputs are: output__0"),
    ("POST", "/v2/models/mlp/infer", {"input": X16}, 400,
     "'inputs' is required: a non-empty list of {name, shape, datatype, data}"),
    ("POST", "/v2/models/mlp/infer", '{"inputs": [', 400,
     "malformed JSON: parse error at line 1, column 13: syntax error while parsing value - "
     "unexpected end of input; expected '[', '{', or a literal"),
    ("POST", "/v2/models/mlp/infer", "", 400,
     "malformed JSON: parse error at line 1, column 1: syntax error while parsing value - "
     "unexpected end of input; expected '[', '{', or a literal"),
    ("GET", "/v2/models/mlp/infer", None, 404, "no endpoint GET /v2/models/mlp/infer"),
    ("GET", "/v2/repository/index", None, 404, "no endpoint GET /v2/repository/index"),
    ("POST", "/metrics", None, 404, "no endpoint POST /metrics"),
])
def test_bad_requests_get_a_4xx_that_says_what_is_wrong(server, method, path, body, status,
                                                        message):
    assert server.request(method, path, body) == (status, {"error": message})


def test_a_body_over_the_limit_is_refused_with_413(server):
    big = tensor("x", [[0.5] * 16] * 8, "FP32")
    big["padding"] = "x" * MAX_REQUEST_BYTES
    status, body = server.request("POST", "/v2/models/mlp/infer", {"inputs": [big]})
    assert status == 413
    assert body == {"error": f"request body larger than the server's limit of "
                             f"{MAX_REQUEST_BYTES} bytes (--max-request-bytes)"}


def test_a_model_that_fails_answers_500_naming_the_model_and_the_cause(server):
    # add_sub has no config, so mismatched shapes reach the model, which raises.
    status, body = server.infer("add_sub", [tensor("a", [1.0, 2.0], "FP32"),
                                            tensor("b", [1.0, 2.0, 3.0], "FP32")])
    assert status == 500
    assert body == {"error": "model 'add_sub' version 1 failed: RuntimeError: The size of tensor "
                             "a (2) must match the size of tensor b (3) at non-singleton "
                             "dimension 0"}


# ---------------------------------------------------------------------------------------------
# Broken models are refused; the rest serve


def test_broken_models_are_refused_with_the_reason_and_the_others_serve(server, repository):
    status, body = server.get("/v2/models/bad_config/ready")
    assert status == 400 and body["ready"] is False
    config = repository / "bad_config" / "config.yaml"
    assert (f"{config}:2: max_batch_size: must be an integer >= 0, got -3") in body["error"]
    status, body = server.infer("bad_config", [tensor("x", [1.0], "FP32")])
    assert status == 404
    assert body["error"].startswith("model 'bad_config' is not available: invalid config:")

    status, body = server.get("/v2/models/corrupt/ready")
    assert status == 400
    assert "model.pt: not a loadable TorchScript file" in body["error"], body

    status, body = server.get("/v2/models/bad_warmup/ready")
    assert status == 400
    assert "warmup on instance 0: model 'bad_warmup' version 1 failed: RuntimeError:" in \
        body["error"], body

    status, body = server.get("/v2/models/no_versions/ready")
    assert status == 400
    assert f"no version to serve: expected {repository}/no_versions/<version>/model.pt" in \
        body["error"], body

    log = server.stderr()
    assert f"shoal serve: model 'bad_config' refused: invalid config:\n{config}:2: " \
           "max_batch_size: must be an integer >= 0, got -3" in log
    assert "shoal serve: model 'corrupt' version 1 refused: " in log
    assert "shoal serve: model 'bad_warmup' version 1 refused: warmup on instance 0" in log
    assert "shoal serve: model 'mlp' version 2 ready" in log
    # The server as a whole is ready: the broken models do not hold the good ones back.
    assert server.get("/v2/health/ready")[0] == 200


# ---------------------------------------------------------------------------------------------
# Dynamic batching


def test_concurrent_requests_run_together_and_get_their_own_rows_back(server):
    _, before = server.get("/v2/models/batch_probe/stats")
    before = before["model_stats"][0]
    n = 8
    results = [None] * n
    barrier = threading.Barrier(n)

    def send(i):
        barrier.wait()
        results[i] = server.infer("batch_probe", [tensor("x", [[float(i), float(i) + 0.5]],
                                                         "FP32")])

    threads = [threading.Thread(target=send, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sizes = []
    for i, (status, body) in enumerate(results):
        assert status == 200, body
        assert output(body, "doubled")["data"] == [2.0 * i, 2.0 * i + 1.0]  # its own row
        assert output(body, "doubled")["shape"] == [1, 2]
        rows = output(body, "batch_rows")
        assert rows["shape"] == [1, 1]
        sizes.append(rows["data"][0])
    # Sent at once into a 50 ms window: they share executions, and the model saw each batch
    # whole (8 rows over fewer than 8 runs).
    assert max(sizes) > 1, sizes
    _, after = server.get("/v2/models/batch_probe/stats")
    after = after["model_stats"][0]
    inferences = after["inference_count"] - before["inference_count"]
    executions = after["execution_count"] - before["execution_count"]
    assert inferences == n
    assert executions < n, after
    assert sum(1 / s for s in sizes) == pytest.approx(executions)


def test_batched_mlp_outputs_equal_the_unbatched_model(server, repository):
    torch.manual_seed(1)
    xs = [torch.randn(1 + i % 3, 16) for i in range(6)]
    model = load(repository, "mlp", 2)
    results = [None] * len(xs)

    def send(i):
        results[i] = server.infer("mlp", [tensor("x", xs[i], "FP32")])

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for x, (status, body) in zip(xs, results):
        assert status == 200, body
        with torch.inference_mode():
            expected = model(x)
        assert torch.allclose(as_torch(output(body, "scores"), torch.float32), expected,
                              rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# Robustness


def raw_exchange(port, data, shut_write=False, until=None, timeout=2):
    """Sends raw bytes; returns what comes back before the server closes, `until` (bytes)
    arrives, or `timeout` seconds pass."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(data)
        if shut_write:
            sock.shutdown(socket.SHUT_WR)
        sock.settimeout(timeout)
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
                if until and until in received:
                    break
        except (socket.timeout, ConnectionResetError):
            pass
        return received


def test_http_protocol_edges_get_their_own_answers(server):
    # Bytes that are not HTTP: 400 naming the problem, then the connection closes.
    reply = raw_exchange(server.port, b"\x16\x03\x01\x02\x00garbage\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 400"), reply[:100]
    assert b"malformed HTTP request" in reply
    # A header larger than the server takes: 431, without reading on.
    reply = raw_exchange(server.port, b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Big: " +
                         b"a" * 70000 + b"\r\n\r\n", until=b"bytes\"}")
    assert reply.startswith(b"HTTP/1.1 431"), reply[:100]
    # Expect: 100-continue is answered before the body is sent, then the request is served.
    body = json.dumps({"inputs": [tensor("x", [1.5, 2.5], "FP32")]}).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(b"POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\n"
                     b"Expect: 100-continue\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n")
        interim = sock.recv(100)
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n", interim
        sock.sendall(body)
        reply = b""
        while b"]}]}" not in reply:
            chunk = sock.recv(65536)
            assert chunk, reply
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 200"), reply[:100]
    assert b'"data":[1.5,2.5]' in reply
    # A request whose header stalls halfway is dropped once the server stops waiting (5 s),
    # without holding anything up.
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\n")
        sock.settimeout(60)  # a deadline for a hung server, not a figure under test
        closed_by_server = False
        try:
            closed_by_server = sock.recv(100) == b""
        except ConnectionResetError:
            closed_by_server = True
        assert closed_by_server
    # Percent-encoded paths are decoded before routing; a query string is ignored.
    assert server.request("GET", "/v2/models/%69dentity/ready?x=1", None) == \
        (200, {"name": "identity", "ready": True})


def test_the_server_survives_bad_requests_and_keeps_answering_others(server, repository):
    x = torch.randn(2, 16)
    with torch.inference_mode():
        expected = load(repository, "mlp", 2)(x)
    failures = []
    stop = threading.Event()

    def good_traffic():
        while not stop.is_set():
            status, body = server.infer("mlp", [tensor("x", x, "FP32")])
            if status != 200 or not torch.allclose(as_torch(output(body, "scores"), torch.float32),
                                                   expected, rtol=1e-5, atol=1e-6):
                failures.append((status, body))

    worker = threading.Thread(target=good_traffic)
    worker.start()
    try:
        nested = "[" * 100000 + "]" * 100000
        bad_bodies = [
            nested,
            '{"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32", "data": ' + nested + "}]}",
            '{"inputs": [{"name": "x", "shape": [' + ",".join(["1"] * 40) + '], "datatype": "FP32", '
            '"data": [1]}]}',
            '{"inputs": [{"name": "x", "shape": [4611686018427387904, 4], "datatype": "FP32", '
            '"data": [1]}]}',
            '{"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32", "data": [1e999]}]}',
            '{"inputs": [{"name": "\xff\xfe", "shape": [1], "datatype": "FP32", "data": [1]}]}',
            "\x00" * 1000,
            json.dumps({"inputs": [tensor("x", [[True] * 16], "BOOL")]}),
        ]
        for body in bad_bodies:
            status, reply = server.request("POST", "/v2/models/mlp/infer",
                                           body.encode("utf-8", "surrogateescape"))
            assert 400 <= status < 500 and "error" in reply, (body[:80], status, reply)
        # Requests cut short, a lying Content-Length, garbage instead of HTTP.
        raw_exchange(server.port, b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\n"
                                  b"Content-Length: 1000\r\n\r\n{\"inputs\"", shut_write=True)
        raw_exchange(server.port, b"\x16\x03\x01\x02\x00garbage\r\n\r\n")
        raw_exchange(server.port, b"GET /v2/health/live HTTP/1.1\r\n", shut_write=True)
        # A declared length over the limit is refused on the header, without waiting for a
        # body that never comes.
        started = time.monotonic()
        reply = raw_exchange(server.port, b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\n"
                                          b"Content-Length: 99999999999\r\n\r\n",
                             until=b"--max-request-bytes)\"}", timeout=10)
        assert reply.startswith(b"HTTP/1.1 413"), reply[:100]
        assert reply.endswith(b"--max-request-bytes)\"}"), reply
        assert time.monotonic() - started < 2
    finally:
        stop.set()
        worker.join()
    assert not failures, failures[:3]
    assert server.proc.poll() is None, server.stderr()
    status, body = server.infer("mlp", [tensor("x", x, "FP32")])
    assert status == 200


# ---------------------------------------------------------------------------------------------
# The command


SCHED_BATCH = 3  # sched.h; field 41 of /proc/PID/task/TID/stat


def thread_policies(pid):
    policies = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = open(f"/proc/{pid}/task/{task}/stat").read()
        except FileNotFoundError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after the command name, field 3 is index 0
        policies.append(int(fields[41 - 3]))
    return policies


def test_the_http_loops_run_as_batch_threads_so_they_never_preempt_a_model(
        shoal_bin, repository, tmp_path):
    s = Server(shoal_bin, repository, tmp_path, "--http-threads", "3")
    try:
        s.wait_ready()
        status, _ = s.request("GET", "/v2/health/ready")
        assert status == 200
        policies = thread_policies(s.proc.pid)
        assert policies.count(SCHED_BATCH) == 3, policies
        assert policies.count(0) >= 1, "the model instances keep the normal policy"
    finally:
        s.kill()


def test_a_missing_repository_exits_2_with_a_message(shoal_bin, tmp_path):
    r = subprocess.run([shoal_bin, "serve", "--model-repository", str(tmp_path / "nope"),
                        "--http-port", "0"], capture_output=True, text=True, timeout=60,
                       env=e2e.base_env())
    assert r.returncode == 2
    assert r.stderr == f"shoal serve: model repository {tmp_path / 'nope'} does not exist\n"
    (tmp_path / "file").write_text("x")
    r = subprocess.run([shoal_bin, "serve", "--model-repository", str(tmp_path / "file"),
                        "--http-port", "0"], capture_output=True, text=True, timeout=60,
                       env=e2e.base_env())
    assert r.returncode == 2
    assert r.stderr == f"shoal serve: model repository {tmp_path / 'file'} is not a directory\n"


def test_the_repository_flag_is_required(shoal_bin):
    r = subprocess.run([shoal_bin, "serve"], capture_output=True, text=True, timeout=60,
                       env=e2e.base_env())
    assert r.returncode == 2
    assert "--model-repository is required" in r.stderr


def test_a_port_in_use_exits_1_naming_it(shoal_bin, repository):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = subprocess.run([shoal_bin, "serve", "--model-repository", str(repository),
                            "--http-port", str(port)], capture_output=True, text=True,
                           timeout=60, env=e2e.base_env())
    assert r.returncode == 1
    assert f"shoal serve: cannot listen on 127.0.0.1:{port}" in r.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_the_server_cleanly(shoal_bin, repository, tmp_path, sig):
    repo = tmp_path / "models"
    (repo / "identity" / "1").mkdir(parents=True)
    shutil.copy(repository / "identity" / "1" / "model.pt", repo / "identity" / "1")
    s = Server(shoal_bin, repo, tmp_path)
    try:
        s.wait_ready()
        assert s.infer("identity", [tensor("x", [1, 2], "INT64")])[0] == 200
        started = time.monotonic()
        assert s.stop(sig) == 0, s.stderr()
        assert time.monotonic() - started < 10
        name = "SIGTERM" if sig == signal.SIGTERM else "SIGINT"
        assert f"shoal serve: {name}, shutting down" in s.stderr()
    finally:
        s.kill()


# Authentication

def test_a_non_loopback_host_without_a_token_is_refused(shoal_bin, repository):
    r = subprocess.run([shoal_bin, "serve", "--model-repository", str(repository),
                        "--http-port", "0", "--host", "0.0.0.0"], capture_output=True,
                       text=True, timeout=60, env=e2e.base_env())
    assert r.returncode == 2
    assert ("shoal serve: --host 0.0.0.0 is not a loopback address, so callers must "
            "authenticate: give --token-file FILE") in r.stderr, r.stderr
    r = subprocess.run([shoal_bin, "serve", "--model-repository", str(repository),
                        "--http-port", "0", "--token-file", "/nonexistent/token"],
                       capture_output=True, text=True, timeout=60, env=e2e.base_env())
    assert r.returncode == 2
    assert "cannot read the token file /nonexistent/token" in r.stderr, r.stderr


def test_with_a_token_only_callers_that_send_it_are_answered(shoal_bin, repository, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token\n")
    repo = tmp_path / "models"
    (repo / "identity" / "1").mkdir(parents=True)
    shutil.copy(repository / "identity" / "1" / "model.pt", repo / "identity" / "1")
    s = Server(shoal_bin, repo, tmp_path, "--token-file", token_file)
    try:
        good = {"Authorization": "Bearer s3cret-token"}
        e2e.wait_until(lambda: s.request("GET", "/v2/health/ready", headers=good)[0] == 200, 120,
                       "the models to load")
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret-token"},
                        {"Authorization": "Bearer s3cret-token-and-more"}):
            status, body = s.request("GET", "/v2/health/live", headers=headers)
            assert status == 401 and "Authorization: Bearer" in body["error"], (headers, body)
            status, body = s.request("POST", "/v2/models/identity/infer",
                                     {"inputs": [tensor("x", [1, 2], "INT64")]}, headers=headers)
            assert status == 401, (headers, body)
        status, body = s.request("POST", "/v2/models/identity/infer",
                                 {"inputs": [tensor("x", [1, 2], "INT64")]}, headers=good)
        assert status == 200, body

        # A field's name in any case; of a field given twice, the first counts.
        def live(*fields):
            return raw_exchange(s.port, b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n" +
                                b"".join(f + b"\r\n" for f in fields) +
                                b"Connection: close\r\n\r\n")
        reply = live(b"authorization: Bearer s3cret-token")
        assert reply.startswith(b"HTTP/1.1 200"), reply[:100]
        reply = live(b"Authorization: Bearer s3cret-token", b"Authorization: Bearer wrong")
        assert reply.startswith(b"HTTP/1.1 200"), reply[:100]
        reply = live(b"Authorization: Bearer wrong", b"Authorization: Bearer s3cret-token")
        assert reply.startswith(b"HTTP/1.1 401"), reply[:100]
        assert "s3cret-token" not in s.stderr()
    finally:
        s.stop()
