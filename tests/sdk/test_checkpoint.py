"""shoal.checkpoint: naming, atomic writes, retention, load_latest's fallbacks, serialisers."""

import os
import pickle
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import shoal
from shoal import checkpoint
from shoal.checkpoint import Checkpointer, LocalDirStorage

SDK_PYTHON = str(Path(shoal.__file__).resolve().parents[1])


def files(directory):
    return sorted(os.listdir(directory))


def test_names_are_ckpt_step_zero_padded_to_12_digits():
    assert checkpoint.checkpoint_name(200) == "ckpt-000000000200.pt"
    assert checkpoint.checkpoint_name(10**13) == "ckpt-10000000000000.pt"
    assert checkpoint.checkpoint_step("ckpt-000000000200.pt") == 200
    assert checkpoint.checkpoint_step("ckpt-10000000000000.pt") == 10**13
    for other in ("ckpt-.pt", "ckpt-12.pth", ".tmp-ckpt-000000000001.pt.1.ab", "notes.txt",
                  "ckpt-1a.pt"):
        assert checkpoint.checkpoint_step(other) is None
    with pytest.raises(ValueError):
        checkpoint.checkpoint_name(-1)


def test_save_writes_the_final_name_and_leaves_no_temporary(tmp_path):
    path = Checkpointer(tmp_path, keep=3, serializer="pickle").save(7, {"w": 1})
    assert path == str(tmp_path / "ckpt-000000000007.pt")
    assert files(tmp_path) == ["ckpt-000000000007.pt"]
    assert pickle.loads(Path(path).read_bytes()) == {"w": 1}


def test_save_writes_to_a_temporary_in_the_same_dir_then_renames(tmp_path, monkeypatch):
    seen = []
    real_rename = os.rename

    def spy_rename(src, dst):
        seen.append((src, dst, files(tmp_path)))
        return real_rename(src, dst)

    monkeypatch.setattr(os, "rename", spy_rename)
    Checkpointer(tmp_path, serializer="pickle").save(3, "state")
    [(src, dst, listing)] = seen
    assert os.path.dirname(src) == str(tmp_path)
    assert os.path.basename(src).startswith(".tmp-")
    assert dst == str(tmp_path / "ckpt-000000000003.pt")
    assert listing == [os.path.basename(src)]  # not visible under its final name before


def test_save_creates_a_missing_directory(tmp_path):
    target = tmp_path / "a" / "b"
    Checkpointer(target, serializer="pickle").save(1, 1)
    assert files(target) == ["ckpt-000000000001.pt"]


def test_save_prunes_the_oldest_complete_checkpoints_beyond_keep(tmp_path):
    ckpt = Checkpointer(tmp_path, keep=2, serializer="pickle")
    for step in (10, 20, 30, 40):
        ckpt.save(step, step)
    assert files(tmp_path) == ["ckpt-000000000030.pt", "ckpt-000000000040.pt"]
    assert ckpt.steps() == [30, 40]


def test_prune_never_removes_the_checkpoint_just_written(tmp_path):
    ckpt = Checkpointer(tmp_path, keep=1, serializer="pickle")
    ckpt.save(50, "newer")
    ckpt.save(20, "older step, just written")
    # Keeping one means keeping the one just written, even when a higher step exists.
    assert ckpt.steps() == [20]
    ckpt.save(60, "x")
    assert ckpt.steps() == [60]


def test_save_removes_stale_temporaries_but_not_fresh_ones(tmp_path):
    stale = tmp_path / ".tmp-ckpt-000000000001.pt.123.dead"
    stale.write_bytes(b"half")
    old = time.time() - 3600
    os.utime(stale, (old, old))
    # A writer still at work (a live process), written after ours started.
    fresh = tmp_path / f".tmp-ckpt-000000000009.pt.{os.getppid()}.beef"
    fresh.write_bytes(b"in progress")
    future = time.time() + 3600
    os.utime(fresh, (future, future))
    Checkpointer(tmp_path, serializer="pickle").save(2, 2)
    assert files(tmp_path) == [fresh.name, "ckpt-000000000002.pt"]


def test_save_removes_the_temporary_of_a_dead_writer_even_with_a_current_timestamp(tmp_path):
    # File times tick coarsely: a writer killed a moment ago can share the new save's mtime.
    dead = subprocess.Popen(["/bin/true"])
    dead.wait()
    leftover = tmp_path / f".tmp-ckpt-000000000007.pt.{dead.pid}.dead"
    leftover.write_bytes(b"half")
    future = time.time() + 3600
    os.utime(leftover, (future, future))
    Checkpointer(tmp_path, serializer="pickle").save(8, 8)
    assert files(tmp_path) == ["ckpt-000000000008.pt"]


def test_load_latest_returns_zero_none_when_there_is_no_checkpoint(tmp_path):
    assert Checkpointer(tmp_path).load_latest() == (0, None)
    assert Checkpointer(tmp_path / "missing").load_latest() == (0, None)


def test_load_latest_picks_the_highest_step_not_the_newest_file(tmp_path):
    ckpt = Checkpointer(tmp_path, keep=5, serializer="pickle")
    ckpt.save(300, "three hundred")
    ckpt.save(100, "one hundred")  # written last, lower step
    ckpt.save(2000, "two thousand")
    assert ckpt.load_latest() == (2000, "two thousand")


def test_load_latest_ignores_temporary_files(tmp_path):
    ckpt = Checkpointer(tmp_path, serializer="pickle")
    ckpt.save(5, "five")
    (tmp_path / ".tmp-ckpt-000000000009.pt.1.aa").write_bytes(pickle.dumps("partial nine"))
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    assert ckpt.load_latest() == (5, "five")
    assert ckpt.steps() == [5]


@pytest.mark.parametrize("serializer", ["pickle", "torch", "auto"])
def test_load_latest_skips_a_truncated_newest_checkpoint(tmp_path, capsys, serializer):
    ckpt = Checkpointer(tmp_path, keep=5, serializer=serializer)
    ckpt.save(1, {"step": 1, "payload": list(range(1000))})
    newest = Path(ckpt.save(2, {"step": 2, "payload": list(range(1000))}))
    data = newest.read_bytes()
    newest.write_bytes(data[: len(data) // 2])
    step, state = ckpt.load_latest()
    assert (step, state["step"]) == (1, 1)
    err = capsys.readouterr().err
    assert "skipping checkpoint ckpt-000000000002.pt" in err and "previous" in err


def test_load_latest_skips_garbage_and_empty_files_down_to_the_good_one(tmp_path, capsys):
    ckpt = Checkpointer(tmp_path, keep=5)
    ckpt.save(1, "good")
    (tmp_path / "ckpt-000000000002.pt").write_bytes(b"")
    (tmp_path / "ckpt-000000000003.pt").write_bytes(b"\x00garbage\xff" * 10)
    assert ckpt.load_latest() == (1, "good")
    assert capsys.readouterr().err.count("skipping checkpoint") == 2


def test_load_latest_returns_zero_none_when_every_checkpoint_is_corrupt(tmp_path):
    (tmp_path / "ckpt-000000000004.pt").write_bytes(b"junk")
    assert Checkpointer(tmp_path).load_latest() == (0, None)


def test_roundtrip_with_torch_writes_torch_format(tmp_path):
    torch = pytest.importorskip("torch")
    ckpt = Checkpointer(tmp_path)  # auto: torch is installed here
    state = {"model": {"w": torch.arange(6.0).reshape(2, 3)}, "epoch": 3}
    path = ckpt.save(12, state)
    assert Path(path).read_bytes()[:4] == b"PK\x03\x04"  # torch.save's zip format
    step, loaded = Checkpointer(tmp_path).load_latest()
    assert step == 12 and loaded["epoch"] == 3
    assert torch.equal(loaded["model"]["w"], state["model"]["w"])


def test_roundtrip_without_torch_uses_pickle(tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoint, "_torch_available", lambda: False)
    path = Checkpointer(tmp_path).save(4, {"weights": [1.5, 2.5]})
    assert pickle.loads(Path(path).read_bytes()) == {"weights": [1.5, 2.5]}
    assert Checkpointer(tmp_path).load_latest() == (4, {"weights": [1.5, 2.5]})


def run_python(code, *flags, env=None):
    """Runs `code` in a fresh interpreter with the SDK on sys.path (flags such as -S, which
    hides site-packages and so torch)."""
    prelude = f"import sys; sys.path.insert(0, {SDK_PYTHON!r})\n"
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")}
    full_env.update(env or {})
    return subprocess.run([sys.executable, *flags, "-c", prelude + textwrap.dedent(code)],
                          env=full_env, capture_output=True, text=True, timeout=60)


def test_a_process_without_torch_saves_pickle_that_a_torch_process_loads(tmp_path):
    result = run_python(f"""
        import importlib.util
        assert importlib.util.find_spec("torch") is None, "torch visible with -S"
        import shoal
        shoal.Checkpointer({str(tmp_path)!r}).save(8, {{"lr": 0.1}})
        """, "-S")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "ckpt-000000000008.pt").read_bytes()[:1] == b"\x80"  # a pickle
    assert Checkpointer(tmp_path).load_latest() == (8, {"lr": 0.1})


def test_a_process_without_torch_falls_back_past_a_torch_checkpoint(tmp_path):
    pytest.importorskip("torch")
    Checkpointer(tmp_path, serializer="pickle").save(1, "pickled")
    Checkpointer(tmp_path, serializer="torch").save(2, {"t": 1})
    result = run_python(f"""
        import shoal
        print(shoal.Checkpointer({str(tmp_path)!r}).load_latest())
        """, "-S")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "(1, 'pickled')"
    assert "torch is not installed" in result.stderr


def test_raw_serializer_reads_files_named_as_the_cpp_sdk_names_them(tmp_path):
    # sdk.h writes raw bytes as ckpt-%012llu.pt (tests/sdk/sdk_header_test.cc checks the same
    # files from the C++ side).
    (tmp_path / "ckpt-000000000042.pt").write_bytes(b"\x00raw bytes\x01")
    (tmp_path / "ckpt-1000000000000.pt").write_bytes(b"13 digits")
    assert sorted(checkpoint.checkpoint_step(n) for n in LocalDirStorage(tmp_path).list()) == [
        42, 10**12]
    ckpt = Checkpointer(tmp_path, serializer="raw")
    assert ckpt.load_latest() == (10**12, b"13 digits")
    ckpt.save(10**12 + 1, b"more")
    assert (tmp_path / "ckpt-1000000000001.pt").read_bytes() == b"more"
    with pytest.raises(TypeError):
        ckpt.save(1, "not bytes")


def test_directory_and_keep_default_to_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("SHOAL_CHECKPOINT_DIR", str(tmp_path))
    monkeypatch.setenv("SHOAL_CHECKPOINT_KEEP", "1")
    ckpt = Checkpointer(serializer="pickle")
    assert ckpt.keep == 1 and ckpt.storage.directory == str(tmp_path)
    ckpt.save(1, 1)
    ckpt.save(2, 2)
    assert files(tmp_path) == ["ckpt-000000000002.pt"]
    monkeypatch.delenv("SHOAL_CHECKPOINT_KEEP")
    assert Checkpointer().keep == 3


def test_without_a_directory_the_error_says_how_to_give_one():
    with pytest.raises(ValueError, match="SHOAL_CHECKPOINT_DIR"):
        Checkpointer()


def test_invalid_keep_is_refused(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="at least 1"):
        Checkpointer(tmp_path, keep=0)
    monkeypatch.setenv("SHOAL_CHECKPOINT_KEEP", "three")
    with pytest.raises(ValueError, match="SHOAL_CHECKPOINT_KEEP"):
        Checkpointer(tmp_path)


def test_a_custom_storage_replaces_files_without_changing_the_calls():
    class MemoryStorage(checkpoint.CheckpointStorage):
        def __init__(self):
            self.objects = {}

        def list(self):
            return list(self.objects)

        def write_atomically(self, name, data):
            self.objects[name] = bytes(data)
            return f"memory://{name}"

        def read(self, name):
            return self.objects[name]

        def delete(self, name):
            self.objects.pop(name, None)

    storage = MemoryStorage()
    ckpt = Checkpointer(storage=storage, keep=2, serializer="pickle")
    for step in (1, 2, 3):
        assert ckpt.save(step, {"s": step}) == f"memory://ckpt-{step:012d}.pt"
    assert sorted(storage.objects) == ["ckpt-000000000002.pt", "ckpt-000000000003.pt"]
    assert ckpt.load_latest() == (3, {"s": 3})


def test_a_write_failure_leaves_no_temporary(tmp_path, monkeypatch):
    def failing_fsync(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(OSError):
        Checkpointer(tmp_path, serializer="pickle").save(1, 1)
    assert files(tmp_path) == []
