"""The online-training example (examples/online-training) end to end, as its README runs it:
`shoal serve` following the repository, the job training on data files as they arrive and
publishing every 40 steps, the feeder writing files, and the load generator running
throughout. No request fails, several versions are published and answer, and every data file
is trained on exactly once, although the trainer is killed once in the middle."""

import json
import os
import re
import signal
import subprocess

import shoal_e2e as e2e

EXAMPLE = e2e.REPO_ROOT / "examples" / "online-training"


def example_job(tmp_path):
    """examples/online-training/job.yaml with its /tmp/shoal-online paths moved under tmp_path,
    its working directory the example's, a shorter idle exit and slower steps."""
    text = (EXAMPLE / "job.yaml").read_text()
    assert text.count("/tmp/shoal-online") >= 3 and "--idle-exit\", \"60\"" in text
    text = text.replace("/tmp/shoal-online", str(tmp_path / "online"))
    # 50 ms a step: a file (8 steps) takes longer to train on than the feeder takes to write
    # the next, so the trainer is busy when it is killed, most likely in the middle of a file.
    text = text.replace("--idle-exit\", \"60\"",
                        "--idle-exit\", \"6\", \"--step-delay\", \"0.05\"")
    text = text.replace("    instances: 1\n", f"    instances: 1\n    working_dir: {EXAMPLE}\n")
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return path


def background(argv, out_path, env=None):
    with open(out_path, "wb") as out:
        return subprocess.Popen([str(a) for a in argv], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=e2e.base_env(env),
                                start_new_session=True)


def feed(base, files):
    r = subprocess.run([e2e.PYTHON, str(EXAMPLE / "feed.py"), "--out", str(base / "incoming"),
                        "--files", str(files), "--interval", "0.3"], capture_output=True,
                       text=True, timeout=120, env=e2e.base_env())
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])["files"]


def versions_on_disk(base):
    try:
        return [int(n) for n in os.listdir(base / "models" / "online") if n.isdigit()]
    except FileNotFoundError:
        return []


def test_online_training_serves_every_published_version_without_a_failed_request(
        shoal_bin, run_shoal, detach_job, shoal_status, wait_for_state, tmp_path):
    base = tmp_path / "online"
    (base / "models").mkdir(parents=True)
    job_file = example_job(tmp_path)

    serve = background([shoal_bin, "serve", "--model-repository", base / "models",
                        "--http-port", "0", "--grpc-port", "0"],
                       tmp_path / "serve.out")
    load = None
    try:
        line = e2e.wait_until(lambda: next((l for l in (tmp_path / "serve.out").read_text()
                                            .splitlines() if "listening on http://" in l), None),
                              60, "shoal serve to listen")
        url = line.split("listening on ")[1].split()[0]
        load = background([e2e.PYTHON, EXAMPLE / "load.py", "--url", url, "--rate", "50",
                           "--wait", "120", "--json"], tmp_path / "load.out")

        job_id = detach_job(job_file)
        fed = feed(base, 15)
        # Two versions published: the trainer is in the middle of the stream, with files
        # waiting. Kill it; the job restarts it from its newest checkpoint (the file it was
        # training on is trained on again from there) while the rest of the data arrives.
        e2e.wait_until(lambda: len(versions_on_disk(base)) >= 2, 90, "two published versions")
        trainer = shoal_status(job_id)["tasks"][0]
        assert e2e.kill_task(trainer["pid"], job_id), trainer
        fed += feed(base, 15)
        final = wait_for_state(job_id, lambda s: s["state"] not in ("pending", "running"), 120,
                               "the job to end once the data stopped")
        assert final["state"] == "succeeded", final
        assert final["tasks"][0]["restarts"] == 1, final

        logs = run_shoal("logs", job_id, timeout=60)
        assert logs.returncode == 0, logs.stderr
        summary = json.loads(next(l for l in reversed(logs.stdout.splitlines())
                                  if '"consumed"' in l).split("| ", 1)[1])
        # Every file once: the checkpointed record holds each fed file, none twice, and the
        # rows trained on are exactly the rows fed.
        assert summary["consumed"] == sorted(fed) and len(set(fed)) == 30, summary
        assert summary["rejected"] == [] and summary["rows"] == 30 * 256, summary
        reported = re.findall(r"consumed (data-\d+\.csv) rows", logs.stdout)
        assert len(reported) == len(set(reported)), "a file was reported consumed twice"
        assert "resumed from checkpoint step" in logs.stdout
        last = summary["last_version"]
        assert last is not None and last >= 4, summary

        # The load saw the last version answer, then stops and reports.
        e2e.wait_until(lambda: f"load: version {last} answering" in
                       (tmp_path / "load.out").read_text(), 30, f"version {last} to answer")
        load.send_signal(signal.SIGTERM)
        assert load.wait(timeout=60) == 0, (tmp_path / "load.out").read_text()
        report = json.loads((tmp_path / "load.out").read_text().strip().splitlines()[-1])
        assert report["failed"] == 0, report
        assert report["went_back"] == 0, report
        assert report["requests"] > 100, report
        seen = sorted(int(v) for v in report["versions"])
        assert len(seen) >= 3 and seen[-1] == last, report
    finally:
        for proc in (load, serve):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
