"""Parquet datasets (`dataset: {parquet: DIR}`): one shard per Parquet file of a directory as
Spark writes it, listed once by `shoal run` and fixed in submit.json and the journal; each
file is consumed exactly once per epoch across a SIGKILLed task; bad datasets are refused
before anything starts. The tasks read their shard with Shard.read_numpy, under the spark venv's
python (the only one with pyarrow).
"""

import json
import os
import signal
import subprocess

import pytest

import shoal_e2e as e2e

SPARK_PYTHON = "/var/cache/shoal/venvs/spark/bin/python"

# Writes `files` Parquet files of `rows` ids each (file f holds ids [f*rows, (f+1)*rows)), named
# and surrounded as Spark leaves them: _SUCCESS, hidden .crc files.
WRITE_DATASET = """
import os, sys
import pyarrow as pa, pyarrow.parquet as pq
out, files, rows = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
os.makedirs(out, exist_ok=True)
for f in range(files):
    name = f"part-{f:05d}-4f1c.c000.snappy.parquet"
    pq.write_table(pa.table({"id": pa.array(range(f * rows, (f + 1) * rows), type=pa.int64())}),
                   os.path.join(out, name))
    open(os.path.join(out, f".{name}.crc"), "wb").write(b"crc")
open(os.path.join(out, "_SUCCESS"), "w").close()
"""


@pytest.fixture(autouse=True, scope="module")
def spark_venv_has_this_sdk():
    """The tasks import the SDK installed in the spark venv (or the one PYTHONPATH names): one
    older than Shard.read_numpy would fail every test here for a reason of its own."""
    r = subprocess.run([SPARK_PYTHON, "-c", "import shoal; shoal.Shard.read_numpy"],
                       capture_output=True, text=True, env=e2e.base_env())
    assert r.returncode == 0, (
        f"{SPARK_PYTHON} has no shoal SDK with Shard.read_numpy (run ./setup.sh, which installs "
        f"this checkout's SDK into the spark venv, or set PYTHONPATH=sdk/python):\n{r.stderr}")


def write_dataset(directory, files, rows):
    subprocess.run([SPARK_PYTHON, "-c", WRITE_DATASET, str(directory), str(files), str(rows)],
                   check=True, env=e2e.base_env())


PARQUET_WORKER = """
import json, os, sys, time
import shoal
out, epochs, kill_plan = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
task, attempt = shoal.env.task(), shoal.env.restart_count()
# [epoch, n]: this attempt stops halfway through the n-th shard it leases in that epoch and
# waits there for the test to SIGKILL it.
plan = kill_plan.get(f"{task}/{attempt}")
step = 0
for epoch in range(epochs):
    leased = 0
    for shard in shoal.shards(epoch):
        column = shard.read_numpy(columns=["id"])["id"]
        ids = []
        for i in column.tolist():
            ids.append(i)
            step += 1
            shoal.progress(step)
            time.sleep(0.003)
            if plan == [epoch, leased] and len(ids) == len(column) // 2:
                print(f"MIDSHARD epoch {epoch} shard {shard.id}", flush=True)
                time.sleep(120)
        leased += 1
        try:
            shard.done(step)
        except shoal.LeaseLost as e:
            print(f"LEASELOST {e}", flush=True)
            continue
        name = os.path.join(out, f"e{epoch}-s{shard.id}.json")
        with open(name + f".tmp-{os.getpid()}", "w") as f:
            json.dump({"ids": ids, "file": shard.file, "task": task, "attempt": attempt}, f)
        os.rename(name + f".tmp-{os.getpid()}", name)
print(f"finished attempt {attempt}", flush=True)
"""

FILES, ROWS, EPOCHS = 8, 40, 2


def test_each_parquet_file_is_consumed_once_per_epoch_across_a_killed_task(
        tmp_path, write_file, write_job, start_shoal, jobs_dir, shoal_status):
    data = tmp_path / "digits.parquet"
    write_dataset(data, FILES, ROWS)
    write_file("parquet_worker.py", PARQUET_WORKER)
    out = tmp_path / "out"
    out.mkdir()
    plan = {"worker:1/0": [0, 1], "worker:0/0": [1, 0]}
    job = write_job(f"""
        name: parquetonce
        on_failure: restart-task
        max_restarts: 3
        backoff: {{initial: 100ms, max: 100ms}}
        dataset: {{parquet: ./digits.parquet, epochs: {EPOCHS}}}
        roles:
          worker:
            instances: 2
            command: ["{SPARK_PYTHON}", "parquet_worker.py", "{out}", "{EPOCHS}", '{json.dumps(plan)}']
            resources: {{cpus: 0.5}}
        """)
    client = start_shoal("run", job)
    job_dir = e2e.wait_for_job(jobs_dir, "parquetonce")
    job_id = job_dir.name
    killed = []
    for key in plan:
        task, attempt = key.split("/")
        epoch = plan[key][0]

        def midshard():
            lines = [l for l in client.stdout().splitlines()
                     if l.startswith(f"{task} | MIDSHARD epoch {epoch} ")]
            if not lines:
                return None
            status = shoal_status(job_id)
            t = next(t for t in status["tasks"] if t["task"] == task)
            return t if t["restarts"] == int(attempt) and t["state"] == "running" else None
        victim = e2e.wait_until(midshard, 60, f"{task} attempt {attempt} to stop mid-shard")
        assert e2e.kill_task(victim["pid"], job_id), victim
        killed.append((task, int(attempt), epoch))
    rc = client.wait(120)
    assert rc == 0, f"rc={rc}\n{client.stdout()[-3000:]}\n{client.stderr()[-3000:]}"
    assert "LEASELOST" not in client.stdout()

    # The listing, fixed at submission: the part files in name order, nothing else.
    expected = [str(data / f"part-{f:05d}-4f1c.c000.snappy.parquet") for f in range(FILES)]
    submit = json.loads((job_dir / "submit.json").read_text())
    assert submit["dataset_files"] == expected
    events = e2e.read_events(job_dir)
    listed = e2e.events_of(events, "dataset_listed")
    assert len(listed) == 1 and listed[0]["files"] == expected, listed
    assert listed[0]["location"] == str(data)

    done = {}
    for e in e2e.events_of(events, "shard_done"):
        key = (e["epoch"], e["shard"])
        assert key not in done, f"shard {key} done twice: {done[key]} and {e}"
        done[key] = e
    assert set(done) == {(e, s) for e in range(EPOCHS) for s in range(FILES)}, sorted(done)
    returned = e2e.events_of(events, "shard_returned")
    for task, attempt, epoch in killed:
        lost = [r for r in returned if (r["task"], r["attempt"]) == (task, attempt)]
        assert len(lost) == 1 and lost[0]["epoch"] == epoch, (task, attempt, returned)

    # The record the tasks wrote: shard s is file s, and every id exactly once per epoch.
    for epoch in range(EPOCHS):
        ids = []
        for s in range(FILES):
            rec = json.loads((out / f"e{epoch}-s{s}.json").read_text())
            assert rec["file"] == expected[s]
            assert (rec["task"], rec["attempt"]) == (done[(epoch, s)]["task"],
                                                     done[(epoch, s)]["attempt"]), rec
            ids += rec["ids"]
        assert sorted(ids) == list(range(FILES * ROWS)), f"epoch {epoch}: ids not exactly once"
    status = shoal_status(job_id)
    assert status["state"] == "succeeded"
    assert [c["done"] for c in status["shards"]["epoch_counts"]] == [FILES] * EPOCHS


# Each task pauses after its first shard, between `done` and the next `lease`, until the test
# says go: the master is replaced while no SDK request is in flight (one sent to a master that
# dies is not answered, and the SDK would time out after 30 s).
PAUSING_READER = """
import json, os, sys, time
import shoal
out, epochs = sys.argv[1], int(sys.argv[2])
step = 0
for epoch in range(epochs):
    for shard in shoal.shards(epoch):
        ids = shard.read_numpy(columns=["id"])["id"].tolist()
        for i in ids:
            step += 1
            shoal.progress(step)
        shard.done(step)
        name = os.path.join(out, f"e{epoch}-s{shard.id}.json")
        with open(name + ".tmp", "w") as f:
            json.dump({"ids": ids, "file": shard.file}, f)
        os.rename(name + ".tmp", name)
        paused = os.path.join(out, "paused-" + shoal.env.task())
        if not os.path.exists(paused):
            open(paused, "w").close()
            while not os.path.exists(os.path.join(out, "go")):
                time.sleep(0.05)
"""


def test_a_replaced_master_hands_out_the_shards_listed_at_submission(
        tmp_path, write_file, write_job, detach_job, start_shoal, jobs_dir):
    data = tmp_path / "data"
    write_dataset(data, 6, 10)
    write_file("pausing_reader.py", PAUSING_READER)
    out = tmp_path / "out"
    out.mkdir()
    job = write_job(f"""
        name: parquetrecover
        dataset: {{parquet: ./data, epochs: 2}}
        roles:
          worker:
            instances: 2
            command: ["{SPARK_PYTHON}", pausing_reader.py, "{out}", "2"]
            resources: {{cpus: 0.5}}
        """)
    job_id = detach_job(job, env={"SHOAL_AGENT_MASTER_GRACE_MS": "30000"})
    job_dir = jobs_dir / job_id
    listed = json.loads((job_dir / "submit.json").read_text())["dataset_files"]
    e2e.wait_until(lambda: (out / "paused-worker:0").exists() and
                   (out / "paused-worker:1").exists(), 60, "both workers to pause")
    os.kill(json.loads((job_dir / "master.json").read_text())["pid"], signal.SIGKILL)
    # A file that sorts first: listed again, every shard id would now name another file.
    subprocess.run([SPARK_PYTHON, "-c", WRITE_DATASET, str(tmp_path / "extra"), "1", "10"],
                   check=True, env=e2e.base_env())
    (tmp_path / "extra" / "part-00000-4f1c.c000.snappy.parquet").rename(
        data / "part-00000-0000.c000.snappy.parquet")

    client = start_shoal("resume", job_id)
    e2e.wait_until(lambda: len(e2e.events_of(e2e.read_events(job_dir), "agent_reattached")) >= 1,
                   60, "the new master to take the agent back")
    (out / "go").touch()
    rc = client.wait(120)
    assert rc == 0, client.stderr()
    events = e2e.read_events(job_dir)
    assert len(e2e.events_of(events, "master_recovered")) == 1
    assert [e["files"] for e in e2e.events_of(events, "dataset_listed")] == [listed]
    done = [(e["epoch"], e["shard"]) for e in e2e.events_of(events, "shard_done")]
    assert sorted(done) == [(e, s) for e in range(2) for s in range(6)], done
    for epoch in range(2):
        ids = []
        for s in range(6):
            rec = json.loads((out / f"e{epoch}-s{s}.json").read_text())
            assert rec["file"] == listed[s]
            ids += rec["ids"]
        assert sorted(ids) == list(range(60)), f"epoch {epoch}"
    final = json.loads((job_dir / "status.json").read_text())
    assert final["state"] == "succeeded", final


def refused(run_shoal, write_job, jobs_dir, parquet, line_text):
    job = write_job(f"""
        name: badparquet
        dataset:
          parquet: {parquet}
        roles:
          worker: {{command: [/bin/true]}}
        """)
    r = run_shoal("run", job)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert f"{job}:3: dataset.parquet: {line_text}" in r.stderr, r.stderr
    # Nothing started: no job directory.
    assert e2e.job_dirs(jobs_dir) == []
    return r.stderr


def test_missing_empty_or_non_parquet_datasets_are_refused_before_anything_starts(
        tmp_path, run_shoal, write_job, jobs_dir):
    refused(run_shoal, write_job, jobs_dir, "./nowhere", f"{tmp_path}/nowhere does not exist")
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "_SUCCESS").write_text("")
    (empty / ".part-00000.parquet.crc").write_text("")
    refused(run_shoal, write_job, jobs_dir, "./empty",
            f"{empty} holds no Parquet files (hidden and _-prefixed files such as _SUCCESS are "
            f"not data)")
    csv = tmp_path / "csv"
    write_dataset(csv, 1, 3)
    (csv / "part-00001.csv").write_text("id\n1\n2\n")
    refused(run_shoal, write_job, jobs_dir, "./csv",
            f"{csv}/part-00001.csv is not a Parquet file (a Parquet file begins and ends with "
            f"PAR1; this one has 7 bytes)")
    (tmp_path / "notes.txt").write_text("not parquet at all")
    refused(run_shoal, write_job, jobs_dir, "./notes.txt", f"{tmp_path}/notes.txt is not a Parquet")
    partitioned = tmp_path / "partitioned"
    write_dataset(partitioned / "label=3", 1, 3)
    refused(run_shoal, write_job, jobs_dir, "./partitioned",
            f"{partitioned} holds the directory label=3: partitioned Parquet datasets")


def test_a_single_parquet_file_is_one_shard(tmp_path, write_file, write_job, run_shoal, jobs_dir):
    write_dataset(tmp_path / "d", 1, 5)
    single = tmp_path / "d" / "part-00000-4f1c.c000.snappy.parquet"
    write_file("one.py", """
import shoal
for shard in shoal.shards(0):
    print("SHARD", shard.id, shard.file, shard.read_numpy()["id"].tolist(), flush=True)
    shard.done(1)
""")
    job = write_job(f"""
        name: singleparquet
        dataset: {{parquet: {single}}}
        roles:
          worker: {{command: ["{SPARK_PYTHON}", one.py]}}
        """)
    r = run_shoal("run", job, timeout=60)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert f"SHARD 0 {single} [0, 1, 2, 3, 4]" in r.stdout


# ------------------------------------------------------------------------------------------
# examples/spark-parquet: PySpark prepares, Shoal trains

def test_spark_parquet_example_trains_to_its_threshold_across_a_killed_trainer(
        tmp_path, repo_root, start_shoal, jobs_dir, shoal_status):
    example = repo_root / "examples" / "spark-parquet"
    work = tmp_path / "example"
    work.mkdir()
    (work / "train.py").write_text((example / "train.py").read_text())
    # Slowed down so that the trainer can be killed mid-run; otherwise the example's own job.
    job_text = (example / "job.yaml").read_text()
    assert '--epochs, "10",' in job_text
    (work / "job.yaml").write_text(
        job_text.replace('--epochs, "10",', '--epochs, "10", --step-delay, "0.01",'))
    # PySpark in local[2] with a 1g driver; its JVM ends with the script (spark.stop()).
    r = subprocess.run([SPARK_PYTHON, str(example / "prepare.py"), "--out", str(work / "data")],
                       capture_output=True, text=True, timeout=300, env=e2e.base_env())
    assert r.returncode == 0, r.stdout + r.stderr
    parts = sorted(p.name for p in (work / "data" / "digits-train.parquet").iterdir()
                   if p.name.endswith(".parquet") and not p.name.startswith("."))
    assert len(parts) == 6, parts

    client = start_shoal("run", work / "job.yaml")
    job_dir = e2e.wait_for_job(jobs_dir, "digits-parquet")
    # In the second epoch, after a checkpoint: the group restarts from it.
    e2e.wait_until(lambda: any(e["epoch"] >= 1 for e in e2e.events_of(
        e2e.read_events(job_dir), "shard_done")), 120, "a shard of the second epoch to be done")
    trainer = next(t for t in shoal_status(job_dir.name)["tasks"] if t["task"] == "trainer:0")
    assert e2e.kill_task(trainer["pid"], job_dir.name), trainer
    rc = client.wait(300)
    out = client.stdout()
    assert rc == 0, f"{out[-3000:]}\n{client.stderr()[-3000:]}"
    assert "trainer:0 | resumed from checkpoint step" in out, out[-3000:]
    accuracy = [float(l.split("=", 1)[1]) for l in out.splitlines()
                if l.startswith("trainer:0 | final_accuracy=")]
    assert len(accuracy) == 1 and accuracy[0] >= 0.9, out[-3000:]
    events = e2e.read_events(job_dir)
    assert len(e2e.events_of(events, "group_restart_begun")) == 1
    status = shoal_status(job_dir.name)
    assert status["state"] == "succeeded"
    assert [c["done"] for c in status["shards"]["epoch_counts"]] == [6] * 10
