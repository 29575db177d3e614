"""shoal.publish_model into hdfs:// repositories (sdk/python/shoal/hdfs_publish.py) on the
project's HDFS mini-cluster (tests/yarn/cluster.sh): numbers claimed once under two concurrent
publishers, versions that appear whole to a poller, a killed publisher that leaves no version,
keep, and clear errors. ctest runs this file as sdk_hdfs_publish with the yarn_cluster fixture
(one cluster for the whole run); by hand: `SHOAL_YARN_DIR=... tests/yarn/cluster.sh up`, then
pytest with SHOAL_YARN_DIR and PYTHONPATH=sdk/python."""

import http.server
import json
import os
import secrets
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch

import shoal
from shoal import webhdfs
from shoal.hdfs_publish import CLAIMS_DIR, INCOMING_PREFIX
from shoal.publish import versions

YARN_DIR = Path(os.environ.get("SHOAL_YARN_DIR", "/tmp/shoal-yarn"))
SDK_PYTHON = str(Path(shoal.__file__).resolve().parents[1])
USER = "shoal"


@pytest.fixture(scope="module")
def cluster():
    env_file = YARN_DIR / "env"
    assert env_file.is_file(), (
        f"no {env_file}: the HDFS test cluster is not up. Run this through ctest (its "
        f"yarn_cluster fixture starts it), or start it first: tests/yarn/cluster.sh up")
    return dict(line.split("=", 1) for line in env_file.read_text().splitlines() if "=" in line)


@pytest.fixture
def repo(cluster, request, monkeypatch):
    """A fresh, existing HDFS repository for the test: (uri, path, client)."""
    monkeypatch.setenv("SHOAL_WEBHDFS", cluster["SHOAL_WEBHDFS"])
    monkeypatch.setenv("HADOOP_USER_NAME", USER)
    monkeypatch.delenv("SHOAL_MODEL_KEEP", raising=False)
    monkeypatch.delenv("SHOAL_TEST_PUBLISH_WRITE_DELAY_S", raising=False)
    path = f"/publish/{request.node.name[:40]}-{secrets.token_hex(3)}/models"
    client = webhdfs.WebHdfsClient(cluster["SHOAL_WEBHDFS"], USER)
    client.mkdirs(path)
    return f"{cluster['SHOAL_HDFS']}{path}", path, client


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = torch.nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.hidden(x))


def names(client, path):
    return sorted(s["pathSuffix"] for s in client.list_status(path))


def run_python(code, directory, env=None, **kwargs):
    Path(directory).mkdir(exist_ok=True)
    script = Path(directory) / f"script-{len(os.listdir(directory))}.py"
    script.write_text(textwrap.dedent(code))
    full_env = dict(os.environ, PYTHONPATH=SDK_PYTHON, **(env or {}))
    return subprocess.Popen([sys.executable, str(script)], env=full_env, **kwargs)


def test_versions_count_up_load_as_published_and_carry_their_config(repo, tmp_path):
    import yaml
    uri, path, client = repo
    torch.manual_seed(1)
    model = Mlp()
    assert shoal.publish_model(model, "mlp", repository=uri, example_inputs=torch.zeros(2, 16),
                               config={"max_batch_size": 8}) == 1
    saved = tmp_path / "saved.pt"
    torch.jit.script(model).save(str(saved))
    assert shoal.publish_model(saved, "mlp", repository=uri) == 2
    assert versions(uri, "mlp") == [1, 2]
    x = torch.rand(3, 16)
    for v in (1, 2):
        (tmp_path / f"{v}.pt").write_bytes(client.read(f"{path}/mlp/{v}/model.pt"))
        assert torch.equal(torch.jit.load(str(tmp_path / f"{v}.pt"))(x), model(x))
    config = yaml.safe_load(client.read(f"{path}/mlp/config.yaml"))
    assert config["max_batch_size"] == 8
    assert config["inputs"] == [{"name": "x", "datatype": "FP32", "dims": [16]}]
    # The versions, the config and the claims; no hidden directory left behind.
    assert names(client, f"{path}/mlp") == [CLAIMS_DIR, "1", "2", "config.yaml"]
    assert names(client, f"{path}/mlp/{CLAIMS_DIR}") == ["1", "2"]


def test_the_repository_comes_from_the_environment(repo, monkeypatch):
    uri, path, client = repo
    monkeypatch.setenv("SHOAL_MODEL_REPOSITORY", uri)
    assert shoal.publish_model(Mlp(), "m") == 1
    assert names(client, f"{path}/m/1") == ["model.pt"]


def test_two_publishers_never_get_the_same_number(repo, tmp_path):
    uri, path, client = repo
    code = f"""
        import torch, shoal
        class M(torch.nn.Module):
            def forward(self, x): return x + 1
        print(" ".join(str(shoal.publish_model(M(), "shared", repository={uri!r}))
                       for _ in range(8)))
        """
    a = run_python(code, tmp_path / "scripts", stdout=subprocess.PIPE, text=True)
    b = run_python(code, tmp_path / "scripts", stdout=subprocess.PIPE, text=True)
    out_a, _ = a.communicate(timeout=240)
    out_b, _ = b.communicate(timeout=240)
    assert a.returncode == 0 and b.returncode == 0
    got_a = [int(v) for v in out_a.split()]
    got_b = [int(v) for v in out_b.split()]
    assert sorted(got_a + got_b) == list(range(1, 17))
    assert got_a == sorted(got_a) and got_b == sorted(got_b)
    assert versions(uri, "shared") == list(range(1, 17))


def test_publishers_starting_at_once_each_get_their_own_number(repo, tmp_path):
    """Four publishers list the same empty model and claim number 1 at the same instant: HDFS
    lets one create the claim and answers the others FileAlreadyExistsException or, while the
    winner still holds the new file open, AlreadyBeingCreatedException (regression: the
    second was taken for a failure, and two concurrent publishers failed now and then)."""
    uri, path, client = repo
    data = tmp_path / "m.pt"
    torch.jit.script(Mlp()).save(str(data))
    for round_number in range(3):
        barrier, got, errors = threading.Barrier(4), [], []

        def publish():
            barrier.wait()
            try:
                got.append(shoal.publish_model(data, f"m{round_number}", repository=uri))
            except shoal.PublishError as e:
                errors.append(str(e))
        threads = [threading.Thread(target=publish) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        assert sorted(got) == [1, 2, 3, 4]
        assert versions(uri, f"m{round_number}") == [1, 2, 3, 4]


def test_a_poller_never_sees_part_of_a_version(repo, tmp_path, monkeypatch):
    """A poller lists the versions through WebHDFS and loads each one's model.pt as soon as it
    appears, while a publisher publishes 6 versions of a model of a few MB, each pausing 0.3 s
    half-written (the test hook), so that a version visible before it is whole would be seen so."""
    uri, path, _ = repo
    monkeypatch.setenv("SHOAL_TEST_PUBLISH_WRITE_DELAY_S", "0.3")
    reader = run_python(f"""
        import io, time, torch
        from shoal import webhdfs
        from shoal.publish import versions
        client = webhdfs.WebHdfsClient(webhdfs.HdfsLocation.parse({uri!r}).base, "{USER}")
        seen, deadline = set(), time.time() + 200
        while len(seen) < 6 and time.time() < deadline:
            for v in versions({uri!r}, "big"):
                if v in seen:
                    continue
                data = client.read({path!r} + f"/big/{{v}}/model.pt")
                torch.jit.load(io.BytesIO(data))  # raises if partial
                seen.add(v)
        print(sorted(seen))
        """, tmp_path / "scripts", stdout=subprocess.PIPE, text=True)
    big = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.Linear(1024, 512))  # ~4 MB
    published = [shoal.publish_model(big, "big", repository=uri) for _ in range(6)]
    out, _ = reader.communicate(timeout=240)
    assert reader.returncode == 0, "the reader failed to load a version it saw"
    assert published == list(range(1, 7))
    assert out.strip() == str(list(range(1, 7)))


def test_a_publisher_killed_mid_write_leaves_no_version_and_its_number_is_skipped(repo, tmp_path):
    uri, path, client = repo
    shoal.publish_model(Mlp(), "m", repository=uri)
    writer = run_python(f"""
        import torch, shoal
        class M(torch.nn.Module):
            def forward(self, x): return x * 2
        shoal.publish_model(M(), "m", repository={uri!r})
        """, tmp_path / "scripts", env={"SHOAL_TEST_PUBLISH_WRITE_DELAY_S": "60"})

    def half_written():
        assert writer.poll() is None, "the publisher ended before it was killed"
        for entry in client.list_status(f"{path}/m"):
            if entry["pathSuffix"].startswith(INCOMING_PREFIX):
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
    assert versions(uri, "m") == [1]
    assert names(client, f"{path}/m/{CLAIMS_DIR}") == ["1", "2"]
    # The next publication takes the number after the dead one's claim.
    assert shoal.publish_model(Mlp(), "m", repository=uri) == 3
    assert versions(uri, "m") == [1, 3]


def test_keep_leaves_the_newest_versions_and_clears_stale_leftovers(repo, monkeypatch):
    uri, path, client = repo
    # A dead publisher's directory, last touched two hours ago, and a fresh one of a live one.
    client.mkdirs(f"{path}/m/{INCOMING_PREFIX}gone-1-ab")
    client.mkdirs(f"{path}/m/{INCOMING_PREFIX}alive-2-cd")
    two_hours_ago_ms = int((time.time() - 7200) * 1000)
    client.json("PUT", client.url(f"{path}/m/{INCOMING_PREFIX}gone-1-ab", "SETTIMES",
                                  modificationtime=str(two_hours_ago_ms)))
    monkeypatch.setenv("SHOAL_MODEL_KEEP", "2")
    for expected in range(1, 5):
        assert shoal.publish_model(Mlp(), "m", repository=uri) == expected
        assert versions(uri, "m") == list(range(max(1, expected - 1), expected + 1))
    assert names(client, f"{path}/m") == [CLAIMS_DIR, f"{INCOMING_PREFIX}alive-2-cd", "3", "4"]
    assert names(client, f"{path}/m/{CLAIMS_DIR}") == ["3", "4"]
    # The numbers go on from the newest claim, not from the versions left.
    monkeypatch.delenv("SHOAL_MODEL_KEEP")
    assert shoal.publish_model(Mlp(), "m", repository=uri) == 5


def test_a_version_copied_in_without_a_claim_is_never_overwritten(repo):
    uri, path, client = repo
    client.create(f"{path}/m/1/model.pt", b"copied by hand")
    assert shoal.publish_model(Mlp(), "m", repository=uri) == 2
    assert client.read(f"{path}/m/1/model.pt") == b"copied by hand"


def test_bad_repositories_are_named_and_publish_nothing(repo, cluster, monkeypatch):
    uri, path, client = repo
    namenode = cluster["SHOAL_HDFS"]
    for bad, message in [
        ("hdfs:///models", "must be hdfs://namenode"),
        ("hdfs://:8020/models", "must be hdfs://namenode"),
        (f"{namenode}{path}/missing", "does not exist in HDFS"),
    ]:
        with pytest.raises(shoal.PublishError, match=message):
            shoal.publish_model(Mlp(), "m", repository=bad)
    # A NameNode whose WebHDFS does not answer: said so, with the variable to fix it.
    monkeypatch.setenv("SHOAL_WEBHDFS", "http://127.0.0.1:1")
    with pytest.raises(shoal.PublishError,
                       match=r"WebHDFS at http://127.0.0.1:1 is unreachable .*SHOAL_WEBHDFS="):
        shoal.publish_model(Mlp(), "m", repository=uri)
    monkeypatch.setenv("SHOAL_WEBHDFS", cluster["SHOAL_WEBHDFS"])
    assert names(client, path) == []


class RefusingNameNode(http.server.BaseHTTPRequestHandler):
    """Answers every WebHDFS call as a NameNode with permissions on answers a user it does not
    let in (the test cluster runs with permissions off, so it cannot refuse anyone)."""

    def _refuse(self):
        body = json.dumps({"RemoteException": {
            "exception": "AccessControlException",
            "javaClassName": "org.apache.hadoop.security.AccessControlException",
            "message": "Permission denied: user=shoal, access=WRITE, inode=\"/models\":hdfs:"
                       "supergroup:drwxr-xr-x"}}).encode()
        self.send_response(403)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if "GETFILESTATUS" in self.path:
            body = json.dumps({"FileStatus": {"type": "DIRECTORY", "length": 0,
                                              "modificationTime": 0, "pathSuffix": ""}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            self._refuse()

    do_PUT = _refuse

    def log_message(self, *args):
        pass


def test_permission_denied_is_said_with_the_user(monkeypatch):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), RefusingNameNode)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("SHOAL_WEBHDFS", f"http://127.0.0.1:{server.server_port}")
        monkeypatch.setenv("HADOOP_USER_NAME", USER)
        with pytest.raises(shoal.PublishError,
                           match="permission denied for HDFS user 'shoal' .*HADOOP_USER_NAME.*"
                                 "Permission denied: user=shoal, access=WRITE"):
            shoal.publish_model(Mlp(), "m", repository="hdfs://nn:8020/models")
    finally:
        server.shutdown()
