"""examples/paddle: two PaddlePaddle trainers on CPU train with paddle.DataParallel over gloo,
started by Shoal's `framework: paddle` (the launcher's collective variables)."""

import framework_examples as fx


def test_paddle_collective_example_trains_to_its_threshold(run_shoal, repo_root):
    fx.require_venv("paddle")
    r = run_shoal("run", repo_root / "examples" / "paddle" / "job.yaml", timeout=240)
    metrics = fx.check_trained(r, "trainer:0", 0.90)
    assert metrics["world_size"] == 2 and metrics["weights_identical"] is True, metrics
