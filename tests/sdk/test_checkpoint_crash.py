"""A writer SIGKILLed in the middle of a save: the previous checkpoint stays the latest.

Uses the SDK's test hook SHOAL_TEST_CHECKPOINT_WRITE_DELAY_S, which makes a save sleep after
writing half of its bytes to the temporary file.
"""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import shoal
from shoal.checkpoint import Checkpointer

SDK_PYTHON = str(Path(shoal.__file__).resolve().parents[1])


def wait_until(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def half_written_temporary(directory):
    for entry in os.scandir(directory):
        if entry.name.startswith(".tmp-") and entry.stat().st_size > 0:
            return entry.name
    return None


def test_sigkill_during_a_slow_save_leaves_the_previous_checkpoint_latest(tmp_path):
    ckpt = Checkpointer(tmp_path, keep=3, serializer="pickle")
    ckpt.save(100, {"step": 100})

    env = {k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")}
    env["SHOAL_TEST_CHECKPOINT_WRITE_DELAY_S"] = "60"
    code = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {SDK_PYTHON!r})
        from shoal.checkpoint import Checkpointer
        Checkpointer({str(tmp_path)!r}, keep=3, serializer="pickle").save(
            200, {{"step": 200, "payload": b"x" * (1 << 20)}})
        print("save finished", flush=True)
    """)
    writer = subprocess.Popen([sys.executable, "-c", code], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        temp = wait_until(lambda: half_written_temporary(tmp_path), 30,
                          "the writer's half-written temporary file")
        writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=10)
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()
    assert writer.returncode == -signal.SIGKILL
    assert b"save finished" not in writer.stdout.read()

    # The killed write is visible only as its temporary, which nothing loads.
    assert sorted(os.listdir(tmp_path)) == [temp, "ckpt-000000000100.pt"]
    assert ckpt.load_latest() == (100, {"step": 100})

    # The next save removes the dead writer's leftover.
    ckpt.save(300, {"step": 300})
    assert sorted(os.listdir(tmp_path)) == ["ckpt-000000000100.pt", "ckpt-000000000300.pt"]
    assert ckpt.load_latest() == (300, {"step": 300})
