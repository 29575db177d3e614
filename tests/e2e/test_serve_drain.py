"""`shoal serve` on SIGTERM: it drains (not ready, still answering, every reply closing its
connection), then closes its listeners, finishes what is in flight and exits 0; a second
signal ends it at once. And `shoal serve --print-manifests`, the Kubernetes objects that rely
on that (their use on a real cluster: test_kubernetes_serve.py).

The load here plays the part of a load balancer that follows readiness, as a Kubernetes
Service's endpoints do: it stops sending to the server once /v2/health/ready stops saying 200.
"""

import http.client
import json
import os
import signal
import subprocess
import threading
import time

import grpc
import pytest
import torch
import yaml

import shoal_e2e as e2e
from test_serve_grpc import pb  # noqa: F401 (fixture: the generated gRPC modules)


class Identity(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class Slow(torch.nn.Module):
    """As many 256x256 matrix products as x[0] says: a request that stays in flight a while."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = torch.ones(256, 256) / 256.0
        for _ in range(int(x[0])):
            m = torch.mm(m, m)
        return x + m.sum() * 0


def repository(tmp_path):
    repo = tmp_path / "models"
    for name, module in (("identity", Identity()), ("slow", Slow())):
        (repo / name / "1").mkdir(parents=True)
        torch.jit.script(module).save(str(repo / name / "1" / "model.pt"))
    return repo


class Server:
    def __init__(self, shoal_bin, repo, out_dir, *extra):
        self.stdout_path = out_dir / "serve.stdout"
        self.stderr_path = out_dir / "serve.stderr"
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                [shoal_bin, "serve", "--model-repository", str(repo), "--http-port", "0",
                 "--grpc-port", "0", *map(str, extra)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=e2e.base_env(),
                start_new_session=True)
        line = e2e.wait_until(self._listening_line, 60, "shoal serve to print its port")
        self.port = int(line.rsplit(":", 1)[1])
        e2e.wait_until(lambda: self.status("/v2/health/ready") == 200, 120, "the models to load")

    def _listening_line(self):
        if self.proc.poll() is not None:
            raise AssertionError(f"shoal serve exited with {self.proc.returncode}:\n{self.stderr()}")
        lines = self.stdout_path.read_text().splitlines()
        return lines[0] if lines else None

    def stderr(self):
        return self.stderr_path.read_text(errors="replace")

    def status(self, path):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request("GET", path)
            response = conn.getresponse()
            response.read()
            return response.status
        finally:
            conn.close()

    def signal(self, sig):
        os.kill(self.proc.pid, sig)

    def wait(self, timeout):
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"shoal serve still running {timeout}s later:\n{self.stderr()}")

    def kill(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def infer_body(values):
    return json.dumps({"inputs": [{"name": "x", "shape": [len(values)], "datatype": "INT64",
                                   "data": values}]})


def infer(conn, model, values):
    """(status, output data or error text, whether the reply closed the connection)."""
    conn.request("POST", f"/v2/models/{model}/infer", body=infer_body(values),
                 headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    body = json.loads(response.read())
    closed = (response.getheader("Connection") or "").lower() == "close"
    if response.status != 200:
        return response.status, body.get("error"), closed
    return response.status, body["outputs"][0]["data"], closed


def test_sigterm_drains_then_stops_and_no_request_fails(shoal_bin, tmp_path):
    server = Server(shoal_bin, repository(tmp_path), tmp_path, "--drain-seconds", 3)
    removed = threading.Event()  # the load balancer saw the server not ready
    sigterm_sent = threading.Event()
    lock = threading.Lock()
    answered = {"before_sigterm": 0, "after_sigterm": 0, "closed_by_server": 0}
    failures = []
    ready_seen = []  # (ready status, live status while not ready)

    def client(index):
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        n = 0
        while not removed.is_set():
            values = [index, n]
            after = sigterm_sent.is_set()
            try:
                status, data, closed = infer(conn, "identity", values)
            except (OSError, http.client.HTTPException) as e:
                with lock:
                    failures.append(f"client {index} request {n}: {e!r}")
                conn.close()
                continue
            with lock:
                if status != 200 or data != values:
                    failures.append(f"client {index} request {n}: {status} {data}")
                else:
                    answered["after_sigterm" if after else "before_sigterm"] += 1
                    answered["closed_by_server"] += closed
            n += 1
        conn.close()

    def balancer():
        while True:
            ready = server.status("/v2/health/ready")
            if ready != 200:
                ready_seen.append((ready, server.status("/v2/health/live")))
                removed.set()
                return
            ready_seen.append((ready, None))
            time.sleep(0.05)

    clients = [threading.Thread(target=client, args=(i,)) for i in range(4)]
    watcher = threading.Thread(target=balancer)
    for t in clients + [watcher]:
        t.start()
    try:
        e2e.wait_until(lambda: answered["before_sigterm"] >= 200, 60, "200 answers under load")
        sigterm_sent.set()
        server.signal(signal.SIGTERM)
        watcher.join(timeout=60)
        assert removed.is_set(), "/v2/health/ready never stopped saying 200 after SIGTERM"
        # The balancer's view lags: whatever reaches the server meanwhile is answered, on fresh
        # connections too, each reply closing its connection.
        late = []
        for i in range(5):
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
            late.append(infer(conn, "identity", [100 + i]))
            conn.close()
        for t in clients:
            t.join(timeout=60)
        assert server.wait(60) == 0, server.stderr()
    finally:
        removed.set()
        server.kill()

    assert failures == []
    assert late == [(200, [100 + i], True) for i in range(5)]
    # Ready, then 503 (not the 400 of loading) while the server is still live.
    assert ready_seen[-1] == (503, 200), ready_seen
    assert all(status == 200 for status, _ in ready_seen[:-1])
    assert answered["after_sigterm"] > 0, answered
    assert answered["closed_by_server"] > 0, answered
    err = server.stderr()
    assert "shoal serve: SIGTERM, shutting down: draining for 3 s" in err, err
    assert ("shoal serve: stopped: drained for 3 s, then closed the listeners and finished the "
            "requests in flight in") in err, err
    with pytest.raises(ConnectionRefusedError):
        server.status("/v2/health/live")


def test_a_request_in_flight_when_the_listeners_close_is_answered(shoal_bin, tmp_path):
    server = Server(shoal_bin, repository(tmp_path), tmp_path, "--drain-seconds", 0)
    try:
        # Calibrate: enough products that the request runs well past the signal.
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
        started = time.monotonic()
        assert infer(conn, "slow", [200])[0] == 200
        per_product = (time.monotonic() - started) / 200
        count = max(200, int(3.0 / per_product))
        result = {}
        conn.close()

        def slow_request():
            c = http.client.HTTPConnection("127.0.0.1", server.port, timeout=300)
            result["reply"] = infer(c, "slow", [count])
            c.close()

        t = threading.Thread(target=slow_request)
        t.start()
        time.sleep(0.5)
        server.signal(signal.SIGTERM)
        t.join(timeout=300)
        assert server.wait(300) == 0, server.stderr()
        assert result["reply"] == (200, [count], True)
        err = server.stderr()
        assert "shoal serve: SIGTERM, shutting down\n" in err, err
        assert "shoal serve: stopped: closed the listeners and finished the requests" in err, err
    finally:
        server.kill()


def test_requests_longer_than_finish_seconds_are_left_and_the_exit_says_so(shoal_bin, tmp_path):
    server = Server(shoal_bin, repository(tmp_path), tmp_path, "--drain-seconds", 0,
                    "--finish-seconds", 1)
    try:
        def slow_request():
            c = http.client.HTTPConnection("127.0.0.1", server.port, timeout=600)
            try:
                infer(c, "slow", [10_000_000])
            except (OSError, http.client.HTTPException):
                pass  # the server went away without answering: what this test is about
            c.close()

        t = threading.Thread(target=slow_request, daemon=True)
        t.start()
        time.sleep(0.5)
        server.signal(signal.SIGTERM)
        assert server.wait(120) == 1, server.stderr()
        assert ("shoal serve: requests still in flight 1 s after the listeners closed "
                "(--finish-seconds); exiting without them") in server.stderr()
    finally:
        server.kill()


@pytest.mark.parametrize("second", [signal.SIGTERM, signal.SIGINT])
def test_a_second_signal_while_draining_exits_at_once(shoal_bin, tmp_path, second):
    server = Server(shoal_bin, repository(tmp_path), tmp_path, "--drain-seconds", 600)
    try:
        server.signal(signal.SIGTERM)
        e2e.wait_until(lambda: server.status("/v2/health/ready") == 503, 60, "ready to say 503")
        assert server.status("/v2/health/live") == 200
        server.signal(second)
        assert server.wait(60) == 1, server.stderr()
        name = "SIGTERM" if second == signal.SIGTERM else "SIGINT"
        assert (f"shoal serve: second signal ({name}): exiting at once, without the requests "
                "in flight") in server.stderr()
    finally:
        server.kill()


def test_grpc_server_ready_is_false_while_draining_and_live_stays_true(shoal_bin, tmp_path, pb):
    server = Server(shoal_bin, repository(tmp_path), tmp_path, "--drain-seconds", 600)
    messages, stubs = pb
    lines = server.stdout_path.read_text().splitlines()
    channel = grpc.insecure_channel(f"127.0.0.1:{int(lines[1].rsplit(':', 1)[1])}")
    try:
        stub = stubs.GRPCInferenceServiceStub(channel)
        assert stub.ServerReady(messages.ServerReadyRequest(), timeout=60).ready
        server.signal(signal.SIGTERM)
        e2e.wait_until(lambda: server.status("/v2/health/ready") == 503, 60, "ready to say 503")
        assert not stub.ServerReady(messages.ServerReadyRequest(), timeout=60).ready
        assert stub.ServerLive(messages.ServerLiveRequest(), timeout=60).live
        server.signal(signal.SIGINT)
        assert server.wait(60) == 1, server.stderr()
    finally:
        channel.close()
        server.kill()


# --print-manifests

def manifests(shoal_bin, *flags):
    r = subprocess.run([shoal_bin, "serve", "--print-manifests", *map(str, flags)],
                       capture_output=True, text=True, timeout=60, env=e2e.base_env())
    return r


def test_print_manifests_makes_a_deployment_a_service_and_a_token_secret(shoal_bin):
    r = manifests(shoal_bin, "--replicas", 3, "--image", "registry.example.com/shoal-serve:1.2",
                  "--model-repository-volume", "hostpath:/srv/models", "--name", "ranker",
                  "--namespace", "ml", "--cpu", "250m", "--memory", "512Mi",
                  "--drain-seconds", 7, "--finish-seconds", 11, "--http-port", 9000)
    assert r.returncode == 0, r.stderr
    docs = [d for d in yaml.safe_load_all(r.stdout) if d]
    assert [d["kind"] for d in docs] == ["Secret", "Deployment", "Service"]
    secret, deployment, service = docs
    assert secret["metadata"]["name"] == "ranker-token"
    assert len(secret["stringData"]["token"]) == 64
    assert all(d["metadata"]["namespace"] == "ml" for d in docs)

    spec = deployment["spec"]
    assert spec["replicas"] == 3
    assert spec["strategy"] == {"type": "RollingUpdate",
                                "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
    pod = spec["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] > 7 + 11
    (container,) = pod["containers"]
    assert container["image"] == "registry.example.com/shoal-serve:1.2"
    command = container["command"]
    flag = lambda name: command[command.index(name) + 1]  # noqa: E731
    assert flag("--host") == "0.0.0.0" and flag("--model-repository") == "/models"
    assert flag("--drain-seconds") == "7" and flag("--finish-seconds") == "11"
    assert flag("--http-port") == "9000"
    token_mount = [m for m in container["volumeMounts"] if m["name"] == "token"][0]
    assert flag("--token-file") == token_mount["mountPath"] + "/token"
    assert "/v2/health/ready" in container["readinessProbe"]["exec"]["command"][-1]
    assert "/v2/health/live" in container["livenessProbe"]["exec"]["command"][-1]
    assert container["resources"]["requests"] == {"cpu": "250m", "memory": "512Mi"}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["model-repository"]["hostPath"]["path"] == "/srv/models"
    assert volumes["token"]["secret"]["secretName"] == "ranker-token"
    assert service["spec"]["selector"] == spec["selector"]["matchLabels"]
    assert service["spec"]["selector"] == spec["template"]["metadata"]["labels"]
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == {"http": 9000,
                                                                        "grpc": 8001}

    # A Secret of one's own: none printed; and a claim.
    r = manifests(shoal_bin, "--model-repository-volume", "pvc:models", "--token-secret", "mine")
    assert r.returncode == 0, r.stderr
    docs = [d for d in yaml.safe_load_all(r.stdout) if d]
    assert [d["kind"] for d in docs] == ["Deployment", "Service"]
    pod = docs[0]["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["model-repository"]["persistentVolumeClaim"]["claimName"] == "models"
    assert volumes["token"]["secret"]["secretName"] == "mine"
    # Two runs, two tokens.
    a = manifests(shoal_bin, "--model-repository-volume", "pvc:models").stdout
    b = manifests(shoal_bin, "--model-repository-volume", "pvc:models").stdout
    assert a != b


@pytest.mark.parametrize("flags, message", [
    (["--replicas", "0"], "--replicas"),
    (["--replicas", "many"], "--replicas"),
    (["--image", "has space"], "--image: must be a container image reference"),
    (["--image-pull-policy", "Sometimes"], "--image-pull-policy: must be one of Always"),
    (["--name", "Bad_Name"], "--name: must be at most 57"),
    (["--namespace", "-ml"], "--namespace: must be a Kubernetes namespace"),
    (["--token-secret", "UPPER"], "--token-secret: must be a Kubernetes object name"),
    (["--cpu", "0"], "--cpu: must be a CPU quantity above 0"),
    (["--cpu", "1.5m"], "--cpu: must be a CPU quantity above 0"),
    (["--memory", "lots"], "--memory: must be a memory quantity above 0"),
    (["--http-port", "0"], "--http-port: must be a port above 0 with --print-manifests"),
    (["--grpc-port", "8000"], "--grpc-port: must differ from --http-port"),
    (["--host", "0.0.0.0"], "--host: not with --print-manifests"),
    (["--token-file", "/tmp/t"], "--token-file: not with --print-manifests"),
    (["--model-repository", "/srv"], "--model-repository: not with --print-manifests"),
])
def test_print_manifests_refuses_a_bad_flag_and_prints_nothing(shoal_bin, flags, message):
    r = manifests(shoal_bin, "--model-repository-volume", "hostpath:/srv/models", *flags)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stdout == ""
    assert message in r.stderr, r.stderr


@pytest.mark.parametrize("volume, message", [
    (None, "--model-repository-volume: required with --print-manifests"),
    ("nfs:/srv", "--model-repository-volume: must be hostpath:/DIR"),
    ("hostpath:relative/models", "--model-repository-volume hostpath:: must be an absolute path"),
    ("hostpath:/srv/../etc", "--model-repository-volume hostpath:: must be an absolute path"),
    ("pvc:Not_A_Claim", "--model-repository-volume pvc:: must be a Kubernetes object name"),
])
def test_print_manifests_refuses_a_bad_volume(shoal_bin, volume, message):
    flags = [] if volume is None else ["--model-repository-volume", volume]
    r = manifests(shoal_bin, *flags)
    assert r.returncode == 2 and r.stdout == "", (r.stdout, r.stderr)
    assert message in r.stderr, r.stderr


def test_manifest_flags_without_print_manifests_are_refused(shoal_bin, tmp_path):
    r = subprocess.run([shoal_bin, "serve", "--model-repository", str(tmp_path), "--replicas", "3"],
                       capture_output=True, text=True, timeout=60, env=e2e.base_env())
    assert r.returncode == 2
    assert "shoal serve: --replicas only shapes --print-manifests' output" in r.stderr, r.stderr
