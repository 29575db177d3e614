"""`shoal agent-watchdog`, which every backend-started agent runs beside itself: when the
agent stops pinging (hung, stopped), it kills the agent and everything under it; when the
agent goes away, it goes quietly. Here a stand-in "agent" (a real process with a child task
in its own process group, and that task's own child) drives a real watchdog."""

import os
import signal
import subprocess
import sys
import time

import shoal_e2e as e2e

# A stand-in agent: starts a "task" in its own process group which starts a child of its own,
# prints both pids, then pings the watchdog (fd 3) every 50 ms until it reads a line on stdin.
AGENT = r"""
import os, subprocess, sys, threading, time
task = subprocess.Popen(["/bin/sh", "-c", "sleep 311 & echo $!; wait"], stdout=subprocess.PIPE,
                        text=True, start_new_session=True)
grandchild = int(task.stdout.readline())
print(task.pid, grandchild, flush=True)
stop = threading.Event()
def ping():
    while not stop.is_set():
        os.write(PING_FD, b"p")
        time.sleep(0.05)
threading.Thread(target=ping, daemon=True).start()
sys.stdin.readline()   # "stop pinging"
stop.set()
time.sleep(600)
"""


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def start_agent_with_watchdog(shoal_bin, limit_ms):
    r, w = os.pipe()
    agent = subprocess.Popen([sys.executable, "-c", AGENT.replace("PING_FD", str(w))],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             pass_fds=(w,), start_new_session=True)
    os.close(w)
    task, grandchild = map(int, agent.stdout.readline().split())
    watchdog = subprocess.Popen([shoal_bin, "agent-watchdog", str(agent.pid), str(limit_ms)],
                                stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                pass_fds=(r, 3), preexec_fn=lambda: os.dup2(r, 3))
    os.close(r)
    return agent, watchdog, task, grandchild


def test_a_silent_agent_is_killed_with_everything_under_it(shoal_bin):
    agent, watchdog, task, grandchild = start_agent_with_watchdog(shoal_bin, 400)
    try:
        time.sleep(1.0)  # pinged: nothing happens
        assert watchdog.poll() is None and alive(agent.pid) and alive(task) and alive(grandchild)
        agent.stdin.write("stop\n")
        agent.stdin.flush()
        assert watchdog.wait(timeout=10) == 3
        assert "sent no heartbeat for 0.4s: killing it" in watchdog.stderr.read()
        agent.wait(timeout=10)
        e2e.wait_until(lambda: not alive(task) and not alive(grandchild), 10,
                       "the agent's task and the task's child to be killed")
    finally:
        for pid in (agent.pid, task, grandchild):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_the_watchdog_leaves_quietly_when_the_agent_exits(shoal_bin):
    agent, watchdog, task, grandchild = start_agent_with_watchdog(shoal_bin, 400)
    try:
        os.killpg(task, signal.SIGKILL)
        agent.kill()  # the ping pipe closes with it
        agent.wait(timeout=10)
        assert watchdog.wait(timeout=10) == 0
        assert watchdog.stderr.read() == ""
    finally:
        for pid in (task, grandchild):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
