"""The Spark benchmarks' drivers (bench/spark_submit.py, bench/spark_recovery.py) without a Spark
cluster: a missing cluster is an `error` field in their JSON, the bare anchor refuses bad
arguments, and the recovery driver tells the chief from the worker it kills by each real
process's TF_CONFIG. No timing is asserted; the runs against a cluster are the drivers' own."""

import importlib.util
import json
import subprocess
import sys

import shoal_e2e as e2e

BENCH_DIR = e2e.REPO_ROOT / "bench"


def load(name):
    sys.path.insert(0, str(BENCH_DIR))
    spec = importlib.util.spec_from_file_location(name, BENCH_DIR / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def no_cluster_env(tmp_path):
    # An empty state directory: no env file of tests/spark/cluster.sh to find the cluster in.
    return e2e.base_env({"SHOAL_SPARK_DIR": str(tmp_path / "no-cluster")})


def test_both_drivers_report_a_missing_cluster_as_an_error(tmp_path):
    for driver in ("spark_submit.py", "spark_recovery.py"):
        r = subprocess.run([sys.executable, str(BENCH_DIR / driver), "--shoal", e2e.SHOAL_BIN,
                            "--reps", "1"], capture_output=True, text=True, timeout=60,
                           env=no_cluster_env(tmp_path))
        assert r.returncode == 1, (driver, r.stderr)
        result = json.loads(r.stdout)
        assert "no Spark cluster" in result["error"], (driver, result)
        assert "tests/spark/cluster.sh up" in result["error"]


def test_the_cluster_comes_from_the_env_file_of_the_test_cluster(tmp_path, monkeypatch):
    state = tmp_path / "spark"
    state.mkdir()
    (state / "env").write_text("SHOAL_SPARK_MASTER=spark://127.0.0.1:7999\n"
                               "SHOAL_SPARK_MASTER_WEB=http://127.0.0.1:8999\n")
    monkeypatch.setenv("SHOAL_SPARK_DIR", str(state))
    monkeypatch.delenv("SHOAL_SPARK_MASTER", raising=False)
    monkeypatch.delenv("SHOAL_SPARK_MASTER_WEB", raising=False)
    found = load("spark_submit").cluster_env()
    assert found["SHOAL_SPARK_MASTER"] == "spark://127.0.0.1:7999"
    assert found["SHOAL_SPARK_MASTER_WEB"] == "http://127.0.0.1:8999"
    # The environment wins over the file.
    monkeypatch.setenv("SHOAL_SPARK_MASTER", "spark://10.0.0.1:7077")
    assert load("spark_submit").cluster_env()["SHOAL_SPARK_MASTER"] == "spark://10.0.0.1:7077"


def test_the_bare_anchor_refuses_bad_arguments_with_exit_2():
    for argv in ([], ["two", "true"], ["0", "true"], ["2"]):
        r = subprocess.run([e2e.PYTHON, str(BENCH_DIR / "spark" / "bare_barrier.py"), *argv],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 2, (argv, r.stderr)
        assert "usage: bare_barrier.py N COMMAND" in r.stderr


def test_the_victim_is_never_the_chief(tmp_path):
    recovery = load("spark_recovery")
    cluster_with_chief = {"chief": ["h:1"], "worker": ["h:2"]}   # TensorFlowOnSpark's
    cluster_of_workers = {"worker": ["h:1", "h:2"]}              # Shoal's framework: tensorflow
    cases = [(cluster_with_chief, {"type": "chief", "index": 0}, True),
             (cluster_with_chief, {"type": "worker", "index": 0}, False),
             (cluster_of_workers, {"type": "worker", "index": 0}, True),
             (cluster_of_workers, {"type": "worker", "index": 1}, False)]
    procs = []
    try:
        for cluster, task, _ in cases:
            env = e2e.base_env({"TF_CONFIG": json.dumps({"cluster": cluster, "task": task})})
            procs.append(subprocess.Popen(["sleep", "60"], env=env))
        for proc, (_, task, chief) in zip(procs, cases):
            assert recovery.is_chief(proc.pid) is chief, task
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    assert recovery.is_chief(procs[0].pid) is None  # gone


def test_stamps_are_read_per_process_and_only_once_stepped(tmp_path):
    recovery = load("spark_recovery")
    (tmp_path / "11.jsonl").write_text(
        json.dumps({"pid": 11, "t_site": 1.0, "t_first": 2.0}) + "\n"
        + json.dumps({"pid": 11, "t_site": 1.0, "t_fit_end": 9.0}) + "\n")
    (tmp_path / "12.jsonl").write_text("{\"pid\": 12, \"t_site\": 1.5")  # being written
    stamps = recovery.read_stamps(tmp_path)
    assert list(stamps) == [11]
    assert stamps[11]["t_first"] == 2.0
