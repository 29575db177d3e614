"""The connection from a task process to its node's Shoal agent (docs/sdk-protocol.md).

One Unix stream connection per process, opened on first use and re-created in a forked child
(a child never writes to its parent's connection). Requests are newline-delimited JSON; replies
come back in request order, so a request and the read of its reply happen under one lock.

Two kinds of calls:
- `report(op, step)`: fire-and-forget (`progress`, `checkpointed`; `report_alone` for
  `published`, on a connection of its own). Never raises for a socket
  problem: a broken connection is re-made once and the line re-sent; if that fails too, reports
  are disabled for the rest of the process with one warning on stderr.
- `request(fields)`: waits for the reply (`resumed`, `lease`, `done`). A broken connection is
  re-made once and the request re-sent; then `AgentUnavailable` is raised. No reply within
  `REPLY_TIMEOUT_S` raises `AgentTimeout` (and drops the connection, whose reply order is lost).

Without SHOAL_AGENT_SOCKET there is no client: reports are no-ops, requests are the caller's
decision (see reports.py and data.py).
"""

import json
import mmap
import os
import socket
import struct
import sys
import threading
import time

from .errors import AgentError, AgentTimeout, AgentUnavailable

# Seconds to wait for a reply (and for a send into a full socket buffer) before giving up.
REPLY_TIMEOUT_S = 30.0

_MAX_REPLY_BYTES = 1 << 20


def socket_address(text):
    """SHOAL_AGENT_SOCKET as `socket.connect` wants it: `@name` is Linux's abstract namespace."""
    if text.startswith("@"):
        return b"\0" + text[1:].encode()
    return text


class AgentConnection:
    """One stream connection to the agent, connected lazily.

    Not thread-safe: the owner (`_ProcessClient`) serialises every call with its lock.
    """

    def __init__(self, address_text, timeout):
        self.address_text = address_text
        self._timeout = timeout
        self._sock = None
        self._buffer = bytearray()

    def close(self):
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
        self._sock = None
        self._buffer.clear()

    def _connect(self):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            sock.settimeout(self._timeout)
            sock.connect(socket_address(self.address_text))
        except OSError:
            sock.close()
            raise
        self._sock = sock
        self._buffer.clear()

    def _send_once(self, line):
        if self._sock is None:
            self._connect()
        self._sock.sendall(line, socket.MSG_NOSIGNAL)

    def send(self, line):
        """Sends one line, re-making a broken connection once. Raises OSError on failure."""
        try:
            self._send_once(line)
        except OSError:
            self.close()
            self._send_once(line)

    def request(self, line, op):
        """Sends one line and returns the decoded reply object."""
        for attempt in (0, 1):
            try:
                self._send_once(line)
                reply = self._read_line(time.monotonic() + self._timeout)
            except AgentError:
                self.close()
                raise
            except AgentTimeout:
                self.close()
                raise AgentTimeout(
                    f"the Shoal agent at {self.address_text} did not answer {op!r} within "
                    f"{self._timeout:g}s") from None
            except OSError as e:
                self.close()
                if attempt == 0:
                    continue
                raise AgentUnavailable(
                    f"cannot reach the Shoal agent at {self.address_text} for {op!r}: "
                    f"{e.strerror or e}") from e
            if reply is None:  # EOF: the agent closed the connection (e.g. it restarted).
                self.close()
                if attempt == 0:
                    continue
                raise AgentUnavailable(
                    f"the Shoal agent at {self.address_text} closed the connection without "
                    f"answering {op!r}")
            try:
                decoded = json.loads(reply)
            except ValueError:
                decoded = None
            if not isinstance(decoded, dict):
                self.close()
                raise AgentError(f"malformed reply from the Shoal agent to {op!r}: {reply[:200]!r}")
            return decoded
        raise AssertionError("unreachable")

    def _read_line(self, deadline):
        """The next reply line (without the newline), or None at end of stream."""
        while True:
            end = self._buffer.find(b"\n")
            if end >= 0:
                line = bytes(self._buffer[:end])
                del self._buffer[:end + 1]
                return line
            if len(self._buffer) > _MAX_REPLY_BYTES:
                raise AgentError("reply from the Shoal agent exceeds 1 MiB without a newline")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AgentTimeout()
            self._sock.settimeout(remaining)
            try:
                chunk = self._sock.recv(65536)
            except socket.timeout:
                raise AgentTimeout() from None
            finally:
                if self._sock is not None:
                    self._sock.settimeout(self._timeout)
            if not chunk:
                return None
            self._buffer += chunk


class _ProcessClient:
    """The process's agent client: the task's identity, the connection and its lock."""

    def __init__(self, address_text):
        self.pid = os.getpid()
        self.address_text = address_text
        role = os.environ.get("SHOAL_ROLE", "")
        index = os.environ.get("SHOAL_INDEX", "0")
        self.task = f"{role}:{index}"
        try:
            self.attempt = int(os.environ.get("SHOAL_RESTART_COUNT", "0") or 0)
        except ValueError:
            self.attempt = 0
        self.lock = threading.Lock()
        self.connection = AgentConnection(address_text, REPLY_TIMEOUT_S)
        self.reports_disabled = False
        head = '{"op":%s,"task":%s,"attempt":%d,"step":'
        self._report_prefix = {
            op: head % (json.dumps(op), json.dumps(self.task), self.attempt)
            for op in ("progress", "checkpointed")
        }

    def report(self, op, step):
        if self.reports_disabled:
            return
        line = (self._report_prefix[op] + str(step) + "}\n").encode()
        with self.lock:
            if self.reports_disabled:
                return
            try:
                self.connection.send(line)
            except OSError as e:
                self.connection.close()
                self.reports_disabled = True
                print(f"shoal: cannot reach the Shoal agent at {self.address_text} "
                      f"({e.strerror or e}); progress and checkpoint reports are disabled for "
                      f"this process", file=sys.stderr, flush=True)

    def report_alone(self, fields):
        """A fire-and-forget report with fields of its own (`published`), on a connection of
        its own that is closed after the line: an agent older than the op answers it with an
        error, which must not be read as the reply to this process's next request. Never
        raises for a socket problem (one warning on stderr)."""
        message = {"op": fields["op"], "task": self.task, "attempt": self.attempt}
        message.update(fields)
        line = (json.dumps(message, separators=(",", ":"), allow_nan=False) + "\n").encode()
        connection = AgentConnection(self.address_text, REPLY_TIMEOUT_S)
        try:
            connection.send(line)
        except OSError as e:
            print(f"shoal: cannot reach the Shoal agent at {self.address_text} "
                  f"({e.strerror or e}); the {fields['op']!r} report was not sent",
                  file=sys.stderr, flush=True)
        finally:
            connection.close()

    def request(self, fields):
        message = {"op": fields["op"], "task": self.task, "attempt": self.attempt}
        message.update(fields)
        line = (json.dumps(message, separators=(",", ":")) + "\n").encode()
        with self.lock:
            return self.connection.request(line, fields["op"])


_lock = threading.Lock()
_state = None


def _reset_after_fork():
    global _lock, _state
    _lock = threading.Lock()  # the parent's may have been held by another thread at fork
    _state = None


os.register_at_fork(after_in_child=_reset_after_fork)


def client():
    """The process's client, or None when SHOAL_AGENT_SOCKET is unset (not run by Shoal)."""
    global _state
    address = os.environ.get("SHOAL_AGENT_SOCKET")
    if not address:
        return None
    state = _state
    if state is not None and state.pid == os.getpid() and state.address_text == address:
        return state
    with _lock:
        state = _state
        if state is None or state.pid != os.getpid() or state.address_text != address:
            if state is not None and state.pid == os.getpid():
                state.connection.close()
            state = _ProcessClient(address)
            _state = state
        return state


def reset():
    """Drops the process's client (closing its connection) and progress board; the next call
    makes new ones."""
    global _state, _board
    with _lock:
        if _state is not None and _state.pid == os.getpid():
            _state.connection.close()
        _state = None
        _board = None


# ---- the progress board (SHOAL_PROGRESS_FILE; docs/sdk-protocol.md, "The progress file")

_SEQUENCE = struct.Struct("<Q")
_STEP_AND_TIME = struct.Struct("<Qq")
_BOARD_MAGIC = b"SHOALPG1"
_U64_MAX = (1 << 64) - 1


class ProgressBoard:
    """The task's progress board: a step is three stores into a small shared file that the
    agent reads when it builds a heartbeat or its hang watchdog is due, so reporting every step
    sends nothing and wakes no one. A forked child shares the mapping (the same task's)."""

    def __init__(self, path):
        self.path = path
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            self._map = mmap.mmap(fd, 64, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        if self._map[:8] != _BOARD_MAGIC:
            self._map.close()
            raise OSError(f"{path} is not a Shoal progress file")

    def write(self, step):
        m = self._map
        odd = _SEQUENCE.unpack_from(m, 8)[0] | 1  # odd: a write is under way
        _SEQUENCE.pack_into(m, 8, odd)
        _STEP_AND_TIME.pack_into(m, 16, min(max(step, 0), _U64_MAX), time.monotonic_ns())
        _SEQUENCE.pack_into(m, 8, odd + 1)


_board = None  # (path, ProgressBoard or None when it could not be opened)


def progress_board():
    """The board named by SHOAL_PROGRESS_FILE, or None (unset, or not usable: then progress
    goes over the socket as before)."""
    global _board
    path = os.environ.get("SHOAL_PROGRESS_FILE")
    if not path:
        return None
    board = _board
    if board is not None and board[0] == path:
        return board[1]
    try:
        opened = ProgressBoard(path)
    except (OSError, ValueError):
        opened = None
    _board = (path, opened)
    return opened
