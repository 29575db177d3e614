"""What the Kubernetes benchmarks (kubernetes_startup.py, kubernetes_failure.py) need of the API
server, with the standard library only: the kubeconfig's cluster and credentials, plain
requests, and one watch of a namespace's pods that stamps every event on arrival.

Timing: a pod's moments (first seen, first seen Running, deletion seen, gone) are time.time()
taken when the watch event that shows it is read, on a thread that does nothing else. The API
server's own stamps (creationTimestamp, startedAt, conditions) have one-second resolution, too
coarse for this; the watch's delay is the API server's fan-out plus a read, milliseconds, and the
same for every mode. time.time() is also the clock of Shoal's journal (ts_us).
"""

import base64
import contextlib
import http.client
import json
import os
import ssl
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import quote

REPO_ROOT = Path(__file__).resolve().parent.parent
CLUSTER_SH = REPO_ROOT / "tests" / "kubernetes" / "cluster.sh"
DEFAULT_KUBECONFIG = "/tmp/shoal-kubernetes/pki/admin.kubeconfig"


def kubeconfig_path(explicit=None):
    return explicit or os.environ.get("KUBECONFIG", "").split(":")[0] or DEFAULT_KUBECONFIG


def kubectl_argv(kubeconfig):
    """The test cluster's own kubectl when this checkout has it, else kubectl on PATH."""
    if CLUSTER_SH.is_file():
        return ["bash", str(CLUSTER_SH), "kubectl", "--kubeconfig", kubeconfig]
    return ["kubectl", "--kubeconfig", kubeconfig]


class Api:
    """A client for one kubeconfig's current context: client certificate or token."""

    def __init__(self, kubeconfig):
        self.kubeconfig = kubeconfig
        r = subprocess.run(kubectl_argv(kubeconfig) + ["config", "view", "--raw", "--minify",
                                                       "-o", "json"],
                           capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise RuntimeError(f"kubectl config view ({kubeconfig}): {r.stderr.strip()[-300:]}")
        config = json.loads(r.stdout)
        cluster = config["clusters"][0]["cluster"]
        user = config["users"][0]["user"] if config.get("users") else {}
        self._tmp = tempfile.TemporaryDirectory(prefix="shoal-bench-kube-")
        server = cluster["server"]
        if not server.startswith("https://"):
            raise RuntimeError(f"{kubeconfig}: only https servers are supported, not {server}")
        hostport = server[len("https://"):].rstrip("/")
        self.host, _, port = hostport.partition(":")
        self.port = int(port or 443)
        self.ctx = ssl.create_default_context(cafile=self._file(cluster, "certificate-authority"))
        if cluster.get("insecure-skip-tls-verify"):
            self.ctx.check_hostname = False
            self.ctx.verify_mode = ssl.CERT_NONE
        cert = self._file(user, "client-certificate")
        if cert:
            self.ctx.load_cert_chain(cert, self._file(user, "client-key"))
        self.token = user.get("token")
        if not self.token and user.get("tokenFile"):
            self.token = Path(user["tokenFile"]).read_text().strip()

    def _file(self, section, key):
        if section.get(key + "-data"):
            path = Path(self._tmp.name) / key
            path.write_bytes(base64.b64decode(section[key + "-data"]))
            return str(path)
        return section.get(key)

    def _connection(self, timeout):
        return http.client.HTTPSConnection(self.host, self.port, context=self.ctx,
                                           timeout=timeout)

    def _headers(self):
        h = {"Accept": "application/json", "Content-Type": "application/json"}
        if self.token:
            h["Authorization"] = "Bearer " + self.token
        return h

    def request(self, method, path, body=None, timeout=30):
        """(HTTP status, decoded JSON body or None)."""
        conn = self._connection(timeout)
        try:
            conn.request(method, path, body=None if body is None else json.dumps(body),
                         headers=self._headers())
            resp = conn.getresponse()
            data = resp.read()
        finally:
            conn.close()
        try:
            return resp.status, json.loads(data) if data else None
        except ValueError:
            return resp.status, None

    def ok(self, method, path, body=None, allow=()):
        status, doc = self.request(method, path, body)
        if status >= 300 and status not in allow:
            message = (doc or {}).get("message", "") if isinstance(doc, dict) else ""
            raise RuntimeError(f"{method} {path}: HTTP {status}: {message}")
        return doc

    def watch_lines(self, path, stop):
        """Yields (arrival time, event) of a watch until the server ends it or stop is set."""
        conn = self._connection(timeout=330)
        try:
            conn.request("GET", path, headers=self._headers())
            resp = conn.getresponse()
            if resp.status != 200:
                raise RuntimeError(f"watch {path}: HTTP {resp.status}: {resp.read()[:300]!r}")
            while not stop.is_set():
                line = resp.readline()
                if not line:
                    return
                arrived = time.time()
                if line.strip():
                    yield arrived, json.loads(line)
        finally:
            conn.close()

    def create_namespace(self, name):
        self.ok("POST", "/api/v1/namespaces",
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name,
                 "labels": {"app.kubernetes.io/created-by": "shoal-bench"}}}, allow=(409,))

    def delete_namespace(self, name, timeout=120):
        self.request("DELETE", f"/api/v1/namespaces/{name}")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status, _ = self.request("GET", f"/api/v1/namespaces/{name}")
            if status == 404:
                return True
            time.sleep(0.5)
        return False


class PodRecord:
    __slots__ = ("name", "uid", "labels", "annotations", "added", "running", "deleting",
                 "gone", "phase")

    def __init__(self, meta):
        self.name, self.uid = meta["name"], meta["uid"]
        self.labels = meta.get("labels") or {}
        self.annotations = meta.get("annotations") or {}
        self.added = self.running = self.deleting = self.gone = None
        self.phase = None


class PodWatch:
    """Every pod of a namespace as the API server reports it, stamped on arrival, on a thread of
    its own: list, then watch from the list's resourceVersion, again after the server ends it."""

    def __init__(self, api, namespace):
        self.api, self.ns = api, namespace
        self.pods = {}  # uid -> PodRecord
        self.cond = threading.Condition()
        self.stop = threading.Event()
        self.error = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self):
        self.thread.start()
        return self

    def close(self):
        self.stop.set()

    def _observe(self, arrived, kind, pod):
        meta = pod["metadata"]
        with self.cond:
            rec = self.pods.get(meta["uid"])
            if rec is None:
                rec = self.pods[meta["uid"]] = PodRecord(meta)
                rec.added = arrived
            rec.annotations = meta.get("annotations") or rec.annotations
            rec.phase = (pod.get("status") or {}).get("phase")
            if kind == "DELETED":
                rec.gone = rec.gone or arrived
            if meta.get("deletionTimestamp") and rec.deleting is None:
                rec.deleting = arrived
            if rec.phase == "Running" and rec.running is None and rec.deleting is None:
                rec.running = arrived
            self.cond.notify_all()

    def _run(self):
        base = f"/api/v1/namespaces/{self.ns}/pods"
        version = None
        try:
            while not self.stop.is_set():
                if version is None:
                    doc = self.api.ok("GET", base)
                    now = time.time()
                    for pod in doc["items"]:
                        self._observe(now, "ADDED", pod)
                    version = doc["metadata"]["resourceVersion"]
                path = (f"{base}?watch=1&allowWatchBookmarks=true&timeoutSeconds=300"
                        f"&resourceVersion={quote(version)}")
                for arrived, event in self.api.watch_lines(path, self.stop):
                    obj = event.get("object") or {}
                    if event.get("type") == "ERROR":
                        version = None  # too old: list again
                        break
                    version = obj.get("metadata", {}).get("resourceVersion", version)
                    if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                        self._observe(arrived, event["type"], obj)
        except Exception as e:  # the drivers report it rather than hang
            with self.cond:
                self.error = f"pod watch: {e}"
                self.cond.notify_all()

    def select(self, pred):
        with self.cond:
            return [r for r in self.pods.values() if pred(r)]

    def wait(self, fn, timeout):
        """Waits until fn() (called under the lock with no arguments) returns something truthy;
        returns it, or None after timeout seconds or when the watch has failed."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                value = fn()
                if value or self.error:
                    return value or None
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.cond.wait(min(left, 0.5))

    def wait_running(self, pred, n, timeout):
        """The n pods matching pred once all of them are Running, or None."""
        def ready():
            pods = [r for r in self.pods.values() if pred(r) and r.deleting is None]
            return pods if len(pods) >= n and all(r.running for r in pods) else None
        return self.wait(ready, timeout)

    def wait_empty(self, timeout):
        """True once no pod of the namespace is left."""
        return bool(self.wait(lambda: all(r.gone for r in self.pods.values()) or None, timeout))


def bootstrap_ratio_ci(a, b, resamples=2000, seed=1):
    """95 % percentile-bootstrap interval of median(a) / median(b), resampling repetitions
    (pairs a[i], b[i] together: they ran back to back). None with fewer than 3 pairs."""
    import random
    import statistics
    pairs = list(zip(a, b))
    if len(pairs) < 3:
        return None
    rng = random.Random(seed)
    ratios = []
    for _ in range(resamples):
        sample = [rng.choice(pairs) for _ in pairs]
        den = statistics.median(p[1] for p in sample)
        if den > 0:
            ratios.append(statistics.median(p[0] for p in sample) / den)
    ratios.sort()
    return [round(ratios[int(0.025 * len(ratios))], 4),
            round(ratios[int(0.975 * len(ratios)) - 1], 4)]


def dns_label(text):
    out = ""
    for ch in text.lower():
        if ch.isalnum() and ch.isascii():
            out += ch
        elif out and out[-1] != "-":
            out += "-"
    return out.strip("-") or "x"


@contextlib.contextmanager
def namespace(api, name, keep=False):
    api.create_namespace(name)
    try:
        yield name
    finally:
        if not keep:
            api.delete_namespace(name)
