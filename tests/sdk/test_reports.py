"""progress / checkpointed / resumed on the wire, against a fake agent on a real Unix socket."""

import os
import struct
import time

import pytest

import shoal
from shoal import _client


def test_progress_without_an_agent_is_a_no_op(capsys):
    assert "SHOAL_AGENT_SOCKET" not in os.environ
    for step in range(100):
        shoal.progress(step)
    shoal.checkpointed(5)
    shoal.resumed(5)
    assert capsys.readouterr().err == ""


def test_progress_sends_one_line_per_step_with_task_and_attempt(agent):
    shoal.progress(1)
    shoal.progress(2)
    agent.wait_for_count("progress", 2)
    assert agent.ops() == [
        {"op": "progress", "task": "worker:1", "attempt": 2, "step": 1},
        {"op": "progress", "task": "worker:1", "attempt": 2, "step": 2},
    ]
    assert agent.connections == 1


def test_progress_accepts_integer_like_steps(agent):
    torch = pytest.importorskip("torch")
    shoal.progress(torch.tensor(7))
    agent.wait_for_count("progress", 1)
    assert agent.ops("progress")[0]["step"] == 7


def test_progress_costs_microseconds(agent):
    shoal.progress(0)  # connects
    count = 20000
    start = time.perf_counter()
    for step in range(1, count + 1):
        shoal.progress(step)
    per_call_us = (time.perf_counter() - start) / count * 1e6
    agent.wait_for_count("progress", count + 1, timeout=30)
    assert per_call_us < 500, f"{per_call_us:.1f} us per progress call"
    assert agent.connections == 1


def make_board(path):
    """What the agent makes for a task (agent/progress_slot.h): 64 bytes, the magic first."""
    path.write_bytes(b"SHOALPG1" + bytes(56))
    return path


def read_board(path):
    sequence, step, when = struct.unpack_from("<QQq", path.read_bytes(), 8)
    return sequence, step, when


def test_progress_goes_to_the_board_and_sends_nothing(agent, tmp_path, monkeypatch):
    board = make_board(tmp_path / "progress")
    monkeypatch.setenv("SHOAL_PROGRESS_FILE", str(board))
    before = time.monotonic_ns()
    shoal.progress(5)
    shoal.progress(6)
    after = time.monotonic_ns()
    sequence, step, when = read_board(board)
    assert sequence == 4, "two complete writes: the sequence is even and counts them"
    assert step == 6
    assert before <= when <= after, "the report's CLOCK_MONOTONIC time, as the agent reads it"
    shoal.checkpointed(6)  # still a message: the master must hear of it
    agent.wait_for_count("checkpointed", 1)
    assert agent.ops("progress") == []


def test_a_file_that_is_not_a_board_leaves_progress_on_the_socket(agent, tmp_path,
                                                                  monkeypatch):
    junk = tmp_path / "progress"
    junk.write_bytes(b"not a board" + bytes(53))
    monkeypatch.setenv("SHOAL_PROGRESS_FILE", str(junk))
    shoal.progress(3)
    agent.wait_for_count("progress", 1)
    assert agent.ops("progress")[0]["step"] == 3
    assert junk.read_bytes() == b"not a board" + bytes(53)


def test_a_forked_child_reports_to_the_same_board(tmp_path, monkeypatch):
    board = make_board(tmp_path / "progress")
    monkeypatch.setenv("SHOAL_PROGRESS_FILE", str(board))
    shoal.progress(1)
    pid = os.fork()
    if pid == 0:
        try:
            shoal.progress(2)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    sequence, step, _ = read_board(board)
    assert (sequence, step) == (4, 2)


def test_progress_after_the_agent_died_does_not_raise_and_warns_once(agent, capsys):
    shoal.progress(1)
    agent.wait_for_count("progress", 1)
    agent.close()
    for step in range(2, 50):
        shoal.progress(step)
    shoal.checkpointed(10)
    err = capsys.readouterr().err
    assert err.count("reports are disabled") == 1, err
    assert agent.address in err


def test_progress_reconnects_once_after_the_agent_dropped_the_connection(agent, capsys):
    shoal.progress(1)
    agent.wait_for(lambda a: a.connections == 1, what="the first connection")
    agent.wait_for_count("progress", 1)
    agent.drop_connections()  # as an agent restart would; it listens again
    shoal.progress(2)  # the send fails (EPIPE): reconnect, send again
    agent.wait_for(lambda a: a.connections == 2, what="the second connection")
    agent.wait_for(lambda a: [m["step"] for m in a.received] == [1, 2], what="step 2")
    assert "disabled" not in capsys.readouterr().err


def test_save_reports_checkpointed_after_the_file_is_durable(agent, tmp_path):
    seen_on_disk = []

    def handler(message):
        if message["op"] == "checkpointed":
            seen_on_disk.append(sorted(os.listdir(tmp_path)))
        return None

    agent.handler = handler
    shoal.Checkpointer(tmp_path, serializer="pickle").save(200, {"s": 1})
    agent.wait_for_count("checkpointed", 1)
    assert agent.ops() == [{"op": "checkpointed", "task": "worker:1", "attempt": 2, "step": 200}]
    assert seen_on_disk == [["ckpt-000000000200.pt"]]


def test_load_latest_reports_resumed_with_the_loaded_step_and_waits(agent, tmp_path):
    ckpt = shoal.Checkpointer(tmp_path, serializer="pickle")
    assert ckpt.load_latest() == (0, None)
    ckpt.save(40, "forty")
    assert ckpt.load_latest() == (40, "forty")
    resumed = agent.ops("resumed")  # no wait needed: load_latest waited for both replies
    assert resumed == [
        {"op": "resumed", "task": "worker:1", "attempt": 2, "step": 0},
        {"op": "resumed", "task": "worker:1", "attempt": 2, "step": 40},
    ]


def test_a_refused_resumed_raises_agent_error(agent, tmp_path):
    agent.handler = lambda m: {"ok": False, "error": "stale attempt 2 (current is 3)"}
    with pytest.raises(shoal.AgentError, match="stale attempt 2"):
        shoal.Checkpointer(tmp_path).load_latest()


def test_a_missing_reply_times_out_with_a_clear_error(agent, monkeypatch):
    monkeypatch.setattr(_client, "REPLY_TIMEOUT_S", 0.3)
    _client.reset()
    agent.handler = lambda m: None  # never answers
    start = time.monotonic()
    with pytest.raises(shoal.AgentTimeout, match=r"did not answer 'resumed' within 0.3s"):
        shoal.resumed(1)
    assert time.monotonic() - start < 5


def test_a_request_reconnects_once_when_the_agent_closed_the_connection(agent):
    answered = []

    def handler(message):
        if message["op"] != "resumed":
            return None
        if not answered:
            answered.append("closed")
            return "close"  # the agent goes away mid-request, comes back on reconnect
        return {"ok": True}

    agent.handler = handler
    shoal.resumed(3)
    assert [m["step"] for m in agent.ops("resumed")] == [3, 3]
    assert agent.connections == 2


def test_a_request_gives_up_after_one_reconnect(agent):
    agent.handler = lambda m: "close"
    with pytest.raises(shoal.AgentUnavailable, match="closed the connection"):
        shoal.resumed(3)
    assert agent.connections == 2


def test_a_request_to_a_dead_agent_raises_agent_unavailable(agent):
    agent.close()
    with pytest.raises(shoal.AgentUnavailable, match="cannot reach the Shoal agent"):
        shoal.resumed(1)


def test_replies_are_read_in_request_order_between_reports(agent, tmp_path):
    ckpt = shoal.Checkpointer(tmp_path, serializer="pickle")
    for step in range(1, 6):
        shoal.progress(step)
        ckpt.save(step, step)
        assert ckpt.load_latest() == (step, step)
    ops = [m["op"] for m in agent.ops()]
    assert ops == ["progress", "checkpointed", "resumed"] * 5


def test_a_forked_child_uses_its_own_connection(agent):
    shoal.progress(1)
    agent.wait_for_count("progress", 1)
    pid = os.fork()
    if pid == 0:  # the child: report through a connection of its own, then leave at once
        try:
            shoal.progress(1000)
            shoal.resumed(1000)
            os._exit(0)
        except BaseException:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    shoal.progress(2)
    agent.wait_for_count("progress", 3)
    assert agent.connections == 2
    assert sorted(m["step"] for m in agent.ops("progress")) == [1, 2, 1000]


def test_a_filesystem_socket_path_works_too(tmp_path, monkeypatch):
    import socket
    import threading

    path = tmp_path / "agent.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    lines = []

    def serve():
        conn, _ = server.accept()
        with conn:
            data = b""
            while b"\n" not in data:
                data += conn.recv(4096)
            lines.append(data)
            conn.sendall(b'{"ok":true}\n')

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    monkeypatch.setenv("SHOAL_AGENT_SOCKET", str(path))
    monkeypatch.setenv("SHOAL_ROLE", "chief")
    monkeypatch.setenv("SHOAL_INDEX", "0")
    shoal.resumed(9)
    thread.join(timeout=10)
    server.close()
    assert lines == [b'{"op":"resumed","task":"chief:0","attempt":0,"step":9}\n']
