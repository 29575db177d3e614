"""Fixtures for the Python SDK's tests: a clean environment and a fake agent.

`FakeAgent` is a real Unix stream server on an abstract address that records every request it
receives and answers per docs/sdk-protocol.md (or as a test scripts it). Tests wait for what it
received with `wait_for`, a condition with a deadline; nothing sleeps and hopes.
"""

import json
import os
import secrets
import socket
import threading

import pytest

from shoal import _client

REPLY_OPS = {"resumed", "lease", "done"}


class FakeAgent:
    """Answers `resumed` with ok, `lease`/`done` from scripted queues (or `handler`), and
    nothing to `progress`/`checkpointed`."""

    def __init__(self):
        self.name = f"shoal-sdk-test-{os.getpid()}-{secrets.token_hex(6)}"
        self.address = "@" + self.name
        self.received = []          # every request, in arrival order, as dicts
        self.connections = 0        # connections accepted so far
        self.lease_replies = []     # scripted replies to `lease`, popped in order
        self.done_replies = []      # scripted replies to `done`, popped in order
        self.handler = None         # optional: msg -> reply dict, None (no reply) or "close"
        self._cond = threading.Condition()
        self._conns = []
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(b"\0" + self.name.encode())
        self._listener.listen(16)
        self._closed = False
        threading.Thread(target=self._accept_loop, daemon=True).start()

    # -- the server

    def _accept_loop(self):
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            with self._cond:
                if self._closed:
                    conn.close()
                    return
                self.connections += 1
                self._conns.append(conn)
                self._cond.notify_all()
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        buffer = b""
        while True:
            try:
                chunk = conn.recv(65536)
            except OSError:
                return
            if not chunk:
                return
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                message = json.loads(line)
                reply = self._reply(message)  # first: a waiter sees the handler's effects
                with self._cond:
                    self.received.append(message)
                    self._cond.notify_all()
                if reply == "close":
                    conn.close()
                    return
                if reply is not None:
                    try:
                        conn.sendall(json.dumps(reply).encode() + b"\n")
                    except OSError:
                        return

    def _reply(self, message):
        if self.handler is not None:
            return self.handler(message)
        op = message.get("op")
        if op == "resumed":
            return {"ok": True}
        if op == "lease":
            return self.lease_replies.pop(0) if self.lease_replies else {
                "ok": True, "exhausted": True, "epoch": message.get("epoch")}
        if op == "done":
            return self.done_replies.pop(0) if self.done_replies else {"ok": True}
        return None

    # -- for tests

    def ops(self, op=None):
        with self._cond:
            return [m for m in self.received if op is None or m.get("op") == op]

    def wait_for(self, predicate, timeout=10, what="the fake agent's condition"):
        with self._cond:
            if not self._cond.wait_for(lambda: predicate(self), timeout):
                raise AssertionError(f"timed out after {timeout}s waiting for {what}; "
                                     f"received: {self.received!r}")

    def wait_for_count(self, op, count, timeout=10):
        self.wait_for(lambda a: len([m for m in a.received if m.get("op") == op]) >= count,
                      timeout, f"{count} {op!r} request(s)")

    def drop_connections(self):
        """Closes every accepted connection (as an agent restart would) but keeps listening."""
        with self._cond:
            conns, self._conns = self._conns, []
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()

    def close(self):
        """Stops listening and closes every connection (as a dead agent)."""
        with self._cond:
            self._closed = True
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        self.drop_connections()


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    """No SHOAL_* variable from the runner's environment (tests may run inside a Shoal task),
    and a fresh agent client before and after each test."""
    for key in list(os.environ):
        if key.startswith("SHOAL_") and key != "SHOAL_SOURCE_DIR":
            monkeypatch.delenv(key)
    _client.reset()
    yield
    _client.reset()


@pytest.fixture
def agent(monkeypatch):
    """A FakeAgent, with the task's variables pointing at it (task worker:1, attempt 2)."""
    fake = FakeAgent()
    monkeypatch.setenv("SHOAL_AGENT_SOCKET", fake.address)
    monkeypatch.setenv("SHOAL_ROLE", "worker")
    monkeypatch.setenv("SHOAL_INDEX", "1")
    monkeypatch.setenv("SHOAL_RESTART_COUNT", "2")
    yield fake
    _client.reset()
    fake.close()
