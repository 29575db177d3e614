"""`shoal serve`: the KServe v2 gRPC service (inference.GRPCInferenceService) and the REST
binary tensor extension, on real TorchScript models.

The Python stubs are generated at test time from the repository's own .proto
(proto/inference/grpc_predict_v2.proto) with Debian's python3-grpc-tools, so the test speaks
exactly the wire the server was built from. Every answer is compared with the model run
directly here (torch), and the four ways to send a tensor (gRPC typed contents, gRPC raw
contents, REST JSON, REST binary) must give identical bytes.
"""

import http.client
import importlib
import json
import os
import shutil
import signal
import re
import socket
import subprocess
import sys
import threading
import time

import grpc
import pytest
import torch

import shoal_e2e as e2e
from test_serve import EXPORTER, TORCH_DTYPES, Server, load, output

MAX_REQUEST_BYTES = 6 << 20  # above the 4 MiB round trip, below the oversized request


@pytest.fixture(scope="module")
def pb(tmp_path_factory):
    """The generated modules: (messages, stubs)."""
    out = tmp_path_factory.mktemp("stubs")
    proto_root = e2e.REPO_ROOT / "proto"
    r = subprocess.run([e2e.PYTHON, "-m", "grpc_tools.protoc", f"-I{proto_root}",
                        f"--python_out={out}", f"--grpc_python_out={out}",
                        str(proto_root / "inference" / "grpc_predict_v2.proto")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"grpc_tools.protoc failed (python3-grpc-tools):\n{r.stderr}"
    sys.path.insert(0, str(out))
    try:
        messages = importlib.import_module("inference.grpc_predict_v2_pb2")
        stubs = importlib.import_module("inference.grpc_predict_v2_pb2_grpc")
    finally:
        sys.path.remove(str(out))
    return messages, stubs


class GrpcServer(Server):
    """A `shoal serve` with its gRPC port read from the second line it prints."""

    def __init__(self, shoal_bin, repository, out_dir, pb, *extra, metadata=None):
        super().__init__(shoal_bin, repository, out_dir, *extra)
        lines = e2e.wait_until(lambda: (lambda l: l if len(l) >= 2 else None)(
            self.stdout_path.read_text().splitlines()), 30, "the gRPC listening line")
        assert lines[1].startswith("shoal serve: listening on grpc://127.0.0.1:"), lines
        self.grpc_port = int(lines[1].rsplit(":", 1)[1])
        self.messages, stubs = pb
        self.channel = grpc.insecure_channel(
            f"127.0.0.1:{self.grpc_port}",
            options=[("grpc.max_receive_message_length", -1),
                     ("grpc.max_send_message_length", -1)])
        self.stub = stubs.GRPCInferenceServiceStub(self.channel)
        self.metadata = metadata

    def call(self, rpc, request, metadata=None):
        """The response of one RPC; raises grpc.RpcError."""
        return getattr(self.stub, rpc)(request, timeout=60,
                                       metadata=metadata if metadata is not None else self.metadata)

    def error(self, rpc, request, metadata=None):
        """(code, message) of an RPC that must fail."""
        with pytest.raises(grpc.RpcError) as failure:
            self.call(rpc, request, metadata)
        return failure.value.code(), failure.value.details()

    def close(self):
        self.channel.close()


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    repo = tmp_path_factory.mktemp("models")
    r = subprocess.run([e2e.PYTHON, str(EXPORTER), "--out", str(repo)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, f"export_models.py failed:\n{r.stderr}"
    (repo / "bad_config" / "1").mkdir(parents=True)
    (repo / "bad_config" / "1" / "model.pt").write_bytes((repo / "identity/1/model.pt").read_bytes())
    (repo / "bad_config" / "config.yaml").write_text("max_batch_size: -3\n")
    return repo


@pytest.fixture(scope="module")
def server(shoal_bin, repository, tmp_path_factory, pb):
    s = GrpcServer(shoal_bin, repository, tmp_path_factory.mktemp("serve"), pb,
                   "--max-request-bytes", MAX_REQUEST_BYTES)
    try:
        s.wait_ready()
        yield s
    finally:
        s.close()
        s.kill()


# ---------------------------------------------------------------------------------------------
# Tensors in each of the four forms

TYPED_FIELD = {"BOOL": "bool_contents", "UINT8": "uint_contents", "INT8": "int_contents",
               "INT16": "int_contents", "INT32": "int_contents", "INT64": "int64_contents",
               "FP32": "fp32_contents", "FP64": "fp64_contents"}


def raw_bytes(t):
    return t.contiguous().numpy().tobytes()


def from_raw(data, datatype, shape):
    dtype = TORCH_DTYPES[datatype]
    if not data:
        return torch.zeros(shape, dtype=dtype)
    return torch.frombuffer(bytearray(data), dtype=dtype).reshape(shape)


def infer_request(server, model, inputs, raw, version="", outputs=(), request_id=""):
    """A ModelInferRequest; `inputs` is [(name, tensor, datatype)]."""
    m = server.messages
    request = m.ModelInferRequest(model_name=model, model_version=version, id=request_id)
    for name, t, datatype in inputs:
        tensor = request.inputs.add(name=name, datatype=datatype, shape=list(t.shape))
        if raw:
            request.raw_input_contents.append(raw_bytes(t))
        else:
            getattr(tensor.contents, TYPED_FIELD[datatype]).extend(t.flatten().tolist())
    for name in outputs:
        request.outputs.add(name=name)
    return request


def grpc_outputs(response):
    """{name: tensor} of a ModelInferResponse, typed or raw."""
    result = {}
    for i, out in enumerate(response.outputs):
        shape = list(out.shape)
        if response.raw_output_contents:
            result[out.name] = from_raw(response.raw_output_contents[i], out.datatype, shape)
        else:
            values = list(getattr(out.contents, TYPED_FIELD[out.datatype]))
            result[out.name] = torch.tensor(values, dtype=TORCH_DTYPES[out.datatype]).reshape(shape)
        assert result[out.name].dtype == TORCH_DTYPES[out.datatype]
    return result


def grpc_infer(server, model, inputs, raw, **kwargs):
    response = server.call("ModelInfer", infer_request(server, model, inputs, raw, **kwargs))
    return response, grpc_outputs(response)


def http_exchange(port, path, body, headers):
    """(status, headers dict, body bytes) of one POST on a connection of its own."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", path, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


def rest_binary_infer(server, model, inputs, binary_outputs=True, json_inputs=()):
    """REST with the binary tensor extension: `inputs` as binary data after the JSON,
    `json_inputs` as JSON data, every output as binary. (status, {name: tensor} or error)."""
    header = {"inputs": [], "parameters": {"binary_data_output": binary_outputs}}
    tail = b""
    for name, t, datatype in inputs:
        data = raw_bytes(t)
        header["inputs"].append({"name": name, "shape": list(t.shape), "datatype": datatype,
                                 "parameters": {"binary_data_size": len(data)}})
        tail += data
    for name, t, datatype in json_inputs:
        header["inputs"].append({"name": name, "shape": list(t.shape), "datatype": datatype,
                                 "data": t.flatten().tolist()})
    head = json.dumps(header).encode()
    status, headers, body = http_exchange(
        server.port, f"/v2/models/{model}/infer", head + tail,
        {"Content-Type": "application/octet-stream",
         "Inference-Header-Content-Length": str(len(head))})
    if status != 200:
        return status, json.loads(body)
    json_size = int(headers["Inference-Header-Content-Length"])
    assert headers["Content-Type"] == "application/octet-stream", headers
    reply = json.loads(body[:json_size])
    offset = json_size
    result = {}
    for out in reply["outputs"]:
        size = out["parameters"]["binary_data_size"]
        assert "data" not in out, out
        result[out["name"]] = from_raw(body[offset:offset + size], out["datatype"], out["shape"])
        offset += size
    assert offset == len(body), (offset, len(body))
    return status, result


def rest_json_infer(server, model, inputs):
    status, body = server.infer(model, [{"name": n, "shape": list(t.shape), "datatype": d,
                                         "data": t.flatten().tolist()} for n, t, d in inputs])
    assert status == 200, body
    return {o["name"]: torch.tensor(o["data"], dtype=TORCH_DTYPES[o["datatype"]]).reshape(o["shape"])
            for o in body["outputs"]}


def all_four_ways(server, model, inputs):
    """{way: {output: tensor}} for gRPC typed, gRPC raw, REST JSON and REST binary."""
    _, typed = grpc_infer(server, model, inputs, raw=False)
    _, raw = grpc_infer(server, model, inputs, raw=True)
    status, binary = rest_binary_infer(server, model, inputs)
    assert status == 200, binary
    return {"grpc typed": typed, "grpc raw": raw, "rest json": rest_json_infer(server, model, inputs),
            "rest binary": binary}


def assert_identical(results):
    ways = list(results)
    first = results[ways[0]]
    for way in ways[1:]:
        assert sorted(results[way]) == sorted(first), (way, sorted(results[way]), sorted(first))
        for name, t in first.items():
            other = results[way][name]
            assert other.dtype == t.dtype and other.shape == t.shape, (way, name)
            assert torch.equal(other, t), (way, name, other, t)


# ---------------------------------------------------------------------------------------------
# Health and metadata


def test_server_live_ready_and_metadata(server):
    m = server.messages
    assert server.call("ServerLive", m.ServerLiveRequest()).live is True
    assert server.call("ServerReady", m.ServerReadyRequest()).ready is True
    meta = server.call("ServerMetadata", m.ServerMetadataRequest())
    assert meta.name == "shoal"
    assert meta.version == "0.1.0"
    assert list(meta.extensions) == ["binary_tensor_data", "statistics"]
    # REST lists the same extensions.
    assert server.get("/v2")[1]["extensions"] == ["binary_tensor_data", "statistics"]


def test_model_ready(server):
    m = server.messages
    assert server.call("ModelReady", m.ModelReadyRequest(name="mlp")).ready is True
    assert server.call("ModelReady", m.ModelReadyRequest(name="mlp", version="1")).ready is True
    # Refused: known, not ready (as REST's 400 {"ready": false}).
    assert server.call("ModelReady", m.ModelReadyRequest(name="bad_config")).ready is False
    assert server.error("ModelReady", m.ModelReadyRequest(name="mlp", version="7")) == (
        grpc.StatusCode.NOT_FOUND, "model 'mlp' has no version '7'; ready versions: 1, 2")
    code, message = server.error("ModelReady", m.ModelReadyRequest(name="nope"))
    assert code == grpc.StatusCode.NOT_FOUND
    assert message == ("unknown model 'nope'; the repository has: add_sub, bad_config, "
                       "batch_probe, identity, mlp")


def test_readiness_of_each_kind_of_version_agrees_over_rest_and_grpc(shoal_bin, repository,
                                                                        tmp_path, pb):
    """Issue 23, defect 8: a version that exists but does not serve answered /ready with 404,
    as if it did not exist, while docs/serving.md promised 400 {"ready": false, "error"}."""
    repo = tmp_path / "models"
    identity = (repository / "identity" / "1" / "model.pt").read_bytes()
    for version, content in ((1, identity), (2, identity), (3, b"not a TorchScript archive")):
        (repo / "m" / str(version)).mkdir(parents=True)
        (repo / "m" / str(version) / "model.pt").write_bytes(content)
    s = GrpcServer(shoal_bin, repo, tmp_path, pb)
    try:
        s.wait_ready()
        m = s.messages

        def grpc_ready(name, version=""):
            return s.call("ModelReady", m.ModelReadyRequest(name=name, version=version)).ready

        # Ready: the model, and version 2 (`latest` serves the highest that loads).
        assert s.get("/v2/models/m/ready") == (200, {"name": "m", "ready": True})
        assert s.get("/v2/models/m/versions/2/ready") == (200, {"name": "m", "ready": True})
        assert grpc_ready("m") is True and grpc_ready("m", "2") is True
        # Refused: version 3 failed to load.
        status, body = s.get("/v2/models/m/versions/3/ready")
        assert status == 400, body
        assert body["name"] == "m" and body["ready"] is False
        assert body["error"].startswith("model 'm' version 3 is not available: "), body
        assert grpc_ready("m", "3") is False
        # On disk, but not what the version policy serves.
        assert s.get("/v2/models/m/versions/1/ready") == (400, {
            "name": "m", "ready": False,
            "error": "model 'm' version 1 is not served: its version_policy serves version(s) 2"})
        assert grpc_ready("m", "1") is False
        # Unknown version, unknown model: 404 and NOT_FOUND.
        unknown_version = "model 'm' has no version '4'; ready versions: 2"
        assert s.get("/v2/models/m/versions/4/ready") == (404, {"error": unknown_version})
        assert s.error("ModelReady", m.ModelReadyRequest(name="m", version="4")) == (
            grpc.StatusCode.NOT_FOUND, unknown_version)
        unknown_model = "unknown model 'nope'; the repository has: m"
        assert s.get("/v2/models/nope/ready") == (404, {"error": unknown_model})
        assert s.get("/v2/models/nope/versions/1/ready") == (404, {"error": unknown_model})
        assert s.error("ModelReady", m.ModelReadyRequest(name="nope")) == (
            grpc.StatusCode.NOT_FOUND, unknown_model)
        assert s.error("ModelReady", m.ModelReadyRequest(name="nope", version="1")) == (
            grpc.StatusCode.NOT_FOUND, unknown_model)
    finally:
        s.close()
        s.kill()


def test_model_metadata(server):
    m = server.messages
    meta = server.call("ModelMetadata", m.ModelMetadataRequest(name="mlp"))
    assert meta.name == "mlp"
    assert list(meta.versions) == ["1", "2"]
    assert meta.platform == "pytorch_libtorch"
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.inputs] == [("x", "FP32", [-1, 16])]
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.outputs] == [("scores", "FP32", [-1, 4])]
    assert dict(meta.properties) == {"version": "2", "max_batch_size": "8", "instances": "1",
                                     "threads_per_instance": meta.properties["threads_per_instance"]}
    assert int(meta.properties["threads_per_instance"]) >= 1
    meta = server.call("ModelMetadata", m.ModelMetadataRequest(name="mlp", version="1"))
    assert meta.properties["version"] == "1"
    # No config: the forward arguments, any datatype and shape.
    meta = server.call("ModelMetadata", m.ModelMetadataRequest(name="add_sub"))
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.inputs] == [("a", "", []), ("b", "", [])]
    assert list(meta.outputs) == []
    # Errors are REST's, as gRPC codes.
    for request, path in ((m.ModelMetadataRequest(name="nope"), "/v2/models/nope"),
                          (m.ModelMetadataRequest(name="mlp", version="x"), "/v2/models/mlp/versions/x"),
                          (m.ModelMetadataRequest(name="bad_config"), "/v2/models/bad_config")):
        status, body = server.get(path)
        assert status == 404
        assert server.error("ModelMetadata", request) == (grpc.StatusCode.NOT_FOUND, body["error"])


# ---------------------------------------------------------------------------------------------
# Inference: gRPC typed and raw, REST JSON and binary give the same bytes, equal to torch


def test_mlp_outputs_are_identical_every_way_and_equal_the_model_in_python(server, repository):
    torch.manual_seed(0)
    x = torch.randn(3, 16)
    for version in (1, 2):
        with torch.inference_mode():
            expected = load(repository, "mlp", version)(x)
        response, typed = grpc_infer(server, "mlp", [("x", x, "FP32")], raw=False,
                                     version=str(version), request_id=f"v{version}")
        assert response.model_name == "mlp" and response.model_version == str(version)
        assert response.id == f"v{version}"
        assert torch.allclose(typed["scores"], expected, rtol=1e-5, atol=1e-6)
    # Unversioned: the newest, the same way over every front end.
    results = all_four_ways(server, "mlp", [("x", x, "FP32")])
    assert_identical(results)
    with torch.inference_mode():
        expected = load(repository, "mlp", 2)(x)
    assert torch.allclose(results["grpc raw"]["scores"], expected, rtol=1e-5, atol=1e-6)


def test_named_outputs_and_several_inputs_every_way(server, repository):
    a = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    b = torch.tensor([[0.5, 0.25], [-1.0, 8.0]])
    expected = load(repository, "add_sub")(a, b)
    results = all_four_ways(server, "add_sub", [("b", b, "FP32"), ("a", a, "FP32")])
    assert_identical(results)
    for name in ("sum", "difference"):
        assert torch.equal(results["grpc typed"][name], expected[name])
    # The outputs parameter selects and orders.
    response, outs = grpc_infer(server, "add_sub", [("a", a, "FP32"), ("b", b, "FP32")], raw=True,
                                outputs=["difference"])
    assert [o.name for o in response.outputs] == ["difference"]
    assert torch.equal(outs["difference"], expected["difference"])


@pytest.mark.parametrize("datatype,values", [
    ("FP32", [[1.5, -2.25], [3.0, 4.125]]), ("FP64", [1e300, -1e-300]),
    ("INT64", [[-9223372036854775808, 9223372036854775807]]), ("INT32", [-5, 2147483647]),
    ("INT16", [-32768, 32767]), ("INT8", [-128, 127]), ("UINT8", [0, 255]),
    ("BOOL", [[True, False], [False, True]])])
def test_identity_returns_every_datatype_unchanged_every_way(server, datatype, values):
    x = torch.tensor(values, dtype=TORCH_DTYPES[datatype])
    results = all_four_ways(server, "identity", [("x", x, datatype)])
    assert_identical(results)
    assert torch.equal(results["grpc typed"]["output__0"], x)
    # Raw in, raw out; typed in, typed out.
    response, _ = grpc_infer(server, "identity", [("x", x, datatype)], raw=True)
    assert len(response.raw_output_contents) == 1 and not response.outputs[0].HasField("contents")
    response, _ = grpc_infer(server, "identity", [("x", x, datatype)], raw=False)
    assert not response.raw_output_contents and response.outputs[0].HasField("contents")


def test_a_4_mib_tensor_round_trips_over_grpc_and_rest_binary(server):
    torch.manual_seed(3)
    x = torch.randn(1024, 1100)  # 4.3 MiB
    assert x.numel() * 4 > 4 << 20
    _, raw = grpc_infer(server, "identity", [("x", x, "FP32")], raw=True)
    assert torch.equal(raw["output__0"], x)
    _, typed = grpc_infer(server, "identity", [("x", x, "FP32")], raw=False)
    assert torch.equal(typed["output__0"], x)
    status, binary = rest_binary_infer(server, "identity", [("x", x, "FP32")])
    assert status == 200, binary
    assert torch.equal(binary["output__0"], x)


def test_rest_binary_mixes_binary_and_json_inputs_and_outputs(server, repository):
    a = torch.tensor([[1.0, 2.0]])
    b = torch.tensor([[4.0, -1.0]])
    expected = load(repository, "add_sub")(a, b)
    header = {"inputs": [
        {"name": "a", "shape": [1, 2], "datatype": "FP32", "parameters": {"binary_data_size": 8}},
        {"name": "b", "shape": [1, 2], "datatype": "FP32", "data": b.flatten().tolist()}],
        "outputs": [{"name": "sum", "parameters": {"binary_data": True}}, {"name": "difference"}]}
    head = json.dumps(header).encode()
    status, headers, body = http_exchange(
        server.port, "/v2/models/add_sub/infer", head + raw_bytes(a),
        {"Inference-Header-Content-Length": str(len(head))})
    assert status == 200, body
    json_size = int(headers["Inference-Header-Content-Length"])
    reply = json.loads(body[:json_size])
    assert [o["name"] for o in reply["outputs"]] == ["sum", "difference"]
    assert reply["outputs"][0]["parameters"] == {"binary_data_size": 8}
    assert torch.equal(from_raw(body[json_size:], "FP32", [1, 2]), expected["sum"])
    assert torch.equal(torch.tensor(reply["outputs"][1]["data"]).reshape(1, 2),
                       expected["difference"])
    # The header's name in any case.
    status, headers, body = http_exchange(
        server.port, "/v2/models/add_sub/infer", head + raw_bytes(a),
        {"inference-header-content-length": str(len(head))})
    assert status == 200, body
    assert int(headers["Inference-Header-Content-Length"]) == json_size
    # No output asked binary: plain JSON, no header.
    header["outputs"] = [{"name": "sum"}]
    head = json.dumps(header).encode()
    status, headers, body = http_exchange(
        server.port, "/v2/models/add_sub/infer", head + raw_bytes(a),
        {"Inference-Header-Content-Length": str(len(head))})
    assert status == 200 and headers["Content-Type"] == "application/json", (status, headers)
    assert "Inference-Header-Content-Length" not in headers
    assert json.loads(body)["outputs"][0]["data"] == expected["sum"].flatten().tolist()


# ---------------------------------------------------------------------------------------------
# Errors: REST's message, as a gRPC code


X16 = torch.zeros(1, 16)


# (model, version, inputs, requested outputs, gRPC code, REST status)
SAME_ERRORS = [
    ("nope", "", [("x", X16, "FP32")], [], grpc.StatusCode.NOT_FOUND, 404),
    ("mlp", "3", [("x", X16, "FP32")], [], grpc.StatusCode.NOT_FOUND, 404),
    ("mlp", "latest", [("x", X16, "FP32")], [], grpc.StatusCode.NOT_FOUND, 404),
    ("bad_config", "", [("x", X16, "FP32")], [], grpc.StatusCode.NOT_FOUND, 404),
    ("mlp", "", [("y", X16, "FP32")], [], grpc.StatusCode.INVALID_ARGUMENT, 400),
    ("add_sub", "", [("a", torch.ones(1), "FP32")], [], grpc.StatusCode.INVALID_ARGUMENT, 400),
    ("mlp", "", [("x", X16.double(), "FP64")], [], grpc.StatusCode.INVALID_ARGUMENT, 400),
    ("mlp", "", [("x", torch.zeros(1, 15), "FP32")], [], grpc.StatusCode.INVALID_ARGUMENT, 400),
    ("mlp", "", [("x", torch.zeros(9, 16), "FP32")], [], grpc.StatusCode.INVALID_ARGUMENT, 400),
    ("mlp", "", [("x", torch.zeros(16), "FP32")], [], grpc.StatusCode.INVALID_ARGUMENT, 400),
    ("mlp", "", [("x", X16, "FP32")], ["probs"], grpc.StatusCode.INVALID_ARGUMENT, 400),
    ("identity", "", [("x", torch.ones(1, dtype=torch.int64), "INT64")], ["probs"],
     grpc.StatusCode.INVALID_ARGUMENT, 400),
    # Mismatched shapes reach add_sub (no config), which fails.
    ("add_sub", "", [("a", torch.ones(2), "FP32"), ("b", torch.ones(3), "FP32")], [],
     grpc.StatusCode.INTERNAL, 500),
]


@pytest.mark.parametrize("model,version,inputs,outputs,code,http_status", SAME_ERRORS)
def test_errors_carry_the_rest_message_with_a_grpc_code(server, model, version, inputs, outputs,
                                                        code, http_status):
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"
    body = {"inputs": [{"name": n, "shape": list(t.shape), "datatype": d,
                        "data": t.flatten().tolist()} for n, t, d in inputs]}
    if outputs:
        body["outputs"] = [{"name": n} for n in outputs]
    status, rest = server.request("POST", path, body)
    assert status == http_status, rest
    for raw in (False, True):
        request = infer_request(server, model, inputs, raw, version=version, outputs=outputs)
        assert server.error("ModelInfer", request) == (code, rest["error"]), raw


def test_malformed_grpc_requests_are_invalid_argument_saying_what(server):
    m = server.messages
    cases = []
    r = m.ModelInferRequest(model_name="mlp")
    cases.append((r, "'inputs' is required: a non-empty list of {name, shape, datatype, contents}"))
    r = infer_request(server, "mlp", [("x", X16, "FP32")], raw=False)
    del r.inputs[0].contents.fp32_contents[3:]
    cases.append((r, "inputs[0] (x): shape [1,16] needs 16 values, contents.fp32_contents has 3"))
    r = infer_request(server, "mlp", [("x", X16, "FP32")], raw=False)
    r.inputs[0].contents.ClearField("fp32_contents")
    r.inputs[0].contents.fp64_contents.extend([0.0] * 16)
    cases.append((r, "inputs[0] (x): FP32 values go in contents.fp32_contents; got 16 in "
                     "contents.fp64_contents"))
    r = infer_request(server, "mlp", [("x", X16, "FP32")], raw=False)
    r.inputs[0].datatype = "FP16"
    cases.append((r, "inputs[0] (x): datatype 'FP16' is not supported; supported: BOOL, UINT8, "
                     "INT8, INT16, INT32, INT64, FP32, FP64"))
    r = infer_request(server, "identity", [("x", torch.tensor([1, 2], dtype=torch.int32), "INT8")],
                      raw=False)
    r.inputs[0].contents.int_contents[1] = 300
    cases.append((r, "inputs[0] (x): contents.int_contents[1] is out of range for INT8: 300"))
    r = infer_request(server, "mlp", [("x", X16, "FP32")], raw=True)
    r.raw_input_contents[0] = r.raw_input_contents[0][:-1]
    cases.append((r, "inputs[0] (x): raw_input_contents[0] has 63 bytes, but shape [1,16] of FP32 "
                     "needs 64"))
    r = infer_request(server, "add_sub", [("a", X16, "FP32"), ("b", X16, "FP32")], raw=True)
    del r.raw_input_contents[1]
    cases.append((r, "raw_input_contents has 1 entries for 2 inputs; give one per input, in the "
                     "order of 'inputs'"))
    r = infer_request(server, "add_sub", [("a", X16, "FP32"), ("b", X16, "FP32")], raw=True)
    r.inputs[1].contents.fp32_contents.extend([0.0] * 16)
    cases.append((r, "inputs[1] (b): has contents.fp32_contents, but the request sends its "
                     "tensors in raw_input_contents; send every input one way"))
    r = infer_request(server, "identity", [("x", torch.tensor([True, False]), "BOOL")], raw=True)
    r.raw_input_contents[0] = b"\x01\x05"
    cases.append((r, "inputs[0] (x): BOOL element 1 is the byte 5; BOOL elements are one byte, "
                     "0 (false) or 1 (true)"))
    r = infer_request(server, "mlp", [("x", X16, "FP32")], raw=True)
    r.inputs[0].shape[:] = [4611686018427387904, 4]
    cases.append((r, "inputs[0] (x): shape [4611686018427387904,4] is too large"))
    r = infer_request(server, "identity", [("x", X16, "FP32"), ("x", X16, "FP32")], raw=False)
    cases.append((r, "inputs[1] (x): input 'x' is given twice"))
    for request, message in cases:
        assert server.error("ModelInfer", request) == (grpc.StatusCode.INVALID_ARGUMENT, message)


def identity_inference_count(server):
    status, body = server.get("/v2/models/identity/versions/1/stats")
    assert status == 200, body
    stats = body["model_stats"][0]
    return stats["inference_count"], stats["inference_stats"]["fail"]["count"]


def test_a_tensor_whose_data_does_not_match_its_shape_is_refused_before_the_model(server):
    """Issue 23, defect 8: JSON data nested otherwise than its shape reached the model. Every
    way of sending a tensor refuses data that does not match its shape with 400 or
    INVALID_ARGUMENT naming the input, and the model (identity, which takes any shape, so
    nothing after the decoder would notice) never sees it."""
    before = identity_inference_count(server)
    how_to = ("(nested data follows the shape; or send the [2,2] tensor's values flat, in "
              "row-major order)")
    json_cases = [
        ([[1, 2, 3], [4]], f"data[0] has 3 entries, but shape [2,2] needs 2 at dimension 1 {how_to}"),
        ([[1, 2], [3]], f"data[1] has 1 entries, but shape [2,2] needs 2 at dimension 1 {how_to}"),
        ([[[1], [2]], [[3], [4]]], "data[0][0] is a list, but shape [2,2] has 2 dimensions: data "
                                   f"is nested deeper than the shape {how_to}"),
        ([[1, 2, 3, 4]], f"data has 1 entries, but shape [2,2] needs 2 at dimension 0 {how_to}"),
        ([1, 2, 3], "shape [2,2] needs 4 values, data has 3"),
    ]
    for data, message in json_cases:
        status, body = server.infer("identity", [{"name": "x", "shape": [2, 2],
                                                  "datatype": "FP32", "data": data}])
        assert (status, body) == (400, {"error": f"inputs[0] (x): {message}"}), data
    # The binary tensor extension: a binary_data_size that is not the shape's.
    head = json.dumps({"inputs": [{"name": "x", "shape": [2, 2], "datatype": "FP32",
                                   "parameters": {"binary_data_size": 12}}]}).encode()
    status, _, reply = http_exchange(server.port, "/v2/models/identity/infer", head + bytes(12),
                                     {"Inference-Header-Content-Length": str(len(head))})
    assert (status, json.loads(reply)) == (400, {
        "error": "inputs[0] (x): binary_data_size is 12, but shape [2,2] of FP32 is 16 bytes"})
    # gRPC: raw contents of the wrong size, typed contents of the wrong count.
    x = torch.ones(2, 2)
    raw = infer_request(server, "identity", [("x", x, "FP32")], raw=True)
    raw.raw_input_contents[0] = raw.raw_input_contents[0][:12]
    assert server.error("ModelInfer", raw) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "inputs[0] (x): raw_input_contents[0] has 12 bytes, but shape [2,2] of FP32 needs 16")
    typed = infer_request(server, "identity", [("x", x, "FP32")], raw=False)
    typed.inputs[0].contents.fp32_contents.append(5.0)
    assert server.error("ModelInfer", typed) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "inputs[0] (x): shape [2,2] needs 4 values, contents.fp32_contents has 5")
    assert identity_inference_count(server) == before
    # What does match its shape, nested or flat, still runs.
    for data in ([[1, 2], [3, 4]], [1, 2, 3, 4]):
        status, body = server.infer("identity", [{"name": "x", "shape": [2, 2],
                                                  "datatype": "FP32", "data": data}])
        assert status == 200 and output(body, "output__0")["data"] == [1, 2, 3, 4], body


def test_an_oversized_grpc_message_is_resource_exhausted_and_the_server_goes_on(server):
    big = torch.zeros(MAX_REQUEST_BYTES // 4 + 1024)
    code, message = server.error("ModelInfer",
                                 infer_request(server, "identity", [("x", big, "FP32")], raw=True))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert str(MAX_REQUEST_BYTES) in message, message
    _, outs = grpc_infer(server, "identity", [("x", torch.ones(2), "FP32")], raw=True)
    assert torch.equal(outs["output__0"], torch.ones(2))


def rss_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS in /proc/{pid}/status")


# Sequential calls of this many bytes each way: large enough that gRPC moves them in many
# slices, as the 60 MB ones (scripts measured 40 x 60 MB, docs/serving.md).
LARGE_CALL_BYTES = 16 << 20
LARGE_CALLS = 24


def test_memory_returns_after_a_load_of_large_grpc_calls(shoal_bin, repository, tmp_path, pb):
    """Issue 23, defect 8: after 40 sequential 60 MB ModelInfer calls the server's RSS rose from
    245 MB to 1.27 GB and stayed there. After a load of large calls, RSS must come back to
    near what it was before (a few calls' worth of slack for what gRPC and libtorch cache)."""
    s = GrpcServer(shoal_bin, repository, tmp_path, pb,
                   "--max-request-bytes", LARGE_CALL_BYTES + (1 << 20))
    try:
        s.wait_ready()
        x = torch.arange(LARGE_CALL_BYTES // 4, dtype=torch.float32)
        request = infer_request(s, "identity", [("x", x, "FP32")], raw=True)
        small = infer_request(s, "identity", [("x", torch.ones(4), "FP32")], raw=True)
        s.call("ModelInfer", small)  # the first call's one-off set-up is not the load's
        baseline = rss_bytes(s.proc.pid)
        peak = baseline
        for _ in range(LARGE_CALLS):
            response = s.call("ModelInfer", request)
            assert len(response.raw_output_contents[0]) == LARGE_CALL_BYTES
            peak = max(peak, rss_bytes(s.proc.pid))
        del response
        bound = baseline + 3 * LARGE_CALL_BYTES
        # gRPC frees a call's buffers once the response is sent, on its own threads: a short
        # idle poll.
        after = rss_bytes(s.proc.pid)
        deadline = time.monotonic() + 10
        while after >= bound and time.monotonic() < deadline:
            time.sleep(0.1)
            after = rss_bytes(s.proc.pid)
        print(f"VmRSS before {baseline >> 20} MiB, peak {peak >> 20} MiB, after the load "
              f"{after >> 20} MiB ({LARGE_CALLS} calls of {LARGE_CALL_BYTES >> 20} MiB)")
        assert after < bound, (
            f"VmRSS stayed at {after >> 20} MiB after the load, from {baseline >> 20} MiB before "
            f"(bound {bound >> 20} MiB)")
        s.call("ModelInfer", small)  # and it still answers
    finally:
        s.close()
        s.kill()


@pytest.mark.parametrize("body,json_size,message", [
    (b'{"inputs": []}', "99",
     "the header Inference-Header-Content-Length says the JSON is 99 bytes, but the body has "
     "only 14"),
    (b'{"inputs": []}', "x1",
     "the header Inference-Header-Content-Length must be the length in bytes of the JSON at the "
     "start of the body, an integer; got 'x1'"),
    (b'{"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32", '
     b'"parameters": {"binary_data_size": 60}}]}' + bytes(60), "105",
     "inputs[0] (x): binary_data_size is 60, but shape [1,16] of FP32 is 64 bytes"),
    (b'{"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32", '
     b'"parameters": {"binary_data_size": 64}}]}' + bytes(60), "105",
     "inputs[0] (x): binary_data_size 64 runs past the end of the body: 60 bytes of binary data "
     "are left after the JSON (105 bytes) and the inputs before this one"),
    (b'{"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32", '
     b'"parameters": {"binary_data_size": 64}}]}' + bytes(70), "105",
     "the body has 70 bytes after the JSON (105 bytes, Inference-Header-Content-Length), but the "
     "inputs' binary_data_size add up to 64"),
    (b'{"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32", '
     b'"parameters": {"binary_data_size": 64}}]}', None,
     "inputs[0] (x): binary_data_size needs the header Inference-Header-Content-Length (the "
     "length of the JSON, which the binary data follows)"),
])
def test_malformed_binary_rest_requests_get_400_saying_what(server, body, json_size, message):
    if json_size == "105":
        assert body.index(b"}]}") + 3 == 105  # the JSON is exactly 105 bytes
    headers = {"Content-Type": "application/octet-stream"}
    if json_size is not None:
        headers["Inference-Header-Content-Length"] = json_size
    status, _, reply = http_exchange(server.port, "/v2/models/mlp/infer", body, headers)
    assert (status, json.loads(reply)) == (400, {"error": message})


# ---------------------------------------------------------------------------------------------
# One model manager: gRPC and REST requests batch together


def test_grpc_and_rest_requests_are_batched_together(server):
    per_front = 4
    for attempt in range(5):
        _, before = server.get("/v2/models/batch_probe/stats")
        results = {}
        barrier = threading.Barrier(2 * per_front)

        def via_grpc(i):
            barrier.wait()
            _, outs = grpc_infer(server, "batch_probe",
                                 [("x", torch.tensor([[float(i), 0.5]]), "FP32")], raw=True)
            results[("grpc", i)] = outs

        def via_rest(i):
            barrier.wait()
            status, body = server.infer("batch_probe", [{"name": "x", "shape": [1, 2],
                                                         "datatype": "FP32",
                                                         "data": [float(100 + i), 0.5]}])
            assert status == 200, body
            results[("rest", i)] = {o["name"]: torch.tensor(o["data"]).reshape(o["shape"])
                                    for o in body["outputs"]}

        threads = [threading.Thread(target=f, args=(i,)) for i in range(per_front)
                   for f in (via_grpc, via_rest)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(results) == 2 * per_front
        for (front, i), outs in results.items():  # each got its own row back
            base = float(i) if front == "grpc" else float(100 + i)
            assert outs["doubled"].flatten().tolist() == [2 * base, 1.0], (front, i, outs)
        rows = [int(outs["batch_rows"].flatten()[0]) for outs in results.values()]
        # A batch of more rows than one front end sent holds requests of both.
        if max(rows) > per_front:
            _, after = server.get("/v2/models/batch_probe/stats")
            runs = (after["model_stats"][0]["execution_count"]
                    - before["model_stats"][0]["execution_count"])
            assert runs < 2 * per_front
            return
    pytest.fail(f"no batch mixed gRPC and REST requests in 5 rounds (last batch sizes {rows})")


# ---------------------------------------------------------------------------------------------
# Robustness


def test_bad_grpc_requests_do_not_disturb_others(server, repository):
    x = torch.randn(2, 16)
    with torch.inference_mode():
        expected = load(repository, "mlp", 2)(x)
    failures = []
    stop = threading.Event()

    def good_traffic():
        while not stop.is_set():
            try:
                _, outs = grpc_infer(server, "mlp", [("x", x, "FP32")], raw=True)
                if not torch.allclose(outs["scores"], expected, rtol=1e-5, atol=1e-6):
                    failures.append(outs)
            except grpc.RpcError as e:
                failures.append((e.code(), e.details()))

    worker = threading.Thread(target=good_traffic)
    worker.start()
    try:
        # Bytes that are no ModelInferRequest, through a method that sends them as they are.
        garbage = server.channel.unary_unary(
            "/inference.GRPCInferenceService/ModelInfer",
            request_serializer=lambda b: b, response_deserializer=lambda b: b)
        # gRPC's callback API answers a message it cannot parse with UNIMPLEMENTED and no
        # message, before any handler runs (docs/serving.md, gRPC errors).
        for payload in (b"\xff" * 100, b"\x0a\xff\xff\xff\xff\x0f"):
            with pytest.raises(grpc.RpcError) as failure:
                garbage(payload, timeout=30)
            assert failure.value.code() == grpc.StatusCode.UNIMPLEMENTED, failure.value
        # Parses: three inputs named abc, for the model ''.
        with pytest.raises(grpc.RpcError) as failure:
            garbage(b"\x2a\x05\x0a\x03abc" * 3, timeout=30)
        assert failure.value.code() == grpc.StatusCode.NOT_FOUND
        assert failure.value.details().startswith("unknown model ''; the repository has: ")
        unknown = server.channel.unary_unary("/inference.GRPCInferenceService/RepositoryIndex",
                                             request_serializer=lambda b: b,
                                             response_deserializer=lambda b: b)
        with pytest.raises(grpc.RpcError) as failure:
            unknown(b"", timeout=30)
        assert failure.value.code() == grpc.StatusCode.UNIMPLEMENTED
        for _ in range(20):
            # A shape claiming 2^40 rows with 64 bytes of data.
            r = infer_request(server, "mlp", [("x", X16, "FP32")], raw=True)
            r.inputs[0].shape[:] = [2 ** 40, 16]
            server.error("ModelInfer", r)
        with socket.create_connection(("127.0.0.1", server.grpc_port), timeout=5) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b"\x00" * 1000)
    finally:
        stop.set()
        worker.join()
    assert not failures, failures[:3]
    assert server.proc.poll() is None, server.stderr()


# ---------------------------------------------------------------------------------------------
# The command: ports, token, shutdown


def small_repository(repository, tmp_path):
    repo = tmp_path / "models"
    (repo / "identity" / "1").mkdir(parents=True)
    shutil.copy(repository / "identity" / "1" / "model.pt", repo / "identity" / "1")
    return repo


def test_a_grpc_port_in_use_exits_1_naming_it(shoal_bin, repository, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = subprocess.run([shoal_bin, "serve", "--model-repository",
                            str(small_repository(repository, tmp_path)), "--http-port", "0",
                            "--grpc-port", str(port)], capture_output=True, text=True,
                           timeout=60, env=e2e.base_env())
    assert r.returncode == 1, r.stderr
    assert f"shoal serve: cannot listen for gRPC on 127.0.0.1:{port}" in r.stderr, r.stderr
    # Shoal's message, not gRPC's own log line ("E1205 06:00:00.000 ... chttp2_server.cc").
    grpc_lines = [l for l in r.stderr.splitlines() if re.match(r"[EWID]\d{4} ", l) or "chttp2" in l]
    assert not grpc_lines, r.stderr


def test_two_servers_cannot_share_a_grpc_port(shoal_bin, repository, tmp_path, pb):
    repo = small_repository(repository, tmp_path)
    first = GrpcServer(shoal_bin, repo, tmp_path, pb)
    try:
        r = subprocess.run([shoal_bin, "serve", "--model-repository", str(repo), "--http-port",
                            "0", "--grpc-port", str(first.grpc_port)], capture_output=True,
                           text=True, timeout=60, env=e2e.base_env())
        assert r.returncode == 1, r.stderr
        assert f"cannot listen for gRPC on 127.0.0.1:{first.grpc_port}" in r.stderr
    finally:
        first.close()
        first.kill()


def test_with_a_token_every_rpc_needs_it(shoal_bin, repository, tmp_path, pb):
    token_file = tmp_path / "token"
    token_file.write_text("grpc-s3cret\n")
    s = GrpcServer(shoal_bin, small_repository(repository, tmp_path), tmp_path, pb,
                   "--token-file", token_file)
    try:
        m = s.messages
        good = [("authorization", "Bearer grpc-s3cret")]
        e2e.wait_until(lambda: s.call("ServerReady", m.ServerReadyRequest(), good).ready, 120,
                       "the models to load")
        x = torch.tensor([1, 2], dtype=torch.int64)
        calls = [("ServerLive", m.ServerLiveRequest()), ("ServerReady", m.ServerReadyRequest()),
                 ("ServerMetadata", m.ServerMetadataRequest()),
                 ("ModelReady", m.ModelReadyRequest(name="identity")),
                 ("ModelMetadata", m.ModelMetadataRequest(name="identity")),
                 ("ModelInfer", infer_request(s, "identity", [("x", x, "INT64")], raw=True))]
        for metadata in ([], [("authorization", "Bearer wrong")],
                         [("authorization", "grpc-s3cret")],
                         [("authorization", "Bearer grpc-s3cret-and-more")]):
            for rpc, request in calls:
                code, message = s.error(rpc, request, metadata)
                assert code == grpc.StatusCode.UNAUTHENTICATED, (rpc, metadata, code)
                assert message == ("this server needs its token: send the metadata "
                                   "authorization: Bearer <token>")
        for rpc, request in calls:
            s.call(rpc, request, good)
        response = s.call("ModelInfer", calls[-1][1], good)
        assert torch.equal(grpc_outputs(response)["output__0"], x)
        assert "grpc-s3cret" not in s.stderr()
    finally:
        s.close()
        s.stop()


def test_sigterm_stops_a_server_answering_grpc(shoal_bin, repository, tmp_path, pb):
    s = GrpcServer(shoal_bin, small_repository(repository, tmp_path), tmp_path, pb)
    try:
        s.wait_ready()
        x = torch.ones(3)
        _, outs = grpc_infer(s, "identity", [("x", x, "FP32")], raw=False)
        assert torch.equal(outs["output__0"], x)
        s.close()
        assert s.stop(signal.SIGTERM) == 0, s.stderr()
        assert "shoal serve: SIGTERM, shutting down" in s.stderr()
    finally:
        s.kill()


class SlowToWarmUp(torch.nn.Module):
    """One pass over x per row of x: a warmup with many rows keeps the model loading."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x
        for _ in range(x.size(0)):
            y = torch.sin(y)
        return y


def test_while_a_model_loads_it_is_unavailable_and_not_ready(shoal_bin, tmp_path, pb):
    repo = tmp_path / "models"
    (repo / "slow" / "1").mkdir(parents=True)
    torch.jit.script(SlowToWarmUp()).save(str(repo / "slow" / "1" / "model.pt"))
    # About a minute of warmup here (2.8 s a run): the calls below are made while it runs,
    # and the server is killed before it ends.
    (repo / "slow" / "config.yaml").write_text(
        "inputs: [{name: x, datatype: FP32, dims: [-1, 1]}]\n"
        "warmup:\n  - count: 20\n    inputs: {x: {dims: [50000, 1], fill: one}}\n")
    s = GrpcServer(shoal_bin, repo, tmp_path, pb)
    try:
        m = s.messages
        assert s.call("ServerReady", m.ServerReadyRequest()).ready is False
        assert s.call("ModelReady", m.ModelReadyRequest(name="slow")).ready is False
        request = infer_request(s, "slow", [("x", torch.ones(2, 1), "FP32")], raw=True)
        assert s.error("ModelInfer", request) == (grpc.StatusCode.UNAVAILABLE,
                                                  "model 'slow' is still loading")
        assert s.error("ModelMetadata", m.ModelMetadataRequest(name="slow")) == (
            grpc.StatusCode.UNAVAILABLE, "model 'slow' is still loading")
        status, body = s.infer("slow", [{"name": "x", "shape": [2, 1], "datatype": "FP32",
                                         "data": [1, 2]}])
        assert (status, body) == (503, {"error": "model 'slow' is still loading"})
        # Still loading after all that: the answers above were not a race with the end of it.
        assert s.call("ServerReady", m.ServerReadyRequest()).ready is False
    finally:
        s.close()
        s.kill()
