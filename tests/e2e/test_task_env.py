"""What every task gets from Shoal (framework none): SHOAL_* variables, the cluster spec file,
OMP_NUM_THREADS, its working directory; and what it must not get (the torchrun variables)."""

import json
import re

import pytest

import shoal_e2e as e2e

DUMP = """
import json, os, sys
name = f"{os.environ['SHOAL_ROLE']}-{os.environ['SHOAL_INDEX']}"
with open(os.path.join(sys.argv[1], name + ".json"), "w") as f:
    json.dump({"env": dict(os.environ), "cwd": os.getcwd()}, f)
"""

TORCH_ONLY = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK",
              "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_NAME", "ROLE_RANK",
              "ROLE_WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
              "TORCHELASTIC_RUN_ID")


@pytest.fixture
def dumped(tmp_path, write_file, write_job, run_shoal, jobs_dir):
    """Runs a three-role job whose tasks dump their environment; returns (job_dir, dumps)."""
    script = write_file("dump.py", DUMP)
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "sub").mkdir()
    job = write_job(f"""
        name: envjob
        roles:
          alpha:
            instances: 1
            command: ["/usr/bin/python3", "{script}", "{out}"]
            resources: {{cpus: 1.5}}
          beta:
            instances: 2
            command: ["/usr/bin/python3", "{script}", "{out}"]
            working_dir: sub
            resources: {{cpus: 0.125}}
          gamma:
            instances: 1
            command: /usr/bin/python3 {script} {out}
            env: {{OMP_NUM_THREADS: 7, CUSTOM_VALUE: "hello world"}}
            resources: {{cpus: 0.125}}
        """)
    r = run_shoal("run", job, timeout=60)
    assert r.returncode == 0, f"rc={r.returncode}\n{r.stderr}"
    (job_dir,) = e2e.job_dirs(jobs_dir)
    dumps = {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}
    assert set(dumps) == {"alpha-0", "beta-0", "beta-1", "gamma-0"}
    return job_dir, dumps


def test_shoal_variables(dumped):
    job_dir, dumps = dumped
    ranks = []
    for name, d in dumps.items():
        env = d["env"]
        role, index = name.split("-")
        assert env["SHOAL_JOB_ID"] == job_dir.name
        assert env["SHOAL_JOB_DIR"] == str(job_dir)
        assert env["SHOAL_ROLE"] == role
        assert env["SHOAL_INDEX"] == index
        ranks.append(int(env["SHOAL_RANK"]))
        for k in TORCH_ONLY:
            assert k not in env, f"{k} set for a framework-none task: {env[k]}"
    assert sorted(ranks) == [0, 1, 2, 3]
    assert dumps["gamma-0"]["env"]["CUSTOM_VALUE"] == "hello world"


def test_omp_num_threads(dumped, write_job, run_shoal, tmp_path):
    _, dumps = dumped
    assert dumps["alpha-0"]["env"]["OMP_NUM_THREADS"] == "1"  # floor(1.5)
    assert dumps["beta-0"]["env"]["OMP_NUM_THREADS"] == "1"   # at least 1
    assert dumps["gamma-0"]["env"]["OMP_NUM_THREADS"] == "7"  # the role's env wins
    job = write_job("""
        name: twocpus
        roles:
          worker:
            command: ["/bin/sh", "-c", "echo omp=$OMP_NUM_THREADS"]
            resources: {cpus: 2}
        """, name="two.yaml")
    r = run_shoal("run", "-q", job, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "worker:0 | omp=2" in r.stdout.splitlines()


def test_working_directory(dumped, tmp_path):
    _, dumps = dumped
    assert dumps["alpha-0"]["cwd"] == str(tmp_path)          # the job file's directory
    assert dumps["gamma-0"]["cwd"] == str(tmp_path)
    assert dumps["beta-1"]["cwd"] == str(tmp_path / "sub")   # working_dir, relative to it


def test_cluster_spec_file_lists_every_task(dumped):
    job_dir, dumps = dumped
    for name, d in dumps.items():
        spec = json.loads(open(d["env"]["SHOAL_CLUSTER_SPEC_FILE"]).read())
        cluster = spec["cluster"]
        assert set(cluster) == {"alpha", "beta", "gamma"}
        assert [len(cluster[r]) for r in ("alpha", "beta", "gamma")] == [1, 2, 1]
        endpoints = [e for r in cluster.values() for e in r]
        assert len(set(endpoints)) == 4, endpoints
        for e in endpoints:
            host, port = e.rsplit(":", 1)
            assert host and 0 < int(port) < 65536


def test_cluster_spec_file_finds_each_task(dumped):
    """docs/environment.md: {"job_id", "restart_count", "cluster": {role: ["host:port"]},
    "tasks": [{"role", "index", "rank", "node", "address", "port"}]}; a task finds itself by
    SHOAL_ROLE and SHOAL_INDEX, and its entry holds its rank and its SHOAL_TASK_PORT."""
    job_dir, dumps = dumped
    for name, d in dumps.items():
        env = d["env"]
        spec = json.loads(open(env["SHOAL_CLUSTER_SPEC_FILE"]).read())
        assert spec["job_id"] == job_dir.name
        assert spec["restart_count"] == 0
        assert len(spec["tasks"]) == 4
        (me,) = [t for t in spec["tasks"]
                 if t["role"] == env["SHOAL_ROLE"] and t["index"] == int(env["SHOAL_INDEX"])]
        assert me["rank"] == int(env["SHOAL_RANK"])
        assert me["port"] == int(env["SHOAL_TASK_PORT"])
        assert me["node"] == env["SHOAL_NODE"]
        assert spec["cluster"][me["role"]][me["index"]] == f"{me['address']}:{me['port']}"
        assert env["SHOAL_JOB_NAME"] == "envjob"
        assert env["SHOAL_WORLD_SIZE"] == "4"
        assert env["SHOAL_ROLE_INSTANCES"] == {"alpha": "1", "beta": "2", "gamma": "1"}[me["role"]]
        assert env["SHOAL_RESTART_COUNT"] == "0"


def test_ranks_put_chief_first_then_file_order(write_file, write_job, run_shoal, tmp_path):
    """docs/environment.md: ranks go to a chief (or master) role first, then roles in file
    order."""
    script = write_file("rank.py", """
        import os
        print(f"rank={os.environ['SHOAL_RANK']}", flush=True)
        """)
    job = write_job(f"""
        name: ranks
        success: {{roles: [worker, evaluator, chief]}}
        roles:
          worker:
            instances: 2
            command: ["/usr/bin/python3", "{script}"]
            resources: {{cpus: 0.25}}
          evaluator:
            instances: 1
            command: ["/usr/bin/python3", "{script}"]
            resources: {{cpus: 0.25}}
          chief:
            instances: 1
            depends_on: [worker, evaluator]
            command: ["/usr/bin/python3", "{script}"]
            resources: {{cpus: 0.25}}
        """, name="ranks.yaml")
    r = run_shoal("run", "-q", job, timeout=60)
    assert r.returncode == 0, r.stderr
    got = dict(l.split(" | rank=") for l in r.stdout.splitlines() if " | rank=" in l)
    assert got == {"chief:0": "0", "worker:0": "1", "worker:1": "2", "evaluator:0": "3"}, got


PORTS_JOB = """
    name: ports
    framework: tensorflow
    roles:
      worker:
        instances: 3
        command: ["/bin/sh", "-c", "echo \\"$TF_CONFIG\\""]
        resources: {cpus: 0.25}
    """


def tf_config_ports(stdout):
    """Every port in the workers' TF_CONFIG cluster specs, from `worker:i | {...}` lines."""
    ports = set()
    for line in stdout.splitlines():
        _, sep, rest = line.partition(" | ")
        if sep and rest.startswith("{"):
            for address in json.loads(rest)["cluster"]["worker"]:
                ports.add(int(address.rsplit(":", 1)[1]))
    return ports


def test_task_ports_come_from_shoal_task_ports_when_it_is_set(write_job, run_shoal):
    # A firewall's open range, say: every port handed to a task is inside it.
    job = write_job(PORTS_JOB)
    r = run_shoal("run", job, timeout=60, env={"SHOAL_TASK_PORTS": "24500-24599"})
    assert r.returncode == 0, r.stderr
    ports = tf_config_ports(r.stdout)
    assert len(ports) == 3 and all(24500 <= p <= 24599 for p in ports), (ports, r.stdout)

    # Unset: below the kernel's ephemeral range, which nothing else picks by itself.
    low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    r = run_shoal("run", job, timeout=60)
    assert r.returncode == 0, r.stderr
    ports = tf_config_ports(r.stdout)
    assert len(ports) == 3 and all(p < low for p in ports), (ports, low)


def test_a_task_port_range_too_small_is_said_and_the_job_still_runs(write_job, run_shoal):
    job = write_job(PORTS_JOB)
    r = run_shoal("run", job, timeout=60, env={"SHOAL_TASK_PORTS": "24600-24600"})
    assert r.returncode == 0, r.stderr
    assert len(tf_config_ports(r.stdout)) == 3, r.stdout
    assert re.search(r"SHOAL_TASK_PORTS 24600-24600 had [01] free port\(s\) of the 3 this "
                     r"node's tasks need; the others were picked by the kernel", r.stderr), r.stderr


@pytest.mark.parametrize("value, why", [
    ("abc", "expected a port range LOW-HIGH"),
    ("80-90", "ports must be from 1024 to 65535"),
    ("30000-20000", "the range 30000-20000 is empty"),
])
def test_a_malformed_task_port_range_is_refused_before_anything_starts(write_job, run_shoal,
                                                                      jobs_dir, value, why):
    job = write_job(PORTS_JOB)
    r = run_shoal("run", job, timeout=30, env={"SHOAL_TASK_PORTS": value})
    assert r.returncode == 2, f"rc={r.returncode}\n{r.stderr}"
    assert f"SHOAL_TASK_PORTS='{value}'" in r.stderr and why in r.stderr, r.stderr
    assert not e2e.job_dirs(jobs_dir), "a job directory was created"


def test_reserved_variables_come_only_from_shoal(write_job, run_shoal):
    """Issue 24, docs/environment.md "What wins": a reserved name in the environment shoal was
    started with (here as an enclosing Shoal task would leave it) is not this task's, so it is
    not passed on; a SHOAL_* setting Shoal does not set itself is."""
    job = write_job("""
        name: inherited
        roles:
          worker:
            command: ["/bin/sh", "-c",
                      'echo "tb=${SHOAL_TENSORBOARD_LOGDIR-unset} hdfs=$SHOAL_WEBHDFS"']
            resources: {cpus: 0.25}
        """)
    r = run_shoal("run", "-q", job, timeout=60,
                  env={"SHOAL_TENSORBOARD_LOGDIR": "/outer/tensorboard",
                       "SHOAL_WEBHDFS": "http://nn:9870"})
    assert r.returncode == 0, r.stderr
    assert "worker:0 | tb=unset hdfs=http://nn:9870" in r.stdout.splitlines(), r.stdout
