"""`shoal run --backend spark` on the project's Spark standalone test cluster (tests/spark/
cluster.sh: a master and two workers on 127.0.0.1, real JVMs, fake GPUs). Each job is one Spark
application whose barrier stage holds the gang; executors, their Python workers and the agents
their barrier tasks start are processes of this machine, so the tests look at them directly.
ctest's spark_cluster fixture brings the cluster up before these tests and down after them; by
hand: tests/spark/cluster.sh up, then SHOAL_SPARK_DIR as for it."""

import json
import os
import re
import shutil
import signal
import subprocess
import urllib.request
from pathlib import Path

import pytest

import shoal_e2e as e2e

SPARK_DIR = Path(os.environ.get("SHOAL_SPARK_DIR", "/tmp/shoal-spark"))
CLUSTER_SH = e2e.REPO_ROOT / "tests" / "spark" / "cluster.sh"
TF_PYTHON = "/var/cache/shoal/venvs/tensorflow/bin/python"


@pytest.fixture(scope="module")
def cluster():
    env_file = SPARK_DIR / "env"
    assert env_file.is_file(), (
        f"no {env_file}: the Spark test cluster is not up. Run these tests through ctest (its "
        f"spark_cluster fixture starts the cluster), or start it first: {CLUSTER_SH} up")
    env = dict(line.split("=", 1) for line in env_file.read_text().splitlines() if "=" in line)
    r = subprocess.run(["bash", str(CLUSTER_SH), "status"], capture_output=True, text=True,
                       timeout=60, env={**os.environ, "SHOAL_SPARK_DIR": str(SPARK_DIR)})
    assert r.returncode == 0, f"cluster.sh status: {r.stdout}{r.stderr}"
    return env


@pytest.fixture
def spark_env(cluster):
    """What `shoal run --backend spark` is given: what `cluster.sh env` exports, nothing more."""
    return dict(cluster)


def master_state(cluster):
    with urllib.request.urlopen(cluster["SHOAL_SPARK_MASTER_WEB"] + "/json/", timeout=10) as r:
        return json.load(r)


def active_apps(cluster, prefix="shoal-"):
    return [a for a in master_state(cluster).get("activeapps", [])
            if a.get("name", "").startswith(prefix)]


@pytest.fixture(autouse=True)
def no_application_left(cluster):
    yield
    # Every test leaves the cluster as it found it: no application, no agent of ours.
    e2e.wait_until(lambda: not active_apps(cluster), 60, "every Shoal application to end")


def application_of(job_dir):
    return json.loads((job_dir / "agents" / "spark" / "application.json").read_text())


def test_pytorch_ddp_trains_to_its_threshold_in_a_barrier_stage(run_shoal, write_job, repo_root,
                                                                 jobs_dir, cluster, spark_env):
    train = repo_root / "examples" / "pytorch-ddp" / "train.py"
    job = write_job(f"""
        name: spark-ddp
        framework: pytorch
        roles:
          worker:
            instances: 2
            command: ["/usr/bin/python3", "{train}", "--epochs", "10"]
            resources: {{cpus: 1, memory: 2GiB}}
        spark:
          executor_memory: 512m
        """)
    r = run_shoal("run", "--backend", "spark", "--spark-master", cluster["SHOAL_SPARK_MASTER"],
                  job, timeout=400, env=spark_env)
    assert r.returncode == 0, e2e.fail_message(r)
    accuracy = [float(m.group(1)) for l in r.stdout.splitlines()
                if (m := re.fullmatch(r"worker:0 \| final_accuracy=([0-9.]+)", l))]
    assert accuracy and accuracy[0] >= 0.90, r.stdout
    job_dir = e2e.only_job_dir(jobs_dir)
    events = e2e.read_events(job_dir)
    registered = {e["node"] for e in e2e.events_of(events, "agent_registered")}
    assert registered == {"worker.0", "worker.1"}, registered
    # Queued until Spark started the barrier stage, in the driver's words.
    queued = e2e.events_of(events, "queued")
    assert queued and "barrier stage" in queued[0]["reason"], queued
    app = application_of(job_dir)
    assert app["application_id"].startswith("app-") and app["application_name"] == \
        f"shoal-{job_dir.name}", app
    completed = {a["id"]: a for a in master_state(cluster).get("completedapps", [])}
    assert completed.get(app["application_id"], {}).get("state") == "FINISHED", completed
    e2e.wait_until(lambda: not e2e.processes_of_application(app["application_id"]), 60,
                   "every executor-side process of the application to end")


def test_gpus_spark_assigned_reach_the_tasks(run_shoal, write_job, jobs_dir, cluster, spark_env):
    job = write_job("""
        name: spark-gpus
        roles:
          worker:
            instances: 2
            command: ["/bin/sh", "-c", "echo gpus=$CUDA_VISIBLE_DEVICES"]
            resources: {cpus: 1, memory: 128MiB, gpus: 1}
        spark: {executor_memory: 512m}
        """)
    r = run_shoal("run", "--backend", "spark", job, timeout=300, env=spark_env)
    assert r.returncode == 0, e2e.fail_message(r)
    gpus = [l.split("gpus=", 1)[1] for l in r.stdout.splitlines() if " | gpus=" in l]
    # One fake GPU each, from the workers' addresses (0-1 on one worker, 2-3 on the other).
    assert len(gpus) == 2 and all(g in {"0", "1", "2", "3"} for g in gpus), r.stdout
    events = e2e.read_events(e2e.only_job_dir(jobs_dir))
    seen = {e["node"]: e["gpus"] for e in e2e.events_of(events, "agent_registered")}
    assert sorted(seen) == ["worker.0", "worker.1"] and all(len(g) == 1 for g in seen.values()), \
        seen


def test_the_binary_can_travel_with_the_application(run_shoal, write_job, jobs_dir, cluster,
                                                   spark_env, shoal_bin):
    # What a cluster without this machine's files gets (SparkContext.addFile): forced here.
    job = write_job("""
        name: spark-ship
        roles:
          worker:
            instances: 2
            command: ["/bin/sh", "-c", "tr '\\\\0' ' ' < /proc/$PPID/cmdline; echo"]
            resources: {cpus: 1, memory: 128MiB}
        spark: {executor_memory: 512m}
        """)
    r = run_shoal("run", "--backend", "spark", job, timeout=300,
                  env={**spark_env, "SHOAL_SPARK_SHIP_BINARY": "1"})
    assert r.returncode == 0, e2e.fail_message(r)
    driver = e2e.only_job_dir(jobs_dir) / "agents" / "spark" / "driver.json"
    settings = json.loads(driver.read_text())
    assert settings["ship_binary"] is True, settings
    # The tasks' parent is their agent: started from the executor's copy, not from here.
    agents = [l.split(" | ", 1)[1] for l in r.stdout.splitlines() if " agent --node " in l]
    assert len(agents) == 2, r.stdout
    for argv in agents:
        binary = argv.split()[0]
        assert binary != str(shoal_bin) and binary.startswith(str(SPARK_DIR / "work")), argv


def test_tensorflow_mwms_trains_to_its_threshold(run_shoal, write_job, repo_root, cluster,
                                                spark_env):
    assert os.access(TF_PYTHON, os.X_OK), f"no {TF_PYTHON}: ./setup.sh makes it"
    example = repo_root / "examples" / "tensorflow"
    job = write_job(f"""
        name: spark-tf-mwms
        framework: tensorflow
        roles:
          worker:
            instances: 2
            command: ["{TF_PYTHON}", "train_mwms.py", "--epochs", "8", "--min-accuracy", "0.9"]
            working_dir: {example}
            env: {{TF_CPP_MIN_LOG_LEVEL: "2"}}
            resources: {{cpus: 1, memory: 3GiB}}
        spark: {{executor_memory: 512m}}
        """)
    r = run_shoal("run", "--backend", "spark", job, timeout=600, env=spark_env)
    assert r.returncode == 0, e2e.fail_message(r)


def test_killing_a_task_process_under_restart_group_recovers(start_shoal, write_job, jobs_dir,
                                                             cluster, spark_env, tmp_path):
    marker = tmp_path / "first-attempt-ran"
    # Attempt 0 of worker 0 writes the marker and waits to be killed; the group restarts (both
    # workers, in the same barrier tasks: Spark sees nothing) and sees the marker.
    job = write_job(f"""
        name: spark-restart-group
        on_failure: restart-group
        max_restarts: 2
        backoff: {{initial: 100ms, max: 100ms}}
        roles:
          worker:
            instances: 2
            command: ["/bin/sh", "-c", "if [ -e {marker} ]; then echo resumed; else [ $SHOAL_INDEX = 0 ] && touch {marker}; sleep 300; fi"]
            resources: {{cpus: 1, memory: 128MiB}}
        spark: {{executor_memory: 512m}}
        """)
    client = start_shoal("run", "--backend", "spark", job, env=spark_env)
    job_dir = e2e.wait_for_job(jobs_dir, timeout=60)
    e2e.wait_until(marker.exists, 240, "the first attempt to start")
    job_id = job_dir.name
    tasks = e2e.wait_until(lambda: [p for p in e2e.task_processes(job_id)
                                    if p.pid == p.pgid] or None, 30, "the task processes")
    agents_before = set(e2e.agent_processes(job_dir))
    assert e2e.kill_task(tasks[0].pid, job_id)
    rc = client.wait(240)
    assert rc == 0, f"rc={rc}\n{client.stdout()}\n{client.stderr()}"
    assert client.stdout().splitlines().count("worker:0 | resumed") == 1, client.stdout()
    events = e2e.read_events(job_dir)
    # Shoal's policy acted inside the stage: no place was lost, the agents were the same.
    assert not e2e.events_of(events, "place_lost"), e2e.events_of(events, "place_lost")
    assert len(agents_before) == 2


def test_a_killed_agent_is_one_lost_place_replaced_in_the_running_stage(
        start_shoal, write_job, jobs_dir, cluster, spark_env, tmp_path):
    marker = tmp_path / "first-attempt-ran"
    job = write_job(f"""
        name: spark-lost
        on_failure: restart-task
        max_restarts: 2
        backoff: {{initial: 100ms, max: 100ms}}
        roles:
          worker:
            instances: 2
            command: ["/bin/sh", "-c", "if [ $SHOAL_INDEX = 1 ]; then sleep 8; echo other-done; elif [ -e {marker} ]; then echo resumed; else touch {marker}; sleep 300; fi"]
            resources: {{cpus: 1, memory: 128MiB}}
        spark: {{executor_memory: 512m}}
        """)
    client = start_shoal("run", "--backend", "spark", job, env=spark_env)
    job_dir = e2e.wait_for_job(jobs_dir, timeout=60)
    e2e.wait_until(marker.exists, 240, "the first attempt to start")
    # worker:0's agent, killed as a crash would: its barrier task reports it and stays.
    victim = None
    for pid in e2e.agent_processes(job_dir):
        argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        if argv[argv.index(b"--node") + 1] == b"worker.0":
            victim = pid
    assert victim is not None
    os.kill(victim, signal.SIGKILL)
    rc = client.wait(240)
    assert rc == 0, f"rc={rc}\n{client.stdout()}\n{client.stderr()}"
    out = client.stdout().splitlines()
    assert "worker:0 | resumed" in out and "worker:1 | other-done" in out, client.stdout()
    events = e2e.read_events(job_dir)
    lost = e2e.events_of(events, "place_lost")
    assert [e["node"] for e in lost] == ["worker.0"], lost
    assert "agent exited" in lost[0]["reason"], lost
    replaced = e2e.events_of(events, "place_replacing")
    assert replaced and replaced[0]["ok"], replaced


def executor_of(pid):
    """The executor JVM that `pid` descends from (a barrier task's agent: agent <- Python
    worker <- Python daemon <- executor), or None."""
    while pid > 1:
        try:
            argv = open(f"/proc/{pid}/cmdline", "rb").read()
            stat = open(f"/proc/{pid}/stat").read()
        except OSError:
            return None
        if b"CoarseGrainedExecutorBackend" in argv:
            return pid
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return None


def test_a_lost_executor_fails_the_stage_attempt_and_spark_retries_the_gang(
        start_shoal, write_job, jobs_dir, cluster, spark_env, tmp_path):
    # Each task's first attempt leaves a marker and waits; its restart sees it and ends.
    job = write_job(f"""
        name: spark-executor-lost
        on_failure: restart-task
        max_restarts: 2
        backoff: {{initial: 100ms, max: 100ms}}
        roles:
          worker:
            instances: 2
            command: ["/bin/sh", "-c", "if [ -e {tmp_path}/ran-$SHOAL_INDEX ]; then echo resumed; else touch {tmp_path}/ran-$SHOAL_INDEX; sleep 300; fi"]
            resources: {{cpus: 1, memory: 128MiB}}
        spark: {{executor_memory: 512m}}
        """)
    client = start_shoal("run", "--backend", "spark", job, env=spark_env)
    job_dir = e2e.wait_for_job(jobs_dir, timeout=60)
    e2e.wait_until(lambda: (tmp_path / "ran-0").exists() and (tmp_path / "ran-1").exists(), 240,
                   "both first attempts to start")
    agents = e2e.wait_until(
        lambda: len(e2e.agent_processes(job_dir)) == 2 and e2e.agent_processes(job_dir),
        30, "both agents")
    executor = executor_of(agents[0])
    assert executor is not None, "no executor JVM above the agent"
    # The executor's JVM dies as a machine's would: Spark fails the barrier stage attempt, kills
    # its other task, and retries the whole stage; Shoal restarts both tasks in the new agents.
    os.kill(executor, signal.SIGKILL)
    rc = client.wait(300)
    assert rc == 0, f"rc={rc}\n{client.stdout()}\n{client.stderr()}"
    out = client.stdout().splitlines()
    assert out.count("worker:0 | resumed") == 1 and out.count("worker:1 | resumed") == 1, \
        client.stdout()
    events = e2e.read_events(job_dir)
    lost = {e["node"] for e in e2e.events_of(events, "place_lost")}
    assert lost == {"worker.0", "worker.1"}, e2e.events_of(events, "place_lost")
    replaced = e2e.events_of(events, "place_replacing")
    assert replaced and all(e["ok"] for e in replaced), replaced
    registered = [e["node"] for e in e2e.events_of(events, "agent_registered")]
    assert sorted(registered) == ["worker.0", "worker.0", "worker.1", "worker.1"], registered


def test_when_spark_retries_no_more_the_job_fails_with_sparks_reason(
        start_shoal, write_job, jobs_dir, cluster, spark_env, tmp_path):
    # One stage attempt only: a lost executor ends the application. The master asks to replace
    # the lost places after the driver has gone; that must fail the tasks with Spark's reason,
    # not take the master down with it (a write to the dead driver's stdin raised SIGPIPE).
    job = write_job(f"""
        name: spark-no-retry
        on_failure: restart-task
        max_restarts: 2
        roles:
          worker:
            instances: 2
            command: ["/bin/sh", "-c", "touch {tmp_path}/ran-$SHOAL_INDEX; sleep 300"]
            resources: {{cpus: 1, memory: 128MiB}}
        spark:
          executor_memory: 512m
          conf: {{spark.stage.maxConsecutiveAttempts: "1"}}
        """)
    client = start_shoal("run", "--backend", "spark", job, env=spark_env)
    job_dir = e2e.wait_for_job(jobs_dir, timeout=60)
    e2e.wait_until(lambda: (tmp_path / "ran-0").exists() and (tmp_path / "ran-1").exists(), 240,
                   "both tasks to start")
    agents = e2e.wait_until(
        lambda: len(e2e.agent_processes(job_dir)) == 2 and e2e.agent_processes(job_dir),
        30, "both agents")
    os.kill(executor_of(agents[0]), signal.SIGKILL)
    rc = client.wait(180)
    assert rc == 1, f"rc={rc}\n{client.stdout()}\n{client.stderr()}"
    out = client.stderr()
    assert "died" not in out, out
    assert f"killed: the Spark application shoal-{job_dir.name} ended: Job aborted due to " \
           "stage failure" in out, out
    assert "has failed the maximum allowable number of times: 1" in out, out
    app_id = application_of(job_dir)["application_id"]
    e2e.wait_until(lambda: not e2e.processes_of_application(app_id), 60,
                   "every executor-side process of the application to end")


@pytest.mark.parametrize("how", ["ctrl-c", "shoal kill"])
def test_ctrl_c_ends_the_application_and_leaves_no_process(how, start_shoal, run_shoal, write_job,
                                                           jobs_dir, cluster, spark_env):
    job = write_job("""
        name: spark-interrupt
        roles:
          worker:
            instances: 2
            command: ["sleep", "300"]
            resources: {cpus: 1, memory: 128MiB}
        spark: {executor_memory: 512m}
        """)
    client = start_shoal("run", "--backend", "spark", job, env=spark_env)
    job_dir = e2e.wait_for_job(jobs_dir, timeout=60)
    job_id = job_dir.name
    e2e.wait_until(lambda: len(e2e.task_processes(job_id)) >= 2, 240, "both tasks to run")
    app_id = application_of(job_dir)["application_id"]
    assert [a for a in active_apps(cluster) if a["id"] == app_id]
    if how == "ctrl-c":
        os.killpg(client.pid, signal.SIGINT)
    else:
        r = run_shoal("kill", job_id, timeout=60)
        assert r.returncode == 0, e2e.fail_message(r)
    rc = client.wait(120)
    assert rc != 0, client.stdout()
    e2e.wait_until(lambda: not [a for a in active_apps(cluster) if a["id"] == app_id], 60,
                   "the application to end")
    e2e.wait_until(lambda: not e2e.processes_of_application(app_id), 60,
                   "every executor, Python worker, agent and task of the application to end")
    assert not e2e.task_processes(job_id)
    assert not e2e.agent_processes(job_dir)
    completed = {a["id"]: a for a in master_state(cluster).get("completedapps", [])}
    assert app_id in completed, completed


def test_bad_spark_settings_are_refused_before_anything_starts(run_shoal, write_job, jobs_dir,
                                                               cluster, spark_env):
    job = write_job("""
        name: spark-flags
        roles:
          worker: {command: ["true"]}
        """)
    bad_file = write_job("""
        name: spark-bad-file
        roles:
          worker: {command: ["true"]}
        spark:
          executor_memory: lots
          conf: {spark.master: yarn}
        """, name="bad.yaml")
    no_master = {k: v for k, v in spark_env.items() if k != "SHOAL_SPARK_MASTER"}
    cases = [
        (["--spark-master", "spark//127.0.0.1:7077"], job, spark_env,
         "invalid flag: --spark-master: must be a Spark master URL"),
        (["--spark-master", "spark://127.0.0.1:1"], job, spark_env,
         "the Spark master at spark://127.0.0.1:1 does not answer"),
        ([], job, no_master, "--backend spark needs the Spark master"),
        ([], job, {**spark_env, "SHOAL_SPARK_PYTHON": "/usr/bin/python3"},
         "cannot import pyspark with /usr/bin/python3"),
        ([], bad_file, spark_env, "bad.yaml:5: spark.executor_memory: must be a Spark memory "
                                  "size, e.g. 512m or 1g, got 'lots'"),
        ([], bad_file, spark_env, "bad.yaml:6: spark.conf.spark.master: is the section's own"),
    ]
    for flags, job_file, env, message in cases:
        r = run_shoal("run", "--backend", "spark", *flags, job_file, timeout=60, env=env)
        assert r.returncode == 2, f"{flags}: {e2e.fail_message(r)}"
        assert message in r.stderr, f"{flags}: {r.stderr}"
    r = run_shoal("run", "--spark-master", cluster["SHOAL_SPARK_MASTER"], job, timeout=30)
    assert r.returncode == 2 and "--spark-master needs --backend spark" in r.stderr, r.stderr
    # A bad `spark:` section is refused whatever the backend.
    r = run_shoal("run", bad_file, timeout=30)
    assert r.returncode == 2 and "spark.executor_memory" in r.stderr, r.stderr
    assert not jobs_dir.exists() or not list(jobs_dir.iterdir())
    assert not active_apps(cluster)


def test_a_local_cluster_master_runs_the_job_in_its_own_executors(run_shoal, write_job, jobs_dir):
    # `local-cluster[N,CORES,MB]`: Spark's own workers inside the driver's JVM, each executor a
    # JVM of its own; no standalone cluster, no environment but the flag.
    job = write_job("""
        name: spark-local-cluster
        roles:
          worker:
            instances: 2
            command: ["/bin/sh", "-c", "echo rank=$SHOAL_RANK of $SHOAL_WORLD_SIZE"]
            resources: {cpus: 1, memory: 128MiB}
        spark: {executor_memory: 512m}
        """)
    r = run_shoal("run", "--backend", "spark", "--spark-master", "local-cluster[2,1,1024]", job,
                  timeout=400)
    assert r.returncode == 0, e2e.fail_message(r)
    assert sorted(l for l in r.stdout.splitlines() if "rank=" in l) == [
        "worker:0 | rank=0 of 2", "worker:1 | rank=1 of 2"], r.stdout
    job_dir = e2e.only_job_dir(jobs_dir)
    app = application_of(job_dir)
    assert app["master"] == "local-cluster[2,1,1024]" and app["application_id"], app
    registered = {e["node"] for e in e2e.events_of(e2e.read_events(job_dir), "agent_registered")}
    assert registered == {"worker.0", "worker.1"}, registered
    assert not e2e.processes_of_application(app["application_id"])
    # Spark's workers keep the executors' folders in the job's folder, never under PySpark's
    # own folder in the venv (whose contents would then change with every job).
    executors = job_dir / "agents" / "spark" / "spark-home" / "work" / app["application_id"]
    assert sorted(p.name for p in executors.iterdir()) == ["0", "1"], list(executors.iterdir())
    pyspark = subprocess.run([SPARK_PYTHON, "-c", "import os, pyspark; "
                              "print(os.path.dirname(pyspark.__file__))"],
                             capture_output=True, text=True, check=True).stdout.strip()
    assert not (Path(pyspark) / "work" / app["application_id"]).exists()


def test_a_barrier_task_that_cannot_start_its_agent_fails_the_job_with_its_reason(
        harness, start_shoal, write_job, jobs_dir, cluster, spark_env, shoal_bin, tmp_path):
    # The executors run the agent from the submitting `shoal`'s path (a loopback cluster shares
    # this machine's files). Once the master runs, that path holds something no executor can
    # execute: what a binary built for another machine, or a missing one, looks like there.
    binary = tmp_path / "bin" / "shoal"
    binary.parent.mkdir()
    shutil.copy2(shoal_bin, binary)
    harness.shoal_bin = str(binary)
    job = write_job("""
        name: spark-no-agent
        roles:
          worker:
            instances: 2
            command: ["true"]
            resources: {cpus: 1, memory: 128MiB}
        spark: {executor_memory: 512m}
        """)
    client = start_shoal("run", "--backend", "spark", job, env=spark_env)
    job_dir = e2e.wait_for_job(jobs_dir, timeout=60)
    binary.unlink()
    binary.write_text("not a program\n")
    binary.chmod(0o755)
    rc = client.wait(180)
    assert rc != 0, f"rc={rc}\n{client.stdout()}\n{client.stderr()}"
    (finished,) = e2e.events_of(e2e.read_events(job_dir), "job_finished")
    reason = finished["reason"]
    # The barrier task's own error, at once: not the agents' registration deadline 30 s later.
    assert f"cannot start `{binary} agent`" in reason and "Exec format error" in reason, reason
    assert "did not register" not in reason, reason
    assert "Exec format error" in client.stderr() + client.stdout()


SPARK_PYTHON = "/var/cache/shoal/venvs/spark/bin/python"


def test_parquet_written_by_spark_trains_inside_spark_exactly_once_across_a_kill(
        start_shoal, jobs_dir, cluster, spark_env, repo_root, tmp_path, shoal_status):
    """Issue 28's whole path on the cluster: a Spark application prepares the digits as Parquet
    (examples/spark-parquet/prepare.py against the cluster's master), then the example's job
    runs inside Spark (--backend spark) on those files, its trainer is killed mid-run, and every
    Parquet file still goes into the model exactly once per epoch."""
    example = repo_root / "examples" / "spark-parquet"
    work = tmp_path / "example"
    work.mkdir()
    (work / "train.py").write_text((example / "train.py").read_text())
    job_text = (example / "job.yaml").read_text()
    assert '--epochs, "10",' in job_text
    (work / "job.yaml").write_text(
        job_text.replace('--epochs, "10",', '--epochs, "10", --step-delay, "0.01",'))
    r = subprocess.run([SPARK_PYTHON, str(example / "prepare.py"), "--master",
                        cluster["SHOAL_SPARK_MASTER"], "--out", str(work / "data")],
                       capture_output=True, text=True, timeout=300,
                       env={**e2e.base_env(), **spark_env})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    parts = sorted(p.name for p in (work / "data" / "digits-train.parquet").iterdir()
                   if p.name.endswith(".parquet") and not p.name.startswith("."))
    assert len(parts) == 6, parts
    e2e.wait_until(lambda: not active_apps(cluster), 60, "the preparing application to end")

    client = start_shoal("run", "--backend", "spark", work / "job.yaml", env=spark_env)
    job_dir = e2e.wait_for_job(jobs_dir, "digits-parquet", timeout=60)
    e2e.wait_until(lambda: any(e["epoch"] >= 1 for e in e2e.events_of(
        e2e.read_events(job_dir), "shard_done")), 240, "a shard of the second epoch to be done")
    trainer = next(t for t in shoal_status(job_dir.name)["tasks"] if t["task"] == "trainer:0")
    assert e2e.kill_task(trainer["pid"], job_dir.name), trainer
    rc = client.wait(300)
    out = client.stdout()
    assert rc == 0, f"{out[-3000:]}\n{client.stderr()[-3000:]}"
    assert "trainer:0 | resumed from checkpoint step" in out, out[-3000:]
    accuracy = [float(l.split("=", 1)[1]) for l in out.splitlines()
                if l.startswith("trainer:0 | final_accuracy=")]
    assert len(accuracy) == 1 and accuracy[0] >= 0.9, out[-3000:]
    status = shoal_status(job_dir.name)
    assert status["state"] == "succeeded"
    assert [c["done"] for c in status["shards"]["epoch_counts"]] == [6] * 10
