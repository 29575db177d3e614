"""Helpers of the end-to-end tests on the project's Kubernetes test cluster
(test_kubernetes*.py): job files for the cluster, the job's pods, and the checks that a test
leaves nothing behind. Imported, fixtures included, by those files."""

import json
import subprocess

import pytest

import shoal_e2e as e2e

IMAGE = "localhost/shoal-python:test"
TRAIN = str(e2e.EXAMPLE_DIR / "train.py")


kubectl = e2e.kubectl

CLUSTER_SH = e2e.REPO_ROOT / "tests" / "kubernetes" / "cluster.sh"


def import_image(name, archive, timeout=300):
    """`cluster.sh import`: the one way images reach the cluster's containerd, with its checks
    (among them the free disk: below the kubelet's eviction threshold the node schedules no
    pod, and a test would wait for pods that never start)."""
    r = subprocess.run(["bash", str(CLUSTER_SH), "import", name, str(archive)],
                       capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"cluster.sh import {name} {archive}: {r.stderr}"


@pytest.fixture(scope="module", autouse=True)
def cluster():
    e2e.require_kubernetes_cluster()


def shoal_objects(namespace="default"):
    """Every object Shoal left in `namespace`: pods, secrets and configmaps it labelled."""
    r = kubectl("get", "pods,secrets,configmaps", "-n", namespace, "-l",
                "app.kubernetes.io/managed-by=shoal", "-o", "name")
    return [line for line in r.stdout.splitlines() if line.strip()]


@pytest.fixture(autouse=True)
def nothing_left_behind():
    yield
    left = shoal_objects()
    if left:
        kubectl("delete", "pods,secrets,configmaps", "-l", "app.kubernetes.io/managed-by=shoal",
                "--grace-period=0", "--force", check=False)
    assert not left, f"a test left objects in the namespace: {left}"


def k8s_job(write_job, name, roles, extra="", volumes=()):
    """A job file for the test cluster: the roles given, the example's folder mounted where it
    is on this machine (the tasks' working_dir), and `volumes` more host paths."""
    mounts = [{"name": "code", "host_path": str(e2e.EXAMPLE_DIR),
               "mount_path": str(e2e.EXAMPLE_DIR), "read_only": True}]
    for i, path in enumerate(volumes):
        mounts.append({"name": f"v{i}", "host_path": str(path), "mount_path": str(path)})
    # 30 missed heartbeats before an agent counts as lost: starting a pod (an image's layers,
    # the agent's bundle copied in) loads this 2-core machine for seconds at a time.
    text = (f"name: {name}\nheartbeat: {{interval: 1s, misses: 30}}\n{extra}"
            f"roles:\n{roles}"
            f"kubernetes:\n"
            f"  image: {IMAGE}\n"
            f"  image_pull_policy: Never\n"
            f"  volumes: {json.dumps(mounts)}\n")
    return write_job(text, name=f"{name}.yaml")


def pods_of(job_id):
    r = kubectl("get", "pods", "-l", "app.kubernetes.io/managed-by=shoal", "-o", "json")
    return [p for p in json.loads(r.stdout)["items"]
            if p["metadata"].get("annotations", {}).get("shoal.io/job-id") == job_id]


TICKER = ("import os, sys, time, shoal\n"
          "for i in range(int(sys.argv[1])):\n"
          "    print(f'tick {i}', flush=True); time.sleep(0.25)\n")


def wait_for_pods_running(job_id, count, timeout=120):
    def ready():
        pods = [p for p in pods_of(job_id) if p["status"].get("phase") == "Running"
                and not p["metadata"].get("deletionTimestamp")]
        return pods if len(pods) >= count else None
    return e2e.wait_until(ready, timeout, f"{count} running pods of {job_id}")
