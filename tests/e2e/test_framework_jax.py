"""examples/jax: two JAX processes on CPU train data-parallel through jax.distributed, started
by Shoal's `framework: jax` (JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID)."""

import framework_examples as fx


def test_jax_example_trains_to_its_threshold(run_shoal, repo_root):
    fx.require_venv("jax")
    r = run_shoal("run", repo_root / "examples" / "jax" / "job.yaml", timeout=240)
    metrics = fx.check_trained(r, "worker:0", 0.90)
    assert metrics["world_size"] == 2 and metrics["weights_identical"] is True, metrics
