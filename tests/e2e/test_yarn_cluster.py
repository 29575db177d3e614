"""The project's YARN + HDFS test cluster itself (tests/yarn/cluster.sh: a ResourceManager, two
NodeManagers, a NameNode and a DataNode in one JVM, every daemon on a free port), checked
through the interfaces the YARN backend and its benchmark use: the ResourceManager's REST API,
WebHDFS, and YARN's own DistributedShell application. ctest's yarn_cluster fixture brings the
cluster up before these tests and down after them; by hand: tests/yarn/cluster.sh up."""

import glob
import http.client
import json
import os
import re
import socket
import subprocess
import urllib.parse
import uuid
from pathlib import Path

import pytest

import shoal_e2e as e2e

DSHELL_SH = e2e.REPO_ROOT / "tests" / "yarn" / "dshell.sh"
YARN_DIR = e2e.YARN_DIR
HTTP_TIMEOUT_S = 30


@pytest.fixture(scope="module")
def cluster():
    """The KEY=value lines of the cluster's env file, as a dict."""
    return e2e.yarn_cluster_env()


def request(method, url, body=None, headers=None):
    """One HTTP request, redirects not followed: (status, headers, body bytes)."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=HTTP_TIMEOUT_S)
    try:
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


def get_json(url):
    status, _, body = request("GET", url, headers={"Accept": "application/json"})
    assert status == 200, f"GET {url}: HTTP {status}: {body[:500]!r}"
    return json.loads(body)


def test_resourcemanager_lists_every_nodemanager_running(cluster):
    info = get_json(f"{cluster['SHOAL_YARN_RM_WEB']}/ws/v1/cluster/info")["clusterInfo"]
    assert info["state"] == "STARTED" and info["haState"] == "ACTIVE", info
    nodes = get_json(f"{cluster['SHOAL_YARN_RM_WEB']}/ws/v1/cluster/nodes")["nodes"]["node"]
    running = [n for n in nodes if n["state"] == "RUNNING"]
    want = int(cluster["SHOAL_YARN_NODEMANAGERS"])
    assert want >= 2 and len(running) == want, nodes
    # Separate NodeManagers, each offering what cluster.sh asked for, GPUs included.
    assert len({n["id"] for n in running}) == want, running
    for node in running:
        total = node["totalResource"]
        assert total["memory"] == int(cluster["SHOAL_YARN_NM_MEMORY_MB"]), node
        assert total["vCores"] == int(cluster["SHOAL_YARN_NM_VCORES"]), node
        extra = {r["name"]: r["value"]
                 for r in total["resourceInformations"]["resourceInformation"]}
        assert extra.get("yarn.io/gpu", 0) == int(cluster["SHOAL_YARN_NM_GPUS"]), extra
        # Each NodeManager's own REST API answers as itself (one JVM, one web app each).
        nm = get_json(f"http://{node['nodeHTTPAddress']}/ws/v1/node/info")["nodeInfo"]
        assert nm["nodeHostName"] == node["nodeHostName"], (nm, node)


def test_client_configuration_names_the_running_daemons(cluster):
    conf = Path(cluster["HADOOP_CONF_DIR"])
    for name in ("core-site.xml", "hdfs-site.xml", "yarn-site.xml"):
        assert (conf / name).is_file(), f"no {conf / name}"
    core = (conf / "core-site.xml").read_text()
    assert f"<value>{cluster['SHOAL_HDFS']}</value>" in core, core
    yarn = (conf / "yarn-site.xml").read_text()
    assert f"<value>{cluster['SHOAL_YARN_RM']}</value>" in yarn, yarn
    # Something listens on every address the env file gives.
    for key in ("SHOAL_YARN_RM", "SHOAL_YARN_RM_SCHEDULER"):
        host, port = cluster[key].rsplit(":", 1)
        socket.create_connection((host, int(port)), timeout=HTTP_TIMEOUT_S).close()
    hdfs = urllib.parse.urlsplit(cluster["SHOAL_HDFS"])
    socket.create_connection((hdfs.hostname, hdfs.port), timeout=HTTP_TIMEOUT_S).close()


def test_webhdfs_writes_a_file_and_reads_it_back(cluster):
    webhdfs = cluster["SHOAL_WEBHDFS"]
    path = f"/shoal-test/{uuid.uuid4().hex}/hello.bin"
    data = os.urandom(200_000) + b"shoal"
    user = "user.name=shoal"

    # CREATE: the NameNode answers 307 with the DataNode to send the bytes to.
    status, headers, body = request(
        "PUT", f"{webhdfs}/webhdfs/v1{path}?op=CREATE&overwrite=false&{user}")
    assert status == 307, f"CREATE at the NameNode: HTTP {status}: {body[:500]!r}"
    datanode = headers["Location"]
    assert urllib.parse.urlsplit(datanode).netloc != urllib.parse.urlsplit(webhdfs).netloc
    status, _, body = request("PUT", datanode, body=data,
                              headers={"Content-Type": "application/octet-stream"})
    assert status == 201, f"CREATE at the DataNode: HTTP {status}: {body[:500]!r}"

    stat = get_json(f"{webhdfs}/webhdfs/v1{path}?op=GETFILESTATUS&{user}")["FileStatus"]
    assert stat["type"] == "FILE" and stat["length"] == len(data), stat

    # OPEN: again redirected to a DataNode, which serves the bytes.
    status, headers, body = request("GET", f"{webhdfs}/webhdfs/v1{path}?op=OPEN&{user}")
    assert status == 307, f"OPEN at the NameNode: HTTP {status}: {body[:500]!r}"
    status, _, body = request("GET", headers["Location"])
    assert status == 200 and body == data, f"OPEN at the DataNode: HTTP {status}, {len(body)} B"

    status, _, body = request(
        "DELETE", f"{webhdfs}/webhdfs/v1{path.rsplit('/', 1)[0]}?op=DELETE&recursive=true&{user}")
    assert status == 200 and json.loads(body) == {"boolean": True}, body
    status, _, _ = request("GET", f"{webhdfs}/webhdfs/v1{path}?op=GETFILESTATUS&{user}")
    assert status == 404


def test_distributed_shell_runs_hostname_in_two_containers(cluster):
    r = subprocess.run(
        ["bash", str(DSHELL_SH), "-shell_command", "hostname", "-num_containers", "2",
         "-appname", "shoal-test-dshell"],
        capture_output=True, text=True, timeout=240,
        env={**os.environ, "SHOAL_YARN_DIR": str(YARN_DIR)})
    log = r.stdout + r.stderr
    assert r.returncode == 0, f"dshell.sh exited {r.returncode}:\n{log[-6000:]}"
    ids = set(re.findall(r"Submitted application (application_\d+_\d+)", log))
    assert len(ids) == 1, log[-6000:]
    (app_id,) = ids

    app = get_json(f"{cluster['SHOAL_YARN_RM_WEB']}/ws/v1/cluster/apps/{app_id}")["app"]
    assert (app["state"], app["finalStatus"]) == ("FINISHED", "SUCCEEDED"), app
    assert app["name"] == "shoal-test-dshell", app

    # The two shell containers (the AM is container 1) ran `hostname` and printed it.
    outputs = sorted(glob.glob(str(YARN_DIR / "work" / "**" / app_id / "container_*" / "stdout"),
                               recursive=True))
    shells = [p for p in outputs if not re.search(r"_0+1/stdout$", p)]
    assert len(shells) == 2, outputs
    for p in shells:
        assert Path(p).read_text().strip() == socket.gethostname(), p
