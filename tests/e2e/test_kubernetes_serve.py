"""`shoal serve` on the Kubernetes test cluster: the manifests of `shoal serve --print-manifests`
with 3 replicas, a TorchScript model in a hostPath repository, and a rolling update of the
server itself under load that loses no request.

The cluster has no kube-proxy (docs/backends/kubernetes-test-cluster.md): no ClusterIP but the
apiserver's routes. The load generator therefore does kube-proxy's part itself, the way
kube-proxy does it: it follows the Service's EndpointSlices (a watch), opens each new
connection to one of the endpoints that are ready (round robin), and keeps a connection to
whichever pod it reached until that pod closes it, as an established connection through
kube-proxy's NAT stays with its pod. The pods' addresses are on this machine's bridge.
"""

import hashlib
import http.client
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest
import torch
import yaml

import shoal_e2e as e2e
from kubernetes_jobs import (cluster, import_image, kubectl,  # noqa: F401 (fixtures)
                             nothing_left_behind)

AGENT_IMAGE_TOOL = e2e.REPO_ROOT / "tools" / "kubernetes" / "agent_image.py"
CONTAINERD_SOCK = "/run/shoal-kubernetes-containerd/containerd.sock"
IMAGE_REPOSITORY = "localhost/shoal-serve"
NAME = "shoal-serve"
REPLICAS = 3
CLIENTS = 4
# Between two requests of one client: the load stays light on a 2-core machine.
PAUSE_S = 0.01


class Identity(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def ctr(*args, timeout=300):
    r = subprocess.run(["ctr", "-a", CONTAINERD_SOCK, "-n", "k8s.io", *args], capture_output=True,
                       text=True, timeout=timeout)
    assert r.returncode == 0, f"ctr {' '.join(args)}: {r.stderr}"
    return r.stdout


def serve_module():
    """The TorchScript runtime module beside the shoal under test (BUILD/src/serve/)."""
    path = Path(os.environ.get("SHOAL_SERVE_TORCH_MODULE") or
                Path(e2e.SHOAL_BIN).resolve().parents[1] / "serve" / "libshoal_serve_torch.so")
    assert path.is_file(), f"no TorchScript runtime module at {path}: build shoal_serve_torch"
    return path


@pytest.fixture(scope="module")
def serve_image(tmp_path_factory):
    """The server's image (agent_image.py --serve), imported into the cluster's containerd under
    a tag naming what it holds; older tags of this test are removed."""
    module = serve_module()
    key = hashlib.sha256()
    for path in (Path(e2e.SHOAL_BIN).resolve(), module, AGENT_IMAGE_TOOL):
        st = path.stat()
        key.update(f"{path}:{st.st_size}:{st.st_mtime_ns};".encode())
    image = f"{IMAGE_REPOSITORY}:e2e-{key.hexdigest()[:12]}"
    present = ctr("images", "ls", "-q").split()
    if image not in present:
        archive = tmp_path_factory.mktemp("image") / "shoal-serve.tar"
        r = subprocess.run([sys.executable, str(AGENT_IMAGE_TOOL), "--shoal", e2e.SHOAL_BIN,
                            "--serve", str(module), "--image", image, "--output", str(archive)],
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, f"agent_image.py --serve: {r.stderr}"
        import_image(image, archive, timeout=600)
        archive.unlink()
        for old in present:
            if old.startswith(f"{IMAGE_REPOSITORY}:e2e-"):
                ctr("images", "rm", old)
    return image


@pytest.fixture
def namespace():
    ns = f"serve-{uuid.uuid4().hex[:8]}"
    kubectl("create", "namespace", ns)
    yield ns
    kubectl("delete", "namespace", ns, "--wait=true", "--timeout=180s", timeout=240, check=False)


@pytest.fixture
def model_repository():
    """A hostPath repository with one model; the pods run as nobody, so it is world-readable."""
    root = Path(tempfile.mkdtemp(prefix="shoal-serve-e2e-"))
    try:
        repo = root / "models"
        (repo / "identity" / "1").mkdir(parents=True)
        torch.jit.script(Identity()).save(str(repo / "identity" / "1" / "model.pt"))
        for path in [root, *root.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        yield repo
    finally:
        shutil.rmtree(root, ignore_errors=True)


class EndpointWatch:
    """The ready endpoints of the Service, as a watch of its EndpointSlices reports them."""

    def __init__(self, ns):
        self.lock = threading.Lock()
        self.slices = {}  # name -> [ready addresses]
        self.changed = threading.Condition(self.lock)
        self.proc = subprocess.Popen(
            ["bash", str(e2e.KUBERNETES_CLUSTER_SH), "kubectl", "get", "endpointslices", "-n", ns,
             "-l", f"kubernetes.io/service-name={NAME}", "--watch", "--output-watch-events",
             "-o", "json"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        decoder = json.JSONDecoder()
        buffer = ""
        for line in self.proc.stdout:
            buffer += line
            while buffer.strip():
                try:
                    event, end = decoder.raw_decode(buffer.lstrip())
                except json.JSONDecodeError:
                    break  # the rest of the object is still coming
                buffer = buffer.lstrip()[end:]
                self._apply(event)

    def _apply(self, event):
        obj = event["object"]
        name = obj["metadata"]["name"]
        with self.lock:
            if event["type"] == "DELETED":
                self.slices.pop(name, None)
            else:
                self.slices[name] = [
                    e["addresses"][0] for e in obj.get("endpoints") or []
                    if e.get("conditions", {}).get("ready")]
            self.changed.notify_all()

    def ready(self):
        with self.lock:
            return sorted(a for addresses in self.slices.values() for a in addresses)

    def close(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait()


class Load:
    """Clients that send inference requests through the endpoint watch until stopped."""

    def __init__(self, endpoints, token, port):
        self.endpoints, self.token, self.port = endpoints, token, port
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.sent = 0
        self.failures = []
        self.answers = []  # (monotonic time, pod address) of every answer
        self.next_endpoint = itertools.count()
        self.threads = [threading.Thread(target=self._client, args=(i,)) for i in range(CLIENTS)]
        for t in self.threads:
            t.start()

    def _pick(self):
        while not self.stopping.is_set():
            ready = self.endpoints.ready()
            if ready:
                return ready[next(self.next_endpoint) % len(ready)]
            time.sleep(0.01)
        return None

    def _client(self, index):
        conn, address = None, None
        headers = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}
        for n in itertools.count():
            if self.stopping.is_set():
                break
            if conn is None:
                address = self._pick()
                if address is None:
                    break
                conn = http.client.HTTPConnection(address, self.port, timeout=60)
            values = [index, n]
            body = json.dumps({"inputs": [{"name": "x", "shape": [2], "datatype": "INT64",
                                           "data": values}]})
            with self.lock:
                self.sent += 1
            try:
                conn.request("POST", "/v2/models/identity/infer", body=body, headers=headers)
                response = conn.getresponse()
                raw = response.read()
                if response.status != 200 or json.loads(raw)["outputs"][0]["data"] != values:
                    raise AssertionError(f"{response.status} {raw[:200]!r}")
                with self.lock:
                    self.answers.append((time.monotonic(), address))
                if response.will_close:
                    conn.close()
                    conn = None
            except Exception as e:  # noqa: BLE001: every way a request can fail counts
                with self.lock:
                    self.failures.append(f"client {index} request {n} to {address}: {e!r}")
                conn.close()
                conn = None
            time.sleep(PAUSE_S)
        if conn is not None:
            conn.close()

    def stop(self):
        self.stopping.set()
        for t in self.threads:
            t.join(timeout=120)


def pods(ns):
    r = kubectl("get", "pods", "-n", ns, "-l", f"app.kubernetes.io/instance={NAME}", "-o", "json")
    return json.loads(r.stdout)["items"]


def test_a_rolling_update_of_three_replicas_loses_no_request(
        shoal_bin, serve_image, namespace, model_repository):
    r = subprocess.run(
        [shoal_bin, "serve", "--print-manifests", "--replicas", str(REPLICAS), "--image", serve_image,
         "--image-pull-policy", "Never", "--model-repository-volume",
         f"hostpath:{model_repository}", "--name", NAME, "--namespace", namespace,
         "--cpu", "250m", "--memory", "512Mi"],
        capture_output=True, text=True, timeout=60, env=e2e.base_env())
    assert r.returncode == 0, r.stderr
    documents = {d["kind"]: d for d in yaml.safe_load_all(r.stdout) if d}
    token = documents["Secret"]["stringData"]["token"]
    port = next(p["port"] for p in documents["Service"]["spec"]["ports"] if p["name"] == "http")
    kubectl("apply", "-f", "-", stdin=r.stdout)
    rollout = kubectl("rollout", "status", f"deployment/{NAME}", "-n", namespace,
                      "--timeout=400s", timeout=420, check=False)
    assert rollout.returncode == 0, (rollout.stderr, kubectl("describe", "pods", "-n", namespace,
                                                             check=False).stdout[-4000:])

    endpoints = EndpointWatch(namespace)
    load = None
    try:
        e2e.wait_until(lambda: len(endpoints.ready()) == REPLICAS, 120,
                       f"{REPLICAS} ready endpoints of the Service")
        old_pods = {p["metadata"]["name"]: p["status"]["podIP"] for p in pods(namespace)}
        assert len(old_pods) == REPLICAS, old_pods
        load = Load(endpoints, token, port)
        e2e.wait_until(lambda: len(load.answers) >= 100, 120, "100 answers before the update")

        # The update: a new pod template (as kubectl rollout restart makes one), so that every
        # pod is replaced, one at a time (maxSurge 1, maxUnavailable 0).
        update_started = time.monotonic()
        patch = {"spec": {"template": {"metadata": {"annotations": {
            "shoal.test/restarted-at": str(time.time())}}}}}
        kubectl("patch", f"deployment/{NAME}", "-n", namespace, "-p", json.dumps(patch))
        rollout = kubectl("rollout", "status", f"deployment/{NAME}", "-n", namespace,
                          "--timeout=500s", timeout=520, check=False)
        assert rollout.returncode == 0, rollout.stderr
        # The old pods drain after the rollout counts them out; the update ends when they are gone.
        e2e.wait_until(lambda: not set(old_pods) & {p["metadata"]["name"] for p in pods(namespace)},
                       180, "the old pods to be gone")
        update_ended = time.monotonic()
        answered_after = len(load.answers)
        e2e.wait_until(lambda: len(load.answers) >= answered_after + 50, 60,
                       "50 answers after the update")
    finally:
        if load is not None:
            load.stop()
        endpoints.close()

    new_pods = {p["metadata"]["name"]: p["status"]["podIP"] for p in pods(namespace)}
    assert len(new_pods) == REPLICAS and not set(new_pods) & set(old_pods), (old_pods, new_pods)
    during = [(t, a) for t, a in load.answers if update_started <= t <= update_ended]
    times = [update_started] + [t for t, _ in during] + [update_ended]
    longest_gap = max(b - a for a, b in zip(times, times[1:]))
    by_pod = {a: sum(1 for _, b in during if b == a)
              for a in sorted(set(old_pods.values()) | set(new_pods.values()))}
    print(f"\nrolling update of {REPLICAS} replicas: {load.sent} requests sent, "
          f"{len(load.failures)} failed, {len(load.answers)} answered ({len(during)} during the "
          f"update, which took {update_ended - update_started:.1f} s); longest time without an "
          f"answer during the update: {longest_gap:.2f} s; answers by pod during the update: "
          f"{by_pod}")
    assert load.failures == []
    assert load.sent == len(load.answers)
    # Answered throughout: in each tenth of the update, by every old pod and by new ones. (Not
    # necessarily by every new pod: a client keeps its connection to the pod it reached, so the
    # pod that became ready last may get none before the load ends.)
    span = (update_ended - update_started) / 10
    tenths = [sum(1 for t, _ in during if update_started + i * span <= t
                  < update_started + (i + 1) * span) for i in range(10)]
    assert all(count > 0 for count in tenths), tenths
    for address in old_pods.values():
        assert any(a == address for _, a in load.answers), (address, by_pod)
    assert any(a in new_pods.values() for _, a in during), by_pod
