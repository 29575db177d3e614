"""examples/libtorch: a C++ trainer linked with Debian's libtorch finds its peers from the
torchrun environment of `framework: pytorch` (c10d TCPStore + ProcessGroupGloo) and trains."""

import os

import framework_examples as fx
import shoal_e2e as e2e


def test_libtorch_trainer_trains_to_its_threshold(run_shoal, repo_root, tmp_path):
    binary = os.path.join(os.path.dirname(e2e.SHOAL_BIN), "..", "..", "examples", "libtorch",
                          "libtorch-trainer")
    binary = os.path.realpath(binary)
    assert os.access(binary, os.X_OK), (
        f"{binary} was not built: install libtorch-dev and libgloo-dev (./setup.sh does) and "
        "rebuild; CMake says why under 'libtorch example:'")
    # The example names the trainer relative to the repository's build/; this build may be
    # elsewhere, so the same job file points at it.
    text = (repo_root / "examples" / "libtorch" / "job.yaml").read_text()
    assert '"../../build/examples/libtorch/libtorch-trainer"' in text
    job = tmp_path / "job.yaml"
    job.write_text(text.replace('"../../build/examples/libtorch/libtorch-trainer"', f'"{binary}"'))
    r = run_shoal("run", job, timeout=180)
    metrics = fx.check_trained(r, "worker:0", 0.90)
    assert metrics["world_size"] == 2, metrics
