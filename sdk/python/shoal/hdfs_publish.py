"""Publishing into an hdfs:// model repository (docs/design/0015-hdfs-model-repositories.md).

HDFS has no lock a publisher could take (no flock over WebHDFS), so the number is claimed by an
exclusive create instead, and the version appears by one directory rename:

1. v = 1 + max(numeric version directories of `<repo>/<name>`, files in `<name>/.claims`);
2. claim v: CREATE `<name>/.claims/<v>` with overwrite=false. HDFS creates a file atomically, so
   of two publishers claiming v one gets FileAlreadyExistsException (or
   AlreadyBeingCreatedException while the other still holds the new file open) and tries v+1;
3. write the version's files into `<name>/.incoming-<host>-<pid>-<random>/` (HDFS completes a
   file when its writer closes it, before CREATE answers);
4. RENAME that directory to `<name>/<v>` (renameoptions=NONE: refused, never merged, if it
   exists). A rename is one NameNode operation: readers list no version or the whole version.

A publisher that dies leaves at most a claim (the number is skipped) and an `.incoming-` dir
(never a version). `keep` pruning renames each version beyond the newest N to a hidden name,
then deletes it; it also removes claims below the oldest version kept, and `.incoming-` and
`.removing-` directories untouched for an hour (their writer is surely gone).

The C++ SDK and `shoal serve`'s mirror (src/serve/repository/hdfs_repository_mirror.h) follow
the same layout.
"""

import os
import re
import secrets
import socket
import time
from typing import List, Optional

from . import webhdfs

CLAIMS_DIR = ".claims"
INCOMING_PREFIX = ".incoming-"
REMOVING_PREFIX = ".removing-"
STALE_AFTER_S = 3600

_VERSION_RE = re.compile(r"^[1-9][0-9]*$")


# What HDFS answers a CREATE overwrite=false of a name another client has: the file exists
# (closed), or is still being written by the client that created it (its lease; also when that
# client died a moment ago). Either way the name is taken.
_TAKEN_EXCEPTIONS = ("FileAlreadyExistsException", "AlreadyBeingCreatedException")


def _numbers(statuses, kind) -> List[int]:
    return sorted(int(s["pathSuffix"]) for s in statuses
                  if s.get("type") == kind and _VERSION_RE.match(s["pathSuffix"]))


class HdfsModelRepository:
    """The hdfs:// repository `uri`. Raises ValueError for a malformed URI; the methods raise
    OSError (webhdfs.WebHdfsError, webhdfs.WebHdfsUnreachable, FileNotFoundError)."""

    def __init__(self, uri: str, webhdfs_address: Optional[str] = None):
        self.location = webhdfs.HdfsLocation.parse(uri, webhdfs_address)
        self.uri = self.location.uri
        self.client = webhdfs.WebHdfsClient.for_location(self.location)

    def _model_path(self, name: str) -> str:
        return f"{self.location.path.rstrip('/')}/{name}"

    def check(self) -> None:
        """FileNotFoundError unless the repository is an existing directory."""
        status = self.client.status(self.location.path)
        if status.get("type") != "DIRECTORY":
            raise NotADirectoryError(f"{self.location.uri} is not a directory")

    def versions(self, name: str) -> List[int]:
        return _numbers(self.client.list_status(self._model_path(name)), "DIRECTORY")

    def read_config(self, name: str) -> Optional[str]:
        try:
            return self.client.read(f"{self._model_path(name)}/config.yaml").decode()
        except FileNotFoundError:
            return None

    def write_config(self, name: str, text: str) -> None:
        """config.yaml replaced in one RENAME (readers see the old file or the new one)."""
        from .checkpoint import WebHdfsStorage
        storage = WebHdfsStorage(f"{self.location.uri.rstrip('/')}/{name}", self.location.base)
        storage.write_atomically("config.yaml", text.encode())

    def _claim(self, model: str) -> int:
        self.client.mkdirs(f"{model}/{CLAIMS_DIR}")
        taken = max([0, *_numbers(self.client.list_status(model), "DIRECTORY"),
                     *_numbers(self.client.list_status(f"{model}/{CLAIMS_DIR}"), "FILE")])
        version = taken + 1
        while True:
            try:
                self.client.create(f"{model}/{CLAIMS_DIR}/{version}", b"", overwrite=False)
                return version
            except webhdfs.WebHdfsError as e:
                if e.exception not in _TAKEN_EXCEPTIONS:
                    raise
                version += 1

    def publish(self, name: str, files, write_delay_s: float = 0.0) -> int:
        """Writes `files` ({file name: bytes}) as a new version of `name`; its number.
        `write_delay_s` (the test hook): a pause after half of the first file."""
        model = self._model_path(name)
        version = self._claim(model)
        incoming = (f"{model}/{INCOMING_PREFIX}{socket.gethostname()}-{os.getpid()}-"
                    f"{secrets.token_hex(4)}")
        self.client.mkdirs(incoming)
        try:
            for file_name, data in files.items():
                path = f"{incoming}/{file_name}"
                if write_delay_s > 0:
                    half = len(data) // 2
                    self.client.create(path, data[:half], overwrite=False)
                    time.sleep(write_delay_s)
                    self.client.append(path, data[half:])
                    write_delay_s = 0.0
                else:
                    self.client.create(path, data, overwrite=False)
            while True:
                try:
                    self.client.rename(incoming, f"{model}/{version}")
                    return version
                except webhdfs.WebHdfsError as e:
                    # A version made without a claim (copied in by hand): never merged into or
                    # overwritten; the next free number is claimed instead.
                    if e.exception != "FileAlreadyExistsException":
                        raise
                    version = self._claim(model)
        except BaseException:
            try:
                self.client.delete(incoming, recursive=True)
            except OSError:
                pass
            raise

    def prune(self, name: str, keep: int) -> None:
        """Leaves the newest `keep` versions of `name` (see the module's docstring)."""
        model = self._model_path(name)
        entries = self.client.list_status(model)
        numbers = _numbers(entries, "DIRECTORY")
        for number in numbers[:-keep]:
            hidden = f"{model}/{REMOVING_PREFIX}{number}-{secrets.token_hex(4)}"
            try:
                self.client.rename(f"{model}/{number}", hidden)
            except FileNotFoundError:
                continue  # another publisher pruned it
            self.client.delete(hidden, recursive=True)
        kept = numbers[-keep:]
        if kept:
            for claim in _numbers(self.client.list_status(f"{model}/{CLAIMS_DIR}"), "FILE"):
                if claim < kept[0]:
                    self.client.delete(f"{model}/{CLAIMS_DIR}/{claim}")
        now_ms = time.time() * 1000
        for s in entries:
            suffix = s["pathSuffix"]
            if (suffix.startswith((INCOMING_PREFIX, REMOVING_PREFIX))
                    and now_ms - s.get("modificationTime", now_ms) > STALE_AFTER_S * 1000):
                self.client.delete(f"{model}/{suffix}", recursive=True)
