"""The demo: examples/pytorch-ddp/job.yaml trains with real DDP over two workers."""

import re

import shoal_e2e as e2e


def test_demo_trains_to_90_percent(run_shoal, repo_root, jobs_dir):
    job = repo_root / "examples" / "pytorch-ddp" / "job.yaml"
    r = run_shoal("run", job, timeout=240)
    assert r.returncode == 0, f"rc={r.returncode}\n--- stdout\n{r.stdout}\n--- stderr\n{r.stderr}"

    lines = r.stdout.splitlines()
    assert any(l.startswith("worker:0 | ") for l in lines), r.stdout
    assert any(l.startswith("worker:1 | ") for l in lines), r.stdout
    # Task output only on stdout, every line prefixed; shoal's own lines only on stderr.
    assert all(re.match(r"^worker:[01] \| ", l) for l in lines), r.stdout
    assert not any(l.startswith("shoal | ") for l in lines)

    accuracy = [float(m.group(1)) for l in lines
                if (m := re.fullmatch(r"worker:0 \| final_accuracy=([0-9.]+)", l))]
    assert len(accuracy) == 1, f"expected one final_accuracy line from worker:0:\n{r.stdout}"
    assert accuracy[0] >= 0.90
    assert not any("final_accuracy=" in l for l in lines if l.startswith("worker:1 | "))

    err = [l for l in r.stderr.splitlines() if l.strip()]
    assert all(l.startswith("shoal | ") for l in err), r.stderr
    assert err and re.fullmatch(r"shoal \| job digits-ddp-\d{8}-\d{6}-[0-9a-f]{4} succeeded in "
                                r"[0-9.]+s", err[-1]), r.stderr

    # Nothing of the job is left running.
    (job_dir,) = e2e.job_dirs(jobs_dir)
    e2e.wait_until(lambda: not e2e.job_processes(job_dir.name, job_dir), 10,
                   "every process of the finished job to exit")
