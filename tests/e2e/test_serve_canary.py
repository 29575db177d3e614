"""`shoal serve` rolls a new version out as a canary when the model's config asks
(docs/serving.md, "Canary rollout and rollback"): a good version is promoted, a version that
raises or answers with the wrong shape is rolled back under load with at most 1 % of the
requests failed (counted by the load generator), the decision outlives a restart, and a version
can be pinned or rolled back by hand through the repository API.

Every good version of the `swap` model returns a constant that names it (version 7 returns
7.0), so each response shows which version answered.
"""

import http.client
import json
import re

import pytest
import torch

import shoal_e2e as e2e
from test_serve_grpc import pb  # noqa: F401 -- the generated stubs, a fixture
from test_serve_swap import (Constant, LoadGenerator, model_bytes, publish, served_version,
                             start, wait_log, wait_serving)

CONFIG = """\
inputs: [{name: x, datatype: FP32, dims: [1]}]
outputs: [{name: version, datatype: FP32, dims: [1]}]
rollout:
  canary: {share: 0.2, duration_s: 2, min_requests: 40, max_error_rate: 0.05, max_p99_ratio: 0}
"""


class Raises(torch.nn.Module):
    """Loads fine, fails every request."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if bool(x.sum() > -1.0e30):
            raise RuntimeError("deliberately broken version")
        return x


class WrongShape(torch.nn.Module):
    """Answers [2] where the config declares [1]."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x * 0.0 + 99.0, x * 0.0 + 99.0])


def canary_repository(tmp_path, versions=(1,)):
    repo = tmp_path / "models"
    (repo / "swap").mkdir(parents=True)
    (repo / "swap" / "config.yaml").write_text(CONFIG)
    for v in versions:
        publish(repo / "swap", v, model_bytes(Constant(float(v)), tmp_path))
    return repo


def post(server, path, body=None):
    """(status, parsed body) of a POST whose body may be raw text."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    try:
        conn.request("POST", path, body=json.dumps(body) if isinstance(body, dict) else body)
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def rollout(server):
    status, meta = server.get("/v2/models/swap")
    assert status == 200, meta
    return meta["rollout"]


def index_rows(server):
    status, rows = post(server, "/v2/repository/index")
    assert status == 200, rows
    return {r.get("version"): r for r in rows if r["name"] == "swap"}


def metric(server, name, **labels):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    label_text = ",".join(f'{k}="{v}"' for k, v in labels.items())
    match = re.search(rf"^{name}\{{{re.escape(label_text)}\}} (\S+)$", text, re.M)
    assert match, f"no {name}{{{label_text}}} in /metrics:\n{text}"
    return float(match.group(1))


def failed(results):
    return [r for r in results if r[0] != 200]


def test_a_good_new_version_serves_its_share_then_is_promoted(shoal_bin, tmp_path):
    repo = canary_repository(tmp_path)
    server = start(shoal_bin, repo, tmp_path)
    try:
        assert rollout(server)["policy"] == "canary"
        with LoadGenerator(server.port) as load:
            e2e.wait_until(lambda: len(load.results) > 20, 30, "load to start")
            publish(repo / "swap", 2, model_bytes(Constant(2.0), tmp_path))
            wait_log(server, "model 'swap' version 2 is a canary beside version 1: 20%")
            state = rollout(server)
            if "canary" in state:  # unless already promoted
                assert state["canary"]["version"] == "2" and state["serving"] == "1", state
            wait_log(server, "model 'swap' version 2 promoted")
            wait_serving(server, 2)
            n = len(load.results)
            e2e.wait_until(lambda: len(load.results) > n + 20, 30, "load after the promotion")
        assert failed(load.results) == [], failed(load.results)[:5]
        # Both versions answered during the canary; once promoted, only 2 does.
        assert load.versions_answered() == {1, 2}
        for sequence in load.sequences:
            assert sequence[-1] == 2
        state = rollout(server)
        assert state["serving"] == "2" and "canary" not in state, state
        assert state["last_decision"]["decision"] == "promoted", state
        assert "canary requests in" in state["last_decision"]["reason"]
        assert metric(server, "shoal_serve_canary_decisions_total", model="swap",
                      decision="promoted") == 1
        assert metric(server, "shoal_serve_canary_requests_total", model="swap",
                      role="canary") >= 40
        assert metric(server, "shoal_serve_canary_share", model="swap") == 0
        assert index_rows(server)["2"]["rollout_state"] == "serving"
        assert index_rows(server)["2"]["decision"] == "promoted"
    finally:
        server.kill()


@pytest.mark.parametrize("bad", [Raises(), WrongShape()], ids=["raises", "wrong_shape"])
def test_a_bad_version_under_load_is_rolled_back_and_stays_out_after_a_restart(
        shoal_bin, tmp_path, bad):
    repo = canary_repository(tmp_path)
    server = start(shoal_bin, repo, tmp_path)
    try:
        with LoadGenerator(server.port) as load:
            e2e.wait_until(lambda: len(load.results) > 20, 30, "load to start")
            publish(repo / "swap", 2, model_bytes(bad, tmp_path))
            wait_log(server, "model 'swap' version 2 rolled back (was a canary beside version 1")
            n = len(load.results)
            e2e.wait_until(lambda: len(load.results) > n + 50, 30, "load after the rollback")
        results = load.results
        bad_answers = failed(results)
        print(f"{len(results)} requests, {len(bad_answers)} failed")
        assert len(bad_answers) <= 0.01 * len(results), bad_answers[:5]
        assert load.versions_answered() == {1}
        log = server.stderr()
        assert re.search(r"version 2 rolled back .*: \d+ of \d+ canary requests failed", log), log
        state = rollout(server)
        assert state["serving"] == "1" and "canary" not in state, state
        assert state["last_decision"]["decision"] == "rolled_back", state
        assert "2" in state["rolled_back"], state
        row = index_rows(server)["2"]
        assert row["state"] == "UNAVAILABLE" and row["rollout_state"] == "rolled_back", row
        assert metric(server, "shoal_serve_canary_decisions_total", model="swap",
                      decision="rolled_back") == 1
        assert metric(server, "shoal_serve_canary_fallbacks_total", model="swap") >= 1
        status, body = server.get("/v2/models/swap/versions/2/ready")
        assert status == 400 and "rolled back" in body["error"], body
    finally:
        server.kill()

    # After a restart version 2 is not loaded at all; a newer good version still rolls out.
    (tmp_path / "serve").rename(tmp_path / "serve-before-restart")
    server = start(shoal_bin, repo, tmp_path)
    try:
        assert served_version(server) == 1
        assert "2" in rollout(server)["rolled_back"]
        assert "version 2 ready" not in server.stderr()
        with LoadGenerator(server.port) as load:
            publish(repo / "swap", 3, model_bytes(Constant(3.0), tmp_path))
            wait_log(server, "model 'swap' version 3 promoted")
            wait_serving(server, 3)
        assert failed(load.results) == []
        assert 2 not in load.versions_answered()
    finally:
        server.kill()


def test_pin_unpin_and_roll_back_through_the_repository_api(shoal_bin, tmp_path):
    repo = canary_repository(tmp_path, versions=(1, 2))
    server = start(shoal_bin, repo, tmp_path)
    try:
        assert served_version(server) == 2  # the first load has nothing to compare with
        # Bad requests: a 4xx saying what is wrong, and nothing changes.
        before = rollout(server)
        for path, body, status, words in [
            ("/v2/repository/models/nope/pin", {"version": "1"}, 404, "unknown model 'nope'"),
            ("/v2/repository/models/swap/pin", {"version": "9"}, 404, "no version 9"),
            ("/v2/repository/models/swap/pin", {"version": "one"}, 400, "version number"),
            ("/v2/repository/models/swap/pin", {}, 400, "version number"),
            ("/v2/repository/models/swap/pin", "{not json", 400, "JSON object"),
            ("/v2/repository/models/swap/pin", {"version": "1", "force": True}, 400,
             "unknown key 'force'"),
            ("/v2/repository/models/nope/rollback", None, 404, "unknown model 'nope'"),
            ("/v2/repository/models/swap/unpin", None, 409, "not pinned"),
        ]:
            got, reply = post(server, path, body)
            assert got == status and words in reply["error"], (path, body, got, reply)
        assert rollout(server) == before
        assert served_version(server) == 2

        status, reply = post(server, "/v2/repository/models/swap/pin", {"version": "1"})
        assert status == 200 and reply["rollout"]["pinned"] == "1", reply
        assert served_version(server) == 1
        wait_log(server, "model 'swap' pinned to version 1 by request")
        # Pinned: a newer version is ignored.
        publish(repo / "swap", 3, model_bytes(Constant(3.0), tmp_path))
        e2e.wait_until(lambda: "pinned to version 1" in (
            server.get("/v2/models/swap/versions/3/ready")[1].get("error") or ""), 30,
            "the server to see version 3 on disk")
        assert served_version(server) == 1
        assert "version 3 is a canary" not in server.stderr()

        # A pin moves straight to its version, without a canary.
        status, reply = post(server, "/v2/repository/models/swap/pin", {"version": 2})
        assert status == 200 and reply["rollout"]["pinned"] == "2", reply
        assert served_version(server) == 2

        # Unpinned: 3 comes in as a canary; rolled back by hand, it leaves at once.
        status, reply = post(server, "/v2/repository/models/swap/unpin")
        assert status == 200 and reply["rollout"]["pinned"] is None, reply
        wait_log(server, "model 'swap' version 3 is a canary beside version 2")
        status, reply = post(server, "/v2/repository/models/swap/rollback", "{}")
        assert status == 200, reply
        assert reply["rollout"]["last_decision"]["decision"] == "rolled_back", reply
        assert reply["rollout"]["last_decision"]["reason"] == "rolled back by request", reply
        assert "3" in reply["rollout"]["rolled_back"]
        assert {served_version(server) for _ in range(20)} == {2}

        # No canary: rolling back steps down to the version before.
        status, reply = post(server, "/v2/repository/models/swap/rollback")
        assert status == 200 and reply["rollout"]["serving"] == "1", reply
        assert served_version(server) == 1
        status, reply = post(server, "/v2/repository/models/swap/rollback")
        assert status == 409 and "no other version that loads" in reply["error"], reply
        assert served_version(server) == 1
        rows = index_rows(server)
        assert rows["2"]["rollout_state"] == "rolled_back" and rows["3"]["rollout_state"] == \
            "rolled_back", rows
    finally:
        server.kill()

    # The rolled-back versions stay out after a restart; pinning one forgives it.
    (tmp_path / "serve").rename(tmp_path / "serve-before-restart")
    server = start(shoal_bin, repo, tmp_path)
    try:
        assert served_version(server) == 1
        status, reply = post(server, "/v2/repository/models/swap/pin", {"version": 3})
        assert status == 200 and "3" not in reply["rollout"]["rolled_back"], reply
        assert served_version(server) == 3
    finally:
        server.kill()


def test_grpc_requests_are_routed_through_the_canary_too(shoal_bin, tmp_path, pb):
    from test_serve_grpc import GrpcServer
    repo = canary_repository(tmp_path)
    (repo / "swap" / "config.yaml").write_text(CONFIG.replace(
        "share: 0.2, duration_s: 2", "share: 0.5, duration_s: 600"))
    out = tmp_path / "serve"
    out.mkdir()
    server = GrpcServer(shoal_bin, repo, out, pb, "--repository-poll-ms", 50,
                        "--repository-settle-ms", 250)
    messages = server.messages

    def grpc_version():
        request = messages.ModelInferRequest(model_name="swap")
        tensor = request.inputs.add(name="x", datatype="FP32", shape=[1])
        tensor.contents.fp32_contents.append(0.0)
        response = server.call("ModelInfer", request)
        assert float(response.outputs[0].contents.fp32_contents[0]) == \
            float(response.model_version)
        return response.model_version

    try:
        server.wait_ready()
        publish(repo / "swap", 2, model_bytes(Constant(2.0), tmp_path))
        wait_log(server, "model 'swap' version 2 is a canary beside version 1: 50%")
        assert [grpc_version() for _ in range(6)] == ["1", "2", "1", "2", "1", "2"]
        status, reply = post(server, "/v2/repository/models/swap/rollback")
        assert status == 200, reply
        assert {grpc_version() for _ in range(6)} == {"1"}
    finally:
        server.close()
        server.kill()
