"""examples/libtorch: a C++ trainer linked with Debian's libtorch finds its peers from the
torchrun environment of `framework: pytorch` (c10d TCPStore + ProcessGroupGloo) and trains."""

import os
import subprocess

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


def test_libtorch_trainer_publishes_its_model_with_the_cpp_sdk(run_shoal, repo_root, tmp_path,
                                                               jobs_dir):
    """--publish: rank 0 exports the trained MLP as TorchScript and publishes it with the C++
    SDK's PublishModel into the job's publish repository; the journal records it and Python's
    torch loads and runs the version."""
    binary = os.path.realpath(os.path.join(os.path.dirname(e2e.SHOAL_BIN), "..", "..",
                                           "examples", "libtorch", "libtorch-trainer"))
    assert os.access(binary, os.X_OK), f"{binary} was not built"
    job = tmp_path / "job.yaml"
    job.write_text(f"""
name: libtorch-publish
framework: pytorch
publish: {{repository: ./models}}
roles:
  worker:
    instances: 2
    command: ["{binary}", "--epochs", "10", "--publish", "mlp"]
    resources: {{cpus: 1, memory: 1GiB}}
""")
    (tmp_path / "models").mkdir()
    r = run_shoal("run", job, timeout=180)
    metrics = fx.check_trained(r, "worker:0", 0.90)
    assert "published mlp version 1" in r.stdout, r.stdout
    assert sorted(os.listdir(tmp_path / "models" / "mlp")) == [".publish.lock", "1"]

    (job_dir,) = e2e.job_dirs(jobs_dir)
    (published,) = e2e.events_of(e2e.read_events(job_dir), "model_published")
    assert published["task"] == "worker:0" and published["version"] == 1, published
    assert published["step"] == 10 * 32, published  # 10 epochs of 2048 samples in batches of 64
    assert abs(published["metrics"]["accuracy"] - metrics["value"]) < 1e-3, published
    assert 0 < published["metrics"]["loss"] < 1, published

    check = subprocess.run(
        [e2e.PYTHON, "-c",
         "import sys, torch\n"
         "m = torch.jit.load(sys.argv[1])\n"
         "print(tuple(m(torch.zeros(3, 8)).shape))\n",
         str(tmp_path / "models" / "mlp" / "1" / "model.pt")],
        capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stderr
    assert check.stdout.strip() == "(3, 4)"
