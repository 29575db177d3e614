#!/usr/bin/env python3
"""A pod deleted on Kubernetes: to the failure seen, and to the group running again, with Shoal
(restart-group, and restart-task) next to the Job controller's own replacement of the pod of an
indexed batch/v1 Job, on the same cluster, in the same run.

Needs a cluster as bench/kubernetes_startup.py does; runs in a namespace of its own (--namespace,
default bench-failure-<pid>), created and deleted by the driver.

Each repetition runs every mode, in a rotating order, each from a fresh job of N tasks
(--tasks, 4) sleeping in --image (cpus --cpus, memory --memory):
  shoal_group  `shoal submit` of a job with on_failure: restart-group, backoff initial 0s
  shoal_task   the same with on_failure: restart-task
  job          an Indexed Job (completions = parallelism = N, backoffLimit 10) with the same
               image, pull policy, resources and service-account settings as Shoal's pods
Once every pod runs (and, for Shoal, every task: its journal), the driver waits --settle
seconds, takes t_del, and deletes the pod of index 1 (place task.1) with a plain DELETE, the
pod's own grace period, as `kubectl delete pod --wait=false` does. Figures, ms after t_del:
  deletion_seen_ms   the watch sees the pod's deletionTimestamp (the same for every mode: what
                     both Shoal's backend and the Job controller react to)
  failure_seen_ms    Shoal: the task's `failed` record in the job's journal (events.jsonl, ts_us),
                     as `shoal status` shows it; Job: its controller's replacement pod first seen
  running_again_ms   Shoal: every task `running` again per the journal (restart-group: a new
                     generation of all N; restart-task: task 1); Job: the replacement pod Running
  replacement_pod_running_ms  (Shoal) the new pod of place task.1 seen Running
  victim_gone_ms     the deleted pod's DELETED event
Pods are stamped by a watch of the namespace (bench/_kube.py: the event's arrival, ms), the
journal by Shoal's master (microseconds); both on time.time(). Rep 0 is an untimed warmup.

Prints one JSON object: per mode each figure's median, p90, min and max; the ratio of medians
shoal_group / job and shoal_task / job for failure_seen and running_again.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as c  # noqa: E402
import _kube as k  # noqa: E402

MODES = ["shoal_group", "shoal_task", "job"]
SLEEP = ["/usr/bin/python3", "-c", "import time; time.sleep(600)"]
VICTIM = 1


def shoal_job_file(work, mode, args):
    policy = "restart-group" if mode == "shoal_group" else "restart-task"
    path = work / f"{mode}.yaml"
    path.write_text(
        f"name: kfail-{policy}\n"
        "heartbeat: {interval: 1s, misses: 10}\n"
        f"on_failure: {policy}\n"
        "max_restarts: 5\n"
        "backoff: {initial: 0s, max: 1s}\n"
        "roles:\n"
        "  task:\n"
        f"    instances: {args.tasks}\n"
        f"    command: {json.dumps(SLEEP)}\n"
        f"    resources: {{cpus: {args.cpus}, memory: {args.memory}}}\n"
        "kubernetes:\n"
        f"  image: {args.image}\n"
        f"  image_pull_policy: {args.pull_policy}\n")
    return path


def all_running_after(records, tasks, t_from_us):
    """The ts_us at which, after a task failed at or after t_from_us, every task is running
    again (replaying the journal's task_state records), or None."""
    state = {t: "running" for t in tasks}
    failed = False
    for rec in records:
        if rec.get("type") != "task_state" or c.record_us(rec) < t_from_us:
            continue
        state[rec["task"]] = rec["to"]
        failed = failed or rec["to"] == "failed"
        if failed and all(s == "running" for s in state.values()):
            return c.record_us(rec)
    return None


class Runner:
    def __init__(self, api, watch, ns, shoal, work, args):
        self.api, self.watch, self.ns, self.shoal, self.work, self.args = (
            api, watch, ns, shoal, work, args)
        self.env = {**os.environ, "KUBECONFIG": api.kubeconfig}
        self.runs = 0
        self.shoal_spec = None

    def _delete_victim(self, victim):
        t_del = time.time()
        status, doc = self.api.request("DELETE",
                                       f"/api/v1/namespaces/{self.ns}/pods/{victim.name}")
        if status >= 300:
            raise RuntimeError(f"DELETE pod {victim.name}: HTTP {status}")
        return t_del

    def _victim_figures(self, victim, t_del):
        got = self.watch.wait(lambda: victim.gone, self.args.timeout)
        return {"deletion_seen_ms": (victim.deleting - t_del) * 1e3 if victim.deleting else None,
                "victim_gone_ms": (got - t_del) * 1e3 if got else None}

    def run_shoal(self, mode):
        n = self.args.tasks
        jobs = self.work / "jobs"
        p = subprocess.run([self.shoal, "--jobs-dir", str(jobs), "submit", "--backend",
                            "kubernetes", "--namespace", self.ns,
                            str(shoal_job_file(self.work, mode, self.args))],
                           capture_output=True, text=True, timeout=self.args.timeout, env=self.env)
        if p.returncode != 0:
            return None, f"shoal submit: exit {p.returncode}: {p.stderr.strip()[-300:]}"
        job_id = p.stdout.split()[-1]
        mine = lambda r: r.annotations.get("shoal.io/job-id") == job_id
        journal = c.Journal(jobs / job_id / "events.jsonl")
        tasks = [f"task:{i}" for i in range(n)]
        try:
            pods = self.watch.wait_running(mine, n, self.args.timeout)
            _, rec = journal.wait_for(
                lambda r: (r.get("type") == "job_finished"
                           or r.get("type") == "job_state" and r.get("to") == "running"),
                self.args.timeout, poll_s=0.01)
            if pods is None or rec is None or rec.get("type") == "job_finished":
                why = (rec or {}).get("reason") or self.watch.error or "timed out"
                return None, f"{mode}: the job did not start: {why}"
            if self.shoal_spec is None:
                _, doc = self.api.request("GET",
                                          f"/api/v1/namespaces/{self.ns}/pods/{pods[0].name}")
                self.shoal_spec = (doc or {}).get("spec")
            time.sleep(self.args.settle)
            victim = next(r for r in pods if r.annotations.get("shoal.io/place") == f"task.{VICTIM}")
            t_del = self._delete_victim(victim)
            t_del_us = t_del * 1e6
            _, failed = journal.wait_for(
                lambda r: (r.get("type") == "task_state" and r.get("task") == f"task:{VICTIM}"
                           and r.get("to") == "failed" and c.record_us(r) >= t_del_us),
                self.args.timeout, poll_s=0.005)
            again_us = None
            deadline = time.monotonic() + self.args.timeout
            while again_us is None and time.monotonic() < deadline:
                journal.poll()
                again_us = all_running_after(journal.records, tasks, t_del_us)
                time.sleep(0.01)
            new_pod = self.watch.wait(lambda: next(
                (r for r in self.watch.pods.values() if mine(r) and r.running and r.uid !=
                 victim.uid and r.annotations.get("shoal.io/place") == f"task.{VICTIM}"
                 and r.added > t_del), None), self.args.timeout)
            figures = self._victim_figures(victim, t_del)
            figures["failure_seen_ms"] = ((c.record_us(failed) - t_del_us) / 1e3
                                          if failed else None)
            figures["running_again_ms"] = (again_us - t_del_us) / 1e3 if again_us else None
            figures["replacement_pod_running_ms"] = ((new_pod.running - t_del) * 1e3
                                                     if new_pod else None)
            if figures["failure_seen_ms"] is None or figures["running_again_ms"] is None:
                return None, f"{mode}: no failure or no recovery in the journal: {figures}"
            return figures, None
        finally:
            subprocess.run([self.shoal, "--jobs-dir", str(jobs), "kill", job_id],
                           capture_output=True, text=True, timeout=self.args.timeout,
                           env=self.env)

    def job_pod_spec(self):
        if self.shoal_spec is None:
            mem = int(self.args.memory.rstrip("MiB")) + 128
            cpu = f"{round(float(self.args.cpus) * 1000)}m"
            resources = {"requests": {"cpu": cpu, "memory": f"{mem}Mi"},
                         "limits": {"cpu": cpu, "memory": f"{mem}Mi"}}
            base = {"enableServiceLinks": False, "automountServiceAccountToken": False}
        else:
            resources = self.shoal_spec["containers"][0].get("resources", {})
            base = {key: self.shoal_spec[key] for key in ("enableServiceLinks",
                    "automountServiceAccountToken", "hostNetwork", "dnsPolicy")
                    if key in self.shoal_spec}
        return {**base, "restartPolicy": "Never",
                "containers": [{"name": "task", "image": self.args.image,
                                "imagePullPolicy": self.args.pull_policy, "command": SLEEP,
                                "resources": resources}]}

    def run_job(self):
        n = self.args.tasks
        self.runs += 1
        name = f"kfail-job-{self.runs}"
        body = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
                "spec": {"completionMode": "Indexed", "completions": n, "parallelism": n,
                         "backoffLimit": 10, "template": {"spec": self.job_pod_spec()}}}
        path = f"/apis/batch/v1/namespaces/{self.ns}/jobs"
        mine = lambda r: r.labels.get("batch.kubernetes.io/job-name") == name
        index = lambda r: r.annotations.get("batch.kubernetes.io/job-completion-index")
        try:
            self.api.ok("POST", path, body)
            pods = self.watch.wait_running(mine, n, self.args.timeout)
            if pods is None:
                return None, f"job: not every pod ran; {self.watch.error or ''}"
            time.sleep(self.args.settle)
            victim = next(r for r in pods if index(r) == str(VICTIM))
            t_del = self._delete_victim(victim)
            new_pod = self.watch.wait(lambda: next(
                (r for r in self.watch.pods.values() if mine(r) and index(r) == str(VICTIM)
                 and r.uid != victim.uid), None), self.args.timeout)
            running = self.watch.wait(lambda: new_pod.running if new_pod else None,
                                      self.args.timeout)
            figures = self._victim_figures(victim, t_del)
            figures["failure_seen_ms"] = (new_pod.added - t_del) * 1e3 if new_pod else None
            figures["running_again_ms"] = (running - t_del) * 1e3 if running else None
            if figures["running_again_ms"] is None:
                return None, f"job: no replacement pod ran: {figures}"
            return figures, None
        finally:
            self.api.request("DELETE", f"{path}/{name}", {"propagationPolicy": "Background"})
            self.api.request("DELETE", f"/api/v1/namespaces/{self.ns}/pods?labelSelector="
                             f"batch.kubernetes.io%2Fjob-name%3D{name}",
                             {"gracePeriodSeconds": 0})

    def run(self, mode):
        if not self.watch.wait_empty(self.args.timeout):
            return None, "pods of an earlier run are still there"
        try:
            return self.run_job() if mode == "job" else self.run_shoal(mode)
        except (RuntimeError, OSError, subprocess.SubprocessError, ValueError,
                StopIteration) as e:
            return None, f"{mode}: {type(e).__name__} {e}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    c.add_shoal_arg(ap)
    ap.add_argument("--kubeconfig", help="default: $KUBECONFIG, else the test cluster's")
    ap.add_argument("--namespace", help="created and deleted here (default bench-failure-PID)")
    ap.add_argument("--tasks", type=int, default=4, help="tasks (pods) per job (4)")
    ap.add_argument("--reps", type=int, default=5, help="timed pod deletions per mode (5)")
    ap.add_argument("--modes", default=",".join(MODES), help=f"subset of {','.join(MODES)}")
    ap.add_argument("--settle", type=float, default=1.0, help="s between running and delete (1)")
    ap.add_argument("--image", default="localhost/shoal-python:test")
    ap.add_argument("--pull-policy", default="Never")
    ap.add_argument("--cpus", default="0.025")
    ap.add_argument("--memory", default="32MiB", help="per task, in MiB (32MiB)")
    ap.add_argument("--timeout", type=float, default=120, help="per-step limit, s (120)")
    ap.add_argument("--keep", action="store_true", help="keep the namespace and jobs dir")
    args = ap.parse_args()
    modes = args.modes.split(",")
    bad = [m for m in modes if m not in MODES]
    if bad or args.tasks < 2 or args.reps < 1 or not args.memory.endswith("MiB"):
        print("kubernetes_failure.py: " + (f"unknown mode {bad[0]!r}" if bad else
              "--tasks must be >= 2, --reps >= 1, --memory in MiB"), file=sys.stderr)
        return 2
    shoal, why = c.find_shoal(args.shoal)
    namespace = args.namespace or f"bench-failure-{os.getpid()}"
    result = {"benchmark": "kubernetes_failure", "machine": c.machine_info(), "reps": args.reps,
              "tasks": args.tasks, "namespace": namespace, "modes": modes,
              "timing": "ms after the DELETE's t0: watch event arrival (time.time()) and the "
                        "journal's ts_us", "results": {}}
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
    times = {m: [] for m in modes}
    errors = []
    with c.temp_dir("shoal-bench-k8s-", keep=args.keep) as work, \
            k.namespace(api, namespace, keep=args.keep):
        watch = k.PodWatch(api, namespace).start()
        runner = Runner(api, watch, namespace, shoal, Path(work), args)
        try:
            for rep in range(args.reps + 1):
                shift = rep % len(modes)
                order = modes[shift:] + modes[:shift]
                for mode in order:
                    figures, err = runner.run(mode)
                    if err:
                        errors.append(f"rep {rep} {mode}: {err}")
                        c.log(f"rep {rep} {mode}: {err}")
                        continue
                    c.log(f"rep {rep} {mode}: " + ", ".join(
                        f"{key} {v:.0f}" for key, v in figures.items() if v is not None))
                    if rep > 0:
                        times[mode].append(figures)
        finally:
            watch.wait_empty(args.timeout)
            watch.close()
    for mode, runs in times.items():
        if runs:
            result["results"][mode] = {key: c.summary_ms([r[key] for r in runs
                                                          if r.get(key) is not None])
                                       for key in runs[0]}
    ratios = {}
    for mode in ("shoal_group", "shoal_task"):
        for key in ("failure_seen_ms", "running_again_ms"):
            a = [r[key] for r in times.get(mode, [])]
            b = [r[key] for r in times.get("job", [])]
            if a and b:
                ratios[f"{mode}_over_job_{key[:-3]}"] = c.ratio(c.median(a), c.median(b))
    result["ratios_of_medians"] = ratios
    if errors:
        result["errors"] = errors[:8]
    result["machine_at_end"] = c.machine_info()
    c.emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
