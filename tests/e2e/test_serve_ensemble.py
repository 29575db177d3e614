"""`shoal serve` ensembles: models declared in config.yaml as a combination of other models,
each combiner checked against values worked out by hand, and every bad ensemble refused with
its reason while the others serve."""

import pytest
import torch

from test_serve import Server
from test_serve_swap import model_bytes, publish

MEMBER_CONFIG = """\
inputs: [{name: x, datatype: FP32, dims: [1]}]
outputs: [{name: y, datatype: FP32, dims: [%d]}]
"""
# What each member returns, whatever x is.
MEMBERS = {"a": [1.0, 2.0, 4.0], "b": [4.0, 8.0, 1.0], "c": [2.0, 4.0, 2.0]}


class Fixed(torch.nn.Module):
    def __init__(self, values):
        super().__init__()
        self.values = torch.tensor(values)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 0.0 + self.values


@pytest.fixture(scope="module")
def server(shoal_bin, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ensemble")
    repo = tmp / "models"
    repo.mkdir()

    def member(name, values):
        (repo / name).mkdir()
        (repo / name / "config.yaml").write_text(MEMBER_CONFIG % len(values))
        publish(repo / name, 1, model_bytes(Fixed(values), tmp))

    def ensemble(name, models, combine):
        (repo / name).mkdir()
        (repo / name / "config.yaml").write_text(
            f"ensemble: {{models: [{', '.join(models)}], combine: {combine}}}\n")

    for name, values in MEMBERS.items():
        member(name, values)
    member("four", [1.0, 2.0, 3.0, 4.0])  # four outputs where the others have three
    for combine in ("mean", "geometric_mean", "harmonic_mean", "median", "vote"):
        ensemble(combine, ["a", "b", "c"], combine)
    ensemble("tie", ["a", "b"], "vote")
    ensemble("nested", ["mean", "c"], "mean")  # an ensemble can be a member
    ensemble("unknown_member", ["a", "zz"], "mean")
    ensemble("incompatible", ["a", "four"], "mean")
    ensemble("cycle_1", ["a", "cycle_2"], "mean")
    ensemble("cycle_2", ["b", "cycle_1"], "mean")
    ensemble("vote_of_votes", ["vote", "tie"], "median")  # INT64 outputs: no median
    out = tmp / "serve"
    out.mkdir()
    s = Server(shoal_bin, repo, out, "--repository-poll-ms", 0)
    try:
        s.wait_ready()
        yield s
    finally:
        s.kill()


def infer(server, model):
    status, body = server.infer(model, [{"name": "x", "datatype": "FP32", "shape": [1],
                                         "data": [0.0]}])
    assert status == 200, body
    assert body["model_name"] == model and body["model_version"] == "1"
    [output] = body["outputs"]
    return output


@pytest.mark.parametrize("model, expected", [
    # Elementwise over a = [1, 2, 4], b = [4, 8, 1], c = [2, 4, 2]:
    ("mean", [7 / 3, 14 / 3, 7 / 3]),                   # (1+4+2)/3, (2+8+4)/3, (4+1+2)/3
    ("geometric_mean", [2.0, 4.0, 2.0]),                # cbrt(8), cbrt(64), cbrt(8)
    ("harmonic_mean", [3 / 1.75, 3 / 0.875, 3 / 1.75]),  # 3/(1+1/4+1/2), 3/(1/2+1/8+1/4), ...
    ("median", [2.0, 4.0, 2.0]),                        # middle of {1,2,4}, {2,4,8}, {1,2,4}
    ("nested", [(7 / 3 + 2) / 2, (14 / 3 + 4) / 2, (7 / 3 + 2) / 2]),  # mean(mean, c)
])
def test_each_combiner_gives_the_values_worked_out_by_hand(server, model, expected):
    output = infer(server, model)
    assert output["name"] == "y" and output["datatype"] == "FP32" and output["shape"] == [3]
    assert output["data"] == pytest.approx(expected, rel=1e-6)


def test_vote_outputs_the_class_most_members_chose(server):
    # argmax: a -> 2, b -> 1, c -> 1: class 1 by two votes to one.
    output = infer(server, "vote")
    assert output == {"name": "y", "datatype": "INT64", "shape": [1], "data": [1]}


def test_a_vote_tie_goes_to_the_smallest_class_index(server):
    # argmax: a -> 2, b -> 1: one vote each, class 1 wins.
    assert infer(server, "tie")["data"] == [1]


def test_an_ensembles_metadata_shows_the_combined_outputs(server):
    status, meta = server.get("/v2/models/vote")
    assert status == 200
    assert meta["platform"] == "ensemble" and meta["versions"] == ["1"]
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [1]}]
    assert meta["outputs"] == [{"name": "y", "datatype": "INT64", "shape": [1]}]


@pytest.mark.parametrize("model, reason", [
    ("unknown_member", "ensemble refused: unknown member 'zz': unknown model 'zz'"),
    ("incompatible", "ensemble refused: members 'a' and 'four' have incompatible outputs "
                     "(y FP32 [3] vs y FP32 [4]); mean needs the same outputs from every member"),
    ("cycle_1", "ensemble refused: its members form a cycle: cycle_1 -> cycle_2 -> cycle_1"),
    ("cycle_2", "ensemble refused: its members form a cycle: cycle_2 -> cycle_1 -> cycle_2"),
    ("vote_of_votes", "ensemble refused: output 'y' of the members is INT64, which median does "
                      "not combine (FP32 or FP64 only)"),
])
def test_bad_ensembles_are_refused_with_the_reason_and_the_others_serve(server, model, reason):
    status, body = server.get(f"/v2/models/{model}/ready")
    assert status == 400 and body["ready"] is False
    assert body["error"].startswith(f"model '{model}' is not available: {reason}"), body
    status, body = server.infer(model, [{"name": "x", "datatype": "FP32", "shape": [1],
                                         "data": [0.0]}])
    assert status == 404 and body["error"].startswith(f"model '{model}' is not available: {reason}")
    assert f"shoal serve: model '{model}' refused: {reason}" in server.stderr()


def test_a_request_the_members_refuse_is_a_400_naming_the_ensemble(server):
    status, body = server.infer("mean", [{"name": "x", "datatype": "INT32", "shape": [1],
                                          "data": [0]}])
    assert status == 400 and body["error"].startswith("ensemble 'mean': "), body


def test_an_ensemble_whose_member_is_unloaded_answers_503_and_serves_once_it_is_back(server):
    assert server.request("POST", "/v2/repository/models/b/unload") == (200, {})
    try:
        status, body = server.infer("median", [{"name": "x", "datatype": "FP32", "shape": [1],
                                                "data": [0.0]}])
        assert status == 503
        assert body["error"].startswith("ensemble 'median': member 'b' is not available: ")
    finally:
        assert server.request("POST", "/v2/repository/models/b/load") == (200, {})
    assert infer(server, "median")["data"] == [2.0, 4.0, 2.0]
