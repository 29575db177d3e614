"""`shoal run --backend spark --spark-master yarn` on the project's YARN + HDFS mini-cluster
(tests/yarn/cluster.sh: a ResourceManager and two NodeManagers of 4096 MB and 4 vcores each, in
one JVM). Each job is one Spark application on YARN, in client mode: the driver beside Shoal's
master, an ExecutorLauncher as the application master, executors in YARN containers. The
containers are processes of this machine, so the tests look at them directly; YARN's own view
comes from the ResourceManager's and NodeManagers' REST APIs. ctest's yarn_cluster fixture
brings the cluster up before these tests and down after them; by hand: tests/yarn/cluster.sh up,
then SHOAL_YARN_DIR as for it. The job is given exactly what `cluster.sh env` exports
(HADOOP_CONF_DIR among it), nothing more: no --listen, no Spark property."""

import http.client
import json
import os
import re
import signal
import urllib.parse

import pytest

import shoal_e2e as e2e


@pytest.fixture(scope="module")
def cluster():
    return e2e.yarn_cluster_env()


@pytest.fixture
def yarn_env(cluster):
    return dict(cluster)


def rest(url_base, path):
    parts = urllib.parse.urlsplit(url_base)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        conn.request("GET", path, headers={"Accept": "application/json"})
        response = conn.getresponse()
        data = response.read()
        assert response.status == 200, f"GET {path}: HTTP {response.status}: {data!r}"
        return json.loads(data)
    finally:
        conn.close()


def yarn_apps(cluster):
    return (rest(cluster["SHOAL_YARN_RM_WEB"], "/ws/v1/cluster/apps").get("apps") or {}).get(
        "app", [])


def yarn_app(cluster, app_id):
    return rest(cluster["SHOAL_YARN_RM_WEB"], f"/ws/v1/cluster/apps/{app_id}")["app"]


def unfinished_shoal_apps(cluster):
    return [a for a in yarn_apps(cluster) if a["name"].startswith("shoal-")
            and a["state"] not in ("FINISHED", "FAILED", "KILLED")]


def running_containers(cluster, app_id):
    """Containers of `app_id` that a NodeManager still runs (each NodeManager's REST API)."""
    found = []
    for node in rest(cluster["SHOAL_YARN_RM_WEB"], "/ws/v1/cluster/nodes")["nodes"]["node"]:
        data = rest("http://" + node["nodeHTTPAddress"], "/ws/v1/node/containers")
        for c in (data.get("containers") or {}).get("container") or []:
            if app_id.split("_", 1)[1] in c["id"] and c["state"] in ("NEW", "LOCALIZING",
                                                                      "RUNNING"):
                found.append(c["id"])
    return found


@pytest.fixture(autouse=True)
def no_application_left(cluster):
    yield
    # Every test leaves the cluster as it found it: no Shoal application unfinished.
    e2e.wait_until(lambda: not unfinished_shoal_apps(cluster), 60,
                   "every Shoal application on YARN to end")


def application_of(job_dir):
    return json.loads((job_dir / "agents" / "spark" / "application.json").read_text())


def test_pytorch_ddp_demo_trains_to_its_threshold_on_yarn(run_shoal, repo_root, jobs_dir,
                                                          cluster, yarn_env):
    # The demo's job file as it is: no `spark:` section. Shoal sizes the executors for YARN.
    r = run_shoal("run", "--backend", "spark", "--spark-master", "yarn",
                  repo_root / "examples" / "pytorch-ddp" / "job.yaml", timeout=400, env=yarn_env)
    assert r.returncode == 0, e2e.fail_message(r)
    accuracy = [float(m.group(1)) for l in r.stdout.splitlines()
                if (m := re.fullmatch(r"worker:0 \| final_accuracy=([0-9.]+)", l))]
    assert accuracy and accuracy[0] >= 0.90, r.stdout
    (job_dir,) = e2e.job_dirs(jobs_dir)
    events = e2e.read_events(job_dir)
    registered = {e["node"] for e in e2e.events_of(events, "agent_registered")}
    assert registered == {"worker.0", "worker.1"}, registered
    assert e2e.events_of(events, "queued"), "no queued event before Spark started the gang"
    app = application_of(job_dir)
    assert app["application_id"].startswith("application_"), app
    assert app["application_name"] == f"shoal-{job_dir.name}", app
    settings = json.loads((job_dir / "agents" / "spark" / "driver.json").read_text())
    # The executors used PySpark's jars where they are (nothing uploaded to HDFS) and the
    # binary from this machine's path (the NodeManagers are this machine).
    assert settings["conf"]["spark.yarn.jars"].startswith("local:/"), settings["conf"]
    assert settings["conf"]["spark.executor.instances"] == "2", settings["conf"]
    assert settings["ship_binary"] is False, settings
    e2e.wait_until(lambda: yarn_app(cluster, app["application_id"])["state"] == "FINISHED", 60,
                   "YARN to record the application FINISHED")
    assert yarn_app(cluster, app["application_id"])["finalStatus"] == "SUCCEEDED"
    e2e.wait_until(lambda: not e2e.processes_of_application(app["application_id"]), 60,
                   "every container process of the application to end")


def test_killing_a_task_process_under_restart_group_recovers_on_yarn(
        start_shoal, write_job, jobs_dir, cluster, yarn_env, tmp_path):
    marker = tmp_path / "first-attempt-ran"
    job = write_job(f"""
        name: yarn-spark-restart-group
        on_failure: restart-group
        max_restarts: 2
        backoff: {{initial: 100ms, max: 100ms}}
        roles:
          worker:
            instances: 2
            command: ["/bin/sh", "-c", "if [ -e {marker} ]; then echo resumed; else [ $SHOAL_INDEX = 0 ] && touch {marker}; sleep 300; fi"]
            resources: {{cpus: 1, memory: 128MiB}}
        spark: {{master: yarn}}
        """)
    client = start_shoal("run", "--backend", "spark", job, env=yarn_env)
    job_dir = e2e.wait_for_job(jobs_dir, timeout=60)
    e2e.wait_until(marker.exists, 240, "the first attempt to start")
    job_id = job_dir.name
    tasks = e2e.wait_until(lambda: [p for p in e2e.task_processes(job_id)
                                    if p.pid == p.pgid] or None, 30, "the task processes")
    agents_before = set(e2e.agent_processes(job_dir))
    assert len(agents_before) == 2
    assert e2e.kill_task(tasks[0].pid, job_id)
    rc = client.wait(240)
    assert rc == 0, f"rc={rc}\n{client.stdout()}\n{client.stderr()}"
    assert client.stdout().splitlines().count("worker:0 | resumed") == 1, client.stdout()
    events = e2e.read_events(job_dir)
    # Shoal's policy acted inside the stage, in the same containers: no place was lost.
    assert not e2e.events_of(events, "place_lost"), e2e.events_of(events, "place_lost")
    assert e2e.events_of(events, "group_restart_begun"), [e["type"] for e in events]


def test_a_job_waits_for_room_in_yarn_and_shoal_kill_leaves_no_application_nor_process(
        start_shoal, run_shoal, write_job, jobs_dir, cluster, yarn_env, wait_for_state):
    # The first job fills the cluster (2 x 4096 MB): an application master of 640 MB and two
    # executors of 3456 MB (512m heap, 384m of Spark's, 2504 MiB for the task) leave 640 MB.
    big = write_job("""
        name: yarn-spark-big
        roles:
          worker:
            instances: 2
            command: ["sleep", "300"]
            resources: {cpus: 1, memory: 2504MiB}
        spark:
          conf: {spark.yarn.am.memory: 256m}
        """, name="big.yaml")
    small = write_job("""
        name: yarn-spark-small
        roles:
          worker:
            instances: 1
            command: ["echo", "ran"]
            resources: {cpus: 1, memory: 128MiB}
        """, name="small.yaml")
    first = start_shoal("run", "--backend", "spark", "--spark-master", "yarn", big, env=yarn_env)
    big_dir = e2e.wait_for_job(jobs_dir, "yarn-spark-big", timeout=60)
    e2e.wait_until(lambda: len(e2e.task_processes(big_dir.name)) >= 2, 240, "both tasks to run")
    big_app = application_of(big_dir)["application_id"]
    assert yarn_app(cluster, big_app)["state"] == "RUNNING"

    # The second job's application master (896 MB) has no room: YARN keeps it ACCEPTED, and
    # the job is queued with YARN's words.
    second = start_shoal("run", "--backend", "spark", "--spark-master", "yarn", small,
                         env=yarn_env)
    small_dir = e2e.wait_for_job(jobs_dir, "yarn-spark-small", timeout=60)
    status = wait_for_state(
        small_dir.name, lambda s: s["state"] == "queued" and "YARN has not started the "
        "application master" in (s.get("reason") or ""), 120, "the second job to be queued")
    assert "ACCEPTED" in status["reason"], status["reason"]

    r = run_shoal("kill", big_dir.name, timeout=60)
    assert r.returncode == 0, e2e.fail_message(r)
    rc = first.wait(120)
    assert rc != 0, first.stdout()
    e2e.wait_until(lambda: yarn_app(cluster, big_app)["state"] in ("FINISHED", "KILLED",
                                                                   "FAILED"), 60,
                   "YARN to end the killed job's application")
    e2e.wait_until(lambda: not running_containers(cluster, big_app), 60,
                   "the NodeManagers to stop the killed job's containers")
    e2e.wait_until(lambda: not e2e.processes_of_application(big_app), 60,
                   "every executor, Python worker, agent and task of the application to end")
    assert not e2e.task_processes(big_dir.name)
    assert not e2e.agent_processes(big_dir)

    # The room it left lets the second job run.
    rc = second.wait(240)
    assert rc == 0, f"rc={rc}\n{second.stdout()}\n{second.stderr()}"
    assert "worker:0 | ran" in second.stdout().splitlines(), second.stdout()


def test_yarn_needs_its_configuration_and_a_resource_manager_that_answers(
        run_shoal, write_job, jobs_dir, cluster, yarn_env, tmp_path):
    job = write_job("""
        name: yarn-spark-flags
        roles:
          worker: {command: ["true"]}
        """)
    no_conf = tmp_path / "no-conf"
    no_conf.mkdir()
    dead_rm = tmp_path / "dead-rm"
    dead_rm.mkdir()
    (dead_rm / "yarn-site.xml").write_text(
        "<configuration><property><name>yarn.resourcemanager.address</name>"
        "<value>127.0.0.1:1</value></property></configuration>\n")
    cases = [
        ({**yarn_env, "HADOOP_CONF_DIR": "", "YARN_CONF_DIR": ""},
         "--backend spark with master yarn needs HADOOP_CONF_DIR or YARN_CONF_DIR"),
        ({**yarn_env, "HADOOP_CONF_DIR": str(no_conf)},
         f"HADOOP_CONF_DIR={no_conf} has no readable yarn-site.xml"),
        ({**yarn_env, "HADOOP_CONF_DIR": str(dead_rm)},
         "the YARN ResourceManager at 127.0.0.1:1 (yarn.resourcemanager.address in "
         f"{dead_rm}/yarn-site.xml) does not answer"),
    ]
    for env, message in cases:
        r = run_shoal("run", "--backend", "spark", "--spark-master", "yarn", job, timeout=60,
                      env=env)
        assert r.returncode == 2, f"{message}: {e2e.fail_message(r)}"
        assert message in r.stderr, f"{message}: {r.stderr}"
    assert not jobs_dir.exists() or not list(jobs_dir.iterdir())
    assert not unfinished_shoal_apps(cluster)
