"""The TensorBoard sidecar: `tensorboard:` in a job file starts TensorBoard on loopback for the
job's life, prints its address, gives every task SHOAL_TENSORBOARD_LOGDIR, stays out of the
job's outcome; `shoal tensorboard JOB` serves the logs again after the job ended."""

import json
import re
import urllib.error
import urllib.request

import framework_examples as fx
import shoal_e2e as e2e

URL = re.compile(r"TensorBoard(?: \S+)? at (http://127\.0\.0\.1:\d+/)")


def get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read().decode()


def runs(url):
    try:
        status, body = get(url + "data/runs")
        return json.loads(body) if status == 200 else []
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return []


def test_tensorboard_serves_the_jobs_logs_while_it_runs(start_shoal, run_shoal, repo_root,
                                                        jobs_dir, tmp_path):
    fx.require_venv("tensorboard")
    # The demo's tensorboard.yaml, made to run long enough (a 20 ms pause per step) for
    # TensorBoard (rescanning every second) to be seen listing the run before the job ends.
    example = repo_root / "examples" / "pytorch-ddp"
    text = (example / "tensorboard.yaml").read_text()
    text = text.replace("tensorboard: {}", "tensorboard: {command: "
                        "[/var/cache/shoal/venvs/tensorboard/bin/tensorboard, --reload_interval, "
                        "'1']}")
    text = text.replace('"--epochs", "10"]', '"--epochs", "10", "--step-delay", "0.02"]')
    assert "--step-delay" in text and "--reload_interval" in text
    job = tmp_path / "tensorboard.yaml"
    job.write_text(text.replace("train.py", str(example / "train.py")))
    client = start_shoal("run", job)
    url = e2e.wait_until(lambda: (m := URL.search(client.stderr())) and m.group(1), 60,
                         "shoal run to print TensorBoard's address")
    job_id = e2e.wait_for_job(jobs_dir).name
    # rank 0 writes one run, named after the job, into SHOAL_TENSORBOARD_LOGDIR.
    e2e.wait_until(lambda: job_id in runs(url), 60, "TensorBoard to list the job's run")
    assert client.wait(240) == 0, client.stderr()
    # Gone with the job; the job's outcome never waited for it.
    def refused():
        try:
            get(url, timeout=1)
            return False
        except (urllib.error.URLError, ConnectionError):
            return True
    e2e.wait_until(refused, 10, "TensorBoard to stop with the job")

    # Afterwards, over the same logs.
    again = start_shoal("tensorboard", job_id)
    try:
        url2 = e2e.wait_until(lambda: (m := URL.search(again.stderr())) and m.group(1), 60,
                              "shoal tensorboard to print an address")
        e2e.wait_until(lambda: job_id in runs(url2), 30, "the run to be listed again")
        status, _ = get(url2 + "data/plugin/scalars/tags")
        assert status == 200
    finally:
        again.kill()


def test_missing_tensorboard_program_refuses_the_job(run_shoal, write_job, jobs_dir):
    job = write_job("""
        name: tb-missing
        tensorboard: {command: [/nonexistent/bin/tensorboard]}
        roles:
          worker: {command: ["true"]}
        """)
    r = run_shoal("run", job, timeout=30)
    assert r.returncode == 2, r.stderr
    assert "tensorboard.command: '/nonexistent/bin/tensorboard' is not an executable program" \
        in r.stderr, r.stderr
    assert not jobs_dir.exists() or not list(jobs_dir.iterdir())


def test_a_job_without_tensorboard_is_not_served_as_an_empty_directory(run_shoal, write_job,
                                                                       jobs_dir):
    job = write_job("""
        name: tb-none
        roles:
          worker: {command: ["true"]}
        """)
    assert run_shoal("run", job, timeout=60).returncode == 0
    (job_dir,) = e2e.job_dirs(jobs_dir)
    r = run_shoal("tensorboard", job_dir.name, timeout=30)
    assert r.returncode == 2, r.stderr
    assert (f"shoal: job {job_dir.name} has no `tensorboard` section, so its tasks were given no "
            "TensorBoard directory") in r.stderr, r.stderr
    assert "add `tensorboard: {}` to the job file" in r.stderr
