"""shoal.shards / shoal.lease / Shard.done against a fake agent on a real Unix socket."""

import pytest

import shoal


def test_shards_retries_after_retry_ms_then_yields_then_ends_on_exhausted(agent):
    agent.lease_replies = [
        {"ok": True, "retry_ms": 20},
        {"ok": True, "shard": {"id": 3, "epoch": 0, "start": 300, "end": 400}},
        {"ok": True, "retry_ms": 0},
        {"ok": True, "shard": {"id": 5, "epoch": 0, "file": "data/part-5.npz"}},
        {"ok": True, "exhausted": True, "epoch": 0},
    ]
    got = list(shoal.shards(0))
    assert got == [shoal.Shard(id=3, epoch=0, start=300, end=400),
                   shoal.Shard(id=5, epoch=0, file="data/part-5.npz")]
    assert got[0].range() == range(300, 400)
    assert agent.ops() == [
        {"op": "lease", "task": "worker:1", "attempt": 2, "epoch": 0, "wait": True}] * 5


def test_shards_passes_wait_false_for_synchronous_loops(agent):
    agent.lease_replies = [{"ok": True, "exhausted": True, "epoch": 4}]
    assert list(shoal.shards(4, wait=False)) == []
    assert agent.ops() == [
        {"op": "lease", "task": "worker:1", "attempt": 2, "epoch": 4, "wait": False}]


def test_lease_returns_one_reply(agent):
    agent.lease_replies = [{"ok": True, "retry_ms": 200},
                           {"ok": True, "shard": {"id": 1, "epoch": 2, "start": 0, "end": 10}},
                           {"ok": True, "exhausted": True, "epoch": 2}]
    assert shoal.lease(2) == shoal.LeaseReply(retry_ms=200)
    assert shoal.lease(2).shard == shoal.Shard(id=1, epoch=2, start=0, end=10)
    assert shoal.lease(2) == shoal.LeaseReply(exhausted=True)


def test_done_sends_epoch_shard_and_step(agent):
    agent.lease_replies = [{"ok": True, "shard": {"id": 3, "epoch": 1, "start": 0, "end": 4}}]
    for shard in shoal.shards(1):
        shard.done(57)
    assert agent.ops("done") == [
        {"op": "done", "task": "worker:1", "attempt": 2, "epoch": 1, "shard": 3, "step": 57}]


def test_a_refused_done_raises_lease_lost_with_the_agents_reason(agent):
    reason = "the lease on shard 3 of epoch 0 was lost: expired"
    agent.lease_replies = [{"ok": True, "shard": {"id": 3, "epoch": 0, "file": "a"}}]
    agent.done_replies = [{"ok": False, "error": reason}]
    shard = next(shoal.shards(0))
    with pytest.raises(shoal.LeaseLost) as info:
        shard.done(10)
    assert str(info.value) == reason
    assert isinstance(info.value, shoal.AgentError)


def test_a_refused_lease_raises_agent_error(agent):
    agent.lease_replies = [{"ok": False, "error": "the job has no dataset"}]
    with pytest.raises(shoal.AgentError, match="the job has no dataset"):
        list(shoal.shards(0))


def test_an_unexpected_lease_reply_is_an_error_not_a_hang(agent):
    agent.lease_replies = [{"ok": True}]
    with pytest.raises(shoal.AgentError, match="unexpected reply"):
        shoal.lease(0)


def test_range_of_a_file_shard_is_a_type_error():
    with pytest.raises(TypeError, match="file shard"):
        shoal.Shard(id=1, epoch=0, file="x").range()


def test_shards_without_an_agent_raise_a_clear_error():
    with pytest.raises(shoal.AgentUnavailable, match="SHOAL_AGENT_SOCKET is not set"):
        next(shoal.shards(0))
    with pytest.raises(shoal.AgentUnavailable):
        shoal.Shard(id=1, epoch=0, start=0, end=1).done(1)
