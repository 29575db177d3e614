"""Parquet datasets on HDFS (`dataset: {parquet: hdfs://...}`), on the project's HDFS
mini-cluster (tests/yarn/cluster.sh; ctest's yarn_cluster fixture brings it up): `shoal run`
lists the directory through WebHDFS (part files in name order, without _SUCCESS and .crc), each
task reads its leased file alone through WebHDFS, and a missing, empty or non-Parquet HDFS
dataset is refused before anything starts. The jobs themselves run on the local backend.
"""

import json
import secrets
import subprocess

import pytest

import shoal_e2e as e2e
from shoal import webhdfs

SPARK_PYTHON = "/var/cache/shoal/venvs/spark/bin/python"
USER = "shoal"

WRITE_PART = """
import sys
import pyarrow as pa, pyarrow.parquet as pq
first, rows = int(sys.argv[2]), int(sys.argv[3])
pq.write_table(pa.table({"id": pa.array(range(first, first + rows), type=pa.int64())}), sys.argv[1])
"""

READER = """
import shoal
for shard in shoal.shards(0):
    ids = shard.read_numpy(columns=["id"])["id"].tolist()
    print("SHARD", shard.id, shard.file, ids, flush=True)
    shard.done(len(ids))
"""


@pytest.fixture(autouse=True, scope="module")
def spark_venv_has_this_sdk():
    """The tasks import the SDK installed in the spark venv (or the one PYTHONPATH names)."""
    r = subprocess.run([SPARK_PYTHON, "-c", "import shoal; shoal.Shard.read_numpy"],
                       capture_output=True, text=True, env=e2e.base_env())
    assert r.returncode == 0, (
        f"{SPARK_PYTHON} has no shoal SDK with Shard.read_numpy (run ./setup.sh, which installs "
        f"this checkout's SDK into the spark venv, or set PYTHONPATH=sdk/python):\n{r.stderr}")


def hdfs_dataset(cluster, tmp_path, files, rows):
    """Uploads `files` Parquet files (file f: ids [f*rows, (f+1)*rows)) with Spark's _SUCCESS
    and .crc files; (uri, path, client)."""
    client = webhdfs.WebHdfsClient(cluster["SHOAL_WEBHDFS"], USER)
    path = f"/parquet-datasets/{secrets.token_hex(4)}/digits.parquet"
    client.mkdirs(path)
    for f in reversed(range(files)):  # uploaded out of order: the listing sorts by name
        local = tmp_path / f"part-{f}.parquet"
        subprocess.run([SPARK_PYTHON, "-c", WRITE_PART, str(local), str(f * rows), str(rows)],
                       check=True, env=e2e.base_env())
        name = f"part-{f:05d}-9e2a.c000.snappy.parquet"
        client.create(f"{path}/{name}", local.read_bytes())
        client.create(f"{path}/.{name}.crc", b"crc")
    client.create(f"{path}/_SUCCESS", b"")
    return f"{cluster['SHOAL_HDFS']}{path}", path, client


def test_an_hdfs_parquet_dataset_is_listed_and_each_task_reads_its_file(
        tmp_path, write_file, write_job, run_shoal, jobs_dir):
    cluster = e2e.yarn_cluster_env()
    uri, path, _ = hdfs_dataset(cluster, tmp_path, 3, 4)
    write_file("reader.py", READER)
    job = write_job(f"""
        name: hdfsparquet
        dataset: {{parquet: '{uri}'}}
        roles:
          reader:
            instances: 2
            command: ["{SPARK_PYTHON}", reader.py]
        """)
    env = {"SHOAL_WEBHDFS": cluster["SHOAL_WEBHDFS"], "HADOOP_USER_NAME": USER}
    r = run_shoal("run", job, env=env, timeout=120)
    assert r.returncode == 0, (r.stdout, r.stderr)
    expected = [f"{uri}/part-{f:05d}-9e2a.c000.snappy.parquet" for f in range(3)]
    job_dir = e2e.job_dirs(jobs_dir)[0]
    assert json.loads((job_dir / "submit.json").read_text())["dataset_files"] == expected
    shards = sorted(l.split(" | ", 1)[1] for l in r.stdout.splitlines() if " | SHARD " in l)
    assert shards == [f"SHARD {f} {expected[f]} {list(range(f * 4, f * 4 + 4))}"
                      for f in range(3)], r.stdout


def test_missing_empty_or_non_parquet_hdfs_datasets_are_refused(tmp_path, write_job, run_shoal,
                                                                jobs_dir):
    cluster = e2e.yarn_cluster_env()
    uri, path, client = hdfs_dataset(cluster, tmp_path, 1, 2)
    client.mkdirs(f"{path}-empty")
    client.create(f"{path}-empty/_SUCCESS", b"")
    client.create(f"{path}/part-00001.csv", b"id\n1\n")
    env = {"SHOAL_WEBHDFS": cluster["SHOAL_WEBHDFS"], "HADOOP_USER_NAME": USER}
    cases = [(f"{uri}-nowhere", f"{uri}-nowhere does not exist"),
             (f"{uri}-empty", f"{uri}-empty holds no Parquet files"),
             (uri, f"{uri}/part-00001.csv is not a Parquet file: over WebHDFS a Parquet file is "
                   f"one whose name ends in .parquet")]
    for location, message in cases:
        job = write_job(f"""
            name: badhdfs
            dataset:
              parquet: '{location}'
            roles:
              worker: {{command: [/bin/true]}}
            """)
        r = run_shoal("run", job, env=env)
        assert r.returncode == 2, (location, r.stdout, r.stderr)
        assert f"{job}:3: dataset.parquet: {message}" in r.stderr, r.stderr
        assert e2e.job_dirs(jobs_dir) == []
