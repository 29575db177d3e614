"""examples/pytorch-torchrun: a script written for torchrun (init_process_group() from env://,
LOCAL_RANK, TORCHELASTIC_RUN_ID) runs unchanged under Shoal's `framework: pytorch`."""

import framework_examples as fx


def test_torchrun_script_trains_unchanged(run_shoal, repo_root):
    r = run_shoal("run", repo_root / "examples" / "pytorch-torchrun" / "job.yaml", timeout=180)
    metrics = fx.check_trained(r, "worker:0", 0.90)
    assert metrics["world_size"] == 2, metrics
    assert "worker:0 | run torchrun-style-" in r.stdout, r.stdout  # TORCHELASTIC_RUN_ID: the job id
