"""A task killed in the middle of writing a checkpoint (SHOAL_TEST_CHECKPOINT_WRITE_DELAY_S holds
the SDK between the two halves of the write, see docs/sdk.md) leaves only a temporary file:
the restarted task loads the previous complete checkpoint, never the temporary, and its next
save removes the leftover."""

import json
import os

import shoal_e2e as e2e

# Attempt 0 saves step 10, then starts saving step 20 with the write held halfway (the test
# kills it there). Later attempts report what they find and load, then save step 30.
TRAINER = """
import json, os, sys
import shoal

def listing(d):
    return sorted(os.listdir(d)) if os.path.isdir(d) else []

attempt = shoal.env.restart_count()
ckpt_dir = shoal.env.checkpoint_dir()
ckpt = shoal.Checkpointer(serializer="pickle")
before = listing(ckpt_dir)
step, state = ckpt.load_latest()
tag = None if state is None else state["tag"]
print("LOADED " + json.dumps({"attempt": attempt, "step": step, "tag": tag, "before": before,
                              "intact": state is None or state["payload"] == bytes(range(256)) * 4096}),
      flush=True)
if attempt == 0:
    assert step == 0 and state is None, (step, state)
    ckpt.save(10, {"tag": "complete-10", "payload": bytes(range(256)) * 4096})
    os.environ["SHOAL_TEST_CHECKPOINT_WRITE_DELAY_S"] = "120"
    print("WRITING 20", flush=True)
    ckpt.save(20, {"tag": "torn-20", "payload": bytes(range(256)) * 4096})
    print("SAVED 20: the write delay did not hold", flush=True)
    sys.exit(5)
ckpt.save(30, {"tag": "complete-30", "payload": b""})
print("AFTER " + json.dumps({"attempt": attempt, "files": listing(ckpt_dir)}), flush=True)
"""


def test_kill_during_checkpoint_write_resumes_from_previous(tmp_path, write_file, write_job,
                                                            start_shoal, jobs_dir,
                                                            wait_for_state, shoal_status):
    write_file("trainer.py", TRAINER)
    ckpt_dir = tmp_path / "ckpt"
    job = write_job(f"""
        name: tornckpt
        on_failure: restart-task
        max_restarts: 1
        backoff: {{initial: 100ms, max: 100ms}}
        checkpoint: {{dir: {ckpt_dir}, keep: 3}}
        roles:
          trainer:
            command: ["/usr/bin/python3", "trainer.py"]
            resources: {{cpus: 0.5}}
        """)
    client = start_shoal("run", job)
    job_dir = e2e.wait_for_job(jobs_dir, "tornckpt")
    job_id = job_dir.name

    def torn_temp():
        if "trainer:0 | WRITING 20" not in client.stdout().splitlines():
            return None
        temps = [p for p in ckpt_dir.glob(".tmp-ckpt-000000000020.pt.*") if p.stat().st_size > 0]
        return temps[0] if temps else None
    temp = e2e.wait_until(torn_temp, 60, "the checkpoint of step 20 to be half written")
    # The first half only: the SDK sleeps before the rest.
    half = temp.stat().st_size
    status = shoal_status(job_id)
    (trainer,) = status["tasks"]
    assert trainer["restarts"] == 0 and trainer["state"] == "running", trainer
    assert e2e.kill_task(trainer["pid"], job_id), "the trainer is gone before the kill"

    rc = client.wait(60)
    assert rc == 0, f"rc={rc}\n{client.stdout()}\n{client.stderr()}"
    lines = client.stdout().splitlines()
    assert "trainer:0 | SAVED 20: the write delay did not hold" not in lines
    loaded = [json.loads(l.split("LOADED ", 1)[1]) for l in lines if " | LOADED " in l]
    assert [l["attempt"] for l in loaded] == [0, 1], loaded
    first, second = loaded
    assert first["step"] == 0 and first["tag"] is None
    # The restarted task found the torn temporary next to the complete checkpoint of step 10
    # and loaded step 10, intact: the temporary was not taken for a checkpoint.
    assert f".tmp-ckpt-000000000020.pt." in " ".join(second["before"]), second
    assert "ckpt-000000000010.pt" in second["before"], second
    assert "ckpt-000000000020.pt" not in second["before"], second
    assert second["step"] == 10 and second["tag"] == "complete-10" and second["intact"], second
    # Its own save removed the leftover temporary.
    after = [json.loads(l.split("AFTER ", 1)[1]) for l in lines if " | AFTER " in l]
    assert after == [{"attempt": 1,
                      "files": ["ckpt-000000000010.pt", "ckpt-000000000030.pt"]}], after
    assert sorted(os.listdir(ckpt_dir)) == ["ckpt-000000000010.pt", "ckpt-000000000030.pt"]

    events = e2e.read_events(job_dir)
    failed = [e for e in e2e.task_transitions(events, "trainer:0") if e["to"] == "failed"]
    assert len(failed) == 1 and failed[0]["signal"] == 9, failed
    resumed = [(e["attempt"], e["step"]) for e in e2e.events_of(events, "resumed")]
    assert resumed == [(0, 0), (1, 10)], resumed
    checkpoints = [e["step"] for e in e2e.events_of(events, "checkpoint")]
    assert checkpoints == [10, 30], checkpoints  # never 20: it was not completed
    assert half > 0
