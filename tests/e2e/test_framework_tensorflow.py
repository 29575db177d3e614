"""examples/tensorflow: Keras under tf.distribute, from the TF_CONFIG Shoal's
`framework: tensorflow` gives: MultiWorkerMirroredStrategy with 2 workers, and
ParameterServerStrategy with a chief, 2 workers and a ps (the last three untracked)."""

import json

import framework_examples as fx
import shoal_e2e as e2e


def test_multi_worker_mirrored_strategy_trains_to_its_threshold(run_shoal, repo_root):
    fx.require_venv("tensorflow")
    r = run_shoal("run", repo_root / "examples" / "tensorflow" / "mwms.yaml", timeout=240)
    fx.check_trained(r, "worker:0", 0.90)
    # Both workers trained (MWMS all-reduces every step; one alone would hang or fail).
    assert any(l.startswith("worker:1 | ") for l in r.stdout.splitlines()), r.stdout


def test_parameter_server_strategy_trains_to_its_threshold(run_shoal, repo_root, jobs_dir):
    fx.require_venv("tensorflow")
    r = run_shoal("run", repo_root / "examples" / "tensorflow" / "ps.yaml", timeout=240)
    fx.check_trained(r, "chief:0", 0.90)
    (job_dir,) = e2e.job_dirs(jobs_dir)
    status = json.loads((job_dir / "status.json").read_text())
    states = {f'{t["role"]}:{t["index"]}': t["state"] for t in status["tasks"]}
    assert states["chief:0"] == "succeeded", states
    # The servers never exit by themselves: Shoal stops them once the chief is done.
    assert {states["worker:0"], states["worker:1"], states["ps:0"]} == {"killed"}, states
