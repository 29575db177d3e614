"""examples/horovod: two Horovod ranks (PyTorch, gloo) train without horovodrun: Shoal's
`framework: horovod` gives each rank horovodrun's variables and the master serves the gloo
rendezvous store."""

import framework_examples as fx


def test_horovod_example_trains_through_shoals_rendezvous(run_shoal, repo_root):
    fx.require_venv("horovod")
    r = run_shoal("run", repo_root / "examples" / "horovod" / "job.yaml", timeout=240)
    metrics = fx.check_trained(r, "worker:0", 0.90)
    assert metrics["world_size"] == 2, metrics
