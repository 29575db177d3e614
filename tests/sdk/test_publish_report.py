"""shoal.publish_model reports each publication to the agent (`published`, fire-and-forget) with
its step and metrics, once the version is in place; bad step or metrics are refused before
anything is written."""

import math
import os

import pytest
import torch

import shoal
from shoal.publish import versions


class Double(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


@pytest.fixture
def saved(tmp_path):
    path = tmp_path / "double.pt"
    torch.jit.script(Double()).save(str(path))
    return path


def test_the_publication_is_reported_after_the_version_is_in_place(agent, tmp_path, saved):
    repo = tmp_path / "repo"
    repo.mkdir()
    seen_in_place = {}

    def look(message):
        # The agent looks at the repository when the report arrives: the version is there.
        if message.get("op") == "published":
            seen_in_place[message["version"]] = versions(str(repo), "mlp")
    agent.handler = look
    assert shoal.publish_model(saved, "mlp", repository=str(repo), step=1200,
                               metrics={"loss": torch.tensor(0.25), "accuracy": 0.875,
                                        "samples": 64000}) == 1
    assert shoal.publish_model(saved, "mlp", repository=str(repo)) == 2
    agent.wait_for_count("published", 2)
    # Each on a connection of its own, so they may arrive in either order.
    assert sorted(agent.ops("published"), key=lambda m: m["version"]) == [
        {"op": "published", "task": "worker:1", "attempt": 2, "model": "mlp", "version": 1,
         "repository": str(repo), "metrics": {"loss": 0.25, "accuracy": 0.875, "samples": 64000},
         "step": 1200},
        {"op": "published", "task": "worker:1", "attempt": 2, "model": "mlp", "version": 2,
         "repository": str(repo), "metrics": {}},
    ]
    assert 1 in seen_in_place[1] and seen_in_place[2] == [1, 2]


def test_an_older_agents_error_answer_is_not_taken_for_the_next_reply(agent, tmp_path, saved):
    """An agent that does not know `published` answers it with an error although the op wants
    no reply; on the process's connection that answer would be read as the reply to its next
    request (here `resumed`, which would then fail)."""
    def old_agent(message):
        if message.get("op") == "published":
            return {"ok": False, "error": "unknown op 'published'"}
        if message.get("op") == "resumed":
            return {"ok": True}
        return None
    agent.handler = old_agent
    shoal.progress(1)  # the process's connection is open before the publication
    assert shoal.publish_model(saved, "m", repository=str(tmp_path), step=1) == 1
    agent.wait_for_count("published", 1)
    shoal.resumed(5)  # raises AgentError if it read the answer meant for `published`
    agent.wait_for_count("resumed", 1)


def test_a_relative_repository_is_reported_as_an_absolute_path(agent, tmp_path, saved,
                                                               monkeypatch):
    (tmp_path / "repo").mkdir()
    monkeypatch.chdir(tmp_path)
    shoal.publish_model(saved, "m", repository="repo")
    agent.wait_for_count("published", 1)
    assert agent.ops("published")[0]["repository"] == str(tmp_path / "repo")


def test_without_an_agent_publishing_reports_nothing_and_works(tmp_path, saved, capsys):
    assert "SHOAL_AGENT_SOCKET" not in os.environ
    assert shoal.publish_model(saved, "m", repository=str(tmp_path), step=3,
                               metrics={"loss": 1}) == 1
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("step, metrics, message", [
    (-1, None, "step must be an integer >= 0, not -1"),
    (1.5, None, "step must be an integer >= 0, not float"),
    ("7", None, "step must be an integer >= 0, not str"),
    (None, [("loss", 1.0)], "metrics must be a dict of name -> number, not list"),
    (None, {"loss": math.nan}, "metric 'loss' must be a finite number, not float nan"),
    (None, {"loss": math.inf}, "metric 'loss' must be a finite number"),
    (None, {"loss": 10 ** 400}, "metric 'loss' must be a finite number, not int"),
    (None, {"loss": "low"}, "metric 'loss' must be a finite number, not str 'low'"),
    (None, {"ok": True}, "metric 'ok' must be a finite number, not bool"),
    (None, {"loss": {"train": 1.0}}, "metric 'loss' must be a finite number, not dict"),
    (None, {"loss": torch.zeros(3)}, "metric 'loss' must be a finite number, not Tensor"),
    (None, {1: 0.5}, "metric name 1 must be a non-empty string"),
    (None, {"": 0.5}, "metric name '' must be a non-empty string"),
    (None, {"x" * 129: 0.5}, "of at most 128 bytes"),
    (None, {f"m{i}": i for i in range(65)}, "metrics has 65 entries; at most 64"),
])
def test_bad_steps_and_metrics_are_named_and_publish_nothing(agent, tmp_path, saved, step,
                                                             metrics, message):
    with pytest.raises(shoal.PublishError, match=message.replace("(", r"\(").replace(")", r"\)")):
        shoal.publish_model(saved, "m", repository=str(tmp_path), step=step, metrics=metrics)
    assert not (tmp_path / "m").exists()
    shoal.progress(1)  # a sentinel: anything sent before it has arrived once it has
    agent.wait_for_count("progress", 1)
    assert agent.ops("published") == []
