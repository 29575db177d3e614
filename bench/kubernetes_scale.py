#!/usr/bin/env python3
"""The 1,000-pod gang on kwok's fake nodes: what Shoal's Kubernetes backend costs at scale,
next to a plain indexed Kubernetes Job of the same pods on the same nodes, in the same run.

Needs the project's test cluster and kwok's fake nodes (tests/kubernetes/cluster.sh up;
tests/kubernetes/kwok.sh up: 100 nodes of 8 cpus, tainted kwok.x-k8s.io/node=fake:NoSchedule).
kwok runs nothing: it marks each pod bound to its nodes Running (a Job's pods too: they stay so),
so no agent registers and each Shoal job is killed once all its pods run.

Each repetition runs both, alternating which goes first, in a namespace of the driver's own:
  shoal  t0, then `shoal submit --backend kubernetes --namespace NS job.yaml`: one role of N
         tasks (cpus 0.1, memory 64MiB), node_selector type=kwok and the taint's toleration;
         once all pods run, `shoal kill`.
  job    t0, then `kubectl create` of a batch/v1 Job, completionMode Indexed, parallelism =
         completions = N, the same pod template (requests, selector, toleration); once all
         pods run, `kubectl delete job` (background propagation).
Times come from one watch on the namespace's pods (this driver's own HTTPS connection to the
API server), stamped on arrival:
  created_s    t0 -> the Nth pod exists
  admission_s  t0 -> the Nth pod bound to a node (spec.nodeName set)
  running_s    t0 -> the Nth pod Running per kwok
  pods_gone_s  kill / delete -> the last pod gone (the watch's DELETED)
  teardown_s   for Shoal, kill -> its pods, Secret and owner ConfigMap all gone (polled every
               half second); for the Job, pods_gone_s
Costs:
  shoal: api_requests_per_pod, from the master's log line "N API requests to the API server
         for M pods" (its KubeClient's count, written when it releases the job);
         master_cpu_s, utime + stime of the master (pid in master.json) from /proc, sampled
         until it exits (its last sample), and master_peak_rss_mb, its VmHWM then;
  job:   controller_manager_cpu_s, the kube-controller-manager's CPU over the same span (the
         Job controller lives there; the other controllers are idle on this cluster);
  both:  apiserver_requests, the API server's own count (apiserver_request_total) of requests
         on pods, bindings and pod status over the run, by verb: the API server's view.
Prints one JSON object: per side, median / min / max of each figure over the repetitions, and
the ratio of the medians (shoal / job) for admission and running.
"""

import argparse
import http.client
import json
import os
import re
import ssl
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as c  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CLUSTER_SH = REPO / "tests" / "kubernetes" / "cluster.sh"
KWOK_SH = REPO / "tests" / "kubernetes" / "kwok.sh"
CLUSTER_DIR = Path(os.environ.get("SHOAL_KUBERNETES_DIR", "/tmp/shoal-kubernetes"))
TOLERATION = {"key": "kwok.x-k8s.io/node", "operator": "Equal", "value": "fake",
              "effect": "NoSchedule"}
IMAGE = "localhost/never-pulled:kwok"
REQUESTS_LINE = re.compile(r"(\d+) API requests to the API server for (\d+) pods")


def kubectl(*args, stdin=None, timeout=120):
    return subprocess.run(["bash", str(CLUSTER_SH), "kubectl", *args], input=stdin,
                          capture_output=True, text=True, timeout=timeout)


class Api:
    """HTTPS to the API server with the admin kubeconfig's client certificate."""

    def __init__(self):
        r = kubectl("config", "view", "--raw", "--minify", "-o", "json")
        if r.returncode != 0:
            raise RuntimeError(f"kubectl config view: {r.stderr.strip()}")
        config = json.loads(r.stdout)
        cluster = config["clusters"][0]["cluster"]
        user = config["users"][0]["user"]
        m = re.match(r"https://([^:/]+):(\d+)", cluster["server"])
        self.host, self.port = m.group(1), int(m.group(2))
        self.context = ssl.create_default_context(cafile=cluster["certificate-authority"])
        self.context.load_cert_chain(user["client-certificate"], user["client-key"])

    def connection(self, timeout=60):
        return http.client.HTTPSConnection(self.host, self.port, context=self.context,
                                           timeout=timeout)

    def get_text(self, path):
        conn = self.connection()
        try:
            conn.request("GET", path)
            r = conn.getresponse()
            return r.read().decode()
        finally:
            conn.close()

    def pod_request_counts(self):
        """apiserver_request_total summed by verb for pods and their binding and status."""
        counts = {}
        for line in self.get_text("/metrics").splitlines():
            if not line.startswith("apiserver_request_total{"):
                continue
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
            if labels.get("resource") != "pods":
                continue
            key = labels.get("verb", "") + (("/" + labels["subresource"])
                                            if labels.get("subresource") else "")
            counts[key] = counts.get(key, 0) + float(line.rsplit(" ", 1)[1])
        return counts


class PodWatch:
    """One watch on a namespace's pods; per pod, when it was first seen, bound, running, and
    gone (wall-clock seconds on arrival)."""

    def __init__(self, api, ns):
        self.api, self.ns = api, ns
        self.lock = threading.Lock()
        self.pods = {}
        self.error = None
        self.stopping = False
        self.conn = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self):
        # The watch starts from the (empty) namespace's current state: nothing is missed.
        r = json.loads(self.api.get_text(f"/api/v1/namespaces/{self.ns}/pods?limit=1"))
        self.version = r["metadata"]["resourceVersion"]
        self.thread.start()

    def _run(self):
        while not self.stopping:
            try:
                self.conn = self.api.connection(timeout=600)
                self.conn.request("GET", f"/api/v1/namespaces/{self.ns}/pods?watch=1"
                                         f"&resourceVersion={self.version}"
                                         f"&allowWatchBookmarks=true")
                r = self.conn.getresponse()
                for line in r:
                    now = time.time()
                    event = json.loads(line)
                    self._observe(event, now)
            except Exception as e:  # noqa: BLE001 -- reported, the run goes on
                if not self.stopping:
                    self.error = f"pod watch: {e!r}"
                    time.sleep(0.5)

    def _observe(self, event, now):
        pod = event["object"]
        meta = pod.get("metadata", {})
        if meta.get("resourceVersion"):
            self.version = meta["resourceVersion"]
        if event["type"] in ("BOOKMARK", "ERROR"):
            return
        name = meta["name"]
        with self.lock:
            p = self.pods.setdefault(name, {"labels": meta.get("labels", {}), "seen": now})
            if pod.get("spec", {}).get("nodeName") and "bound" not in p:
                p["bound"] = now
                p["node"] = pod["spec"]["nodeName"]
            phase = pod.get("status", {}).get("phase")
            if phase in ("Running", "Succeeded") and "running" not in p:
                p["running"] = now
            if event["type"] == "DELETED":
                p["gone"] = now

    def of(self, predicate):
        with self.lock:
            return [dict(p) for p in self.pods.values() if predicate(p["labels"])]

    def stop(self):
        self.stopping = True
        if self.conn is not None:
            try:
                self.conn.sock.shutdown(2)
            except Exception:  # noqa: BLE001
                pass


def nth(pods, key, n):
    """The time the nth pod reached `key`, or None when fewer did."""
    times = sorted(p[key] for p in pods if key in p)
    return times[n - 1] if len(times) >= n else None


def cpu_seconds(pid):
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pid):
    """The process's peak resident memory (VmHWM) in MB, or None once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


def wait(predicate, timeout, interval=0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    return None


def shoal_objects(ns):
    r = kubectl("get", "secrets,configmaps", "-n", ns, "-l", "app.kubernetes.io/managed-by=shoal",
                "-o", "name")
    return [l for l in r.stdout.splitlines() if l.strip()] if r.returncode == 0 else ["?"]


def run_shoal(args, api, watch, ns, jobs_dir, n, rep):
    name = f"kwok{rep}"
    job = jobs_dir / f"{name}.yaml"
    job.write_text(json.dumps({
        "name": name,
        "roles": {"worker": {"instances": n, "command": ["/bin/true"],
                             "resources": {"cpus": 0.1, "memory": "64MiB"}}},
        "kubernetes": {"image": IMAGE, "image_pull_policy": "Never",
                       "node_selector": {"type": "kwok"}, "tolerations": [TOLERATION]}}))
    out = {}
    before = api.pod_request_counts()
    t0 = time.time()
    r = subprocess.run([args.shoal_path, "--jobs-dir", str(jobs_dir), "submit", "--backend",
                        "kubernetes", "--namespace", ns, "--quiet", str(job)],
                       capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        return {"error": f"shoal submit: rc={r.returncode}: {r.stderr.strip()[-500:]}"}
    job_id = r.stdout.strip()
    job_dir = jobs_dir / job_id
    master = json.loads((job_dir / "master.json").read_text())["pid"]
    mine = lambda labels: labels.get("shoal.io/job", "").endswith(job_id)  # noqa: E731
    cpu = {"last": cpu_seconds(master)}

    def sample():
        cpu["last"] = cpu_seconds(master) or cpu["last"]
        out["master_peak_rss_mb"] = peak_rss_mb(master) or out.get("master_peak_rss_mb")

    def all_running():
        sample()
        return nth(watch.of(mine), "running", n)
    if not wait(all_running, args.timeout):
        out["error"] = f"not all {n} pods ran within {args.timeout} s"
    pods = watch.of(mine)
    for key, figure in (("seen", "created_s"), ("bound", "admission_s"), ("running", "running_s")):
        t = nth(pods, key, n)
        out[figure] = round(t - t0, 3) if t else None
    out["master_cpu_to_running_s"] = cpu["last"]
    out["nodes_used"] = len({p.get("node") for p in pods if p.get("node")})
    t_kill = time.time()
    k = subprocess.run([args.shoal_path, "--jobs-dir", str(jobs_dir), "kill", job_id],
                       capture_output=True, text=True, timeout=120)
    if k.returncode != 0:
        # Its registration deadline may have ended it first: teardown from that moment.
        ended = c.Journal(job_dir / "events.jsonl").find(
            lambda e: e.get("type") == "outcome_decided")
        if ended:
            t_kill = min(t_kill, c.record_us(ended[0][1]) / 1e6)
        out["kill"] = f"rc={k.returncode}: {k.stderr.strip()[-200:]}"

    def gone():
        sample()
        ps = watch.of(mine)
        return len([p for p in ps if "gone" in p]) >= n and not shoal_objects(ns)
    if not wait(gone, args.timeout, interval=0.5):
        out["error"] = f"pods or objects of {job_id} still exist {args.timeout} s after the kill"
    t_all_gone = time.time() if not out.get("error") else None
    last_gone = max((p["gone"] for p in watch.of(mine) if "gone" in p), default=None)
    out["pods_gone_s"] = round(last_gone - t_kill, 3) if last_gone else None
    # The Secret and the owner ConfigMap go after the pods (polled: within about a second).
    out["teardown_s"] = round(t_all_gone - t_kill, 3) if t_all_gone else None
    # The master exits after releasing the job: its last CPU sample is (nearly) its total.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        s = cpu_seconds(master)
        if s is None or not c.proc_alive(master):
            break
        sample()
        time.sleep(0.1)
    out["master_cpu_s"] = cpu["last"]
    after = api.pod_request_counts()
    out["apiserver_requests"] = {k: int(after.get(k, 0) - before.get(k, 0))
                                 for k in after if after.get(k, 0) - before.get(k, 0) > 0}
    log_text = (job_dir / "master.log").read_text(errors="replace") \
        if (job_dir / "master.log").exists() else ""
    m = REQUESTS_LINE.search(log_text)
    if m:
        out["api_requests"] = int(m.group(1))
        out["api_requests_per_pod"] = round(int(m.group(1)) / max(int(m.group(2)), 1), 3)
    else:
        out.setdefault("error", "no 'API requests to the API server' line in master.log")
    return out


def run_job(args, api, watch, ns, n, rep):
    name = f"anchor{rep}-{uuid.uuid4().hex[:4]}"
    container = {"name": "task", "image": IMAGE, "imagePullPolicy": "Never",
                 "command": ["/bin/true"],
                 "resources": {"requests": {"cpu": "100m", "memory": "64Mi"},
                               "limits": {"cpu": "100m", "memory": "64Mi"}}}
    manifest = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
                "spec": {"completionMode": "Indexed", "completions": n, "parallelism": n,
                         "backoffLimit": 0,
                         "template": {"spec": {"restartPolicy": "Never",
                                               "nodeSelector": {"type": "kwok"},
                                               "tolerations": [TOLERATION],
                                               "containers": [container]}}}}
    kcm = (CLUSTER_DIR / "pid" / "kube-controller-manager").read_text().strip()
    out = {}
    before = api.pod_request_counts()
    cpu0 = cpu_seconds(kcm)
    t0 = time.time()
    r = kubectl("create", "-n", ns, "-f", "-", stdin=json.dumps(manifest))
    if r.returncode != 0:
        return {"error": f"kubectl create job: {r.stderr.strip()[-500:]}"}
    mine = lambda labels: labels.get("batch.kubernetes.io/job-name") == name  # noqa: E731
    if not wait(lambda: nth(watch.of(mine), "running", n), args.timeout):
        out["error"] = f"not all {n} pods ran within {args.timeout} s"
    pods = watch.of(mine)
    for key, figure in (("seen", "created_s"), ("bound", "admission_s"), ("running", "running_s")):
        t = nth(pods, key, n)
        out[figure] = round(t - t0, 3) if t else None
    out["controller_manager_cpu_to_running_s"] = round(cpu_seconds(kcm) - cpu0, 3)
    out["nodes_used"] = len({p.get("node") for p in pods if p.get("node")})
    t_kill = time.time()
    d = kubectl("delete", "job", name, "-n", ns, "--cascade=background", "--wait=false")
    if d.returncode != 0:
        out["error"] = f"kubectl delete job: {d.stderr.strip()[-300:]}"
    if not wait(lambda: len([p for p in watch.of(mine) if "gone" in p]) >= n, args.timeout,
                interval=0.5):
        out["error"] = f"pods of job {name} still exist {args.timeout} s after its deletion"
    last_gone = max((p["gone"] for p in watch.of(mine) if "gone" in p), default=None)
    out["pods_gone_s"] = round(last_gone - t_kill, 3) if last_gone else None
    out["teardown_s"] = out["pods_gone_s"]
    out["controller_manager_cpu_s"] = round(cpu_seconds(kcm) - cpu0, 3)
    after = api.pod_request_counts()
    out["apiserver_requests"] = {k: int(after.get(k, 0) - before.get(k, 0))
                                 for k in after if after.get(k, 0) - before.get(k, 0) > 0}
    return out


def summarize(runs, keys):
    out = {}
    for key in keys:
        values = [r[key] for r in runs if isinstance(r.get(key), (int, float))]
        if values:
            out[key] = {"median": round(c.median(values), 3), "min": round(min(values), 3),
                        "max": round(max(values), 3), "values": values}
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    c.add_shoal_arg(parser)
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=100, help="fake nodes needed")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--keep", action="store_true", help="keep the jobs dir")
    args = parser.parse_args()
    result = {"benchmark": "kubernetes_scale", "pods": args.pods, "reps": args.reps,
              "machine": c.machine_info()}
    args.shoal_path, err = c.find_shoal(args.shoal)
    if err:
        result["error"] = err
        c.emit(result)
        return
    r = subprocess.run(["bash", str(KWOK_SH), "status"], capture_output=True, text=True)
    if r.returncode != 0:
        result["error"] = (f"kwok is not up ({r.stdout.strip()} {r.stderr.strip()}): run "
                           f"tests/kubernetes/cluster.sh up, then tests/kubernetes/kwok.sh up")
        c.emit(result)
        return
    os.environ.setdefault("KUBECONFIG", str(CLUSTER_DIR / "pki" / "admin.kubeconfig"))
    api = Api()
    nodes = kubectl("get", "nodes", "-l", "type=kwok", "-o", "name").stdout.split()
    result["nodes"] = len(nodes)
    if len(nodes) < args.nodes:
        result["error"] = (f"{len(nodes)} fake nodes, {args.nodes} wanted: "
                           f"tests/kubernetes/kwok.sh nodes {args.nodes}")
        c.emit(result)
        return
    ns = f"bench-kwok-{uuid.uuid4().hex[:6]}"
    r = kubectl("create", "namespace", ns)
    if r.returncode != 0:
        result["error"] = f"kubectl create namespace: {r.stderr.strip()}"
        c.emit(result)
        return
    wait(lambda: kubectl("get", "serviceaccount", "default", "-n", ns).returncode == 0, 30)
    watch = PodWatch(api, ns)
    runs = {"shoal": [], "job": []}
    try:
        watch.start()
        with c.temp_dir("kwok-bench-", keep=args.keep) as jobs_dir:
            for rep in range(args.reps):
                order = ["shoal", "job"] if rep % 2 == 0 else ["job", "shoal"]
                for side in order:
                    c.log(f"rep {rep + 1}/{args.reps}: {side}")
                    try:
                        if side == "shoal":
                            out = run_shoal(args, api, watch, ns, jobs_dir, args.pods, rep)
                        else:
                            out = run_job(args, api, watch, ns, args.pods, rep)
                    except Exception as e:  # noqa: BLE001 -- reported, the rest still runs
                        out = {"error": repr(e)}
                    out["order"] = order.index(side)
                    c.log(f"  {json.dumps(out)}")
                    runs[side].append(out)
                    # Both start on an empty namespace.
                    wait(lambda: not kubectl("get", "pods", "-n", ns, "-o", "name").stdout.strip(),
                         120, interval=1)
    finally:
        watch.stop()
        kubectl("delete", "namespace", ns, "--wait=false")
    times = ["created_s", "admission_s", "running_s", "pods_gone_s", "teardown_s"]
    result["shoal"] = summarize(runs["shoal"], times + ["api_requests_per_pod", "master_cpu_s",
                                                        "master_cpu_to_running_s",
                                                        "master_peak_rss_mb"])
    result["job"] = summarize(runs["job"], times + ["controller_manager_cpu_s",
                                                    "controller_manager_cpu_to_running_s"])
    for key in ("admission_s", "running_s", "teardown_s"):
        a, b = result["shoal"].get(key, {}).get("median"), result["job"].get(key, {}).get("median")
        result[f"ratio_{key}_shoal_over_job"] = c.ratio(a, b)
    result["runs"] = runs
    if watch.error:
        result["watch_error"] = watch.error
    result["machine"]["loadavg_1m_end"] = c.machine_info().get("loadavg_1m")
    c.emit(result)


if __name__ == "__main__":
    main()
