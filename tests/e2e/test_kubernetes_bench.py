"""The Kubernetes benchmark drivers as tools, on the project's test cluster (ctest's
kubernetes_cluster fixture; by hand: export the KUBECONFIG=... line of tests/kubernetes/cluster.sh
up): bench/kubernetes_startup.py and bench/kubernetes_failure.py refuse bad options before
touching the cluster, a one-round run of each reports every mode with the figures its docstring
names, and each deletes the namespace it worked in. No timing is asserted."""

import json
import os
import shutil
import subprocess
import sys

import pytest

import shoal_e2e as e2e

BENCH = e2e.REPO_ROOT / "bench"
# shoal_host_path's DaemonSet runs the agent image's own shoal: this build's (ctest's fixture
# imports it as localhost/shoal-agent:latest; by hand, a tag of your own).
AGENT_IMAGE = os.environ.get("SHOAL_KUBERNETES_AGENT_IMAGE", "localhost/shoal-agent:latest")


def kubectl(*args):
    return e2e.kubectl(*args, check=False, timeout=60)


@pytest.fixture(scope="module", autouse=True)
def cluster():
    e2e.require_kubernetes_cluster()


def run_bench(script, *args, timeout=280):
    return subprocess.run([sys.executable, str(BENCH / script), "--shoal", e2e.SHOAL_BIN,
                           *args], capture_output=True, text=True, timeout=timeout)


def assert_gone(namespace):
    r = kubectl("get", "namespace", namespace, "-o", "name")
    assert r.returncode != 0 and "NotFound" in r.stderr, f"namespace {namespace} is left"


def summary(entry):
    assert set(entry) >= {"median_ms", "p90_ms", "min_ms", "max_ms", "n"}, entry
    assert entry["n"] == 1 and entry["median_ms"] > 0, entry
    return entry["median_ms"]


def test_bad_options_exit_2_and_touch_nothing():
    for script, args in (("kubernetes_startup.py", ["--modes", "shoal,jbo"]),
                         ("kubernetes_startup.py", ["--n", "0"]),
                         ("kubernetes_failure.py", ["--tasks", "1"]),
                         ("kubernetes_failure.py", ["--modes", "shoal"])):
        r = run_bench(script, *args, timeout=60)
        assert r.returncode == 2, (script, args, r.stderr)
        assert r.stdout == "" and script in r.stderr, (script, args, r.stderr)


def test_a_one_round_startup_run_reports_every_mode_and_leaves_nothing():
    namespace = f"bench-test-startup-{os.getpid()}"
    host_dir = f"/tmp/shoal-bench-test-{os.getpid()}"  # on the node, which is this machine
    try:
        r = run_bench("kubernetes_startup.py", "--n", "2", "--reps", "1", "--namespace",
                      namespace, "--agent-image", AGENT_IMAGE, "--agent-host-path",
                      f"{host_dir}/agent")
    finally:
        shutil.rmtree(host_dir, ignore_errors=True)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(r.stdout)
    assert "error" not in result and "agent_daemonset_error" not in result, result
    entry = result["results"]["2"]
    assert "errors" not in entry, entry["errors"]
    for mode in ("shoal", "shoal_host_path", "job", "job_init", "job_shoal_pod", "job_again"):
        created = summary(entry[mode]["pods_created_ms"])
        assert summary(entry[mode]["pods_running_ms"]) >= created, (mode, entry[mode])
    # Not ordered against pods_running: the kubelet may report a pod Running after its agent
    # has already started the task.
    summary(entry["shoal"]["tasks_running_ms"])
    for key in ("shoal_over_job", "shoal_host_path_over_job", "job_init_over_job",
                "job_shoal_pod_over_job", "aa_job_again_over_job"):
        assert entry[key]["ratio_of_medians"] > 0, (key, entry[key])
        assert entry[key]["ci95"] is None, "one round is too few for an interval"
    # The anchors' pods are Shoal's own: the same image and resources, its init container.
    spec = result["anchor_pod_spec"]
    assert spec["containers"][0]["image"] == "localhost/shoal-python:test"
    assert spec["containers"][0]["resources"]["limits"]["cpu"] == "25m"
    assert spec["initContainers"][0]["image"].startswith("localhost/shoal-agent")
    assert isinstance(result["target_met"], bool)
    assert result["target"].startswith("shoal_host_path "), result["target"]
    assert_gone(namespace)
    assert_gone(f"{namespace}-agent")


def test_a_one_round_failure_run_reports_every_mode_and_leaves_nothing():
    namespace = f"bench-test-failure-{os.getpid()}"
    r = run_bench("kubernetes_failure.py", "--tasks", "2", "--reps", "1", "--settle", "0.2",
                  "--namespace", namespace)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(r.stdout)
    assert "error" not in result and "errors" not in result, result
    for mode in ("shoal_group", "shoal_task", "job"):
        figures = result["results"][mode]
        failure = summary(figures["failure_seen_ms"])
        assert summary(figures["running_again_ms"]) >= failure, (mode, figures)
        summary(figures["deletion_seen_ms"])
        if mode != "job":
            summary(figures["replacement_pod_running_ms"])
    assert set(result["ratios_of_medians"]) == {
        "shoal_group_over_job_failure_seen", "shoal_group_over_job_running_again",
        "shoal_task_over_job_failure_seen", "shoal_task_over_job_running_again"}
    assert_gone(namespace)
