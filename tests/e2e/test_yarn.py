"""The YARN backend end to end, on the project's YARN + HDFS mini-cluster (tests/yarn/cluster.sh:
a ResourceManager, two NodeManagers of 4096 MB, 4 vcores and 2 GPUs each, HDFS). ctest's
yarn_cluster fixture builds Shoal's application master, brings the cluster up before these
tests and down after them; by hand: src/backends/yarn/am/build.sh && tests/yarn/cluster.sh up.
Every test talks to YARN only through what an operator has: the ResourceManager's REST API."""

import getpass
import http.client
import json
import os
import re
import shlex
import subprocess
import urllib.parse

import pytest

import shoal_e2e as e2e

AM_JAR = e2e.REPO_ROOT / "src" / "backends" / "yarn" / "am" / "target" / "shoal-yarn-am.jar"


@pytest.fixture(scope="module")
def cluster():
    env = e2e.yarn_cluster_env()
    assert AM_JAR.is_file(), f"no {AM_JAR}: build it with src/backends/yarn/am/build.sh"
    return env


@pytest.fixture
def yarn_env(cluster):
    """What `shoal run --backend yarn` is given: exactly what `cluster.sh env` exports (the
    docs' `eval "$(tests/yarn/cluster.sh env)"`), nothing more."""
    return dict(cluster)


@pytest.fixture(autouse=True)
def no_application_left(cluster):
    yield
    # No test leaves an application running (each checks its own; this catches the rest).
    for app in unfinished_apps(cluster, "shoal-"):
        rest(cluster, "PUT", f"/ws/v1/cluster/apps/{app['id']}/state", {"state": "KILLED"})


def rest(cluster, method, path, body=None):
    parts = urllib.parse.urlsplit(cluster["SHOAL_YARN_RM_WEB"])
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        headers = {"Accept": "application/json", "Content-Type": "application/json"}
        conn.request(method, path, body=json.dumps(body) if body is not None else None,
                     headers=headers)
        response = conn.getresponse()
        data = response.read()
        assert 200 <= response.status < 300, f"{method} {path}: HTTP {response.status}: {data!r}"
        return json.loads(data) if data else {}
    finally:
        conn.close()


def apps_named(cluster, name_prefix):
    apps = (rest(cluster, "GET", "/ws/v1/cluster/apps").get("apps") or {}).get("app", [])
    return [a for a in apps if a["name"].startswith(name_prefix)]


def unfinished_apps(cluster, name_prefix):
    return [a for a in apps_named(cluster, name_prefix)
            if a["state"] not in ("FINISHED", "FAILED", "KILLED")]


def app_of(cluster, job_id):
    (app,) = apps_named(cluster, f"shoal-{job_id}")
    return app


def running_containers(cluster, app_id):
    """Containers of `app_id` that any NodeManager still runs (its own REST API)."""
    nodes = rest(cluster, "GET", "/ws/v1/cluster/nodes")["nodes"]["node"]
    found = []
    for node in nodes:
        host, port = node["nodeHTTPAddress"].rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        conn.request("GET", "/ws/v1/node/containers", headers={"Accept": "application/json"})
        data = json.loads(conn.getresponse().read())
        conn.close()
        for c in ((data.get("containers") or {}).get("container") or []):
            if app_id.split("_", 1)[1] in c["id"] and c["state"] in ("NEW", "LOCALIZING",
                                                                      "RUNNING"):
                found.append(c["id"])
    return found


def test_pytorch_ddp_with_each_worker_in_its_own_container(run_shoal, write_job, repo_root,
                                                           jobs_dir, cluster, yarn_env):
    train = repo_root / "examples" / "pytorch-ddp" / "train.py"
    # 2 GiB per worker (2176 MB containers with the agent): a NodeManager offers 4096 MB, so
    # YARN must put the two workers on different NodeManagers.
    job = write_job(f"""
        name: yarn-ddp
        framework: pytorch
        roles:
          worker:
            instances: 2
            command: ["/usr/bin/python3", "{train}", "--epochs", "10"]
            resources: {{cpus: 1, memory: 2GiB}}
        """)
    r = run_shoal("run", "--backend", "yarn", job, timeout=280, env=yarn_env)
    assert r.returncode == 0, e2e.fail_message(r)
    accuracy = [float(m.group(1)) for l in r.stdout.splitlines()
                if (m := re.fullmatch(r"worker:0 \| final_accuracy=([0-9.]+)", l))]
    assert accuracy and accuracy[0] >= 0.90, r.stdout

    job_dir = e2e.only_job_dir(jobs_dir)
    events = e2e.read_events(job_dir)
    registered = {e["node"] for e in e2e.events_of(events, "agent_registered")}
    assert registered == {"worker.0", "worker.1"}, registered
    app = app_of(cluster, job_dir.name)
    assert (app["state"], app["finalStatus"]) == ("FINISHED", "SUCCEEDED"), app
    record = json.loads((job_dir / "agents" / "yarn" / "application.json").read_text())
    assert record["application_id"] == app["id"]
    # The NodeManagers learn of the application's end on their next heartbeat.
    e2e.wait_until(lambda: not running_containers(cluster, app["id"]), 30,
                   "every container of the application to end")
    # The job's logs stay with the job after the application is gone.
    logs = run_shoal("logs", job_dir.name, timeout=30)
    assert logs.returncode == 0, logs.stderr
    assert any(l.startswith("worker:0 | final_accuracy=") for l in logs.stdout.splitlines())


def test_task_ports_reach_agents_in_containers(run_shoal, write_job, yarn_env):
    # A NodeManager gives a container none of `shoal run`'s environment: SHOAL_TASK_PORTS must
    # still reach every agent (as its --task-ports).
    job = write_job("""
        name: yarn-ports
        framework: tensorflow
        roles:
          worker:
            instances: 2
            command: ["/bin/sh", "-c", "echo \\"$TF_CONFIG\\""]
            resources: {cpus: 1, memory: 128MiB}
        """)
    r = run_shoal("run", "--backend", "yarn", job, timeout=180,
                  env={**yarn_env, "SHOAL_TASK_PORTS": "24800-24899"})
    assert r.returncode == 0, e2e.fail_message(r)
    ports = set()
    for line in r.stdout.splitlines():
        _, sep, rest = line.partition(" | ")
        if sep and rest.startswith("{"):
            ports |= {int(a.rsplit(":", 1)[1]) for a in json.loads(rest)["cluster"]["worker"]}
    assert len(ports) == 2 and all(24800 <= p <= 24899 for p in ports), (ports, r.stdout)


def test_shoal_kill_kills_the_application_and_leaves_no_container(run_shoal, detach_job,
                                                                  write_job, wait_for_state,
                                                                  jobs_dir, cluster, yarn_env):
    job = write_job("""
        name: yarn-kill
        roles:
          worker:
            instances: 2
            command: ["sleep", "300"]
            resources: {cpus: 1, memory: 128MiB}
        """)
    job_id = detach_job(job, "--backend", "yarn", env=yarn_env)
    wait_for_state(job_id, lambda s: s["state"] == "running", 90, "the job to run")
    app = app_of(cluster, job_id)
    assert app["state"] == "RUNNING", app
    assert len(running_containers(cluster, app["id"])) == 3  # the AM and two agents
    assert len(e2e.agent_processes(jobs_dir / job_id)) == 2
    r = run_shoal("kill", job_id, timeout=60)
    assert r.returncode == 0, r.stderr
    wait_for_state(job_id, lambda s: s["state"] == "killed", 60, "the job to be killed")
    app = app_of(cluster, job_id)
    assert app["state"] == "KILLED", app
    e2e.wait_until(lambda: not running_containers(cluster, app["id"]), 30,
                   "every container of the application to end")
    e2e.wait_until(lambda: not e2e.task_processes(job_id), 30, "every task to end")
    assert not e2e.agent_processes(jobs_dir / job_id)


def test_yarn_kill_from_outside_ends_shoal_run_with_a_clear_message(start_shoal, write_job,
                                                                   jobs_dir, cluster, yarn_env):
    job = write_job("""
        name: yarn-outside-kill
        roles:
          worker:
            instances: 2
            command: ["sleep", "300"]
            resources: {cpus: 1, memory: 128MiB}
        """)
    client = start_shoal("run", "--backend", "yarn", job, env=yarn_env)
    job_dir = e2e.wait_for_job(jobs_dir, timeout=60)

    def running():
        path = job_dir / "status.json"
        return path.exists() and json.loads(path.read_text()).get("state") == "running"
    e2e.wait_until(running, 90, "the job to run")
    app = app_of(cluster, job_dir.name)
    # What `yarn application -kill` does: the ResourceManager's kill, from outside Shoal.
    rest(cluster, "PUT", f"/ws/v1/cluster/apps/{app['id']}/state", {"state": "KILLED"})
    rc = client.wait(60)
    err = client.stderr()
    assert rc == 1, f"rc={rc}\n{err}"
    assert f"the YARN application {app['id']} was killed outside Shoal" in err, err
    assert "killed" in err.splitlines()[-1], err
    e2e.wait_until(lambda: not e2e.task_processes(job_dir.name), 30, "every task to end")


def test_more_memory_than_any_nodemanager_offers_is_refused_with_yarns_reason(
        run_shoal, write_job, jobs_dir, cluster, yarn_env):
    job = write_job("""
        name: yarn-too-big
        roles:
          worker:
            instances: 1
            command: ["true"]
            resources: {cpus: 1, memory: 8GiB}
        """)
    r = run_shoal("run", "--backend", "yarn", job, timeout=90, env=yarn_env)
    assert r.returncode == 1, e2e.fail_message(r)
    # YARN's own words, from the ResourceManager through the application master.
    assert "YARN refused the containers:" in r.stderr, r.stderr
    assert "maximum allowed allocation" in r.stderr, r.stderr
    app = app_of(cluster, e2e.only_job_dir(jobs_dir).name)
    assert app["state"] in ("FINISHED", "FAILED"), app
    assert app["finalStatus"] == "FAILED", app


def test_a_lost_container_is_replaced_under_the_failure_policy(start_shoal, write_job, jobs_dir,
                                                               cluster, yarn_env, tmp_path):
    marker = tmp_path / "first-attempt-ran"
    # Attempt 0 of the task writes the marker and waits to be killed; its restart (in a new
    # container, after the first one was lost with its agent) sees the marker and succeeds.
    job = write_job(f"""
        name: yarn-lost
        on_failure: restart-task
        max_restarts: 2
        backoff: {{initial: 100ms, max: 100ms}}
        roles:
          worker:
            instances: 1
            command: ["/bin/sh", "-c", "if [ -e {marker} ]; then echo resumed; else touch {marker}; sleep 300; fi"]
            resources: {{cpus: 1, memory: 128MiB}}
        """)
    client = start_shoal("run", "--backend", "yarn", job, env=yarn_env)
    job_dir = e2e.wait_for_job(jobs_dir, timeout=60)
    e2e.wait_until(marker.exists, 90, "the first attempt to start")
    agents = e2e.wait_until(lambda: e2e.agent_processes(job_dir) or None, 30, "the agent")
    # The container's process, killed as a NodeManager's loss would; its task dies with it.
    os.kill(agents[0], 9)
    rc = client.wait(120)
    assert rc == 0, f"rc={rc}\n{client.stdout()}\n{client.stderr()}"
    assert "worker:0 | resumed" in client.stdout().splitlines(), client.stdout()
    events = e2e.read_events(job_dir)
    lost = e2e.events_of(events, "place_lost")
    assert lost and lost[0]["node"] == "worker.0", lost
    assert "YARN container" in lost[0]["reason"], lost
    replaced = e2e.events_of(events, "place_replacing")
    assert replaced and replaced[0]["ok"], replaced


def test_bad_yarn_flags_are_refused_before_anything_starts(run_shoal, write_job, jobs_dir,
                                                           cluster, yarn_env):
    job = write_job("""
        name: yarn-flags
        roles:
          worker: {command: ["true"]}
        """)
    cases = [
        (["--queue", "a;b"], yarn_env, "--queue: must be a YARN queue name"),
        (["--yarn-rm", "localhost:8088"], yarn_env, "--yarn-rm: the ResourceManager's web "
                                                     "address must be http://HOST:PORT"),
        (["--yarn-rm", "http://127.0.0.1:1"], yarn_env, "does not answer"),
        ([], {}, "needs the ResourceManager's web address"),
        ([], {**yarn_env, "SHOAL_YARN_AM_JAR": "/nonexistent/am.jar"},
         "no application master jar at /nonexistent/am.jar"),
        ([], {**yarn_env, "SHOAL_HDFS": "file:///"},
         "the cluster's file system is 'file:///'; name its HDFS with SHOAL_HDFS"),
        ([], {**yarn_env, "SHOAL_WEBHDFS": "http://127.0.0.1:1"},
         "the NameNode's WebHDFS at 'http://127.0.0.1:1'"),
    ]
    for flags, env, message in cases:
        r = run_shoal("run", "--backend", "yarn", *flags, job, timeout=60, env=env)
        assert r.returncode == 2, f"{flags}: {e2e.fail_message(r)}"
        assert message in r.stderr, f"{flags}: {r.stderr}"
    r = run_shoal("run", "--queue", "ml", job, timeout=30)
    assert r.returncode == 2 and "need --backend yarn" in r.stderr, r.stderr
    assert not jobs_dir.exists() or not list(jobs_dir.iterdir())
    assert not apps_named(cluster, "shoal-yarn-flags")


def hdfs_user():
    return os.environ.get("HADOOP_USER_NAME") or getpass.getuser()


def staging_dir(app_id):
    """Where `shoal run` stages the AM jar and the agent binary for `app_id` (docs)."""
    return f"/user/{hdfs_user()}/.shoal/staging/{app_id}"


def hdfs_status(cluster, path):
    """WebHDFS GETFILESTATUS of `path`, or None when it does not exist."""
    parts = urllib.parse.urlsplit(cluster["SHOAL_WEBHDFS"])
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    conn.request("GET", f"/webhdfs/v1{path}?op=GETFILESTATUS&user.name=shoal")
    response = conn.getresponse()
    data = response.read()
    conn.close()
    if response.status == 404:
        return None
    assert response.status == 200, data
    return json.loads(data)["FileStatus"]


def test_the_docs_run_a_job_with_only_what_cluster_sh_env_prints(cluster, tmp_path, write_job):
    """docs/backends/yarn.md's "Trying it", literally, from a fresh shell: nothing but what
    `tests/yarn/cluster.sh env` prints (no SHOAL_YARN_AM_CLASSPATH, no HADOOP_* of the runner)."""
    job = write_job("""
        name: yarn-docs
        roles:
          worker:
            instances: 2
            command: ["/bin/sh", "-c", "echo hello from $SHOAL_ROLE $SHOAL_INDEX"]
            resources: {cpus: 1, memory: 128MiB}
        """)
    jobs = tmp_path / "jobs"
    script = (f'eval "$({shlex.quote(str(e2e.YARN_CLUSTER_SH))} env)" && '
              f'exec {shlex.quote(e2e.SHOAL_BIN)} --jobs-dir {shlex.quote(str(jobs))} '
              f'run --backend yarn {shlex.quote(str(job))}')
    fresh = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"),
             "SHOAL_YARN_DIR": str(e2e.YARN_DIR)}
    if "HADOOP_USER_NAME" in os.environ:
        fresh["HADOOP_USER_NAME"] = os.environ["HADOOP_USER_NAME"]
    r = subprocess.run(["env", "-i", *(f"{k}={v}" for k, v in fresh.items()), "bash", "-c",
                        script], capture_output=True, text=True, timeout=240, cwd=tmp_path,
                       start_new_session=True)
    assert r.returncode == 0, e2e.fail_message(r)
    assert "NoClassDefFoundError" not in r.stderr, r.stderr
    lines = set(r.stdout.splitlines())
    assert {"worker:0 | hello from worker 0", "worker:1 | hello from worker 1"} <= lines, r.stdout
    app = app_of(cluster, e2e.only_job_dir(jobs).name)
    assert (app["state"], app["finalStatus"]) == ("FINISHED", "SUCCEEDED"), app
    # The staged files are gone with the application.
    e2e.wait_until(lambda: hdfs_status(cluster, staging_dir(app["id"])) is None, 30,
                   "the staging directory to be removed")


def test_an_am_without_hadoop_on_its_classpath_is_reported_as_a_classpath_problem(
        run_shoal, write_job, jobs_dir, cluster, yarn_env):
    job = write_job("""
        name: yarn-bad-classpath
        roles:
          worker: {command: ["true"], resources: {cpus: 1, memory: 128MiB}}
        """)
    bogus = "/nonexistent/hadoop/*"
    r = run_shoal("run", "--backend", "yarn", job, timeout=120,
                  env={**yarn_env, "SHOAL_YARN_AM_CLASSPATH": bogus})
    assert r.returncode == 1, e2e.fail_message(r)
    err = r.stderr
    # What is wrong, with which setting, and how to fix it; not a Java stack trace.
    assert "the YARN application master could not start: Java found no class org.apache.hadoop." \
        in err, err
    assert f"{bogus} (from SHOAL_YARN_AM_CLASSPATH)" in err, err
    assert "yarn.application.classpath" in err, err
    assert "\tat " not in err and "Exception in thread" not in err, err
    app = app_of(cluster, e2e.only_job_dir(jobs_dir).name)
    assert app["finalStatus"] == "FAILED", app
    e2e.wait_until(lambda: hdfs_status(cluster, staging_dir(app["id"])) is None, 30,
                   "the staging directory to be removed")


def java_processes_with(text):
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if text.encode() in argv:
            found.append(int(pid))
    return found


def test_the_am_jar_and_the_agent_binary_reach_the_containers_from_hdfs(
        run_shoal, detach_job, write_job, wait_for_state, jobs_dir, cluster, yarn_env):
    job = write_job("""
        name: yarn-localized
        roles:
          worker:
            instances: 1
            command: ["sleep", "300"]
            resources: {cpus: 1, memory: 128MiB}
        """)
    job_id = detach_job(job, "--backend", "yarn", env=yarn_env)
    wait_for_state(job_id, lambda s: s["state"] == "running", 90, "the job to run")
    app = app_of(cluster, job_id)
    staged = staging_dir(app["id"])
    # Staged on HDFS, byte for byte the files of this machine.
    jar = hdfs_status(cluster, f"{staged}/shoal-yarn-am.jar")
    binary = hdfs_status(cluster, f"{staged}/shoal")
    assert jar and jar["length"] == AM_JAR.stat().st_size, jar
    assert binary and binary["length"] == os.path.getsize(e2e.SHOAL_BIN), binary
    # The agent runs the NodeManager's localized copy, linked into its container's directory,
    # not this checkout's build.
    (agent,) = e2e.agent_processes(jobs_dir / job_id)
    argv0 = open(f"/proc/{agent}/cmdline", "rb").read().split(b"\0")[0].decode()
    container_dir = os.readlink(f"/proc/{agent}/cwd")
    assert argv0 == f"{container_dir}/shoal", (argv0, container_dir)
    exe = os.readlink(f"/proc/{agent}/exe")
    assert exe != os.path.realpath(e2e.SHOAL_BIN) and "/filecache/" in exe, exe
    # So does the AM: its jar is the localized one in its container's directory.
    (am,) = java_processes_with("shoal.yarn.ShoalAppMaster")
    environ = dict(kv.split(b"=", 1) for kv in
                   open(f"/proc/{am}/environ", "rb").read().split(b"\0") if b"=" in kv)
    classpath = environ[b"CLASSPATH"].decode().split(":")
    am_dir = os.readlink(f"/proc/{am}/cwd")
    assert classpath[0] == f"{am_dir}/shoal-yarn-am.jar", classpath
    assert str(AM_JAR) not in classpath, classpath
    assert "/filecache/" in os.path.realpath(classpath[0]), classpath
    r = run_shoal("kill", job_id, timeout=60)
    assert r.returncode == 0, r.stderr
    wait_for_state(job_id, lambda s: s["state"] == "killed", 60, "the job to be killed")
    # A killed AM cannot clean up: the master removes the staging directory.
    e2e.wait_until(lambda: hdfs_status(cluster, staged) is None, 30,
                   "the staging directory to be removed")


def hdfs_listing(cluster, path):
    parts = urllib.parse.urlsplit(cluster["SHOAL_WEBHDFS"])
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    conn.request("GET", f"/webhdfs/v1{path}?op=LISTSTATUS&user.name=shoal")
    response = conn.getresponse()
    data = response.read()
    conn.close()
    if response.status == 404:
        return []
    assert response.status == 200, data
    return [s["pathSuffix"] for s in json.loads(data)["FileStatuses"]["FileStatus"]]


def test_ddp_resumes_from_its_hdfs_checkpoint_after_a_worker_container_is_killed(
        start_shoal, write_job, repo_root, jobs_dir, cluster, yarn_env, tmp_path):
    train = repo_root / "examples" / "pytorch-ddp" / "train.py"
    ckpt = f"/e2e/{tmp_path.name}/ckpt"
    # The tasks run in containers with the NodeManager's environment: the job file gives them
    # this checkout's SDK and the NameNode's WebHDFS address.
    job = write_job(f"""
        name: yarn-hdfs-ckpt
        framework: pytorch
        on_failure: restart-group
        max_restarts: 3
        backoff: {{initial: 100ms, max: 100ms}}
        checkpoint: {{dir: "{cluster['SHOAL_HDFS']}{ckpt}", keep: 2}}
        roles:
          worker:
            instances: 2
            command: ["/usr/bin/python3", "{train}", "--epochs", "10", "--checkpoint-every", "10",
                      "--step-delay", "0.05"]
            resources: {{cpus: 1, memory: 1GiB}}
            env:
              SHOAL_WEBHDFS: "{cluster['SHOAL_WEBHDFS']}"
        """)
    client = start_shoal("run", "--backend", "yarn", job, env=yarn_env)
    job_dir = e2e.wait_for_job(jobs_dir, timeout=60)
    e2e.wait_until(lambda: [n for n in hdfs_listing(cluster, ckpt) if n.startswith("ckpt-")],
                   120, "a checkpoint on HDFS")
    agents = e2e.wait_until(lambda: e2e.agent_processes(job_dir) or None, 30, "the agents")
    assert len(agents) == 2, agents
    # A whole worker container, killed mid-training as a lost NodeManager would lose it.
    os.kill(agents[-1], 9)
    rc = client.wait(240)
    out = client.stdout()
    assert rc == 0, f"rc={rc}\n{out}\n{client.stderr()}"
    resumed = [int(m.group(1)) for l in out.splitlines()
               if (m := re.search(r"resumed from checkpoint step (\d+)", l))]
    assert resumed and min(resumed) > 0, out
    accuracy = [float(m.group(1)) for l in out.splitlines()
                if (m := re.fullmatch(r"worker:0 \| final_accuracy=([0-9.]+)", l))]
    assert accuracy and accuracy[-1] >= 0.90, out
    events = e2e.read_events(job_dir)
    assert e2e.events_of(events, "place_lost"), "no container was lost"
    assert [e for e in e2e.events_of(events, "place_replacing") if e["ok"]]
    names = hdfs_listing(cluster, ckpt)
    assert len([n for n in names if n.startswith("ckpt-")]) == 2, names  # keep: 2
    assert not [n for n in names if n.startswith(".tmp-")], names


def test_hdfs_checkpoint_write_killed_midway_leaves_the_previous_one_readable(cluster, tmp_path):
    """The SDK's WebHdfsStorage is all or nothing: a writer killed between the two halves of a
    checkpoint (SHOAL_TEST_CHECKPOINT_WRITE_DELAY_S) leaves only a temporary, which listing
    ignores and the next save removes."""
    ckpt = f"/e2e/{tmp_path.name}/torn"
    uri = f"{cluster['SHOAL_HDFS']}{ckpt}"
    env = {**e2e.base_env(), "SHOAL_WEBHDFS": cluster["SHOAL_WEBHDFS"]}
    script = ("import shoal, sys\n"
              f"c = shoal.Checkpointer(dir={uri!r}, serializer='raw')\n"
              "c.save(int(sys.argv[1]), sys.argv[2].encode() * 100000)\n"
              "print('SAVED', flush=True)\n")
    r = subprocess.run(["/usr/bin/python3", "-c", script, "10", "a"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "SAVED" in r.stdout, r.stderr
    writer = subprocess.Popen(["/usr/bin/python3", "-c", script, "20", "b"],
                              env={**env, "SHOAL_TEST_CHECKPOINT_WRITE_DELAY_S": "120"},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        e2e.wait_until(lambda: [n for n in hdfs_listing(cluster, ckpt) if n.startswith(".tmp-")],
                       60, "the half-written temporary")
    finally:
        writer.kill()
        writer.wait(30)
    reader = ("import shoal\n"
              f"c = shoal.Checkpointer(dir={uri!r}, serializer='raw')\n"
              "step, data = c.load_latest()\n"
              "print(step, len(data), set(data))\n")
    r = subprocess.run(["/usr/bin/python3", "-c", reader], env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[:2] == ["10", "100000"], r.stdout
    r = subprocess.run(["/usr/bin/python3", "-c", script, "30", "c"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    names = hdfs_listing(cluster, ckpt)
    assert sorted(names) == ["ckpt-000000000010.pt", "ckpt-000000000030.pt"], names
