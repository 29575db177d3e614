"""HDFS through WebHDFS (plain HTTP: no JVM, no libhdfs in the task), for hdfs:// checkpoint
directories (checkpoint.WebHdfsStorage) and hdfs:// model repositories (publish.py).

`HdfsLocation.parse("hdfs://namenode[:port]/path")` finds the NameNode's HTTP address: the
`webhdfs` argument, else $SHOAL_WEBHDFS, else the NameNode's host on port 9870 (Hadoop 3's
default). The user is $HADOOP_USER_NAME, else this process's (simple authentication,
user.name=).

Errors: `FileNotFoundError` for a path that does not exist (HTTP 404); `WebHdfsError` (an
OSError) for any other refusal, with the HTTP status and the NameNode's exception name
(`AccessControlException`, `FileAlreadyExistsException`, ...); `WebHdfsUnreachable` (an OSError)
when nothing answers at the WebHDFS address.
"""

import getpass
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from typing import Dict, List, Optional

WEBHDFS_ENV = "SHOAL_WEBHDFS"
WEBHDFS_DEFAULT_PORT = 9870  # Hadoop 3's NameNode HTTP port
TIMEOUT_S = 60


class WebHdfsError(OSError):
    """WebHDFS refused an operation. `status`: the HTTP status; `exception`: the Java exception
    the NameNode or DataNode named (e.g. "AccessControlException"), or ""."""

    def __init__(self, message, status=0, exception="", remote_message=""):
        super().__init__(message)
        self.status = status
        self.exception = exception
        self.remote_message = remote_message


class WebHdfsUnreachable(OSError):
    """Nothing answered at a WebHDFS address (refused, unresolvable, timed out, the connection
    broken); `address` is the NameNode's or a DataNode's, `reason` says what happened."""

    reason = ""
    address = ""


class HdfsLocation:
    """An hdfs://namenode[:port]/path URI, resolved to the WebHDFS address and user that reach
    it. `path` is absolute without a trailing '/' ("/" for the root)."""

    def __init__(self, uri: str, base: str, path: str, user: str):
        self.uri = uri
        self.base = base
        self.path = path
        self.user = user

    @classmethod
    def parse(cls, uri, webhdfs: Optional[str] = None) -> "HdfsLocation":
        """ValueError naming what is wrong unless `uri` is hdfs://namenode[:port]/path."""
        text = os.fspath(uri)
        parts = urllib.parse.urlsplit(text)
        if parts.scheme != "hdfs" or not parts.hostname or not parts.path.startswith("/"):
            raise ValueError(f"not an hdfs://namenode[:port]/path URI: {text!r}")
        base = webhdfs or os.environ.get(WEBHDFS_ENV) or \
            f"http://{parts.hostname}:{WEBHDFS_DEFAULT_PORT}"
        user = os.environ.get("HADOOP_USER_NAME") or getpass.getuser()
        return cls(text, base.rstrip("/"), parts.path.rstrip("/") or "/", user)


class WebHdfsClient:
    """The WebHDFS operations of one NameNode, as one user. Paths are absolute HDFS paths."""

    def __init__(self, base: str, user: str):
        self.base = base.rstrip("/")
        self.user = user

    @classmethod
    def for_location(cls, location: HdfsLocation) -> "WebHdfsClient":
        return cls(location.base, location.user)

    def url(self, path: str, op: str, **params) -> str:
        query = urllib.parse.urlencode({"op": op, "user.name": self.user, **params})
        return f"{self.base}/webhdfs/v1{urllib.parse.quote(path)}?{query}"

    def request(self, method, url, data=None, follow=True):
        """(status, body bytes, headers); redirects (NameNode -> DataNode) followed by hand,
        because urllib does not follow them for PUT."""

        class NoRedirect(urllib.request.HTTPRedirectHandler):
            def redirect_request(self, *args, **kwargs):
                return None
        opener = urllib.request.build_opener(NoRedirect)
        for _ in range(3):
            request = urllib.request.Request(url, data=data, method=method)
            if data is not None:
                request.add_header("Content-Type", "application/octet-stream")
            try:
                with opener.open(request, timeout=TIMEOUT_S) as response:
                    return response.status, response.read(), response.headers
            except urllib.error.HTTPError as e:
                if e.code in (301, 302, 303, 307, 308) and follow and e.headers.get("Location"):
                    url = e.headers["Location"]
                    continue
                body = e.read()
                raise _refusal(method, url, e.code, body) from None
            except (urllib.error.URLError, OSError) as e:
                # The NameNode, or the DataNode it redirected to.
                parts = urllib.parse.urlsplit(url)
                address = f"{parts.scheme}://{parts.netloc}"
                error = WebHdfsUnreachable(
                    f"WebHDFS at {address} does not answer ({method} "
                    f"{url.split('?', 1)[0]}): {getattr(e, 'reason', e)}")
                error.reason = str(getattr(e, "reason", e))
                error.address = address
                raise error from None
        raise WebHdfsError(f"WebHDFS {method} {url}: too many redirects")

    def json(self, method, url, data=None):
        _, body, _ = self.request(method, url, data)
        return json.loads(body) if body else {}

    # -- Operations --------------------------------------------------------------------------

    def status(self, path: str) -> Dict:
        """GETFILESTATUS: the FileStatus object (type, length, modificationTime, ...)."""
        return self.json("GET", self.url(path, "GETFILESTATUS"))["FileStatus"]

    def list_status(self, path: str) -> List[Dict]:
        """LISTSTATUS: FileStatus objects of the entries of `path` (pathSuffix is the name);
        [] when it does not exist."""
        try:
            listing = self.json("GET", self.url(path, "LISTSTATUS"))
        except FileNotFoundError:
            return []
        return listing.get("FileStatuses", {}).get("FileStatus", [])

    def mkdirs(self, path: str) -> None:
        self.json("PUT", self.url(path, "MKDIRS"))

    def create(self, path: str, data: bytes, overwrite: bool = True) -> None:
        """Writes `data` as the file `path` (complete once this returns: HDFS closes it). With
        overwrite=False an existing file is refused with WebHdfsError whose exception is
        FileAlreadyExistsException: HDFS creates the file atomically, so of two creators of
        one name exactly one succeeds."""
        self.request("PUT", self.url(path, "CREATE", overwrite="true" if overwrite else "false"),
                     bytes(data))

    def append(self, path: str, data: bytes) -> None:
        self.request("POST", self.url(path, "APPEND"), bytes(data))

    def read(self, path: str) -> bytes:
        _, body, _ = self.request("GET", self.url(path, "OPEN"))
        return body

    def rename(self, source: str, destination: str, overwrite: bool = False) -> None:
        """One NameNode operation. Without overwrite an existing destination is refused
        (FileAlreadyExistsException): renameoptions=NONE asks for HDFS's rename2, whereas no
        options would move `source` INTO an existing destination directory."""
        result = self.json("PUT", self.url(source, "RENAME", destination=destination,
                                           renameoptions="OVERWRITE" if overwrite else "NONE"))
        if result.get("boolean") is False:
            raise WebHdfsError(f"WebHDFS could not rename {source} to {destination}")

    def delete(self, path: str, recursive: bool = False) -> None:
        """No error when `path` does not exist."""
        try:
            self.json("DELETE",
                      self.url(path, "DELETE", recursive="true" if recursive else "false"))
        except FileNotFoundError:
            pass


def _refusal(method, url, code, body) -> OSError:
    exception, message = "", ""
    try:
        remote = json.loads(body).get("RemoteException", {})
        exception = str(remote.get("exception", ""))
        # A DataNode appends the NameNode's Java stack to the message: its first line says it.
        message = str(remote.get("message", "")).split("\n", 1)[0].strip()
    except (ValueError, AttributeError):
        pass
    where = url.split("?", 1)[0]
    op = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query).get("op", [""])[0]
    text = f"WebHDFS {op or method} {where}: HTTP {code}: {message or body[:300]!r}"
    if code == 404:
        return FileNotFoundError(text)
    return WebHdfsError(text, status=code, exception=exception, remote_message=message)
