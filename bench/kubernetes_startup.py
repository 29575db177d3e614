#!/usr/bin/env python3
"""Submit to every pod running on Kubernetes: `shoal submit --backend kubernetes` of N trivial
tasks next to a plain indexed batch/v1 Job with the same pods, on the same cluster, in the same
run.

Needs a cluster (the project's: tests/kubernetes/cluster.sh up; --kubeconfig or $KUBECONFIG) and
the images named below there. Everything runs in a namespace of its own (--namespace, default
bench-startup-<pid>), created and deleted by the driver.

Modes, each repetition running all of them back to back in a rotating order (ABCD, BCDA, ...):
  shoal      t0, then `shoal submit --backend kubernetes --namespace NS job.yaml`: one role of
             N tasks running `python3 -c "import time; time.sleep(600)"` in --image (cpus
             --cpus, memory --memory); then `shoal kill`.
  shoal_host_path  `shoal` with --agent-host-path: the agent is on the node already, put there
             by `shoal kubernetes agent-daemonset` (applied once, in a namespace of its own,
             NS-agent, before the first round; --agent-image, --pause-image, --agent-host-path),
             and the pods have no init container.
  job        t0, then POST of an Indexed Job (completions = parallelism = N) whose pod template
             is Shoal's own pod, taken from the warmup's shoal run: the same image, pull policy,
             task container resources (requests and limits: Shoal adds 128 MiB for its agent),
             enableServiceLinks and service-account settings, with the sleep as its command and
             without Shoal's init container.
  job_init   the same Job with Shoal's init container too (copying the agent from the agent
             image into an emptyDir mounted in the task container): the part of the ratio that
             is the init container's.
  job_shoal_pod  a Job whose pod template is Shoal's pod as it is (init container, the agent's
             environment with the token from a Secret, created in the timed window as Shoal
             creates its own), only the command being the sleep: what is left of the ratio
             beyond it is Shoal's control path (client, master, creating pods one by one).
  job_again  `job` once more: the A/A pair, which says how much two identical runs differ.
Figures per run (ms from t0; t0 is taken just before the submitting command or request):
  pods_created_ms   the last of the N pods first seen by the watch
  pods_running_ms   the last of the N pods seen Running (its main container started)
  tasks_running_ms  (shoal) the last task's `running` record in the job's journal (events.jsonl,
                    ts_us), i.e. the agent in each pod registered and started the task: what
                    `shoal status --json` shows as running.
Pods are stamped by a watch of the namespace (bench/_kube.py: arrival time of the event, ms
resolution). The Job is created with a direct API request, not `kubectl create`: its figure
holds no client start-up, so the anchor is the stricter one. After each run the driver deletes
what it made and waits until the namespace holds no pod before the next run starts. Rep 0 is an
untimed warmup (shoal first, so that the Job's template can be copied from Shoal's pod).

Prints one JSON object: per N, each mode's summary (median, p90, min, max), the ratios of medians
shoal/job, shoal_host_path/job, job_init/job and job_again/job (the A/A), each with a 95 %
bootstrap interval over the repetitions, and target_met: the pods_running median of
shoal_host_path (when that mode runs; else shoal) <= 1.1 x the Job's at every N.
"""

import argparse
import contextlib
import copy
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as c  # noqa: E402
import _kube as k  # noqa: E402

MODES = ["shoal", "shoal_host_path", "job", "job_init", "job_shoal_pod", "job_again"]
SLEEP = ["/usr/bin/python3", "-c", "import time; time.sleep(600)"]
TARGET_RATIO = 1.1


def shoal_job_file(work, n, args):
    path = work / f"startup-{n}.yaml"
    path.write_text(
        f"name: kstart-n{n}\n"
        # Ten missed beats before an agent counts as lost: pod start-up loads a 2-core machine.
        "heartbeat: {interval: 1s, misses: 10}\n"
        "roles:\n"
        "  task:\n"
        f"    instances: {n}\n"
        f"    command: {json.dumps(SLEEP)}\n"
        f"    resources: {{cpus: {args.cpus}, memory: {args.memory}}}\n"
        "kubernetes:\n"
        f"  image: {args.image}\n"
        f"  image_pull_policy: {args.pull_policy}\n")
    return path


def fallback_template(args):
    """Used only if no Shoal pod could be read: what Shoal's pods hold (kubernetes_objects.cc)."""
    mem_mib = int(args.memory.rstrip("MiB")) + 128
    cpu = f"{round(float(args.cpus) * 1000)}m"
    res = {"requests": {"cpu": cpu, "memory": f"{mem_mib}Mi"},
           "limits": {"cpu": cpu, "memory": f"{mem_mib}Mi"}}
    return {"containers": [{"name": "task", "image": args.image,
                            "imagePullPolicy": args.pull_policy, "resources": res,
                            "volumeMounts": [{"name": "shoal-agent",
                                              "mountPath": "/opt/shoal", "readOnly": True}]}],
            "initContainers": [{"name": "shoal-agent", "image": "localhost/shoal-agent:latest",
                                "imagePullPolicy": "Never",
                                "command": ["/bin/cp", "-a", "/opt/shoal/.", "/mnt/shoal/"],
                                "volumeMounts": [{"name": "shoal-agent",
                                                  "mountPath": "/mnt/shoal"}],
                                "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}}}],
            "volumes": [{"name": "shoal-agent", "emptyDir": {}}],
            "enableServiceLinks": False, "automountServiceAccountToken": False}


def shoal_pod_spec(shoal_spec, secret):
    """Shoal's pod spec as it is, with the sleep as its command and its token Secret renamed."""
    spec = {key: copy.deepcopy(value) for key, value in shoal_spec.items()
            if key not in ("nodeName", "schedulerName", "priority", "preemptionPolicy")}
    task = spec["containers"][0]
    task["command"] = SLEEP
    for env in task.get("env", []):
        ref = (env.get("valueFrom") or {}).get("secretKeyRef")
        if ref:
            ref["name"] = secret
    return spec


def job_pod_spec(shoal_spec, with_init):
    """Shoal's pod spec with the sleep as its command, without Shoal's agent arguments, token
    and SDK path, and without (or with) its init container."""
    task = copy.deepcopy(shoal_spec["containers"][0])
    spec = {"restartPolicy": "Never",
            "containers": [{"name": "task", "image": task["image"],
                            "imagePullPolicy": task.get("imagePullPolicy", "IfNotPresent"),
                            "command": SLEEP, "resources": task.get("resources", {})}]}
    for key in ("enableServiceLinks", "automountServiceAccountToken", "hostNetwork",
                "dnsPolicy", "nodeSelector", "tolerations", "priorityClassName",
                "serviceAccountName"):
        if key in shoal_spec:
            spec[key] = shoal_spec[key]
    if with_init:
        spec["initContainers"] = copy.deepcopy(shoal_spec["initContainers"])
        agent_volumes = {m["name"] for m in spec["initContainers"][0].get("volumeMounts", [])}
        spec["volumes"] = [v for v in shoal_spec.get("volumes", []) if v["name"] in agent_volumes]
        spec["containers"][0]["volumeMounts"] = [
            m for m in task.get("volumeMounts", []) if m["name"] in agent_volumes]
    return spec


class Runner:
    def __init__(self, api, watch, ns, shoal, work, args):
        self.api, self.watch, self.ns, self.shoal, self.work, self.args = (
            api, watch, ns, shoal, work, args)
        self.shoal_spec = None      # a pod of mode shoal (with the init container)
        self.host_path_spec = None  # a pod of mode shoal_host_path
        self.env = {**os.environ, "KUBECONFIG": api.kubeconfig}
        self.runs = 0

    def _settle(self):
        if not self.watch.wait_empty(self.args.timeout):
            return "pods of an earlier run are still there"
        return None

    def install_agent(self, agent_ns):
        """The agent DaemonSet, applied once in `agent_ns`: waits until every node has it."""
        p = subprocess.run([self.shoal, "kubernetes", "agent-daemonset", "--agent-image",
                            self.args.agent_image, "--pause-image", self.args.pause_image,
                            "--agent-host-path", self.args.agent_host_path],
                           capture_output=True, text=True, timeout=60)
        if p.returncode != 0:
            raise RuntimeError(f"shoal kubernetes agent-daemonset: exit {p.returncode}: "
                               f"{p.stderr.strip()[-300:]}")
        path = f"/apis/apps/v1/namespaces/{agent_ns}/daemonsets"
        self.api.ok("POST", path, json.loads(p.stdout))
        name = json.loads(p.stdout)["metadata"]["name"]
        deadline = time.time() + self.args.timeout
        while time.time() < deadline:
            status, doc = self.api.request("GET", f"{path}/{name}")
            st = doc.get("status", {}) if status == 200 else {}
            if st.get("desiredNumberScheduled", 0) >= 1 and (
                    st.get("numberReady") == st.get("desiredNumberScheduled")):
                return
            time.sleep(0.5)
        raise RuntimeError(f"the agent DaemonSet in {agent_ns} was not ready on every node in "
                           f"{self.args.timeout:.0f} s")

    def run_shoal(self, n, host_path=False):
        jobs = self.work / "jobs"
        job_file = shoal_job_file(self.work, n, self.args)
        extra = ["--agent-host-path", self.args.agent_host_path] if host_path else []
        t0 = time.time()
        p = subprocess.run([self.shoal, "--jobs-dir", str(jobs), "submit", "--backend",
                            "kubernetes", "--namespace", self.ns, *extra, str(job_file)],
                           capture_output=True, text=True, timeout=self.args.timeout, env=self.env)
        if p.returncode != 0:
            return None, f"shoal submit: exit {p.returncode}: {p.stderr.strip()[-300:]}"
        job_id = p.stdout.split()[-1]
        mine = lambda r: r.annotations.get("shoal.io/job-id") == job_id
        try:
            pods = self.watch.wait_running(mine, n, self.args.timeout)
            journal = c.Journal(jobs / job_id / "events.jsonl")
            running = {}

            def tasks_running(rec):
                if rec.get("type") == "task_state" and rec.get("to") == "running":
                    running.setdefault(rec["task"], c.record_us(rec))
                return len(running) >= n or rec.get("type") == "job_finished"
            _, last = journal.wait_for(tasks_running, self.args.timeout, poll_s=0.01)
            if pods is None or last is None or len(running) < n:
                why = (last or {}).get("reason") or self.watch.error or "timed out"
                return None, (f"shoal: {len(running)} of {n} tasks running, pods "
                              f"{'all' if pods else 'not all'} running: {why}")
            if (self.host_path_spec if host_path else self.shoal_spec) is None:
                status, doc = self.api.request(
                    "GET", f"/api/v1/namespaces/{self.ns}/pods/{pods[0].name}")
                if status == 200 and host_path:
                    self.host_path_spec = doc["spec"]
                elif status == 200:
                    self.shoal_spec = doc["spec"]
            return {"pods_created_ms": (max(r.added for r in pods) - t0) * 1e3,
                    "pods_running_ms": (max(r.running for r in pods) - t0) * 1e3,
                    "tasks_running_ms": (max(running.values()) / 1e6 - t0) * 1e3}, None
        finally:
            subprocess.run([self.shoal, "--jobs-dir", str(jobs), "kill", job_id],
                           capture_output=True, text=True, timeout=self.args.timeout,
                           env=self.env)

    def run_job(self, n, mode):
        self.runs += 1
        name = f"kstart-{mode.replace('_', '-')}-{n}-{self.runs}"
        secret = None
        if mode == "job_shoal_pod":
            if self.shoal_spec is None:
                return None, "job_shoal_pod: no Shoal pod was read in the warmup"
            secret = f"{name}-token"
            spec = shoal_pod_spec(self.shoal_spec, secret)
            keys = [e["valueFrom"]["secretKeyRef"]["key"] for e in spec["containers"][0]["env"]
                    if (e.get("valueFrom") or {}).get("secretKeyRef")]
        else:
            # Shoal's pod with its init container; without it, a shoal_host_path pod will do.
            with_init = mode == "job_init"
            template = self.shoal_spec or (None if with_init else self.host_path_spec)
            spec = job_pod_spec(template or fallback_template(self.args), with_init=with_init)
        body = {"apiVersion": "batch/v1", "kind": "Job",
                "metadata": {"name": name, "labels": {"app.kubernetes.io/created-by":
                                                      "shoal-bench"}},
                "spec": {"completionMode": "Indexed", "completions": n, "parallelism": n,
                         "backoffLimit": 0, "template": {"spec": spec}}}
        path = f"/apis/batch/v1/namespaces/{self.ns}/jobs"
        mine = lambda r: r.labels.get("batch.kubernetes.io/job-name") == name
        t0 = time.time()
        try:
            if secret:
                self.api.ok("POST", f"/api/v1/namespaces/{self.ns}/secrets",
                            {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": secret},
                             "stringData": {key: "bench" for key in keys}})
            self.api.ok("POST", path, body)
            pods = self.watch.wait_running(mine, n, self.args.timeout)
            if pods is None:
                return None, f"{mode}: not every pod ran; {self.watch.error or ''}"
            return {"pods_created_ms": (max(r.added for r in pods) - t0) * 1e3,
                    "pods_running_ms": (max(r.running for r in pods) - t0) * 1e3}, None
        finally:
            self.api.request("DELETE", f"{path}/{name}",
                             {"propagationPolicy": "Background", "gracePeriodSeconds": 0})
            self.api.request("DELETE", f"/api/v1/namespaces/{self.ns}/pods?labelSelector="
                             f"batch.kubernetes.io%2Fjob-name%3D{name}",
                             {"gracePeriodSeconds": 0})
            if secret:
                self.api.request("DELETE", f"/api/v1/namespaces/{self.ns}/secrets/{secret}")

    def run(self, n, mode):
        err = self._settle()
        if err:
            return None, err
        try:
            if mode in ("shoal", "shoal_host_path"):
                return self.run_shoal(n, host_path=(mode == "shoal_host_path"))
            return self.run_job(n, mode)
        except (RuntimeError, OSError, subprocess.SubprocessError, ValueError) as e:
            return None, f"{mode}: {e}"


def summarize(n, times, errors):
    entry = {}
    for mode in MODES:
        runs = times[mode]
        if not runs:
            continue
        entry[mode] = {key: c.summary_ms([r[key] for r in runs]) for key in runs[0]}

    def ratio(a_mode, b_mode, key="pods_running_ms"):
        a = [r[key] for r in times[a_mode]]
        b = [r[key] for r in times[b_mode]]
        if not a or not b or len(a) != len(b):
            return None
        return {"ratio_of_medians": c.ratio(c.median(a), c.median(b)),
                "ci95": k.bootstrap_ratio_ci(a, b),
                "paired_min_max": [round(min(x / y for x, y in zip(a, b)), 4),
                                   round(max(x / y for x, y in zip(a, b)), 4)]}
    entry["shoal_over_job"] = ratio("shoal", "job")
    entry["shoal_host_path_over_job"] = ratio("shoal_host_path", "job")
    entry["shoal_host_path_over_shoal"] = ratio("shoal_host_path", "shoal")
    entry["shoal_tasks_running_over_job_pods_running"] = (
        {"ratio_of_medians": c.ratio(c.median([r["tasks_running_ms"] for r in times["shoal"]]),
                                     c.median([r["pods_running_ms"] for r in times["job"]]))}
        if times["shoal"] and times["job"] else None)
    entry["job_init_over_job"] = ratio("job_init", "job")
    entry["shoal_over_job_init"] = ratio("shoal", "job_init")
    entry["job_shoal_pod_over_job"] = ratio("job_shoal_pod", "job")
    entry["shoal_over_job_shoal_pod"] = ratio("shoal", "job_shoal_pod")
    entry["aa_job_again_over_job"] = ratio("job_again", "job")
    if errors:
        entry["errors"] = errors[:5]
    return entry


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    c.add_shoal_arg(ap)
    ap.add_argument("--kubeconfig", help="default: $KUBECONFIG, else the test cluster's")
    ap.add_argument("--namespace", help="created and deleted here (default bench-startup-PID)")
    ap.add_argument("--n", default="2,8,32", help="comma-separated task counts (2,8,32)")
    ap.add_argument("--reps", type=int, default=5, help="timed rounds of every mode per N (5)")
    ap.add_argument("--modes", default=",".join(MODES), help=f"subset of {','.join(MODES)}")
    ap.add_argument("--image", default="localhost/shoal-python:test")
    ap.add_argument("--pull-policy", default="Never")
    ap.add_argument("--cpus", default="0.025", help="per task (0.025: 32 pods hold 0.8 CPU)")
    ap.add_argument("--memory", default="32MiB", help="per task, in MiB (32MiB)")
    ap.add_argument("--agent-image", default="localhost/shoal-agent:latest",
                    help="the agent DaemonSet's image (shoal_host_path)")
    ap.add_argument("--pause-image", default="localhost/pause:test",
                    help="the agent DaemonSet's pause image (shoal_host_path)")
    ap.add_argument("--agent-host-path", default="/tmp/shoal-bench-agent/agent",
                    help="where the DaemonSet puts the agent on the nodes (shoal_host_path; "
                         "left there after the run)")
    ap.add_argument("--timeout", type=float, default=180, help="per-run limit, s (180)")
    ap.add_argument("--keep", action="store_true", help="keep the namespace and jobs dir")
    args = ap.parse_args()
    try:
        ns_list = [int(x) for x in args.n.split(",")]
        modes = args.modes.split(",")
        bad = [m for m in modes if m not in MODES]
        if bad or any(x < 1 for x in ns_list) or args.reps < 1:
            raise ValueError(f"unknown mode {bad[0]!r}" if bad else "--n and --reps must be >= 1")
        if not args.memory.endswith("MiB"):
            raise ValueError("--memory must be given in MiB, e.g. 32MiB")
    except ValueError as e:
        print(f"kubernetes_startup.py: {e}", file=sys.stderr)
        return 2
    shoal, why = c.find_shoal(args.shoal)
    # Delivering the agent per node is how Shoal meets the target, when that mode runs.
    target_mode = "shoal_host_path" if "shoal_host_path" in modes else "shoal"
    namespace = args.namespace or f"bench-startup-{os.getpid()}"
    result = {"benchmark": "kubernetes_startup", "machine": c.machine_info(), "reps": args.reps,
              "namespace": namespace, "image": args.image, "cpus": args.cpus,
              "memory": args.memory, "modes": modes,
              "target": f"{target_mode} pods_running median <= {TARGET_RATIO} x job's at every N",
              "timing": "watch event arrival (time.time(), ms) and the journal's ts_us; t0 just "
                        "before `shoal submit` / the Job's POST", "results": {}}
    if shoal is None:
        result["error"] = why
        c.emit(result)
        return 0
    result["shoal"] = shoal
    try:
        api = k.Api(k.kubeconfig_path(args.kubeconfig))
    except (RuntimeError, OSError, ValueError, KeyError, IndexError) as e:
        result["error"] = f"no cluster: {e}"
        c.emit(result)
        return 0
    met = True
    agent_ns = f"{namespace}-agent"
    with c.temp_dir("shoal-bench-k8s-", keep=args.keep) as work, \
            k.namespace(api, namespace, keep=args.keep), \
            contextlib.ExitStack() as agent_stack:
        watch = k.PodWatch(api, namespace).start()
        runner = Runner(api, watch, namespace, shoal, Path(work), args)
        try:
            if "shoal_host_path" in modes:
                # Its own namespace: the DaemonSet's pod must not count as a job's in the watch.
                agent_stack.enter_context(k.namespace(api, agent_ns, keep=args.keep))
                try:
                    runner.install_agent(agent_ns)
                except (RuntimeError, OSError, subprocess.SubprocessError, ValueError) as e:
                    # Its pods could never start; the others run, and target_met is false.
                    result["agent_daemonset_error"] = str(e)
                    c.log(f"shoal_host_path left out: {e}")
                    modes.remove("shoal_host_path")
            for n in ns_list:
                times = {m: [] for m in MODES}
                errors = []
                for rep in range(args.reps + 1):
                    # Rep 0, the warmup, starts with shoal: the Jobs copy its pod.
                    order = modes if rep == 0 else modes[rep % len(modes):] + modes[:rep % len(
                        modes)]
                    got = {}
                    for mode in order:
                        figures, err = runner.run(n, mode)
                        if err:
                            errors.append(f"rep {rep} {mode}: {err}")
                            c.log(f"N={n} rep {rep} {mode}: {err}")
                        elif rep > 0:
                            got[mode] = figures
                    # Only complete rounds count, so that every ratio is of paired runs.
                    if rep > 0 and len(got) == len(modes):
                        for mode, figures in got.items():
                            times[mode].append(figures)
                        c.log(f"N={n} rep {rep}: " + ", ".join(
                            f"{m} {got[m]['pods_running_ms']:.0f}" for m in order) + " ms "
                            f"(shoal tasks {got.get('shoal', {}).get('tasks_running_ms', 0):.0f})")
                entry = summarize(n, times, errors)
                r = (entry.get(f"{target_mode}_over_job") or {}).get("ratio_of_medians")
                met = met and r is not None and r <= TARGET_RATIO
                result["results"][str(n)] = entry
        finally:
            watch.wait_empty(args.timeout)
            watch.close()
        if runner.shoal_spec is not None:
            result["anchor_pod_spec"] = job_pod_spec(runner.shoal_spec, with_init=True)
        else:
            result["anchor_pod_spec_note"] = "no Shoal pod was read; built from fallback_template"
    result["target_met"] = met
    result["machine_at_end"] = c.machine_info()
    c.emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
