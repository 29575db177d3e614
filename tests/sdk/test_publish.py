"""shoal.publish_model: versions appear whole and numbered once, a killed publisher leaves none,
two publishers never share a number, and the config is derived from a real call."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import shoal
from shoal.publish import INCOMING_PREFIX, versions

SDK_PYTHON = str(Path(shoal.__file__).resolve().parents[1])


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = torch.nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.hidden(x))


def run_python(code, directory, env=None, **kwargs):
    """Runs `code` from a file of its own in `directory` (TorchScript needs the source of what it
    scripts)."""
    Path(directory).mkdir(exist_ok=True)
    script = Path(directory) / f"script-{len(os.listdir(directory))}.py"
    script.write_text(textwrap.dedent(code))
    full_env = dict(os.environ, PYTHONPATH=SDK_PYTHON, **(env or {}))
    return subprocess.Popen([sys.executable, str(script)], env=full_env, **kwargs)


def test_versions_count_up_and_load_as_published(tmp_path):
    torch.manual_seed(1)
    model = Mlp()
    assert shoal.publish_model(model, "mlp", repository=str(tmp_path)) == 1
    assert shoal.publish_model(torch.jit.script(model), "mlp", repository=str(tmp_path)) == 2
    saved = tmp_path / "saved.pt"
    torch.jit.script(model).save(str(saved))
    assert shoal.publish_model(saved, "mlp", repository=str(tmp_path)) == 3
    assert versions(str(tmp_path), "mlp") == [1, 2, 3]
    x = torch.rand(3, 16)
    for v in (1, 2, 3):
        loaded = torch.jit.load(str(tmp_path / "mlp" / str(v) / "model.pt"))
        assert torch.equal(loaded(x), model(x))
    # Nothing but the versions and the lock is left in the model's directory.
    assert sorted(os.listdir(tmp_path / "mlp")) == [".publish.lock", "1", "2", "3"]


def test_the_repository_comes_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("SHOAL_MODEL_REPOSITORY", str(tmp_path))
    assert shoal.publish_model(Mlp(), "m") == 1
    assert (tmp_path / "m" / "1" / "model.pt").is_file()


def test_the_config_is_derived_from_a_real_call_and_rewritten_only_when_it_changes(tmp_path):
    import yaml
    shoal.publish_model(Mlp(), "mlp", repository=str(tmp_path), example_inputs=torch.zeros(2, 16),
                        config={"max_batch_size": 8})
    config_path = tmp_path / "mlp" / "config.yaml"
    config = yaml.safe_load(config_path.read_text())
    # And a warmup of that shape (batch 1), so that TorchScript's first, slow runs fall on no
    # client request (nor into a canary's latency comparison).
    assert config == {"max_batch_size": 8,
                      "inputs": [{"name": "x", "datatype": "FP32", "dims": [16]}],
                      "outputs": [{"name": "output", "datatype": "FP32", "dims": [8]}],
                      "warmup": [{"count": 2, "inputs": {"x": {"dims": [1, 16], "fill": "one"}}}]}
    before = config_path.stat().st_mtime_ns
    time.sleep(0.01)
    assert shoal.publish_model(Mlp(), "mlp", repository=str(tmp_path), example_inputs=torch.zeros(2, 16),
                               config={"max_batch_size": 8}) == 2
    assert config_path.stat().st_mtime_ns == before
    # Without batching the dims are the whole shape; a given key wins over the derived one.
    shoal.publish_model(Mlp(), "flat", repository=str(tmp_path), example_inputs=torch.zeros(1, 16),
                        config={"outputs": [{"name": "h", "datatype": "FP32", "dims": [1, 8]}]})
    flat = yaml.safe_load((tmp_path / "flat" / "config.yaml").read_text())
    assert flat["inputs"] == [{"name": "x", "datatype": "FP32", "dims": [1, 16]}]
    assert flat["outputs"] == [{"name": "h", "datatype": "FP32", "dims": [1, 8]}]
    assert flat["warmup"] == [{"count": 2, "inputs": {"x": {"dims": [1, 16], "fill": "one"}}}]


@pytest.mark.parametrize("given, warmup", [
    ({"warmup": []}, []),  # none, by choice
    ({"warmup": [{"inputs": {"x": {"dims": [1, 16], "fill": "one"}}}]},
     [{"inputs": {"x": {"dims": [1, 16], "fill": "one"}}}]),
    # Inputs of the caller's own: their names and dims may not be the example's, so no warmup.
    ({"inputs": [{"name": "features", "datatype": "FP32", "dims": [-1]}]}, None),
])
def test_a_warmup_or_inputs_the_config_gives_leave_the_warmup_to_it(tmp_path, given, warmup):
    import yaml
    shoal.publish_model(Mlp(), "m", repository=str(tmp_path), example_inputs=torch.zeros(1, 16),
                        config=given)
    assert yaml.safe_load((tmp_path / "m" / "config.yaml").read_text()).get("warmup") == warmup


@pytest.mark.parametrize("call, message", [
    (lambda repo: shoal.publish_model(Mlp(), "m"), "no repository"),
    (lambda repo: shoal.publish_model(Mlp(), ".hidden", repository=repo), "model name '.hidden'"),
    (lambda repo: shoal.publish_model(Mlp(), "a/b", repository=repo), "model name 'a/b'"),
    (lambda repo: shoal.publish_model(Mlp(), "m", repository=repo + "/missing"), "is not a directory"),
    (lambda repo: shoal.publish_model(42, "m", repository=repo), "not int"),
    (lambda repo: shoal.publish_model(repo + "/none.pt", "m", repository=repo), "cannot read the model file"),
    (lambda repo: shoal.publish_model(Mlp(), "m", repository="hdfs:///models"),
     "must be hdfs://namenode"),
    (lambda repo: shoal.publish_model(Mlp(), "m", repository="s3://b/models"), "neither a directory"),
    (lambda repo: shoal.publish_model(Mlp(), "m", repository=repo, config="max_batch_size: 2",
                                      example_inputs=torch.zeros(1, 16)), "give config as a dict"),
])
def test_bad_arguments_are_named_and_publish_nothing(tmp_path, monkeypatch, call, message):
    monkeypatch.delenv("SHOAL_MODEL_REPOSITORY", raising=False)
    with pytest.raises(shoal.PublishError, match=message):
        call(str(tmp_path))
    assert not (tmp_path / "m").exists() or versions(str(tmp_path), "m") == []


def test_a_file_that_is_not_torchscript_is_refused(tmp_path):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a model")
    with pytest.raises(shoal.PublishError, match="not a TorchScript archive"):
        shoal.publish_model(bad, "m", repository=str(tmp_path))
    assert versions(str(tmp_path), "m") == []


def test_a_reader_never_sees_part_of_a_version(tmp_path, monkeypatch):
    """A poller lists the versions and loads each one's model.pt as soon as it appears, while a
    publisher publishes 15 versions of a model of a few MB, each pausing 50 ms half-written (the
    test hook), so that a version visible before it is whole would be seen so."""
    monkeypatch.setenv("SHOAL_TEST_PUBLISH_WRITE_DELAY_S", "0.05")
    reader = run_python(f"""
        import os, sys, time, torch
        from shoal.publish import versions
        repo, seen, deadline = {str(tmp_path)!r}, set(), time.time() + 120
        while len(seen) < 15 and time.time() < deadline:
            for v in versions(repo, "big"):
                if v in seen:
                    continue
                torch.jit.load(os.path.join(repo, "big", str(v), "model.pt"))  # raises if partial
                seen.add(v)
        print(sorted(seen))
        """, tmp_path / "scripts", stdout=subprocess.PIPE, text=True)
    big = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.Linear(1024, 512))  # ~4 MB
    published = [shoal.publish_model(big, "big", repository=str(tmp_path)) for _ in range(15)]
    out, _ = reader.communicate(timeout=150)
    assert reader.returncode == 0, "the reader failed to load a version it saw"
    assert published == list(range(1, 16))
    assert out.strip() == str(list(range(1, 16)))


def test_a_publisher_killed_mid_write_leaves_no_version(tmp_path):
    shoal.publish_model(Mlp(), "m", repository=str(tmp_path))
    writer = run_python(f"""
        import torch, shoal
        class M(torch.nn.Module):
            def forward(self, x): return x * 2
        shoal.publish_model(M(), "m", repository={str(tmp_path)!r})
        """, tmp_path / "scripts", env={"SHOAL_TEST_PUBLISH_WRITE_DELAY_S": "30"})
    model_dir = tmp_path / "m"
    deadline = time.monotonic() + 60
    while not any(e.startswith(INCOMING_PREFIX) and (model_dir / e / "model.pt").exists()
                  and (model_dir / e / "model.pt").stat().st_size > 0 for e in os.listdir(model_dir)):
        assert time.monotonic() < deadline, "the publisher never started writing"
        assert writer.poll() is None, "the publisher ended before it was killed"
        time.sleep(0.02)
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    assert versions(str(tmp_path), "m") == [1]
    assert any(e.startswith(INCOMING_PREFIX) for e in os.listdir(model_dir))
    # The next publication takes the next number and clears what the killed one left.
    assert shoal.publish_model(Mlp(), "m", repository=str(tmp_path)) == 2
    assert not any(e.startswith(INCOMING_PREFIX) for e in os.listdir(model_dir))


def test_two_publishers_never_get_the_same_number(tmp_path):
    code = f"""
        import torch, shoal
        class M(torch.nn.Module):
            def forward(self, x): return x + 1
        print(" ".join(str(shoal.publish_model(M(), "shared", repository={str(tmp_path)!r}))
                       for _ in range(12)))
        """
    a = run_python(code, tmp_path / "scripts", stdout=subprocess.PIPE, text=True)
    b = run_python(code, tmp_path / "scripts", stdout=subprocess.PIPE, text=True)
    out_a, _ = a.communicate(timeout=120)
    out_b, _ = b.communicate(timeout=120)
    assert a.returncode == 0 and b.returncode == 0
    got_a = [int(v) for v in out_a.split()]
    got_b = [int(v) for v in out_b.split()]
    assert sorted(got_a + got_b) == list(range(1, 25))
    assert got_a == sorted(got_a) and got_b == sorted(got_b)
    assert versions(str(tmp_path), "shared") == list(range(1, 25))


def test_keep_leaves_the_newest_versions(tmp_path, monkeypatch):
    monkeypatch.setenv("SHOAL_MODEL_KEEP", "2")
    for expected in range(1, 6):
        assert shoal.publish_model(Mlp(), "m", repository=str(tmp_path)) == expected
        assert versions(str(tmp_path), "m") == list(range(max(1, expected - 1), expected + 1))
    assert not any(e.startswith(".removing-") for e in os.listdir(tmp_path / "m"))
    monkeypatch.setenv("SHOAL_MODEL_KEEP", "0")
    with pytest.raises(shoal.PublishError, match="SHOAL_MODEL_KEEP='0' must be an integer >= 1"):
        shoal.publish_model(Mlp(), "m", repository=str(tmp_path))
    assert versions(str(tmp_path), "m") == [4, 5]
