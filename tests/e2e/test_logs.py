"""Task output: every line once, prefixed role:index, in `shoal run`, `shoal logs`, logs.txt and
the per-task files; `--task` filters and strips the prefix; `--follow` runs to the job's end."""

import collections
import re

import shoal_e2e as e2e

N_OUT = 20000
N_ERR = 300

CHATTY = f"""
import os, sys
i = os.environ["SHOAL_INDEX"]
for n in range({N_OUT}):
    print(f"out {{i}} line {{n:05d}}")
    if n % 100 == 50:
        print(f"err {{i}} line {{n // 100:03d}}", file=sys.stderr)
sys.stdout.write(f"tail {{i}} without newline")
"""


def expected_lines(i):
    out = [f"out {i} line {n:05d}" for n in range(N_OUT)]
    err = [f"err {i} line {n // 100:03d}" for n in range(N_OUT) if n % 100 == 50]
    assert len(err) == 200
    return out + [f"tail {i} without newline"], err


def check_prefixed(lines, what):
    counts = collections.Counter(lines)
    for i in (0, 1):
        out, err = expected_lines(i)
        for l in out + err:
            assert counts[f"worker:{i} | {l}"] == 1, (
                f"{what}: 'worker:{i} | {l}' appears {counts[f'worker:{i} | {l}']} times")
        # one task's stdout keeps its order
        mine = [l for l in lines if l.startswith(f"worker:{i} | out ")]
        assert mine == [f"worker:{i} | {l}" for l in out if l.startswith("out ")], what
    assert len(lines) == 2 * (N_OUT + 1 + 200), f"{what}: {len(lines)} lines"
    bad = [l for l in lines if not re.fullmatch(r"worker:[01] \| (out|err|tail) [01] .*", l)]
    assert not bad, f"{what}: unexpected lines {bad[:5]}"


def chatty_job(write_file, write_job):
    """Two workers running CHATTY; returns the job file."""
    write_file("chatty.py", CHATTY)
    return write_job("""
        name: chatty
        roles:
          worker:
            instances: 2
            command: ["/usr/bin/python3", "chatty.py"]
            resources: {cpus: 0.5}
        """)


def test_logs_are_complete_and_filterable(write_file, write_job, run_shoal, jobs_dir):
    job = chatty_job(write_file, write_job)
    r = run_shoal("run", "-q", job, timeout=120)
    assert r.returncode == 0, r.stderr
    check_prefixed(r.stdout.splitlines(), "shoal run")
    (job_dir,) = e2e.job_dirs(jobs_dir)
    job_id = job_dir.name

    logs = run_shoal("logs", job_id, timeout=60)
    assert logs.returncode == 0, logs.stderr
    check_prefixed(logs.stdout.splitlines(), "shoal logs")
    check_prefixed((job_dir / "logs.txt").read_text().splitlines(), "logs.txt")

    # --task: only that task's lines, unprefixed
    for i in (0, 1):
        t = run_shoal("logs", job_id, "--task", f"worker:{i}", timeout=60)
        assert t.returncode == 0, t.stderr
        out, err = expected_lines(i)
        lines = t.stdout.splitlines()
        assert collections.Counter(lines) == collections.Counter(out + err)
        assert [l for l in lines if l.startswith("out ")] == [l for l in out if l.startswith("out ")]
        # the per-task files hold the raw streams
        assert (job_dir / "tasks" / f"worker-{i}" / "stdout").read_text() == "\n".join(out)
        assert (job_dir / "tasks" / f"worker-{i}" / "stderr").read_text().splitlines() == err

    # a prefix of the id works too
    p = run_shoal("logs", job_id[:-2], "--task", "worker:1", timeout=60)
    assert p.returncode == 0 and len(p.stdout.splitlines()) == N_OUT + 1 + 200

    bad = run_shoal("logs", job_id, "--task", "worker:7", timeout=30)
    assert bad.returncode == 2
    assert "worker:7" in bad.stderr and bad.stdout == ""


def test_logs_follow_runs_until_the_job_ends(tmp_path, write_job, detach_job, start_shoal,
                                             wait_for_state):
    gate = tmp_path / "gate"
    job = write_job(f"""
        name: follow
        roles:
          worker:
            instances: 1
            command: ["/bin/sh", "-c", "echo before; while [ ! -e {gate} ]; do sleep 0.05; done; for i in 1 2 3; do echo after $i; done"]
            resources: {{cpus: 0.5}}
        """)
    job_id = detach_job(job)
    follower = start_shoal("logs", job_id, "--follow")
    e2e.wait_until(lambda: "worker:0 | before" in follower.stdout(), 30,
                   "`logs --follow` to print the first line")
    assert follower.poll() is None, "--follow ended while the job was still running"
    gate.write_text("go")
    assert follower.wait(60) == 0, follower.stderr()
    assert follower.stdout().splitlines() == [
        "worker:0 | before", "worker:0 | after 1", "worker:0 | after 2", "worker:0 | after 3"]
    assert wait_for_state(job_id, lambda s: s["state"] in e2e.TERMINAL_JOB_STATES, 30,
                          "the job to end")["state"] == "succeeded"


def test_a_client_that_attaches_late_still_sees_the_jobs_first_lines(tmp_path, write_job,
                                                                    detach_job, start_shoal,
                                                                    jobs_dir):
    # `shoal run` attaches moments after its master starts; here the gap is made long on purpose
    # (`run --detach`, then `resume` once the first lines are out) so the replay is certain to
    # be what shows them.
    gate = tmp_path / "gate"
    job = write_job(f"""
        name: late
        roles:
          worker:
            command: ["/bin/sh", "-c", "echo first; echo second >&2; while [ ! -e {gate} ]; do sleep 0.05; done; echo after"]
            resources: {{cpus: 0.5}}
        """)
    job_id = detach_job(job)
    logs = jobs_dir / job_id / "logs.txt"
    e2e.wait_until(lambda: logs.exists() and "worker:0 | second" in logs.read_text(), 30,
                   "the first lines to reach the job's logs")
    follower = start_shoal("resume", job_id)
    e2e.wait_until(lambda: "worker:0 | second" in follower.stdout(), 30,
                   "the attached client to print the lines from before it attached")
    gate.write_text("go")
    assert follower.wait(60) == 0, follower.stderr()
    assert sorted(follower.stdout().splitlines()) == [
        "worker:0 | after", "worker:0 | first", "worker:0 | second"], follower.stdout()


def test_output_batching_is_tunable_and_a_bad_value_is_named_and_ignored(write_file, write_job,
                                                                         run_shoal, jobs_dir):
    job = chatty_job(write_file, write_job)
    # 0: every read goes at once (the old way); -5 would wrap to ~forever through strtoul.
    for value in ("0", "-5"):
        r = run_shoal("run", "-q", job, timeout=120, env={"SHOAL_AGENT_LOG_FLUSH_MS": value})
        assert r.returncode == 0, r.stderr
        check_prefixed(r.stdout.splitlines(), f"shoal run, SHOAL_AGENT_LOG_FLUSH_MS={value}")
    newest = max(e2e.job_dirs(jobs_dir), key=lambda d: d.stat().st_mtime)
    said = "".join(p.read_text(errors="replace") for p in newest.rglob("*.log"))
    assert "SHOAL_AGENT_LOG_FLUSH_MS='-5' is not a number of milliseconds" in said, said[-2000:]
