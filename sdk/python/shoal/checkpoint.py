"""Checkpoints that survive a crash at any instant, and the seam for other storages.

Three layers, each replaceable without touching training scripts:

- `Checkpointer`: what a training script uses. Owns the naming (`ckpt-<step:012d>.pt`, the
  step zero-padded to 12 digits), serialisation, retention (`keep` newest complete checkpoints)
  and the reports to the agent (`checkpointed` after a save, `resumed` after a load).
- `CheckpointStorage`: where the bytes live. Four operations on named objects: `list` (complete
  objects only), `write_atomically` (all or nothing: readers see the old state or the whole new
  object, never part of it), `read`, `delete`.
- `WebHdfsStorage`: an HDFS directory through WebHDFS, chosen for `hdfs://` directories
  (docs/backends/yarn.md): a temporary name, then one RENAME over the final name.
- `LocalDirStorage`: a directory on a POSIX filesystem. An object is
  written to `.tmp-<name>.<pid>.<random>` in the same directory, flushed and fsync'd, renamed
  to `<name>`, then the directory is fsync'd. `list` never shows `.tmp-*` files; a writer killed
  mid-write leaves one behind, and the next successful write removes temporaries older than its
  own.

Adding a storage (an in-memory copy on a peer task, HDFS, an object store): subclass
`CheckpointStorage`, implement the four operations with the same all-or-nothing guarantee, and
pass it as `Checkpointer(storage=...)` (or construct it from job configuration in the SDK later).
Scripts keep calling `save`/`load_latest` and never see file names.

Serialisation (`serializer=`): `"auto"` (the default) saves with `torch.save` when torch can be
imported, else with `pickle`; it loads by looking at the bytes (a zip archive is torch's
format, anything else is read as a pickle), so a job can load checkpoints written with or
without torch installed. `"torch"` and `"pickle"` force one format; `"raw"` stores `bytes` as
they are (what the C++ SDK, `sdk/cpp/shoal/sdk.h`, writes and reads). Any object with
`dumps(state) -> bytes` and `loads(bytes) -> state` works too.

Test hook: the environment variable SHOAL_TEST_CHECKPOINT_WRITE_DELAY_S (a float, seconds)
makes `LocalDirStorage.write_atomically` sleep that long after writing the first half of the
bytes to the temporary file, so that a test can kill the writer mid-write. Not for production.
"""

import abc
import importlib.util
import inspect
import io
import os
import pickle
import re
import secrets
import sys
import time
from typing import List, Optional, Tuple

from . import reports
from . import webhdfs as webhdfs_client

CHECKPOINT_PREFIX = "ckpt-"
CHECKPOINT_SUFFIX = ".pt"
TEMP_PREFIX = ".tmp-"
DEFAULT_KEEP = 3
WRITE_DELAY_ENV = "SHOAL_TEST_CHECKPOINT_WRITE_DELAY_S"

_NAME_RE = re.compile(r"^ckpt-([0-9]+)\.pt$")


def checkpoint_name(step: int) -> str:
    """The object name of the checkpoint of `step`: `ckpt-000000000200.pt`."""
    if step < 0:
        raise ValueError(f"a checkpoint step must not be negative, got {step}")
    return f"{CHECKPOINT_PREFIX}{step:012d}{CHECKPOINT_SUFFIX}"


def checkpoint_step(name: str) -> Optional[int]:
    """The step of a checkpoint object name, or None if `name` is not a checkpoint's."""
    match = _NAME_RE.match(name)
    return int(match.group(1)) if match else None


# ------------------------------------------------------------------------------------------
# Storage


class CheckpointStorage(abc.ABC):
    """Where checkpoint bytes live. Implementations must make `write_atomically` all or nothing
    and must never `list` an object whose write has not completed."""

    @abc.abstractmethod
    def list(self) -> List[str]:
        """Names of the complete objects, in no particular order."""

    @abc.abstractmethod
    def write_atomically(self, name: str, data: bytes) -> str:
        """Stores `data` as `name` (replacing it), durably; returns where it went."""

    @abc.abstractmethod
    def read(self, name: str) -> bytes:
        """The bytes of `name`. Raises OSError (FileNotFoundError if it does not exist)."""

    @abc.abstractmethod
    def delete(self, name: str) -> None:
        """Removes `name`; no error when it does not exist."""


def _write_all(fd, view):
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _fsync_dir(path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _test_write_delay_s() -> float:
    value = os.environ.get(WRITE_DELAY_ENV)
    if not value:
        return 0.0
    try:
        return max(0.0, float(value))
    except ValueError:
        raise ValueError(f"{WRITE_DELAY_ENV}={value!r} is not a number") from None


class LocalDirStorage(CheckpointStorage):
    """Objects as files in one directory of a POSIX filesystem (created on first write)."""

    def __init__(self, directory):
        self.directory = os.fspath(directory)

    def __repr__(self):
        return f"LocalDirStorage({self.directory!r})"

    def _path(self, name):
        if not name or "/" in name or name.startswith(".") or name in ("..",):
            raise ValueError(f"invalid checkpoint object name {name!r}")
        return os.path.join(self.directory, name)

    def list(self) -> List[str]:
        try:
            entries = list(os.scandir(self.directory))
        except FileNotFoundError:
            return []
        return [e.name for e in entries
                if not e.name.startswith(TEMP_PREFIX) and not e.name.startswith(".")
                and e.is_file(follow_symlinks=False)]

    def write_atomically(self, name: str, data: bytes) -> str:
        final = self._path(name)
        os.makedirs(self.directory, exist_ok=True)
        temp = os.path.join(self.directory,
                            f"{TEMP_PREFIX}{name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            started_ns = os.fstat(fd).st_mtime_ns
            view = memoryview(data).cast("B")
            delay = _test_write_delay_s()
            if delay > 0:
                half = len(view) // 2
                _write_all(fd, view[:half])
                time.sleep(delay)
                _write_all(fd, view[half:])
            else:
                _write_all(fd, view)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            try:
                os.unlink(temp)
            except OSError:
                pass
            raise
        os.close(fd)
        os.rename(temp, final)
        _fsync_dir(self.directory)
        self._remove_stale_temporaries(started_ns)
        return final

    def _remove_stale_temporaries(self, older_than_ns):
        """Removes leftovers of writers that died mid-write: `.tmp-*` files last written before
        `older_than_ns`, or named after a process of this machine that no longer exists (file
        times tick coarsely, so a writer killed a moment ago can share our timestamp). Others
        may belong to a writer still at work."""
        try:
            entries = list(os.scandir(self.directory))
        except OSError:
            return
        for entry in entries:
            if not entry.name.startswith(TEMP_PREFIX):
                continue
            try:
                if (entry.stat(follow_symlinks=False).st_mtime_ns < older_than_ns
                        or _writer_is_gone(entry.name)):
                    os.unlink(entry.path)
            except OSError:
                pass

    def read(self, name: str) -> bytes:
        with open(self._path(name), "rb") as f:
            return f.read()

    def delete(self, name: str) -> None:
        try:
            os.unlink(self._path(name))
        except FileNotFoundError:
            pass


class WebHdfsStorage(CheckpointStorage):
    """Objects as files in one HDFS directory, through WebHDFS (webhdfs.py: plain HTTP, no JVM
    in the task). `uri` is hdfs://namenode[:port]/path; `webhdfs` the NameNode's HTTP address
    (http://host:port), default $SHOAL_WEBHDFS, else the NameNode's host on port 9870.

    All or nothing as for local checkpoints: an object is written (CREATE, which HDFS completes
    on close) to `.tmp-<name>.<host>.<pid>.<random>` in the same directory, then RENAMEd over
    `<name>` with renameoptions=OVERWRITE (one NameNode operation: readers see the old object
    or the new one). Leftover temporaries older than the latest write are removed by it.
    The user is $HADOOP_USER_NAME, else this process's (WebHDFS simple authentication)."""

    def __init__(self, uri, webhdfs=None):
        location = webhdfs_client.HdfsLocation.parse(uri, webhdfs)
        self.uri = location.uri
        self.path = location.path
        self.base = location.base
        self.user = location.user
        self.client = webhdfs_client.WebHdfsClient.for_location(location)

    def __repr__(self):
        return f"WebHdfsStorage({self.uri!r} via {self.base})"

    # The raw calls, for tests that plant objects beside the storage's own.
    def _url(self, path, op, **params):
        return self.client.url(path, op, **params)

    def _request(self, method, url, data=None, follow=True):
        return self.client.request(method, url, data, follow)

    def _name_path(self, name):
        if not name or "/" in name or name.startswith(".") or name in ("..",):
            raise ValueError(f"invalid checkpoint object name {name!r}")
        return f"{self.path}/{name}"

    def list(self) -> List[str]:
        return [s["pathSuffix"] for s in self.client.list_status(self.path)
                if s.get("type") == "FILE" and not s["pathSuffix"].startswith(".")]

    def write_atomically(self, name: str, data: bytes) -> str:
        import socket
        final = self._name_path(name)
        temp = (f"{self.path}/{TEMP_PREFIX}{name}.{socket.gethostname()}.{os.getpid()}."
                f"{secrets.token_hex(4)}")
        self.client.mkdirs(self.path)
        delay = _test_write_delay_s()
        if delay > 0:
            # Half the bytes, then the wait a test kills the writer in, then the rest (APPEND).
            half = len(data) // 2
            self.client.create(temp, data[:half])
            time.sleep(delay)
            self.client.append(temp, data[half:])
        else:
            self.client.create(temp, data)
        written = self.client.status(temp)
        self.client.rename(temp, final, overwrite=True)
        for s in self.client.list_status(self.path):
            if (s["pathSuffix"].startswith(TEMP_PREFIX)
                    and s.get("modificationTime", 0) < written.get("modificationTime", 0)):
                self.client.delete(f"{self.path}/{s['pathSuffix']}")
        return f"{self.uri.rstrip('/')}/{name}"

    def read(self, name: str) -> bytes:
        return self.client.read(self._name_path(name))

    def delete(self, name: str) -> None:
        self.client.delete(self._name_path(name))


def storage_for(directory):
    """The storage a checkpoint directory names: hdfs:// URIs go through WebHDFS, anything else
    is a local directory."""
    text = os.fspath(directory)
    if text.startswith("hdfs://"):
        return WebHdfsStorage(text)
    if "://" in text:
        raise ValueError(f"unsupported checkpoint storage {text!r}; use a local directory or "
                         "hdfs://namenode/path")
    return LocalDirStorage(text)


def _writer_is_gone(temp_name: str) -> bool:
    """True when `.tmp-<name>.<pid>.<random>` names a pid with no process on this machine."""
    parts = temp_name.rsplit(".", 2)
    if len(parts) != 3 or not parts[1].isdigit():
        return False
    pid = int(parts[1])
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    # A zombie (killed, not yet reaped by its parent) is gone too.
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except OSError:
        return True


# ------------------------------------------------------------------------------------------
# Serialisation

_ZIP_MAGIC = b"PK\x03\x04"


def _torch_available() -> bool:
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):  # e.g. sys.modules["torch"] is None: import blocked
        return False


class TorchSerializer:
    """`torch.save` / `torch.load`. `map_location` is passed to torch.load."""

    def __init__(self, map_location=None):
        self.map_location = map_location

    def dumps(self, state) -> bytes:
        import torch
        buffer = io.BytesIO()
        torch.save(state, buffer)
        return buffer.getvalue()

    def loads(self, data: bytes):
        import torch
        kwargs = {"map_location": self.map_location}
        # The checkpoint is the job's own: load everything it holds, as torch < 2.6 did.
        if "weights_only" in inspect.signature(torch.load).parameters:
            kwargs["weights_only"] = False
        return torch.load(io.BytesIO(data), **kwargs)


class PickleSerializer:
    def dumps(self, state) -> bytes:
        return pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)

    def loads(self, data: bytes):
        return pickle.loads(data)


class RawSerializer:
    """Stores bytes as they are: the format of checkpoints written by the C++ SDK."""

    def dumps(self, state) -> bytes:
        if not isinstance(state, (bytes, bytearray, memoryview)):
            raise TypeError(f"the raw serializer stores bytes, got {type(state).__name__}")
        return bytes(state)

    def loads(self, data: bytes):
        return data


class AutoSerializer:
    """torch.save when torch is importable, else pickle; loads either by sniffing the bytes."""

    def __init__(self, map_location=None):
        self._torch = TorchSerializer(map_location)
        self._pickle = PickleSerializer()

    def dumps(self, state) -> bytes:
        if _torch_available():
            try:
                import torch  # noqa: F401
            except Exception:
                return self._pickle.dumps(state)
            return self._torch.dumps(state)
        return self._pickle.dumps(state)

    def loads(self, data: bytes):
        if data[:4] == _ZIP_MAGIC:
            if not _torch_available():
                raise RuntimeError("written by torch.save, but torch is not installed")
            return self._torch.loads(data)
        return self._pickle.loads(data)


def _make_serializer(serializer, map_location):
    if isinstance(serializer, str):
        choices = {
            "auto": lambda: AutoSerializer(map_location),
            "torch": lambda: TorchSerializer(map_location),
            "pickle": PickleSerializer,
            "raw": RawSerializer,
        }
        if serializer not in choices:
            raise ValueError(f"unknown serializer {serializer!r}; expected one of "
                             f"{', '.join(choices)} or an object with dumps/loads")
        return choices[serializer]()
    if not (hasattr(serializer, "dumps") and hasattr(serializer, "loads")):
        raise TypeError("a serializer needs dumps(state) -> bytes and loads(bytes) -> state")
    return serializer


# ------------------------------------------------------------------------------------------
# Checkpointer


class Checkpointer:
    """Saves and loads a training script's checkpoints.

    `dir`: the checkpoint directory; default SHOAL_CHECKPOINT_DIR (ignored when `storage` is
    given). `keep`: how many complete checkpoints to keep, at least 1; default
    SHOAL_CHECKPOINT_KEEP, else 3. `storage`: a CheckpointStorage (default LocalDirStorage(dir)).
    `serializer`: "auto" (default), "torch", "pickle", "raw" or an object with dumps/loads.
    `map_location`: passed to torch.load.
    """

    def __init__(self, dir=None, keep=None, storage=None, serializer="auto", map_location=None):
        if storage is None:
            if dir is None:
                dir = os.environ.get("SHOAL_CHECKPOINT_DIR") or None
            if dir is None:
                raise ValueError(
                    "no checkpoint directory: pass Checkpointer(dir=...), or run the task under "
                    "Shoal with a `checkpoint` section in the job file (SHOAL_CHECKPOINT_DIR)")
            storage = storage_for(dir)
        if keep is None:
            value = os.environ.get("SHOAL_CHECKPOINT_KEEP")
            if value:
                try:
                    keep = int(value)
                except ValueError:
                    raise ValueError(f"SHOAL_CHECKPOINT_KEEP={value!r} is not an integer") from None
            else:
                keep = DEFAULT_KEEP
        if int(keep) < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        self.keep = int(keep)
        self.storage = storage
        self.serializer = _make_serializer(serializer, map_location)

    def __repr__(self):
        return f"Checkpointer(storage={self.storage!r}, keep={self.keep})"

    def _checkpoints(self) -> List[Tuple[int, str]]:
        """(step, name) of the complete checkpoints, ascending."""
        return sorted((step, name) for name in self.storage.list()
                      if (step := checkpoint_step(name)) is not None)

    def steps(self) -> List[int]:
        """The steps of the complete checkpoints, ascending."""
        return [step for step, _ in self._checkpoints()]

    def save(self, step: int, state) -> str:
        """Serialises `state` as the checkpoint of `step`, atomically; returns where it went.

        Then removes the oldest complete checkpoints beyond `keep` (never the one just
        written) and reports `checkpointed` to the agent (fire-and-forget; none outside Shoal).
        """
        step = int(step)
        name = checkpoint_name(step)
        data = self.serializer.dumps(state)
        location = self.storage.write_atomically(name, data)
        self._prune(keep_name=name)
        reports.checkpointed(step)
        return location

    def _prune(self, keep_name):
        checkpoints = self._checkpoints()
        excess = len(checkpoints) - self.keep
        for _, name in checkpoints:
            if excess <= 0:
                break
            if name == keep_name:
                continue
            self.storage.delete(name)
            excess -= 1

    def load_latest(self) -> Tuple[int, object]:
        """`(step, state)` of the newest checkpoint that loads, or `(0, None)` when none does.

        A checkpoint that fails to read or deserialise (corrupt, truncated) is skipped with a
        warning on stderr and the previous one is tried. Then reports `resumed` with the step
        to the agent and waits for its answer (none outside Shoal); raises AgentError when the
        agent refuses it.
        """
        for step, name in reversed(self._checkpoints()):
            try:
                state = self.serializer.loads(self.storage.read(name))
            except MemoryError:
                raise
            except FileNotFoundError:
                continue  # removed since it was listed (another writer pruned it)
            except Exception as e:
                print(f"shoal: skipping checkpoint {name} in {self.storage!r}: cannot load it "
                      f"({type(e).__name__}: {e}); trying the previous one",
                      file=sys.stderr, flush=True)
                continue
            reports.resumed(step)
            return step, state
        reports.resumed(0)
        return 0, None
