"""A task's publications are recorded: every shoal.publish_model of a task under Shoal is a
model_published event in the job's journal, the last one is in status.json and `shoal status`
(text and --json) shows it; a bad report never gets that far."""

import json
import os
import re
import signal

import shoal_e2e as e2e

TRAIN = """
    import json, os, socket, time, shoal, torch

    class Scale(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2

    saved = "scale.pt"
    torch.jit.script(Scale()).save(saved)
    print("published", shoal.publish_model(saved, "mlp", step=100, metrics={"loss": 0.5}))
    # A bad metric is refused before anything is written, and reports nothing.
    try:
        shoal.publish_model(saved, "mlp", step=150, metrics={"loss": float("nan")})
    except shoal.PublishError as e:
        print("refused:", e)
    print("published", shoal.publish_model(saved, "mlp", step=200,
                                           metrics={"loss": torch.tensor(0.25), "accuracy": 0.875}))
    # A report the SDK would never send, straight onto the agent's socket: refused there.
    address = os.environ["SHOAL_AGENT_SOCKET"]
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(b"\\0" + address[1:].encode())
        bad = {"op": "published", "task": "trainer:0", "attempt": 0, "model": "mlp",
               "version": 99, "repository": "/x", "metrics": {"loss": "low"}}
        s.sendall((json.dumps(bad) + "\\n").encode())
        # The end of our own stream, so the agent has read the line before we exit.
        s.shutdown(socket.SHUT_WR)
        s.recv(100)
    # Running on until the test has seen the publication in the live master's status.
    deadline = time.time() + 120
    while not os.path.exists("release") and time.time() < deadline:
        time.sleep(0.05)
    """


def test_publications_are_journaled_and_the_last_is_in_the_status(run_shoal, write_file,
                                                                   write_job, jobs_dir, tmp_path,
                                                                   detach_job, wait_for_state,
                                                                   shoal_status):
    write_file("train.py", TRAIN)
    job = write_job(f"""
        name: recorder
        publish: {{repository: ./models}}
        roles:
          trainer:
            instances: 1
            command: ["{e2e.PYTHON}", "train.py"]
        """)
    (tmp_path / "models").mkdir()
    job_id = detach_job(job)
    repository = str(tmp_path / "models")
    line_re = (r"^model   mlp version 2 at step 200 \(accuracy 0\.875, loss 0\.25\), "
               r"published by trainer:0 \d+s ago$")

    # While the job runs, from its master.
    live = wait_for_state(job_id, lambda s: (s.get("last_publication") or {}).get("version") == 2,
                          120, "the second publication in the live status")
    assert live["state"] == "running"
    assert {k: v for k, v in live["last_publication"].items() if k != "unix_ms"} == {
        "task": "trainer:0", "model": "mlp", "version": 2, "repository": repository,
        "step": 200, "metrics": {"accuracy": 0.875, "loss": 0.25}}
    human = run_shoal("status", job_id, timeout=30)
    assert human.returncode == 0, human.stderr
    assert re.search(line_re, human.stdout, re.M), human.stdout

    (tmp_path / "release").touch()
    done = wait_for_state(job_id, lambda s: s["state"] in ("succeeded", "failed"), 120,
                         "the job to end")
    assert done["state"] == "succeeded", done
    logs = run_shoal("logs", job_id, timeout=30).stdout
    assert "published 1" in logs and "published 2" in logs, logs
    assert "refused: publish_model: metric 'loss' must be a finite number" in logs, logs
    assert sorted(e.name for e in (tmp_path / "models" / "mlp").iterdir()
                  if e.name.isdigit()) == ["1", "2"]

    # Afterwards, from the job's files: the journal has both, status.json the last.
    job_dir = jobs_dir / job_id
    events = e2e.read_events(job_dir)
    published = [e for e in events if e["type"] == "model_published"]
    assert [{k: e[k] for k in ("task", "model", "version", "repository", "step", "metrics")}
            for e in published] == [
        {"task": "trainer:0", "model": "mlp", "version": 1, "repository": repository,
         "step": 100, "metrics": {"loss": 0.5}},
        {"task": "trainer:0", "model": "mlp", "version": 2, "repository": repository,
         "step": 200, "metrics": {"accuracy": 0.875, "loss": 0.25}},
    ]
    log = (job_dir / "master.log").read_text()
    assert ("task trainer:0 attempt 0: refused a 'published' report: metric 'loss' must be a "
            "finite number") in log, log

    expected = {"task": "trainer:0", "model": "mlp", "version": 2, "repository": repository,
                "step": 200, "metrics": {"accuracy": 0.875, "loss": 0.25},
                "unix_ms": published[1]["ts"]}
    assert live["last_publication"] == expected
    assert json.loads((job_dir / "status.json").read_text())["last_publication"] == expected
    assert shoal_status(job_id)["last_publication"] == expected
    human = run_shoal("status", job_id, timeout=30)
    assert human.returncode == 0, human.stderr
    assert re.search(line_re, human.stdout, re.M), human.stdout


def test_a_job_without_publications_shows_none(run_shoal, write_job, jobs_dir, shoal_status):
    job = write_job("""
        name: quiet
        roles:
          trainer: {instances: 1, command: ["/bin/true"]}
        """)
    r = run_shoal("run", job, timeout=60)
    assert r.returncode == 0, r.stderr
    (job_dir,) = e2e.job_dirs(jobs_dir)
    assert shoal_status(job_dir.name)["last_publication"] is None
    human = run_shoal("status", job_dir.name, timeout=30)
    assert "model " not in human.stdout


RECOVERY_TRAIN = """
    import os, time, shoal, torch

    class Scale(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2

    torch.jit.script(Scale()).save("scale.pt")

    def wait_for(name):
        deadline = time.time() + 120
        while not os.path.exists(name) and time.time() < deadline:
            time.sleep(0.05)

    print("published", shoal.publish_model("scale.pt", "mlp", step=10, metrics={"loss": 0.5}))
    wait_for("release")
    print("published", shoal.publish_model("scale.pt", "mlp", step=20, metrics={"loss": 0.25}))
    """


def test_a_recovered_master_keeps_the_last_publication_and_records_new_ones(
        write_file, write_job, detach_job, start_shoal, jobs_dir, tmp_path, wait_for_state):
    write_file("train.py", RECOVERY_TRAIN)
    job = write_job(f"""
        name: recorder-recovery
        publish: {{repository: ./models}}
        roles:
          trainer:
            instances: 1
            command: ["{e2e.PYTHON}", "train.py"]
        """)
    (tmp_path / "models").mkdir()
    job_id = detach_job(job, env={"SHOAL_AGENT_MASTER_GRACE_MS": "15000"})
    job_dir = jobs_dir / job_id
    first = wait_for_state(job_id, lambda s: s.get("last_publication") is not None, 120,
                           "the first publication")["last_publication"]
    assert first["version"] == 1 and first["step"] == 10
    old_master = json.loads((job_dir / "master.json").read_text())["pid"]
    os.kill(old_master, signal.SIGKILL)

    client = start_shoal("resume", job_id)
    e2e.wait_until(lambda: e2e.events_of(e2e.read_events(job_dir), "master_recovered"), 60,
                   "the new master")
    # The new master rebuilt the last publication from the journal.
    again = wait_for_state(job_id, lambda s: json.loads((job_dir / "master.json").read_text())
                           ["pid"] != old_master and s["state"] == "running", 60,
                           "the new master's status")
    assert again["last_publication"] == first
    (tmp_path / "release").touch()
    assert client.wait(timeout=120) == 0, client.stderr()
    final = json.loads((job_dir / "status.json").read_text())
    assert final["state"] == "succeeded", final
    assert {k: final["last_publication"][k] for k in ("version", "step", "metrics")} == {
        "version": 2, "step": 20, "metrics": {"loss": 0.25}}
    published = e2e.events_of(e2e.read_events(job_dir), "model_published")
    assert [(e["version"], e["step"]) for e in published] == [(1, 10), (2, 20)]
