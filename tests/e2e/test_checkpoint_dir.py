"""The directories a task is told about exist before it starts (issue 23, defect 3).

A torchrun-style script that never uses Shoal's SDK and only calls torch.save into
SHOAL_CHECKPOINT_DIR failed with "Parent directory .../checkpoints does not exist" under each of
the three ways a job file names its checkpoints (no section, `checkpoint:`, `checkpoint: {dir:
./ckpt}`), and under restart-group it burned every restart on that. The agent now makes the
directory (with SHOAL_TENSORBOARD_LOGDIR and SHOAL_JOB_DIR) before exec, and a directory it
cannot make fails the start with a message that names it.
"""

import textwrap

import pytest

import shoal_e2e as e2e

SAVE_SCRIPT = """\
import os
import torch

path = os.path.join(os.environ["SHOAL_CHECKPOINT_DIR"], "x-%s.pt" % os.environ["RANK"])
torch.save({"rank": int(os.environ["RANK"])}, path)
print("saved", path)
"""


def job_text(checkpoint_section, max_restarts=2):
    return textwrap.dedent(f"""\
        name: ckpt-dir
        framework: pytorch
        on_failure: restart-group
        max_restarts: {max_restarts}
        backoff: {{initial: 0, max: 0}}
        """) + checkpoint_section + textwrap.dedent(f"""\
        roles:
          worker:
            instances: 2
            command: ["{e2e.PYTHON}", "save.py"]
            resources: {{cpus: 0.5}}
        """)


@pytest.mark.parametrize("section", ["", "checkpoint:\n", "checkpoint: {dir: ./ckpt}\n"],
                         ids=["no-section", "empty-section", "relative-dir"])
def test_torch_save_into_the_checkpoint_dir_works_at_the_first_attempt(
        section, write_job, write_file, run_shoal, jobs_dir, tmp_path):
    write_file("save.py", SAVE_SCRIPT)
    job = write_job(job_text(section))
    r = run_shoal("run", job, timeout=120)
    assert r.returncode == 0, f"rc={r.returncode}\n{r.stdout}\n{r.stderr}"
    (job_dir,) = e2e.job_dirs(jobs_dir)
    expected = tmp_path / "ckpt" if "./ckpt" in section else job_dir / "checkpoints"
    assert sorted(p.name for p in expected.iterdir()) == ["x-0.pt", "x-1.pt"]
    # Each worker saved at its first attempt: no restart was spent.
    events = e2e.read_events(job_dir)
    assert not e2e.events_of(events, "failure_handled", "group_restart_begun"), events


def test_a_checkpoint_dir_that_cannot_be_made_fails_the_start_naming_it(
        write_job, write_file, run_shoal, tmp_path):
    write_file("save.py", SAVE_SCRIPT)
    blocker = write_file("blocker", "a file, not a directory\n")
    job = write_job(job_text(f"checkpoint: {{dir: {blocker}/ckpt}}\n", max_restarts=0))
    r = run_shoal("run", job, timeout=120)
    assert r.returncode != 0, r.stderr
    assert (f"cannot create the directory '{blocker}/ckpt' named in SHOAL_CHECKPOINT_DIR: "
            "Not a directory (ENOTDIR 20)") in r.stderr, r.stderr
    assert "could not start" in r.stderr, r.stderr
    assert "saved" not in r.stdout
