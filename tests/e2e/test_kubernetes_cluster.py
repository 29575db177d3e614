"""The project's one-node Kubernetes test cluster itself (tests/kubernetes/cluster.sh: etcd,
kube-apiserver, kube-scheduler, kube-controller-manager, containerd and a kubelet on this
machine) and the images the Kubernetes backend relies on: localhost/shoal-python:test, and
localhost/shoal-agent:latest, whose /opt/shoal must run inside images that hold nothing of
Shoal. ctest's kubernetes_cluster fixture brings the cluster up (with SHOAL_BIN, so the agent
image is this build's) before these tests and down after them; by hand:
SHOAL_BIN=build/src/cli/shoal tests/kubernetes/cluster.sh up, then export the KUBECONFIG it
prints."""

import json
import subprocess
import time
import uuid

import pytest

import shoal_e2e as e2e

KUBECTL_TIMEOUT_S = 60
POD_DEADLINE_S = 180


kubectl = e2e.kubectl


@pytest.fixture(scope="module", autouse=True)
def cluster():
    e2e.require_kubernetes_cluster()


def run_pod(name, spec):
    """Creates pod `name` from `spec` (its .spec), waits for it to end, returns (phase, logs).

    The pod is deleted afterwards whatever happened.
    """
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "labels": {"app": "shoal-cluster-test"}}, "spec": spec}
    kubectl("apply", "-f", "-", stdin=json.dumps(pod))
    try:
        deadline = time.monotonic() + POD_DEADLINE_S
        phase = ""
        while time.monotonic() < deadline:
            phase = kubectl("get", "pod", name, "-o", "jsonpath={.status.phase}").stdout
            if phase in ("Succeeded", "Failed"):
                break
            time.sleep(0.5)
        logs = kubectl("logs", name, "--all-containers", "--prefix", check=False).stdout
        if phase != "Succeeded":
            described = kubectl("describe", "pod", name, check=False).stdout
            return phase, f"{logs}\n--- kubectl describe pod {name}\n{described}"
        return phase, logs
    finally:
        kubectl("delete", "pod", name, "--grace-period=0", "--force", "--wait=false",
                check=False)


def unique(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def container(name, image, command, mounts=()):
    return {"name": name, "image": image, "imagePullPolicy": "Never", "command": command,
            "volumeMounts": [{"name": v, "mountPath": p} for v, p in mounts]}


def with_agent_bundle(image, command):
    """A pod spec: the agent image's init container copies /opt/shoal into an emptyDir that
    the `image` container sees at /opt/shoal, as the Kubernetes backend does."""
    return {
        "restartPolicy": "Never",
        "volumes": [{"name": "shoal", "emptyDir": {}}],
        "initContainers": [container("shoal-agent", "localhost/shoal-agent:latest",
                                     ["/bin/cp", "-a", "/opt/shoal/.", "/mnt/shoal/"],
                                     [("shoal", "/mnt/shoal")])],
        "containers": [container("main", image, command, [("shoal", "/opt/shoal")])],
    }


def test_node_localhost_is_ready():
    # kwok's fake nodes (labelled type=kwok, tests/kubernetes/kwok.sh) may be up beside it:
    # ctest orders the kwok fixture's teardown as it likes.
    nodes = [n for n in json.loads(kubectl("get", "nodes", "-o", "json").stdout)["items"]
             if n["metadata"].get("labels", {}).get("type") != "kwok"]
    assert [n["metadata"]["name"] for n in nodes] == ["localhost"]
    conditions = {c["type"]: c["status"] for c in nodes[0]["status"]["conditions"]}
    assert conditions["Ready"] == "True", conditions
    assert nodes[0]["status"]["nodeInfo"]["kubeletVersion"] == "v1.37.2"


def test_python_image_imports_torch_sklearn_and_numpy():
    phase, logs = run_pod(unique("python-image"), {
        "restartPolicy": "Never",
        "containers": [container("main", "localhost/shoal-python:test", [
            "python3", "-c",
            "import torch, sklearn, numpy; print('imported', torch.__version__, "
            "sklearn.__version__, numpy.__version__, int(torch.ones(3).sum()))"])],
    })
    assert phase == "Succeeded", logs
    assert "imported" in logs and logs.rstrip().endswith(" 3"), logs


def test_agent_bundle_runs_shoal_in_busybox_which_has_no_libraries():
    phase, logs = run_pod(unique("agent-busybox"), with_agent_bundle(
        "localhost/busybox:test", ["/opt/shoal/bin/shoal", "--version"]))
    assert phase == "Succeeded", logs
    version = subprocess.run([e2e.SHOAL_BIN, "--version"], capture_output=True, text=True,
                             timeout=30).stdout.strip()
    assert version and version in logs, f"expected '{version}' in:\n{logs}"


def test_agent_bundle_sdk_imports_in_the_python_image():
    phase, logs = run_pod(unique("agent-sdk"), with_agent_bundle(
        "localhost/shoal-python:test",
        ["python3", "-c", "import sys; sys.path.insert(0, '/opt/shoal/python'); import shoal; "
                          "print('sdk from', shoal.__file__)"]))
    assert phase == "Succeeded", logs
    assert "sdk from /opt/shoal/python/shoal/__init__.py" in logs, logs


IN_CLUSTER_GET = """
import os, ssl, urllib.request
sa = "/var/run/secrets/kubernetes.io/serviceaccount"
url = "https://%s:%s/version" % (os.environ["KUBERNETES_SERVICE_HOST"],
                                 os.environ["KUBERNETES_SERVICE_PORT"])
request = urllib.request.Request(url, headers={
    "Authorization": "Bearer " + open(sa + "/token").read().strip()})
context = ssl.create_default_context(cafile=sa + "/ca.crt")
print(url, urllib.request.urlopen(request, context=context, timeout=20).read().decode())
"""


def test_pods_reach_the_apiserver_through_the_kubernetes_service():
    # What an in-cluster client (a master running in a pod) does: the kubernetes Service's
    # address from the environment, the service account's token and CA.
    phase, logs = run_pod(unique("in-cluster"), {
        "restartPolicy": "Never",
        "containers": [container("main", "localhost/shoal-python:test",
                                 ["python3", "-c", IN_CLUSTER_GET])],
    })
    assert phase == "Succeeded", logs
    assert "https://10.96.0.1:443/version" in logs and '"gitVersion": "v1.37.2"' in logs, logs
