"""Losing the agent (SIGKILL of the agent process): every task it ran is killed, the children
they started included (no orphan may survive the agent), and the failure goes through the
tasks' policy: fail-job fails the job naming the lost agent; restart-task starts the tasks
again, on a new agent started in the lost one's place, and the job completes."""

import os
import signal

import pytest

import shoal_e2e as e2e

# Attempt 0 ignores SIGTERM, starts a child that ignores it too, prints "up" and spins: only a
# kill of the whole tree (SIGKILL to the group or the cgroup) ends it. A later attempt prints
# "up" and exits 0 once the file given as argument exists.
STUBBORN = """
import os, signal, subprocess, sys, time
if os.environ["SHOAL_RESTART_COUNT"] != "0":
    print(f"up attempt {os.environ['SHOAL_RESTART_COUNT']} pid {os.getpid()}", flush=True)
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.02)
    sys.exit(0)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time\\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\\nwhile True: time.sleep(0.1)"])
print(f"up attempt {os.environ['SHOAL_RESTART_COUNT']} child={child.pid}", flush=True)
while True:
    time.sleep(0.1)
"""


def start_and_kill_agent(tmp_path, write_file, write_job, start_shoal, jobs_dir, wait_for_state,
                         name, policy_lines):
    write_file("stubborn.py", STUBBORN)
    job = write_job(f"""
        name: {name}
        {policy_lines}
        roles:
          worker:
            instances: 2
            command: ["/usr/bin/python3", "stubborn.py", "{tmp_path}/release"]
            resources: {{cpus: 0.5}}
        """)
    client = start_shoal("run", job)
    job_dir = e2e.wait_for_job(jobs_dir, name)
    job_id = job_dir.name
    status = wait_for_state(job_id, lambda s: s["state"] == "running"
                            and all(t["state"] == "running" for t in s["tasks"]), 60,
                            "every task running")
    e2e.wait_until(lambda: client.stdout().count(" | up attempt 0 child=") == 2, 60,
                   "both workers to start their child")
    tasks = [t["pid"] for t in status["tasks"]]
    pgids = {os.getpgid(pid) for pid in tasks}
    tree = e2e.task_processes(job_id)
    assert len(tree) >= 4, tree  # two tasks, two children
    agents = [p for p in e2e.job_processes(job_id, job_dir) if " agent " in f" {p.cmdline} "]
    assert len(agents) == 1, agents
    agent = agents[0].pid
    os.kill(agent, signal.SIGKILL)
    return client, job_dir, {p.pid for p in tree}, pgids, agent


def assert_tree_gone(job_dir, tree, pgids, what):
    """Every process of the lost agent's tasks (children included) is gone."""
    def gone():
        return (not [pid for pid in tree if e2e.is_task_of(pid, job_dir.name)]
                and all(e2e.pgroup_gone(g) for g in pgids))
    try:
        e2e.wait_until(gone, 10, what)
    except AssertionError:
        pytest.fail(f"processes of {job_dir.name} outlived their agent: "
                    f"{[p for p in e2e.task_processes(job_dir.name) if p.pid in tree]}")


def assert_nothing_left(job_dir):
    try:
        e2e.wait_until(lambda: not e2e.job_processes(job_dir.name, job_dir), 10,
                       "every process of the job to exit")
    except AssertionError:
        pytest.fail(f"processes of the ended job: {e2e.job_processes(job_dir.name, job_dir)}")


def test_agent_loss_fails_the_job_naming_the_agent(tmp_path, write_file, write_job, start_shoal,
                                                   jobs_dir, wait_for_state, shoal_status):
    client, job_dir, tree, pgids, _ = start_and_kill_agent(
        tmp_path, write_file, write_job, start_shoal, jobs_dir, wait_for_state, "agentlost",
        "on_failure: fail-job")
    rc = client.wait(60)
    assert rc == 1, f"rc={rc}\n{client.stderr()}"
    last = [l for l in client.stderr().splitlines() if l.strip()][-1]
    assert last.startswith(f"shoal | job {job_dir.name} failed: worker:"), last
    assert " lost: " in last and "agent" in last, last
    assert_tree_gone(job_dir, tree, pgids, "every task of the lost agent to be killed")
    assert_nothing_left(job_dir)
    assert "up attempt 1" not in client.stdout()

    status = shoal_status(job_dir.name)
    assert status["state"] == "failed"
    assert "lost" in status["reason"] and "agent" in status["reason"], status["reason"]
    for t in status["tasks"]:
        assert t["state"] in ("failed", "killed") and t["restarts"] == 0, t
    failed = [t for t in status["tasks"] if t["state"] == "failed"]
    assert failed and all("agent" in t["reason"] for t in failed), status["tasks"]
    events = e2e.read_events(job_dir)
    types = [e["type"] for e in events]
    assert "agent_disconnected" in types or "place_lost" in types, types


def test_agent_loss_restarts_tasks_on_a_new_agent(tmp_path, write_file, write_job, start_shoal,
                                                   jobs_dir, wait_for_state, shoal_status):
    client, job_dir, tree, pgids, lost_agent = start_and_kill_agent(
        tmp_path, write_file, write_job, start_shoal, jobs_dir, wait_for_state, "agentlostrt",
        "on_failure: restart-task\n        max_restarts: 2\n"
        "        backoff: {initial: 100ms, max: 100ms}")
    job_id = job_dir.name
    # Both tasks start again (attempt 1), on an agent that is not the lost one; by then
    # nothing of attempt 0 is left.
    e2e.wait_until(lambda: client.stdout().count(" | up attempt 1 pid ") == 2, 60,
                   "both workers to start again")
    assert_tree_gone(job_dir, tree, pgids, "every task of the lost agent to be killed")
    agents = [p for p in e2e.job_processes(job_id, job_dir) if " agent " in f" {p.cmdline} "]
    assert len(agents) == 1 and agents[0].pid != lost_agent, agents
    status = wait_for_state(job_id, lambda s: all(t["restarts"] == 1 and t["state"] == "running"
                                                  for t in s["tasks"]), 30,
                            "both workers running as attempt 1")
    for t in status["tasks"]:
        assert e2e.is_task_of(t["pid"], job_id) and t["pid"] not in tree, t
    (tmp_path / "release").touch()
    rc = client.wait(60)
    assert rc == 0, f"rc={rc}\n{client.stderr()}"
    assert_nothing_left(job_dir)

    events = e2e.read_events(job_dir)
    for task in ("worker:0", "worker:1"):
        ts = e2e.task_transitions(events, task)
        ends = [e for e in ts if e["to"] in e2e.TERMINAL_TASK_STATES]
        # The loss was handled as a failure of the task, restart-task restarted it, and the
        # new attempt succeeded.
        assert [e["to"] for e in ends] == ["failed", "succeeded"], ts
        assert ends[0]["reason"].startswith("lost: ") and "agent" in ends[0]["reason"], ts
        assert "restarting in" in ends[0]["reason"], ts
        assert [e.get("attempt") for e in ts if e["to"] == "pending" and "attempt" in e] == [1]
    status = shoal_status(job_id)
    assert status["state"] == "succeeded", status
    assert status["group_restarts"] == 0
