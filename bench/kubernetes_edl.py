#!/usr/bin/env python3
"""EDL on the Kubernetes test cluster: a low-priority training job of 3 workers (0.5 cpu each)
on the 2-cpu node and a high-priority job of 2 x 0.45 cpu that comes and goes; once elastic
(instances {min: 2, max: 3}, on_failure: elastic), once fixed-size (instances: 3,
on_failure: restart-group), same job otherwise, one after the other in the same invocation.

Scenarios (--scenarios, both by default):
  preempt  the high-priority job arrives --arrive s after the training job runs as 3 and stays
           --stay s: the scheduler preempts one training pod.
  busy     the high-priority job runs first; the training job is submitted while it stays
           (--stay s from then): an elastic job starts with the 2 workers that fit, a fixed-size
           one waits for all 3.

Every 0.5 s it samples the training job's world size and its rank 0's step (`shoal status
--json`) and the cpus the cluster has allocated to each job's running pods (their requests),
and reports, per scenario and variant: the job's completion time, its final accuracy, the
cpu-seconds allocated to it and to the high-priority job, the training job's cpu-seconds in
intervals where its step advanced (allocated and training) against those where it did not
(allocated and idle: waiting in a rendezvous, restarting), and allocated / available over the
scenario (the node's 2 cpus from the training job's start to its end). With --figure, a PNG of
the time series (matplotlib).

    tests/kubernetes/cluster.sh up   # then export its KUBECONFIG=... line
    python3 bench/kubernetes_edl.py [--shoal PATH] [--figure docs/benchmarks/kubernetes-edl.png]
"""

import argparse
import json
import os
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from _common import add_shoal_arg, emit, find_shoal, log

REPO = Path(__file__).resolve().parents[1]
CLUSTER_SH = REPO / "tests" / "kubernetes" / "cluster.sh"
EXAMPLE = REPO / "examples" / "pytorch-ddp"
IMAGE = "localhost/shoal-python:test"

PRIORITY_CLASSES = """
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: shoal-bench-low}
value: 100
---
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: shoal-bench-high}
value: 1000
"""


def kubectl(*args, stdin=None, check=True):
    r = subprocess.run(["bash", str(CLUSTER_SH), "kubectl", *args], input=stdin,
                       capture_output=True, text=True, timeout=60)
    if check and r.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)}: {r.stderr.strip()}")
    return r.stdout


def cpus_of(quantity):
    q = str(quantity)
    return float(q[:-1]) / 1000 if q.endswith("m") else float(q)


def allocated(namespace):
    """cpus requested by running pods, by job object label, in `namespace`."""
    pods = json.loads(kubectl("get", "pods", "-n", namespace, "-o", "json"))["items"]
    out = {}
    for p in pods:
        if p["status"].get("phase") != "Running" or p["metadata"].get("deletionTimestamp"):
            continue
        job = p["metadata"].get("labels", {}).get("shoal.io/job", "?")
        cpu = sum(cpus_of(c.get("resources", {}).get("requests", {}).get("cpu", 0))
                  for c in p["spec"]["containers"])
        out[job] = out.get(job, 0) + cpu
    return out


def job_file(directory, name, roles, namespace, priority, extra="", volumes=()):
    mounts = [{"name": "code", "host_path": str(EXAMPLE), "mount_path": str(EXAMPLE),
               "read_only": True}]
    for i, path in enumerate(volumes):
        mounts.append({"name": f"v{i}", "host_path": str(path), "mount_path": str(path)})
    path = Path(directory) / f"{name}.yaml"
    path.write_text(f"name: {name}\nheartbeat: {{interval: 1s, misses: 30}}\n{extra}"
                    f"roles:\n{roles}"
                    f"kubernetes:\n  namespace: {namespace}\n  image: {IMAGE}\n"
                    f"  image_pull_policy: Never\n  priority_class: {priority}\n"
                    f"  volumes: {json.dumps(mounts)}\n")
    return path


def run_variant(shoal, scenario, variant, args, work):
    work = Path(work) / scenario
    work.mkdir(exist_ok=True)
    os.chmod(work, 0o755)
    ckpt = Path(work) / f"ckpt-{variant}"
    ckpt.mkdir()
    instances = "{min: 2, max: 3}" if variant == "elastic" else "3"
    policy = "elastic" if variant == "elastic" else "restart-group"
    train = job_file(work, f"edl-{variant}", f"""\
  worker:
    instances: {instances}
    command: [/usr/bin/python3, {EXAMPLE / 'train.py'}, --epochs, "{args.epochs}",
              --checkpoint-every, "10", --step-delay, "{args.step_delay}"]
    working_dir: {EXAMPLE}
    resources: {{cpus: 0.5, memory: 1GiB}}
""", args.namespace, "shoal-bench-low",
                     extra=(f"framework: pytorch\non_failure: {policy}\nmax_restarts: 20\n"
                            f"backoff: {{initial: 1s, max: 2s}}\ncheckpoint: {{dir: {ckpt}}}\n"),
                     volumes=[ckpt])
    sleeper = Path(work) / "sleeper.py"
    sleeper.write_text("import sys, time\ntime.sleep(float(sys.argv[1]))\n")
    urgent = job_file(work, f"urgent-{variant}", f"""\
  worker:
    instances: 2
    command: [/usr/bin/python3, {sleeper}, "{args.stay}"]
    resources: {{cpus: 0.45, memory: 256MiB}}
""", args.namespace, "shoal-bench-high", volumes=[Path(work)])
    jobs_dir = Path(work) / f"jobs-{variant}"
    env = dict(os.environ)
    urgent_cmd = [shoal, "--jobs-dir", str(jobs_dir) + "-urgent", "run", "--backend",
                  "kubernetes", str(urgent)]
    urgent_proc = None
    if scenario == "busy":
        urgent_proc = subprocess.Popen(urgent_cmd, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if sum(v for k, v in allocated(args.namespace).items() if "urgent-" in k) > 0.8:
                    break
            except (RuntimeError, subprocess.TimeoutExpired):
                pass
            time.sleep(0.5)
    client = subprocess.Popen([shoal, "--jobs-dir", str(jobs_dir), "run", "--backend",
                               "kubernetes", str(train)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env)
    samples = []
    start = time.monotonic()
    arrived = 0.0 if scenario == "busy" else None
    stop = threading.Event()
    job_id = {}

    def sample():
        while not stop.is_set():
            t = time.monotonic() - start
            world = None
            step = None
            if not job_id and jobs_dir.exists():
                found = [d.name for d in jobs_dir.iterdir() if d.is_dir()]
                if found:
                    job_id["id"] = found[0]
            if job_id:
                r = subprocess.run([shoal, "--jobs-dir", str(jobs_dir), "status", job_id["id"],
                                    "--json"], capture_output=True, text=True, timeout=30)
                if r.returncode == 0:
                    s = json.loads(r.stdout)
                    world = sum(1 for x in s["tasks"] if x["in_world"] and x["state"] == "running")
                    step = max((x.get("step", 0) for x in s["tasks"]), default=0)
            try:
                alloc = allocated(args.namespace)
            except (RuntimeError, subprocess.TimeoutExpired):
                alloc = {}
            train_cpus = sum(v for k, v in alloc.items() if "edl-" in k)
            urgent_cpus = sum(v for k, v in alloc.items() if "urgent-" in k)
            samples.append({"t": round(t, 2), "world": world, "step": step,
                            "train_cpus": train_cpus, "urgent_cpus": urgent_cpus})
            stop.wait(0.5)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    if scenario == "preempt":
        # The high-priority job comes once the training job runs as 3, `arrive` seconds later.
        while time.monotonic() - start < 300:
            if samples and samples[-1]["world"] == 3:
                break
            time.sleep(0.5)
        time.sleep(args.arrive)
        arrived = time.monotonic() - start
        log(f"{scenario}/{variant}: the high-priority job arrives at {arrived:.1f}s")
        urgent_proc = subprocess.Popen(urgent_cmd, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True)
    urgent_proc.communicate(timeout=600)
    left = time.monotonic() - start
    log(f"{scenario}/{variant}: it left at {left:.1f}s (rc {urgent_proc.returncode})")
    out, err = client.communicate(timeout=900)
    end = time.monotonic() - start
    stop.set()
    sampler.join(5)
    accuracy = [float(line.split("=")[1]) for line in out.splitlines() if "final_accuracy=" in line]
    # Riemann sums over the samples (0.5 s apart). An interval is training when rank 0's step
    # advanced in it (or the next one: steps take up to 0.5 s here).
    cpu_s = {"train": 0.0, "urgent": 0.0, "training": 0.0}
    steps = [s["step"] for s in samples]
    for i, (a, b) in enumerate(zip(samples, samples[1:])):
        dt = b["t"] - a["t"]
        cpu_s["train"] += a["train_cpus"] * dt
        cpu_s["urgent"] += a["urgent_cpus"] * dt
        later = [x for x in steps[i + 1:i + 3] if x is not None]
        if a["step"] is not None and later and max(later) > a["step"]:
            cpu_s["training"] += a["train_cpus"] * dt
    available = args.node_cpus * end
    return {
        "scenario": scenario,
        "variant": variant,
        "rc": client.returncode,
        "urgent_rc": urgent_proc.returncode,
        "completion_s": round(end, 1),
        "urgent_arrived_s": round(arrived, 1),
        "urgent_left_s": round(left, 1),
        "final_accuracy": accuracy[-1] if accuracy else None,
        "train_cpu_s": round(cpu_s["train"], 1),
        "urgent_cpu_s": round(cpu_s["urgent"], 1),
        "train_training_cpu_s": round(cpu_s["training"], 1),
        "train_idle_cpu_s": round(cpu_s["train"] - cpu_s["training"], 1),
        "allocated_over_available": round((cpu_s["train"] + cpu_s["urgent"]) / available, 3),
        "min_world": min((s["world"] for s in samples if s["world"]), default=None),
        "samples": samples,
        "error": None if client.returncode == 0 else err[-2000:],
    }


def figure(results, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(len(results), 1, figsize=(8, 3.2 * len(results)), sharex=True)
    for ax, r in zip(axes, results):
        t = [s["t"] for s in r["samples"]]
        ax.step(t, [s["train_cpus"] for s in r["samples"]], where="post",
                label="training job's cpus")
        ax.step(t, [s["urgent_cpus"] for s in r["samples"]], where="post",
                label="high-priority job's cpus")
        ax.step(t, [s["world"] or 0 for s in r["samples"]], where="post", linestyle=":",
                label="training world size")
        ax.axvspan(r["urgent_arrived_s"], r["urgent_left_s"], alpha=0.1)
        ax.set_ylabel("cpus / workers")
        ax.set_ylim(0, 3.5)
        ax.set_title(f"{r['scenario']}, {r['variant']}: done in {r['completion_s']} s, "
                     f"allocated/available {r['allocated_over_available']}, training/allocated "
                     f"{r['train_training_cpu_s']}/{r['train_cpu_s']} cpu-s", fontsize=9)
        ax.legend(loc="lower right", fontsize=7)
        steps = ax.twinx()
        steps.plot(t, [s["step"] or 0 for s in r["samples"]], color="grey", linewidth=0.8)
        steps.set_ylabel("rank 0's step", fontsize=8)
    axes[-1].set_xlabel("seconds since the training job was submitted")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_shoal_arg(p)
    p.add_argument("--namespace", default="bench-edl")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--step-delay", type=float, default=0.4)
    p.add_argument("--arrive", type=float, default=10, help="seconds after the job runs as 3")
    p.add_argument("--stay", type=float, default=60, help="how long the high job runs")
    p.add_argument("--scenarios", default="preempt,busy", help="preempt, busy or both")
    p.add_argument("--node-cpus", type=float, default=2)
    p.add_argument("--figure", default=None)
    args = p.parse_args()
    shoal, why = find_shoal(args.shoal)
    if shoal is None:
        emit({"benchmark": "kubernetes_edl", "error": why})
        return
    kubectl("apply", "-f", "-", stdin=PRIORITY_CLASSES)
    kubectl("create", "namespace", args.namespace, check=False)
    results = []
    with tempfile.TemporaryDirectory(prefix="shoal-edl-") as work:
        os.chmod(work, 0o755)
        for scenario in args.scenarios.split(","):
            for variant in ("elastic", "fixed"):
                try:
                    results.append(run_variant(shoal, scenario, variant, args, work))
                except Exception as e:  # noqa: BLE001 - measured pieces stay measured
                    results.append({"scenario": scenario, "variant": variant, "error": repr(e),
                                    "samples": []})
    if args.figure and all(r["samples"] for r in results):
        figure(results, args.figure)
    emit({"benchmark": "kubernetes_edl", "node_cpus": args.node_cpus,
          "results": [{k: v for k, v in r.items() if k != "samples"} for r in results],
          "samples": {f'{r["scenario"]}/{r["variant"]}': r["samples"] for r in results}})


if __name__ == "__main__":
    main()
