"""`shoal serve --model-repository hdfs://...` on the project's HDFS mini-cluster
(tests/yarn/cluster.sh): it serves a copy that follows the repository, so a version published
there with shoal.publish_model is served with no failed request, and a version removed there
stops being served. Bad hdfs:// repositories exit 2 with a clear message. A job's
`publish: {repository: hdfs://...}` reaches its tasks. Named yarn_* so that ctest gives it the
yarn_cluster fixture (one cluster for the whole run)."""

import json
import os
import secrets
import subprocess
import textwrap
import threading
import urllib.error
import urllib.request

import pytest

import shoal_e2e as e2e

USER = "shoal"

PUBLISHER = """
import sys, torch, shoal

class Scale(torch.nn.Module):
    def __init__(self, k: float):
        super().__init__()
        self.k = k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.k

print(shoal.publish_model(Scale(float(sys.argv[2])), "scale", repository=sys.argv[1],
                          example_inputs=torch.zeros(1, 4), config={"max_batch_size": 8}))
"""


@pytest.fixture(scope="module")
def cluster():
    return e2e.yarn_cluster_env()


@pytest.fixture
def hdfs_env(cluster):
    """What a process needs to reach the cluster's HDFS: its WebHDFS address and the user."""
    return {"SHOAL_WEBHDFS": cluster["SHOAL_WEBHDFS"], "HADOOP_USER_NAME": USER}


@pytest.fixture
def repo(cluster, request, hdfs_env):
    """A fresh, existing HDFS repository: (uri, path)."""
    path = f"/serve-hdfs/{request.node.name[:40]}-{secrets.token_hex(3)}"
    webhdfs("PUT", cluster, path, "MKDIRS")
    return f"{cluster['SHOAL_HDFS']}{path}", path


def webhdfs(method, cluster, path, op, **params):
    query = "&".join(f"{k}={v}" for k, v in {"op": op, "user.name": USER, **params}.items())
    req = urllib.request.Request(f"{cluster['SHOAL_WEBHDFS']}/webhdfs/v1{path}?{query}",
                                 method=method)
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read() or b"{}")


def infer(base):
    body = json.dumps({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32",
                                   "data": [1, 1, 1, 1]}]}).encode()
    req = urllib.request.Request(f"{base}/v2/models/scale/infer", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        out = json.loads(r.read())
    return out["model_version"], out["outputs"][0]["data"][0]


def version_ready(base, version):
    try:
        with urllib.request.urlopen(f"{base}/v2/models/scale/versions/{version}/ready",
                                    timeout=30) as r:
            return r.status == 200
    except urllib.error.HTTPError:
        return False


def test_serve_follows_an_hdfs_repository(shoal_bin, cluster, hdfs_env, repo, tmp_path):
    uri, path = repo
    publisher = tmp_path / "publish.py"
    publisher.write_text(textwrap.dedent(PUBLISHER))

    def publish(k):
        r = subprocess.run([e2e.PYTHON, str(publisher), uri, str(k)], capture_output=True,
                           text=True, timeout=120, env=e2e.base_env(hdfs_env))
        assert r.returncode == 0, r.stderr
        return int(r.stdout.strip())

    assert publish(2) == 1
    # A model whose first publisher is only about to claim its number: nothing to serve yet.
    webhdfs("PUT", cluster, f"{path}/pending/.claims", "MKDIRS")
    out_path = tmp_path / "serve.out"
    out = open(out_path, "wb")
    serve = subprocess.Popen([shoal_bin, "serve", "--model-repository", uri, "--http-port", "0",
                              "--grpc-port", "0", "--repository-poll-ms", "200",
                              "--repository-settle-ms", "0"],
                             stdout=out, stderr=subprocess.STDOUT, env=e2e.base_env(hdfs_env),
                             start_new_session=True)
    try:
        line = e2e.wait_until(lambda: next((l for l in out_path.read_text().splitlines()
                                            if "listening on http://" in l), None), 60,
                              "shoal serve")
        base = line.split("listening on ")[1].split()[0]
        copy_line = next(l for l in out_path.read_text().splitlines() if "copying" in l)
        cache_dir = copy_line.rsplit(" into ", 1)[1].strip()

        def served():
            try:
                return infer(base)
            except urllib.error.URLError:
                return None
        assert e2e.wait_until(served, 60, "version 1 to serve") == ("1", 2.0)

        # Published into HDFS under load: it takes over with no failed request.
        failures, answers, stop = [], [], threading.Event()

        def load():
            while not stop.is_set():
                try:
                    answers.append(infer(base))
                except Exception as e:  # noqa: BLE001 - counted, then asserted on
                    failures.append(repr(e))
        threads = [threading.Thread(target=load) for _ in range(2)]
        for t in threads:
            t.start()
        try:
            assert publish(3) == 2
            e2e.wait_until(lambda: answers and answers[-1] == ("2", 3.0), 60, "version 2 to serve")
        finally:
            stop.set()
            for t in threads:
                t.join()
        assert not failures, failures[:3]
        assert set(answers) <= {("1", 2.0), ("2", 3.0)}
        assert "max_batch_size: 8" in open(os.path.join(cache_dir, "scale", "config.yaml")).read()

        # Removed from HDFS (as keep does: a rename to a hidden name, then a delete): no longer
        # served, and version 1, the newest left, serves again.
        webhdfs("PUT", cluster, f"{path}/scale/2", "RENAME",
                destination=f"{path}/scale/.removing-2-x", renameoptions="NONE")
        webhdfs("DELETE", cluster, f"{path}/scale/.removing-2-x", "DELETE", recursive="true")
        e2e.wait_until(lambda: served() == ("1", 2.0), 60, "version 1 to serve again")
        assert not version_ready(base, 2)
        assert sorted(e for e in os.listdir(os.path.join(cache_dir, "scale"))
                      if not e.startswith(".")) == ["1", "config.yaml"]
        assert sorted(os.listdir(cache_dir)) == [".shoal-hdfs-mirror", "scale"]
        assert "pending" not in out_path.read_text()
    finally:
        serve.terminate()
        serve.wait(timeout=60)
        out.close()
    assert serve.returncode == 0, out_path.read_text()
    # The copy was a temporary directory of its own, removed at exit.
    assert not os.path.exists(cache_dir)


@pytest.mark.parametrize("repository, env, message", [
    ("hdfs:///models", {}, "'hdfs:///models' is not hdfs://namenode[:port]/path"),
    ("hdfs://:8020/models", {}, "is not hdfs://namenode[:port]/path"),
    ("{namenode}/no/such/repository", {}, "/no/such/repository does not exist"),
    ("{uri}", {"SHOAL_WEBHDFS": "http://127.0.0.1:1"},
     "the NameNode's WebHDFS at http://127.0.0.1:1 does not answer"),
])
def test_bad_hdfs_repositories_exit_2_with_a_clear_message(shoal_bin, cluster, hdfs_env, repo,
                                                           repository, env, message):
    uri, _ = repo
    repository = repository.format(namenode=cluster["SHOAL_HDFS"], uri=uri)
    r = subprocess.run([shoal_bin, "serve", "--model-repository", repository, "--http-port", "0",
                        "--grpc-port", "0"], capture_output=True, text=True, timeout=120,
                       env=e2e.base_env({**hdfs_env, **env}))
    assert r.returncode == 2, r.stderr
    assert message in r.stderr
    assert f"--model-repository {repository}" in r.stderr or "--model-repository:" in r.stderr


def test_a_cache_dir_that_holds_something_else_is_refused(shoal_bin, hdfs_env, repo, tmp_path):
    uri, _ = repo
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "precious.txt").write_text("not ours")
    r = subprocess.run([shoal_bin, "serve", "--model-repository", uri, "--repository-cache-dir",
                        str(cache), "--http-port", "0", "--grpc-port", "0"],
                       capture_output=True, text=True, timeout=120, env=e2e.base_env(hdfs_env))
    assert r.returncode == 2, r.stderr
    assert "is neither empty nor an earlier copy of an hdfs:// repository" in r.stderr
    assert (cache / "precious.txt").read_text() == "not ours"


def test_a_jobs_publish_section_takes_an_hdfs_repository(run_shoal, write_file, write_job,
                                                         cluster, hdfs_env, repo):
    uri, path = repo
    write_file("train.py", """
        import os, torch, shoal

        class Scale(torch.nn.Module):
            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return x * 2

        print("repository", os.environ["SHOAL_MODEL_REPOSITORY"])
        for _ in range(3):
            print("published", shoal.publish_model(Scale(), "scale"))
        """)
    job = write_job(f"""
        name: publisher
        publish: {{repository: "{uri}", keep: 2}}
        roles:
          trainer:
            instances: 1
            command: ["{e2e.PYTHON}", "train.py"]
        """)
    r = run_shoal("run", job, timeout=120, env=hdfs_env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"repository {uri}" in r.stdout
    assert "published 3" in r.stdout
    listing = webhdfs("GET", cluster, f"{path}/scale", "LISTSTATUS")
    assert sorted(s["pathSuffix"] for s in listing["FileStatuses"]["FileStatus"]) == \
        [".claims", "2", "3"]


def test_a_cache_dir_without_an_hdfs_repository_is_refused(shoal_bin, tmp_path):
    (tmp_path / "models").mkdir()
    r = subprocess.run([shoal_bin, "serve", "--model-repository", str(tmp_path / "models"),
                        "--repository-cache-dir", str(tmp_path / "cache"), "--http-port", "0",
                        "--grpc-port", "0"], capture_output=True, text=True, timeout=60,
                       env=e2e.base_env())
    assert r.returncode == 2, r.stderr
    assert "--repository-cache-dir is only for an hdfs:// --model-repository" in r.stderr
    assert not (tmp_path / "cache").exists()
