"""Per-task resource samples (docs/design/0014-web-ui.md): the agents measure each task's CPU,
memory and GPUs, and the master keeps them in tasks/<role>-<index>/resources.jsonl, which
outlives the job."""

import json

import shoal_e2e as e2e

# Three child processes burn CPU (each until it has used 1.5 s of it), while the task itself
# holds 200 MB and reports a step every 50 ms; it ends when the children are done, and not
# before 3 s, so that several samples land while it runs. The children are started before the
# allocation, so they do not share its pages.
WORKER = """
import os, time
import shoal

def burn():
    while time.process_time() < 1.5:
        pass
    os._exit(0)

children = []
for _ in range(3):
    pid = os.fork()
    if pid == 0:
        burn()
    children.append(pid)
held = b"\\x01" * (200 << 20)
started = time.monotonic()
step = 0
while children or time.monotonic() - started < 3:
    step += 1
    shoal.progress(step)
    time.sleep(0.05)
    for pid in list(children):
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            children.remove(pid)
print(f"done after {step} steps, holding {len(held)} bytes", flush=True)
"""


def test_samples_of_a_finished_job_stay_in_its_directory(write_file, write_job, run_shoal,
                                                          jobs_dir):
    write_file("worker.py", WORKER)
    job = write_job("""
        name: resources
        heartbeat: {interval: 500ms, misses: 20}
        roles:
          worker:
            command: ["/usr/bin/python3", "worker.py"]
            resources: {cpus: 2}
        """)
    r = run_shoal("run", job, timeout=120, env={"SHOAL_AGENT_SAMPLE_INTERVAL_MS": "500"})
    assert r.returncode == 0, r.stderr
    assert "worker:0 | done after" in r.stdout, r.stdout
    (job_dir,) = e2e.job_dirs(jobs_dir)

    path = job_dir / "tasks" / "worker-0" / "resources.jsonl"
    lines = path.read_text().splitlines()
    samples = [json.loads(line) for line in lines]  # every line whole: the job ended cleanly
    assert len(samples) >= 3, lines
    for s in samples:
        assert set(s) == {"ts_ms", "cpu_percent", "rss_bytes", "step", "attempt", "gpus"}, s
        assert s["attempt"] == 0 and s["gpus"] == [], s
    times = [s["ts_ms"] for s in samples]
    assert times == sorted(times) and len(set(times)) == len(times), times
    # The children's CPU counts for the task: three of them burning.
    assert max(s["cpu_percent"] for s in samples) > 50, samples
    assert max(s["rss_bytes"] for s in samples) > 150 << 20, samples
    steps = [s["step"] for s in samples]
    assert steps == sorted(steps) and steps[-1] > 0, steps


def test_no_samples_when_sampling_is_off(write_job, run_shoal, jobs_dir):
    job = write_job("""
        name: unsampled
        roles:
          worker:
            command: ["/bin/sh", "-c", "sleep 1.5"]
            resources: {cpus: 0.5}
        """)
    r = run_shoal("run", job, timeout=60, env={"SHOAL_AGENT_SAMPLE_INTERVAL_MS": "0"})
    assert r.returncode == 0, r.stderr
    (job_dir,) = e2e.job_dirs(jobs_dir)
    assert not (job_dir / "tasks" / "worker-0" / "resources.jsonl").exists()
