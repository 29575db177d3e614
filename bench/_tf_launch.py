#!/usr/bin/python3
"""A hand-written TensorFlow launcher, the anchor that Shoal's `framework: tensorflow` is timed
against: it starts one local process per task, each with its own TF_CONFIG, as a person without
Shoal would.

Usage:  python3 bench/_tf_launch.py ROLE[:N] [ROLE[:N] ...] -- PROGRAM [ARGS...]

  python3 bench/_tf_launch.py worker:2 -- \\
      /var/cache/shoal/venvs/tensorflow/bin/python examples/tensorflow/train_mwms.py --epochs 5
  python3 bench/_tf_launch.py chief worker:2 ps -- \\
      /var/cache/shoal/venvs/tensorflow/bin/python examples/tensorflow/train_ps.py

- ROLE is chief, master, worker, ps or evaluator; N (default 1) is its number of tasks. The
  cluster holds chief, master, worker and ps in the order given, each task at 127.0.0.1 with a
  port picked free by the kernel; an evaluator gets its own `task` entry but is not in the
  cluster (as Shoal and TensorFlow do).
- Every task runs the same argv, after `--`, in the current directory, with the environment of
  this launcher plus TF_CONFIG (and OMP_NUM_THREADS=1 unless it is set).
- The chief is the `chief` (or `master`) task when there is one, else worker 0. With a chief
  role the run ends when the chief exits: the other tasks (parameter-server workers and ps never
  exit on their own) are then stopped with SIGTERM, and SIGKILL 10 s later. Without one it waits
  for every task. A task that fails (non-zero exit, killed) before that stops the others too.
- Exit status: the chief's, or the first failed task's when the run was cut short by a
  failure (128+N for a task killed by signal N). 2 for bad usage.

It prints nothing of its own except errors (to stderr); the tasks' output is theirs, unprefixed.
Standard library only.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time

CLUSTER_ROLES = ("chief", "master", "worker", "ps")
ROLES = CLUSTER_ROLES + ("evaluator",)
KILL_AFTER_S = 10.0


def usage(message):
    print(f"_tf_launch.py: {message}\nusage: _tf_launch.py ROLE[:N]... -- PROGRAM [ARGS...]",
          file=sys.stderr)
    sys.exit(2)


def parse(argv):
    if "--" not in argv:
        usage("missing '--' before the program")
    split = argv.index("--")
    specs, command = argv[:split], argv[split + 1:]
    if not specs:
        usage("no ROLE[:N] given")
    if not command:
        usage("no program after '--'")
    roles = []
    for spec in specs:
        role, _, count = spec.partition(":")
        if role not in ROLES:
            usage(f"unknown role {role!r} in {spec!r}; roles are {', '.join(ROLES)}")
        if any(r == role for r, _ in roles):
            usage(f"role {role!r} given twice")
        try:
            n = int(count) if count else 1
        except ValueError:
            n = 0
        if n < 1:
            usage(f"bad task count in {spec!r}: must be a whole number >= 1")
        roles.append((role, n))
    return roles, command


def free_ports(n):
    """n distinct ports that are free on 127.0.0.1 now (all sockets held open until every port
    is chosen, so none is handed out twice)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def exit_code(returncode):
    return 128 - returncode if returncode < 0 else returncode


def main():
    roles, command = parse(sys.argv[1:])
    in_cluster = [(r, n) for r, n in roles if r in CLUSTER_ROLES]
    ports = iter(free_ports(sum(n for _, n in in_cluster)))
    cluster = {r: [f"127.0.0.1:{next(ports)}" for _ in range(n)] for r, n in in_cluster}

    chief_role = next((r for r in ("chief", "master") if r in cluster), None)
    chief_key = (chief_role, 0) if chief_role else ("worker", 0)

    tasks = {}  # (role, index) -> Popen, in start order
    def stop_all(procs):
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + KILL_AFTER_S
        for p in procs:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def on_signal(signum, _frame):
        stop_all(list(tasks.values()))
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    try:
        for role, n in roles:
            for index in range(n):
                env = dict(os.environ)
                env["TF_CONFIG"] = json.dumps(
                    {"cluster": cluster, "task": {"type": role, "index": index}},
                    separators=(",", ":"))
                env.setdefault("OMP_NUM_THREADS", "1")
                tasks[(role, index)] = subprocess.Popen(command, env=env)
    except OSError as e:
        print(f"_tf_launch.py: cannot start {command[0]!r}: {e}", file=sys.stderr)
        stop_all(list(tasks.values()))
        return 127

    if chief_key not in tasks:  # no chief and no worker: wait for everyone, judge by all
        chief_key = None
    failed = None
    while True:
        running = [p for p in tasks.values() if p.poll() is None]
        if chief_role and tasks[chief_key].poll() is not None:
            break  # the chief is done: the rest are helpers
        if not running:
            break
        failed = next((k for k, p in tasks.items() if p.poll() not in (None, 0)), None)
        if failed:
            break
        time.sleep(0.05)

    stop_all([p for k, p in tasks.items() if k != chief_key])
    if failed and (chief_key is None or tasks[chief_key].poll() is None):
        stop_all([tasks[chief_key]] if chief_key else [])
        role, index = failed
        code = exit_code(tasks[failed].returncode)
        print(f"_tf_launch.py: {role}:{index} failed (exit status {code}); stopped the others",
              file=sys.stderr)
        return code
    if chief_key is None:
        return max(exit_code(p.returncode) for p in tasks.values())
    return exit_code(tasks[chief_key].wait())


if __name__ == "__main__":
    sys.exit(main())
