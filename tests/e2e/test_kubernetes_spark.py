"""`shoal run --backend spark --spark-master k8s://...` on the project's one-node Kubernetes test
cluster (tests/kubernetes/cluster.sh): Spark's own Kubernetes scheduler (PySpark 4.3's
spark-kubernetes, in client mode: the driver runs here, beside Shoal's master) starts the
executor pods through the real apiserver, and each pod gets Shoal's agent bundle from the
agent image through the init container of the pod template the backend writes.

The executors run localhost/shoal-spark:test, made here from this machine's files
(tests/kubernetes/images.py spark: Debian's Java 17, python3 with torch and scikit-learn, the
`spark` venv at its own path, so the driver's PYSPARK_PYTHON is the executors' too) and
imported into the cluster's containerd by this file (once per content: the archive is cached
under $SHOAL_KUBERNETES_CACHE/images). ctest's kubernetes_cluster fixture brings the cluster up
before these tests and down after them; by hand: SHOAL_BIN=build/src/cli/shoal
tests/kubernetes/cluster.sh up, then export the KUBECONFIG=... line it prints."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import shoal_e2e as e2e
from kubernetes_jobs import cluster, import_image, kubectl  # noqa: F401 (fixture)

IMAGE = "localhost/shoal-spark:test"
IMAGE_PACKAGES = ["python3", "python3-torch", "python3-sklearn", "python3-numpy",
                  "openjdk-17-jre-headless"]
SPARK_VENV = "/var/cache/shoal/venvs/spark"
IMAGES_PY = e2e.REPO_ROOT / "tests" / "kubernetes" / "images.py"
IMAGE_CACHE = Path(os.environ.get("SHOAL_KUBERNETES_CACHE", "/var/cache/shoal/kubernetes")) / "images"
# Pods reach this machine at the bridge's address (their default route): Shoal's master and the
# Spark driver listen there.
LISTEN = "10.244.0.1"
TRAIN = e2e.EXAMPLE_DIR / "train.py"


@pytest.fixture(scope="module")
def spark_image(cluster):
    """The executor image, built (or found in the cache) and imported unless this cluster's
    containerd already holds that very archive."""
    r = subprocess.run([sys.executable, str(IMAGES_PY), "spark", IMAGE, str(IMAGE_CACHE),
                        SPARK_VENV, *IMAGE_PACKAGES], capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, f"images.py spark: {r.stderr}"
    import_image(IMAGE, r.stdout.strip().splitlines()[-1])
    return IMAGE


@pytest.fixture(scope="module")
def master_url(cluster):
    """k8s://<the apiserver of $KUBECONFIG>."""
    config = yaml.safe_load(Path(os.environ["KUBECONFIG"]).read_text())
    return "k8s://" + config["clusters"][0]["cluster"]["server"]


def executor_pods():
    r = kubectl("get", "pods", "-l", "spark-role=executor", "-o", "json")
    return [p for p in json.loads(r.stdout)["items"]]


@pytest.fixture(autouse=True)
def no_executor_left(cluster):
    yield
    left = [p["metadata"]["name"] for p in executor_pods()]
    if left:
        kubectl("delete", "pods", "-l", "spark-role=executor", "--grace-period=0", "--force",
                check=False)
    assert not left, f"a test left executor pods: {left}"


def spark_section(image, extra=""):
    """The job file's `spark:` section for the test cluster: the executor image, never pulled;
    a quarter core requested per executor (the node has 2); the example's folder mounted where
    it is here (the tasks' working directory)."""
    example = str(e2e.EXAMPLE_DIR)
    return f"""
        spark:
          executor_memory: 512m
          conf:
            spark.kubernetes.container.image: {image}
            spark.kubernetes.container.image.pullPolicy: Never
            spark.kubernetes.executor.request.cores: 250m
            spark.kubernetes.executor.volumes.hostPath.code.mount.path: {example}
            spark.kubernetes.executor.volumes.hostPath.code.mount.readOnly: "true"
            spark.kubernetes.executor.volumes.hostPath.code.options.path: {example}
{extra}"""


def wait_for_no_executor(app_id=None, timeout=90):
    def gone():
        pods = executor_pods()
        if app_id is not None:
            pods = [p for p in pods
                    if p["metadata"].get("labels", {}).get("spark-app-selector") == app_id]
        return not pods
    e2e.wait_until(gone, timeout, "every executor pod to be deleted", interval=1)


def test_pytorch_ddp_trains_in_executor_pods(run_shoal, write_job, jobs_dir, spark_image,
                                             master_url):
    job = write_job(f"""
        name: spark-k8s-ddp
        framework: pytorch
        heartbeat: {{interval: 1s, misses: 30}}
        roles:
          worker:
            instances: 2
            command: ["/usr/bin/python3", "{TRAIN}", "--epochs", "10"]
            working_dir: {e2e.EXAMPLE_DIR}
            resources: {{cpus: 1, memory: 2GiB}}
        {spark_section(spark_image)}""")
    r = run_shoal("run", "--backend", "spark", "--spark-master", master_url, "--listen", LISTEN,
                  job, timeout=420)
    job_dir = e2e.job_dirs(jobs_dir)[0] if e2e.job_dirs(jobs_dir) else None
    driver_log = (job_dir / "agents" / "spark" / "driver.log").read_text()[-4000:] if job_dir else ""
    assert r.returncode == 0, e2e.fail_message(r) + "\n--- driver.log\n" + driver_log
    accuracy = [float(m.group(1)) for line in r.stdout.splitlines()
                if (m := re.fullmatch(r"worker:0 \| final_accuracy=([0-9.]+)", line))]
    assert accuracy and accuracy[0] >= 0.90, r.stdout
    job_dir = e2e.only_job_dir(jobs_dir)
    app = json.loads((job_dir / "agents" / "spark" / "application.json").read_text())
    # Spark on Kubernetes names its applications spark-<hex>.
    assert app["application_id"].startswith("spark-") and app["master"] == master_url, app
    events = e2e.read_events(job_dir)
    registered = {e["node"] for e in e2e.events_of(events, "agent_registered")}
    assert registered == {"worker.0", "worker.1"}, registered
    template = json.loads((job_dir / "agents" / "spark" / "executor-pod-template.json").read_text())
    assert template["spec"]["initContainers"][0]["image"] == "localhost/shoal-agent:latest"
    wait_for_no_executor(app["application_id"])


def test_shoal_kill_leaves_no_executor_pod(start_shoal, run_shoal, write_job, jobs_dir,
                                           spark_image, master_url):
    job = write_job(f"""
        name: spark-k8s-kill
        heartbeat: {{interval: 1s, misses: 30}}
        roles:
          worker:
            instances: 2
            command: ["sleep", "600"]
            resources: {{cpus: 1, memory: 128MiB}}
        {spark_section(spark_image)}""")
    client = start_shoal("run", "--backend", "spark", "--spark-master", master_url,
                         "--listen", LISTEN, job)
    job_dir = e2e.wait_for_job(jobs_dir, timeout=60)
    job_id = job_dir.name

    def both_registered():
        events = e2e.read_events(job_dir)
        return len({e["node"] for e in e2e.events_of(events, "agent_registered")}) == 2
    e2e.wait_until(both_registered, 240, "both agents to register from their executor pods",
                   interval=0.5)
    app_id = json.loads((job_dir / "agents" / "spark" / "application.json").read_text())[
        "application_id"]
    pods = [p for p in executor_pods()
            if p["metadata"]["labels"].get("spark-app-selector") == app_id]
    assert len(pods) == 2, [p["metadata"]["name"] for p in pods]
    r = run_shoal("kill", job_id, timeout=60)
    assert r.returncode == 0, e2e.fail_message(r)
    rc = client.wait(120)
    assert rc != 0, client.stdout()
    wait_for_no_executor(app_id)


def test_a_k8s_master_without_what_it_needs_is_refused(run_shoal, write_job, jobs_dir, tmp_path,
                                                       master_url):
    no_image = write_job("""
        name: spark-k8s-bad
        roles:
          worker: {command: ["true"]}
        """)
    with_image = write_job(f"""
        name: spark-k8s-bad
        roles:
          worker: {{command: ["true"]}}
        {spark_section(IMAGE)}""", name="image.yaml")
    missing = tmp_path / "no-such-kubeconfig"
    cases = [
        ([master_url, "--listen", LISTEN], no_image, {},
         "needs the executors' image: set `spark: {conf: {spark.kubernetes.container.image"),
        ([master_url, "--listen", LISTEN], with_image, {"KUBECONFIG": str(missing)},
         f"KUBECONFIG={missing} names no readable file"),
        ([master_url, "--listen", LISTEN], with_image,
         {"KUBECONFIG": "", "HOME": str(tmp_path)},
         "no credentials for the Kubernetes API server"),
        (["k8s://https://127.0.0.1:1", "--listen", LISTEN], with_image, {},
         "the Kubernetes API server of k8s://https://127.0.0.1:1 does not answer"),
        ([master_url], with_image, {},
         "give the address the cluster's executors reach this machine at with --listen"),
    ]
    for flags, job_file, env, message in cases:
        r = run_shoal("run", "--backend", "spark", "--spark-master", *flags, job_file,
                      timeout=60, env=env)
        assert r.returncode == 2, f"{flags} {env}: {e2e.fail_message(r)}"
        assert message in r.stderr, f"{flags} {env}: {r.stderr}"
    assert not jobs_dir.exists() or not list(jobs_dir.iterdir())
