"""events.jsonl: the job's journal. Every task goes pending -> starting -> running -> terminal."""

import json

import shoal_e2e as e2e


def check_task_transitions(events, task, terminal):
    ts = e2e.task_transitions(events, task)
    assert [e["to"] for e in ts] == ["pending", "starting", "running", terminal], (
        task, [(e.get("from"), e["to"]) for e in ts])
    for prev, cur in zip(ts, ts[1:]):
        assert cur["from"] == prev["to"], (task, cur)
    return ts[-1]


def test_successful_job_journal(write_job, run_shoal, jobs_dir):
    job = write_job("""
        name: journal
        roles:
          worker:
            instances: 3
            command: ["/bin/sh", "-c", "echo hi"]
            resources: {cpus: 0.5}
        """)
    r = run_shoal("run", "-q", job, timeout=60)
    assert r.returncode == 0, r.stderr
    (job_dir,) = e2e.job_dirs(jobs_dir)
    # every line is one JSON object with a type
    raw = (job_dir / "events.jsonl").read_text().splitlines()
    assert raw and all(isinstance(json.loads(l), dict) and "type" in json.loads(l) for l in raw)
    events = e2e.read_events(job_dir)
    types = [e["type"] for e in events]
    assert types[0] == "job_submitted"
    for t in ("admitted", "agent_registered", "rendezvous", "outcome_decided", "job_state",
              "job_finished"):
        assert t in types, f"no {t} event: {types}"
    assert types.index("admitted") < types.index("agent_registered") < types.index("rendezvous")
    first_start = min(i for i, e in enumerate(events)
                      if e["type"] == "task_state" and e["to"] == "starting")
    assert types.index("rendezvous") < first_start
    for i in range(3):
        last = check_task_transitions(events, f"worker:{i}", "succeeded")
        assert last["exit_code"] == 0 and last["signal"] == 0
    finished = [e for e in events if e["type"] == "job_finished"]
    assert len(finished) == 1 and finished[0]["outcome"] == "succeeded"
    assert isinstance(finished[0]["reason"], str)
    job_states = [e["to"] for e in events if e["type"] == "job_state"]
    assert job_states[-1] == "succeeded"
    assert "running" in job_states
    assert "queued" not in types


def test_failed_job_journal(tmp_path, write_job, run_shoal, jobs_dir):
    # worker:1 fails only once worker:0 has started its command, so worker:0 has been running.
    ready = tmp_path / "ready"
    job = write_job(f"""
        name: journalfail
        roles:
          worker:
            instances: 2
            command: ["/bin/sh", "-c", "if [ $SHOAL_INDEX = 0 ]; then touch {ready}; exec sleep 120; fi; while [ ! -e {ready} ]; do sleep 0.02; done; exit 3"]
            resources: {{cpus: 0.5}}
        """)
    r = run_shoal("run", "-q", job, timeout=60)
    assert r.returncode == 1, r.stderr
    (job_dir,) = e2e.job_dirs(jobs_dir)
    events = e2e.read_events(job_dir)
    failed = check_task_transitions(events, "worker:1", "failed")
    assert failed["exit_code"] == 3 and failed["signal"] == 0
    check_task_transitions(events, "worker:0", "killed")
    finished = [e for e in events if e["type"] == "job_finished"]
    assert len(finished) == 1 and finished[0]["outcome"] == "failed"
    assert "worker:1" in finished[0]["reason"]
    assert [e["to"] for e in events if e["type"] == "job_state"][-1] == "failed"
    # nothing is journalled for a task after its terminal state
    for task in ("worker:0", "worker:1"):
        ts = e2e.task_transitions(events, task)
        assert sum(e["to"] in e2e.TERMINAL_TASK_STATES for e in ts) == 1


def test_killed_task_journal_has_signal(write_job, run_shoal, jobs_dir):
    job = write_job("""
        name: journalsig
        roles:
          worker:
            command: ["/bin/sh", "-c", "kill -9 $$"]
            resources: {cpus: 0.5}
        """)
    r = run_shoal("run", "-q", job, timeout=60)
    assert r.returncode == 1, r.stderr
    (job_dir,) = e2e.job_dirs(jobs_dir)
    last = check_task_transitions(e2e.read_events(job_dir), "worker:0", "failed")
    assert last["signal"] == 9
