"""The C++ SDK's hdfs:// checkpoint directories (sdk/cpp/shoal/sdk.h, WebHDFS) on the project's
HDFS mini-cluster (tests/yarn/cluster.sh), checked against the Python SDK's WebHdfsStorage on
the same directories. ctest runs this file as sdk_hdfs_cpp with the yarn_cluster fixture; by
hand: `SHOAL_YARN_DIR=... tests/yarn/cluster.sh up`, then run pytest with SHOAL_YARN_DIR,
PYTHONPATH=sdk/python and SHOAL_SDK_CHECKPOINT_TOOL (build/tests/sdk/sdk_checkpoint_tool).

The C++ side is sdk_checkpoint_tool (tests/sdk/sdk_checkpoint_tool.cc), a command-line face
of SaveCheckpoint / LoadLatestCheckpoint / ListCheckpoints.
"""

import http.client
import json
import os
import secrets
import socket
import subprocess
import urllib.parse
from pathlib import Path

import pytest

from shoal import checkpoint

SOURCE = Path(os.environ.get("SHOAL_SOURCE_DIR", Path(__file__).resolve().parents[2]))
YARN_DIR = Path(os.environ.get("SHOAL_YARN_DIR", "/tmp/shoal-yarn"))
TOOL = Path(os.environ.get("SHOAL_SDK_CHECKPOINT_TOOL",
                           SOURCE / "build" / "tests" / "sdk" / "sdk_checkpoint_tool"))
USER = "shoal"


@pytest.fixture(scope="module")
def cluster():
    env_file = YARN_DIR / "env"
    assert env_file.is_file(), (
        f"no {env_file}: the HDFS test cluster is not up. Run this through ctest (its "
        f"yarn_cluster fixture starts it), or start it first: tests/yarn/cluster.sh up")
    assert TOOL.is_file(), f"no {TOOL}: build it with `ninja sdk_checkpoint_tool`"
    env = dict(line.split("=", 1) for line in env_file.read_text().splitlines() if "=" in line)
    return env


@pytest.fixture
def hdfs(cluster, request, monkeypatch):
    """A fresh HDFS directory for the test: (uri, path). The Python SDK in this process and
    the C++ tool both reach WebHDFS through SHOAL_WEBHDFS as user `shoal`."""
    monkeypatch.setenv("SHOAL_WEBHDFS", cluster["SHOAL_WEBHDFS"])
    monkeypatch.setenv("HADOOP_USER_NAME", USER)
    path = f"/sdk-cpp/{request.node.name} {secrets.token_hex(3)}/ckpt"  # a space to encode
    return f"{cluster['SHOAL_HDFS']}{path}", path


def tool(*args, env=None, timeout=120):
    return subprocess.run([str(TOOL), *map(str, args)], capture_output=True, timeout=timeout,
                          env=env or os.environ)


def save(uri, step, data, keep, tmp_path):
    src = tmp_path / f"in-{step}"
    src.write_bytes(data)
    r = tool("save", uri, step, keep, src)
    assert r.returncode == 0, r.stderr.decode()
    return r.stdout.decode().strip()


def load(uri, tmp_path, end=None):
    out = tmp_path / f"out-{secrets.token_hex(4)}"
    r = tool("load", uri, out, *([end] if end is not None else []))
    step = int(r.stdout) if r.returncode == 0 else None
    return step, (out.read_bytes() if r.returncode == 0 else None), r


def listing(cluster, path):
    """Names in an HDFS directory, straight from WebHDFS (not through either SDK)."""
    parts = urllib.parse.urlsplit(cluster["SHOAL_WEBHDFS"])
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    conn.request("GET", f"/webhdfs/v1{urllib.parse.quote(path)}?op=LISTSTATUS&user.name={USER}")
    response = conn.getresponse()
    data = response.read()
    conn.close()
    assert response.status == 200, data
    return sorted(s["pathSuffix"] for s in json.loads(data)["FileStatuses"]["FileStatus"])


def test_cpp_save_writes_the_python_file_names_prunes_to_keep_and_removes_leftovers(
        cluster, hdfs, tmp_path):
    uri, path = hdfs
    storage = checkpoint.WebHdfsStorage(uri)
    assert save(uri, 1, b"one", 2, tmp_path) == f"{uri}/ckpt-000000000001.pt"
    # A killed writer's temporary, older than the next write: that write removes it.
    storage._request("PUT", storage._url(f"{path}/.tmp-ckpt-000000000002.pt.otherhost.1.ab",
                                         "CREATE", overwrite="true"), b"partial")
    for step in (2, 3, 4):
        save(uri, step, b"step %d" % step, 2, tmp_path)
    assert listing(cluster, path) == ["ckpt-000000000003.pt", "ckpt-000000000004.pt"]
    r = tool("list", uri)
    assert r.returncode == 0 and r.stdout.decode().split() == ["3", "4"], r
    assert checkpoint.Checkpointer(dir=uri, serializer="raw").steps() == [3, 4]


def test_cpp_checkpoints_load_in_python_and_python_checkpoints_load_in_cpp(
        cluster, hdfs, tmp_path):
    uri, path = hdfs
    data = bytes(range(256)) * 16 + os.urandom(3 << 20)  # every byte value, several MB
    save(uri, 7, data, 3, tmp_path)
    assert checkpoint.WebHdfsStorage(uri).read("ckpt-000000000007.pt") == data
    step, state = checkpoint.Checkpointer(dir=uri, serializer="raw").load_latest()
    assert step == 7 and state == data

    python_data = os.urandom(200_000) + b"\0python"
    checkpoint.Checkpointer(dir=uri, keep=3, serializer="raw").save(8, python_data)
    step, loaded, r = load(uri, tmp_path)
    assert (step, loaded == python_data) == (8, True), r.stderr.decode()
    assert listing(cluster, path) == ["ckpt-000000000007.pt", "ckpt-000000000008.pt"]


def test_a_corrupt_newest_checkpoint_is_skipped_with_a_warning_and_the_previous_loads(
        hdfs, tmp_path):
    uri, _ = hdfs
    save(uri, 1, b"complete state END", 3, tmp_path)
    save(uri, 2, b"second complete state END", 3, tmp_path)
    # A cut-short newest checkpoint (as a writer outside the SDKs could leave).
    checkpoint.WebHdfsStorage(uri).write_atomically("ckpt-000000000003.pt", b"second comp")
    step, loaded, r = load(uri, tmp_path, end="END")
    assert (step, loaded) == (2, b"second complete state END"), r.stderr.decode()
    warning = r.stderr.decode()
    assert f"skipping checkpoint {uri}/ckpt-000000000003.pt" in warning, warning
    assert "trying the previous one" in warning


def test_an_empty_or_missing_directory_loads_nothing_quietly(hdfs, tmp_path):
    uri, _ = hdfs
    step, loaded, r = load(uri, tmp_path)
    assert r.returncode == 3 and r.stderr == b"", r.stderr.decode()
    assert tool("list", uri).stdout == b""


def test_hdfs_refusing_an_operation_is_an_error_value_with_its_message(hdfs, tmp_path):
    uri, path = hdfs
    # The checkpoint directory's parent is a file: MKDIRS fails on the NameNode.
    checkpoint.WebHdfsStorage(uri).write_atomically("blocker", b"x")
    (tmp_path / "in").write_bytes(b"x")
    r = tool("save", f"{uri}/blocker/sub", 1, 1, tmp_path / "in")
    error = r.stderr.decode()
    assert r.returncode == 1, error
    assert "WebHDFS MKDIRS http" in error and "/webhdfs/v1" in error, error
    assert "/blocker" in error and "HTTP 403" in error, error  # HDFS's ParentNotDirectory...
    assert "RemoteException" not in error  # its message, not the raw JSON


def test_an_unreachable_webhdfs_address_is_an_error_value(hdfs, tmp_path):
    uri, _ = hdfs
    (tmp_path / "in").write_bytes(b"x")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]
    env = {**os.environ, "SHOAL_WEBHDFS": f"http://127.0.0.1:{closed_port}"}
    r = tool("save", uri, 1, 1, tmp_path / "in", env=env)
    assert r.returncode == 1, r
    assert f"WebHDFS MKDIRS http://127.0.0.1:{closed_port}/webhdfs/v1/" in r.stderr.decode()
    assert "cannot connect" in r.stderr.decode(), r.stderr.decode()
    r = tool("load", uri, tmp_path / "out", env=env)
    assert r.returncode == 3 and "cannot load a checkpoint: WebHDFS LISTSTATUS" in r.stderr.decode()


def test_a_webhdfs_address_that_never_answers_is_an_error_value_not_a_hang(hdfs, tmp_path):
    uri, _ = hdfs
    (tmp_path / "in").write_bytes(b"x")
    with socket.socket() as silent:  # accepts connections (the kernel does), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        env = {**os.environ, "SHOAL_WEBHDFS": f"http://127.0.0.1:{silent.getsockname()[1]}"}
        r = tool("save", uri, 1, 1, tmp_path / "in", env=env, timeout=240)
    assert r.returncode == 1, r
    assert "WebHDFS MKDIRS" in r.stderr.decode() and "timed out" in r.stderr.decode(), r.stderr
