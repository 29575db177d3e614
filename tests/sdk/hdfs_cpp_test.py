"""The C++ SDK's hdfs:// checkpoint directories (sdk/cpp/shoal/sdk.h, WebHDFS) on the project's
HDFS mini-cluster (tests/yarn/cluster.sh), checked against the Python SDK's WebHdfsStorage on
the same directories. ctest runs this file as sdk_hdfs_cpp with the yarn_cluster fixture; by
hand: `SHOAL_YARN_DIR=... tests/yarn/cluster.sh up`, then run pytest with SHOAL_YARN_DIR,
PYTHONPATH=sdk/python and SHOAL_SDK_CHECKPOINT_TOOL (build/tests/sdk/sdk_checkpoint_tool).

The C++ side is sdk_checkpoint_tool (tests/sdk/sdk_checkpoint_tool.cc), a command-line face
of SaveCheckpoint / LoadLatestCheckpoint / ListCheckpoints and PublishModel: the second half of
this file publishes into hdfs:// model repositories (docs/design/0015-hdfs-model-repositories.md)
beside the Python SDK's publish_model.
"""

import http.client
import http.server
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path

import pytest

from shoal import checkpoint, webhdfs

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


# -- PublishModel into hdfs:// model repositories ---------------------------------------------


@pytest.fixture
def repo(cluster, request, monkeypatch):
    """A fresh, existing HDFS model repository: (uri, path, client)."""
    monkeypatch.setenv("SHOAL_WEBHDFS", cluster["SHOAL_WEBHDFS"])
    monkeypatch.setenv("HADOOP_USER_NAME", USER)
    for name in ("SHOAL_MODEL_KEEP", "SHOAL_TEST_PUBLISH_WRITE_DELAY_S", "SHOAL_AGENT_SOCKET"):
        monkeypatch.delenv(name, raising=False)
    path = f"/publish-cpp/{request.node.name[:40]}-{secrets.token_hex(3)}/models"
    client = webhdfs.WebHdfsClient(cluster["SHOAL_WEBHDFS"], USER)
    client.mkdirs(path)
    return f"{cluster['SHOAL_HDFS']}{path}", path, client


def torchscript_file(tmp_path, name, scale):
    """A saved TorchScript module (x * scale): a real archive, distinct bytes per scale."""
    import torch

    class Scale(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = torch.nn.Parameter(torch.full((4,), float(scale)))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * self.scale
    path = tmp_path / name
    torch.jit.script(Scale()).save(str(path))
    return path


def publish(uri, name, model, count=1, config=None, env=None):
    args = ["publish", uri, name, model, count] + ([config] if config else [])
    return tool(*args, env=env)


def published(r):
    assert r.returncode == 0, r.stderr.decode()
    return [int(v) for v in r.stdout.split()]


def hdfs_names(client, path):
    return sorted(s["pathSuffix"] for s in client.list_status(path))


def test_cpp_publishes_numbered_whole_versions_with_config_and_marker_that_python_continues(
        repo, tmp_path):
    from shoal import publish as py_publish
    uri, path, client = repo
    model = torchscript_file(tmp_path, "m.pt", 2)
    config = tmp_path / "config.yaml"
    config.write_text("max_batch_size: 4")
    assert published(publish(uri, "m", model, 2, config)) == [1, 2]
    assert hdfs_names(client, f"{path}/m") == [".claims", "1", "2", "config.yaml"]
    assert hdfs_names(client, f"{path}/m/.claims") == ["1", "2"]
    for v in (1, 2):
        assert hdfs_names(client, f"{path}/m/{v}") == [".shoal-complete", "model.pt"]
        assert client.read(f"{path}/m/{v}/model.pt") == model.read_bytes()
    assert client.read(f"{path}/m/config.yaml") == b"max_batch_size: 4\n"
    # An unchanged config is not rewritten (its modification time stays).
    before = client.status(f"{path}/m/config.yaml")["modificationTime"]
    time.sleep(0.01)
    assert published(publish(uri, "m", model, 1, config)) == [3]
    assert client.status(f"{path}/m/config.yaml")["modificationTime"] == before
    # The Python SDK reads the same numbering and goes on from it.
    assert py_publish.versions(uri, "m") == [1, 2, 3]
    assert py_publish.publish_model(model, "m", repository=uri) == 4


def test_a_cpp_and_a_python_publisher_at_once_never_share_a_number_and_each_version_is_whole(
        repo, tmp_path):
    uri, path, client = repo
    cpp_model = torchscript_file(tmp_path, "cpp.pt", 3)
    py_model = torchscript_file(tmp_path, "py.pt", 5)
    cpp = subprocess.Popen([str(TOOL), "publish", uri, "shared", str(cpp_model), "8"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    py = subprocess.Popen([sys.executable, "-c", f"""
import shoal
print(" ".join(str(shoal.publish_model({str(py_model)!r}, "shared", repository={uri!r}))
               for _ in range(8)))
"""], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    cpp_out, cpp_err = cpp.communicate(timeout=240)
    py_out, py_err = py.communicate(timeout=240)
    assert cpp.returncode == 0, cpp_err.decode()
    assert py.returncode == 0, py_err.decode()
    got_cpp = [int(v) for v in cpp_out.split()]
    got_py = [int(v) for v in py_out.split()]
    assert got_cpp == sorted(got_cpp) and got_py == sorted(got_py)
    assert sorted(got_cpp + got_py) == list(range(1, 17))
    assert hdfs_names(client, f"{path}/shared") == sorted(
        [".claims"] + [str(v) for v in range(1, 17)])
    for v in got_cpp:
        assert hdfs_names(client, f"{path}/shared/{v}") == [".shoal-complete", "model.pt"]
        assert client.read(f"{path}/shared/{v}/model.pt") == cpp_model.read_bytes()
    for v in got_py:
        assert client.read(f"{path}/shared/{v}/model.pt") == py_model.read_bytes()


def test_cpp_publishers_starting_at_once_each_get_their_own_number(repo, tmp_path):
    """Four C++ publishers list the same empty model and claim number 1 at once: HDFS answers
    the losers FileAlreadyExistsException or, while the winner still holds the claim open,
    AlreadyBeingCreatedException; both mean "taken", never a failure."""
    uri, path, client = repo
    model = torchscript_file(tmp_path, "m.pt", 2)
    for round_number in range(3):
        name = f"m{round_number}"
        procs = [subprocess.Popen([str(TOOL), "publish", uri, name, str(model), "1"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                 for _ in range(4)]
        outs = [p.communicate(timeout=120) for p in procs]
        assert all(p.returncode == 0 for p in procs), [e.decode() for _, e in outs]
        assert sorted(int(out) for out, _ in outs) == [1, 2, 3, 4]
        assert [n for n in hdfs_names(client, f"{path}/{name}") if n.isdigit()] == [
            "1", "2", "3", "4"]


def test_a_cpp_publisher_killed_mid_write_leaves_no_version_and_its_number_is_skipped(
        repo, tmp_path):
    uri, path, client = repo
    model = torchscript_file(tmp_path, "m.pt", 2)
    assert published(publish(uri, "m", model)) == [1]
    writer = subprocess.Popen([str(TOOL), "publish", uri, "m", str(model), "1"],
                              env={**os.environ, "SHOAL_TEST_PUBLISH_WRITE_DELAY_S": "60"})

    def half_written():
        assert writer.poll() is None, "the publisher ended before it was killed"
        for entry in client.list_status(f"{path}/m"):
            if entry["pathSuffix"].startswith(".incoming-"):
                files = client.list_status(f"{path}/m/{entry['pathSuffix']}")
                if files and files[0]["length"] > 0:
                    return True
        return False
    deadline = time.monotonic() + 120
    while not half_written():
        assert time.monotonic() < deadline, "the publisher never started writing"
        time.sleep(0.05)
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    assert [n for n in hdfs_names(client, f"{path}/m") if n.isdigit()] == ["1"]
    assert hdfs_names(client, f"{path}/m/.claims") == ["1", "2"]
    assert published(publish(uri, "m", model)) == [3]


def test_cpp_keep_leaves_the_newest_versions_and_clears_stale_leftovers(repo, tmp_path):
    uri, path, client = repo
    model = torchscript_file(tmp_path, "m.pt", 2)
    # A dead publisher's directory, last touched two hours ago, and a fresh one of a live one.
    client.mkdirs(f"{path}/m/.incoming-gone-1-ab")
    client.mkdirs(f"{path}/m/.incoming-alive-2-cd")
    two_hours_ago_ms = int((time.time() - 7200) * 1000)
    client.json("PUT", client.url(f"{path}/m/.incoming-gone-1-ab", "SETTIMES",
                                  modificationtime=str(two_hours_ago_ms)))
    env = {**os.environ, "SHOAL_MODEL_KEEP": "2"}
    for expected in range(1, 5):
        assert published(publish(uri, "m", model, env=env)) == [expected]
        versions = [int(n) for n in hdfs_names(client, f"{path}/m") if n.isdigit()]
        assert sorted(versions) == list(range(max(1, expected - 1), expected + 1))
    assert hdfs_names(client, f"{path}/m") == [".claims", ".incoming-alive-2-cd", "3", "4"]
    assert hdfs_names(client, f"{path}/m/.claims") == ["3", "4"]
    # The numbers go on from the newest claim, not from the versions left.
    assert published(publish(uri, "m", model)) == [5]


def test_a_version_copied_in_without_a_claim_is_never_overwritten_by_cpp(repo, tmp_path):
    uri, path, client = repo
    client.create(f"{path}/m/1/model.pt", b"copied by hand")
    assert published(publish(uri, "m", torchscript_file(tmp_path, "m.pt", 2))) == [2]
    assert client.read(f"{path}/m/1/model.pt") == b"copied by hand"


def test_cpp_bad_hdfs_repositories_are_named_and_publish_nothing(repo, cluster, tmp_path):
    uri, path, client = repo
    model = torchscript_file(tmp_path, "m.pt", 2)
    namenode = cluster["SHOAL_HDFS"]
    client.create(f"{path}-file", b"not a directory")
    for bad, message in [
        ("hdfs:///models", "must be hdfs://namenode[:port]/path"),
        ("hdfs://:8020/models", "must be hdfs://namenode[:port]/path"),
        (f"{namenode}{path}/missing", "does not exist in HDFS (create it first"),
        (f"{namenode}{path}-file", "is not a directory"),
    ]:
        r = publish(bad, "m", model)
        assert r.returncode == 1 and message in r.stderr.decode(), (bad, r.stderr.decode())
    # A NameNode whose WebHDFS does not answer: said so, with the variable to fix it.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]
    r = publish(uri, "m", model, env={**os.environ,
                                      "SHOAL_WEBHDFS": f"http://127.0.0.1:{closed_port}"})
    error = r.stderr.decode()
    assert r.returncode == 1, error
    assert (f"cannot reach the repository {uri}: the NameNode's WebHDFS at "
            f"http://127.0.0.1:{closed_port} is unreachable") in error, error
    assert "set SHOAL_WEBHDFS=http://HOST:PORT" in error, error
    assert hdfs_names(client, path) == []


class RefusingNameNode(http.server.BaseHTTPRequestHandler):
    """A NameNode with permissions on that does not let the user write (the test cluster runs
    with permissions off, so it cannot refuse anyone): the repository exists, writes are
    refused with AccessControlException."""

    def _answer(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if "GETFILESTATUS" in self.path:
            self._answer(200, {"FileStatus": {"type": "DIRECTORY", "length": 0,
                                              "modificationTime": 0, "pathSuffix": ""}})
        else:
            self.do_PUT()

    def do_PUT(self):
        self._answer(403, {"RemoteException": {
            "exception": "AccessControlException",
            "javaClassName": "org.apache.hadoop.security.AccessControlException",
            "message": "Permission denied: user=shoal, access=WRITE, inode=\"/models\":hdfs:"
                       "supergroup:drwxr-xr-x"}})

    def log_message(self, *args):
        pass


def test_cpp_permission_denied_is_said_with_the_hdfs_user(tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), RefusingNameNode)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        env = {**os.environ, "SHOAL_WEBHDFS": f"http://127.0.0.1:{server.server_port}",
               "HADOOP_USER_NAME": USER}
        r = publish("hdfs://nn:8020/models", "m", torchscript_file(tmp_path, "m.pt", 2), env=env)
    finally:
        server.shutdown()
    error = r.stderr.decode()
    assert r.returncode == 1, error
    assert ("cannot publish m to hdfs://nn:8020/models: permission denied for HDFS user 'shoal' "
            "(set HADOOP_USER_NAME to publish as another): Permission denied: user=shoal, "
            "access=WRITE") in error, error
