"""`shoal serve`'s GET /metrics: Prometheus text counting REST and gRPC requests per model and
version, checked against the requests this test sends."""

import http.client
import threading

import grpc
import pytest
import torch

from test_serve_grpc import GrpcServer, infer_request, pb  # noqa: F401 (pb is a fixture)
import shoal_e2e as e2e
from test_serve_swap import CONFIG, Constant, model_bytes, publish

FAILS_CONFIG = "inputs: [{name: x, datatype: FP32, dims: [1]}]\n"
# A lone request waits up to 3 s in the queue for others to batch with: in flight meanwhile.
HELD_CONFIG = CONFIG + "max_batch_size: 8\nbatch_delay_us: 3000000\n"


class FailsOnPositive(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if bool(x.sum() > 0):
            raise RuntimeError("positive input")
        return x


def scrape(server):
    """(content type, {"name{labels}": value}) of GET /metrics."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request("GET", "/metrics")
        response = conn.getresponse()
        text = response.read().decode()
        assert response.status == 200, text
    finally:
        conn.close()
    samples = {}
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        key, value = line.rsplit(" ", 1)
        assert key not in samples, f"sample {key} given twice"
        samples[key] = float(value)
    return response.getheader("Content-Type"), text, samples


def labels(model, version, **extra):
    inner = f'model="{model}",version="{version}"'
    for k, v in extra.items():
        inner += f',{k}="{v}"'
    return "{" + inner + "}"


@pytest.fixture
def server(shoal_bin, tmp_path, pb):  # noqa: F811
    repo = tmp_path / "models"
    (repo / "swap").mkdir(parents=True)
    (repo / "swap" / "config.yaml").write_text(CONFIG)
    publish(repo / "swap", 1, model_bytes(Constant(1.0), tmp_path))
    (repo / "fails").mkdir()
    (repo / "fails" / "config.yaml").write_text(FAILS_CONFIG)
    publish(repo / "fails", 1, model_bytes(FailsOnPositive(), tmp_path))
    (repo / "held").mkdir()
    (repo / "held" / "config.yaml").write_text(HELD_CONFIG)
    publish(repo / "held", 1, model_bytes(Constant(5.0), tmp_path))
    out = tmp_path / "serve"
    out.mkdir()
    s = GrpcServer(shoal_bin, repo, out, pb, "--repository-poll-ms", 0)
    s.repo = repo
    try:
        s.wait_ready()
        yield s
    finally:
        s.close()
        s.kill()


def rest(server, model, value, datatype="FP32"):
    status, body = server.infer(model, [{"name": "x", "datatype": datatype, "shape": [1],
                                         "data": [value]}])
    return status


def test_metrics_count_rest_and_grpc_requests_per_model_and_version(server, tmp_path):
    content_type, text, samples = scrape(server)
    assert content_type == "text/plain; version=0.0.4; charset=utf-8"
    swap = labels("swap", 1)
    assert samples[f"shoal_inference_request_success_total{swap}"] == 0
    assert "# TYPE shoal_inference_request_duration_seconds histogram" in text

    for _ in range(3):
        assert rest(server, "swap", 0.0) == 200
    for _ in range(2):
        server.call("ModelInfer",
                    infer_request(server, "swap", [("x", torch.zeros(1), "FP32")], raw=True))
    assert rest(server, "swap", 1, datatype="INT32") == 400  # refused by the version's checks
    assert rest(server, "fails", 0.0) == 200
    assert rest(server, "fails", 1.0) == 500  # fails in the model
    assert rest(server, "fails", 2.0) == 500
    assert rest(server, "nope", 0.0) == 404  # no model, no version: not counted anywhere

    _, text, samples = scrape(server)
    fails = labels("fails", 1)
    assert samples[f"shoal_inference_request_success_total{swap}"] == 5
    assert samples[f"shoal_inference_request_failure_total{swap}"] == 1
    assert samples[f"shoal_inference_count_total{swap}"] == 5
    assert samples[f"shoal_inference_exec_count_total{swap}"] == 5
    assert samples[f"shoal_inference_requests_in_flight{swap}"] == 0
    assert samples[f"shoal_inference_compute_seconds_total{swap}"] > 0
    assert samples[f"shoal_inference_queue_seconds_total{swap}"] >= 0
    # The histogram holds the requests that ran: 5 here, 3 for `fails` (1 success, 2 failures).
    assert samples[f"shoal_inference_request_duration_seconds_count{swap}"] == 5
    assert samples[f"shoal_inference_request_duration_seconds_bucket{labels('swap', 1, le='+Inf')}"] == 5
    assert samples[f"shoal_inference_request_duration_seconds_sum{swap}"] > 0
    buckets = [v for k, v in samples.items()
               if k.startswith("shoal_inference_request_duration_seconds_bucket{model=\"swap\"")]
    assert buckets == sorted(buckets) and len(buckets) == 17
    assert samples[f"shoal_inference_request_success_total{fails}"] == 1
    assert samples[f"shoal_inference_request_failure_total{fails}"] == 2
    assert samples[f"shoal_inference_count_total{fails}"] == 3
    assert samples[f"shoal_inference_request_duration_seconds_count{fails}"] == 3
    assert "nope" not in text


def test_a_new_version_gets_its_own_series_and_the_replaced_one_leaves(server, tmp_path):
    assert rest(server, "swap", 0.0) == 200
    publish(server.repo / "swap", 2, model_bytes(Constant(2.0), tmp_path))
    assert server.request("POST", "/v2/repository/models/swap/load") == (200, {})
    assert rest(server, "swap", 0.0) == 200
    assert rest(server, "swap", 0.0) == 200
    _, text, samples = scrape(server)
    assert samples[f"shoal_inference_request_success_total{labels('swap', 2)}"] == 2
    assert 'model="swap",version="1"' not in text


def test_an_unloaded_model_is_not_found_over_grpc_too(server):
    assert server.request("POST", "/v2/repository/models/swap/unload") == (200, {})
    request = infer_request(server, "swap", [("x", torch.zeros(1), "FP32")], raw=True)
    code, details = server.error("ModelInfer", request)
    assert code == grpc.StatusCode.NOT_FOUND
    assert details == ("model 'swap' is not available: unloaded "
                       "(POST /v2/repository/models/swap/load serves it again)")
    _, text, _ = scrape(server)
    assert 'model="swap"' not in text


def test_in_flight_counts_a_request_while_it_waits_and_drops_when_it_is_answered(server):
    held = labels("held", 1)
    assert scrape(server)[2][f"shoal_inference_requests_in_flight{held}"] == 0
    answers = []
    request = threading.Thread(target=lambda: answers.append(server.infer(
        "held", [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [0.0]}])))
    request.start()
    try:
        e2e.wait_until(
            lambda: scrape(server)[2][f"shoal_inference_requests_in_flight{held}"] == 1, 30,
            "the held request to show in flight")
    finally:
        request.join()
    assert answers[0][0] == 200, answers
    _, _, samples = scrape(server)
    assert samples[f"shoal_inference_requests_in_flight{held}"] == 0
    assert samples[f"shoal_inference_request_success_total{held}"] == 1
