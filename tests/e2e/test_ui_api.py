"""`shoal ui`'s server against real jobs and a real `shoal serve` (no browser: the pages are
tested in test_ui_browser.py): bad options exit 2 and change nothing; kill and run-again act on
real jobs; the history outlives the server; the models page reads a real model server."""

import json
import socket
import subprocess

import pytest

import shoal_e2e as e2e
from ui_support import Ui

SLEEPER = """
name: sleeper
roles:
  worker:
    instances: 2
    command: ["/usr/bin/python3", "-u", "-c", "import time\\nfor i in range(600):\\n    print('tick', i, flush=True)\\n    time.sleep(0.2)"]
    resources: {cpus: 0.2}
"""


@pytest.fixture
def ui(shoal_bin, jobs_dir, tmp_path):
    jobs_dir.mkdir(exist_ok=True)
    u = Ui(shoal_bin, jobs_dir, tmp_path)
    yield u
    assert u.stop() == 0


def run_ui(shoal_bin, jobs_dir, *args):
    return subprocess.run([shoal_bin, "--jobs-dir", str(jobs_dir), "ui", *args],
                          capture_output=True, text=True, timeout=30, env=e2e.base_env())


def test_bad_options_exit_2_with_a_message_naming_what_is_wrong(shoal_bin, jobs_dir, tmp_path):
    r = run_ui(shoal_bin, jobs_dir, "--listen", "8470")
    assert r.returncode == 2 and "--listen '8470' is not HOST:PORT" in r.stderr, r.stderr
    r = run_ui(shoal_bin, jobs_dir, "--listen", "0.0.0.0:0")
    assert r.returncode == 2 and "without a token" in r.stderr and "--token-file" in r.stderr, r.stderr
    short = tmp_path / "short-token"
    short.write_text("abc\n")
    r = run_ui(shoal_bin, jobs_dir, "--listen", "0.0.0.0:0", "--token-file", str(short))
    assert r.returncode == 2 and "at least 16 characters" in r.stderr, r.stderr
    r = run_ui(shoal_bin, jobs_dir, "--token-file", str(tmp_path / "missing"))
    assert r.returncode == 2 and "missing" in r.stderr, r.stderr
    r = run_ui(shoal_bin, jobs_dir, "--serve", "localhost:8000")
    assert r.returncode == 2 and "--serve 'localhost:8000' is not an http:// URL" in r.stderr, r.stderr
    r = run_ui(shoal_bin, jobs_dir, "--listen", "999.1.1.1:0")
    assert r.returncode == 2 and "not an IP address" in r.stderr, r.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        r = run_ui(shoal_bin, jobs_dir, "--listen", f"127.0.0.1:{taken.getsockname()[1]}")
    assert r.returncode == 1 and "cannot listen" in r.stderr, r.stderr
    assert not jobs_dir.exists() or not any(jobs_dir.iterdir()), "a refused start wrote files"


def test_a_running_job_is_killed_and_run_again_from_the_api(ui, write_job, detach_job, wait_for_state,
                                                            jobs_dir):
    job_file = write_job(SLEEPER)
    job_id = detach_job(job_file)
    wait_for_state(job_id, lambda s: s["state"] == "running", 30, "the job to run")
    # The list is at most a second old (the index's refresh interval).
    listed = e2e.wait_until(lambda: (lambda l: l if l["jobs"] else None)(ui.get_json("/api/jobs?state=running")),
                            10, "the list to show the running job")
    assert [j["job_id"] for j in listed["jobs"]] == [job_id]
    assert listed["jobs"][0]["backend"] == "local" and listed["jobs"][0]["tasks"] == 2
    detail = ui.get_json(f"/api/jobs/{job_id}")
    assert detail["spec_yaml"] == job_file.read_text()
    assert [t["task"] for t in detail["tasks"]] == ["worker:0", "worker:1"]
    assert all(t["pid"] > 0 for t in detail["tasks"])
    # The last lines, then those before them, as the page pages back.
    e2e.wait_until(lambda: len(ui.get_json(f"/api/jobs/{job_id}/logs?limit=5")["lines"]) == 5, 20,
                   "five lines of output")
    page = ui.get_json(f"/api/jobs/{job_id}/logs?limit=5&task=worker:1")
    assert all(l["task"] == "worker:1" and l["text"].startswith("tick ") for l in page["lines"])
    status, _, _ = ui.request("POST", f"/api/jobs/{job_id}/kill")
    assert status == 403, "a POST without X-Shoal-Request was obeyed"
    assert ui.get_json(f"/api/jobs/{job_id}")["state"] == "running"
    ui.post_json(f"/api/jobs/{job_id}/kill", 202)
    wait_for_state(job_id, lambda s: s["state"] == "killed", 30, "the kill to take effect")
    assert "shoal ui" in ui.get_json(f"/api/jobs/{job_id}")["reason"]
    again = ui.post_json(f"/api/jobs/{job_id}/kill", 409)
    assert "already ended (killed)" in again["error"]
    rerun = ui.post_json(f"/api/jobs/{job_id}/rerun", 202)
    new_id = rerun["job_id"]
    assert new_id.startswith("sleeper-") and new_id != job_id
    wait_for_state(new_id, lambda s: s["state"] == "running", 30, "the rerun to run")
    assert ui.get_json(f"/api/jobs/{new_id}")["spec_yaml"] == job_file.read_text()
    ui.post_json(f"/api/jobs/{new_id}/kill", 202)
    wait_for_state(new_id, lambda s: s["state"] == "killed", 30, "the rerun's kill")
    # A job file changed since: running it again would not be the same job.
    job_file.write_text(SLEEPER.replace("0.2}", "0.3}"))
    changed = ui.post_json(f"/api/jobs/{job_id}/rerun", 409)
    assert "changed since this job ran" in changed["error"]
    e2e.wait_until(lambda: ui.get_json("/api/jobs")["total"] == 2, 10, "both jobs in the list")


def test_the_history_outlives_the_server(shoal_bin, jobs_dir, tmp_path, write_job, run_shoal):
    job = write_job("""
        name: quick
        roles:
          worker:
            instances: 1
            command: ["/bin/sh", "-c", "echo '<b>bold</b>'; exit 3"]
        """)
    assert run_shoal("run", "-q", job, timeout=60).returncode == 1
    first = Ui(shoal_bin, jobs_dir, tmp_path)
    listed = first.get_json("/api/jobs")
    assert first.stop() == 0
    (tmp_path / "again").mkdir()
    second = Ui(shoal_bin, jobs_dir, tmp_path / "again")
    try:
        again = second.get_json("/api/jobs")
        assert again["jobs"] == listed["jobs"] and again["jobs"][0]["state"] == "failed"
        job_id = again["jobs"][0]["job_id"]
        timeline = second.get_json(f"/api/jobs/{job_id}/timeline")
        gens = timeline["tasks"][0]["generations"]
        assert len(gens) == 1 and gens[0]["state"] == "failed" and gens[0]["exit_code"] == 3
        logs = second.get_json(f"/api/jobs/{job_id}/logs")
        assert logs["lines"][0]["text"] == "<b>bold</b>"  # text, as printed
        assert second.get_json("/api/jobs/nonexistent", expect=404)["error"].startswith("no job")
    finally:
        assert second.stop() == 0


def test_the_models_page_reads_a_real_model_server(shoal_bin, jobs_dir, tmp_path):
    repo = tmp_path / "models"
    r = subprocess.run([e2e.PYTHON, str(e2e.REPO_ROOT / "examples" / "serving" / "export_models.py"),
                        "--out", str(repo)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = open(tmp_path / "serve.out", "wb")
    serve = subprocess.Popen([shoal_bin, "serve", "--model-repository", str(repo), "--http-port", "0",
                              "--grpc-port", "0"], stdout=out, stderr=subprocess.STDOUT,
                             env=e2e.base_env(), start_new_session=True)
    try:
        line = e2e.wait_until(lambda: next((l for l in (tmp_path / "serve.out").read_text().splitlines()
                                            if "listening on http://" in l), None), 60, "shoal serve")
        serve_url = line.split("listening on ")[1].split()[0]
        import urllib.error
        import urllib.request

        def infer(n):
            for _ in range(n):
                body = json.dumps({"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32",
                                               "data": [0.5] * 16}]}).encode()
                req = urllib.request.Request(f"{serve_url}/v2/models/mlp/infer", data=body,
                                             headers={"Content-Type": "application/json"})
                assert urllib.request.urlopen(req, timeout=30).status == 200
        def ready():
            try:
                return urllib.request.urlopen(f"{serve_url}/v2/health/ready", timeout=5).status == 200
            except urllib.error.HTTPError:  # 400 while the models load
                return False
        e2e.wait_until(ready, 120, "the models to load")
        infer(20)
        jobs_dir.mkdir()
        ui = Ui(shoal_bin, jobs_dir, tmp_path, "--serve", serve_url, "--serve", "http://127.0.0.1:9")
        try:
            first = ui.get_json("/api/models")
            live, dead = first["servers"]
            assert live["url"] == serve_url and live["ready"] is True and live["error"] is None
            assert dead["ready"] is False and dead["error"], "an unreachable server must say why"
            models = {m["name"]: m for m in live["models"]}
            assert {"identity", "mlp", "add_sub", "batch_probe"} <= set(models)
            mlp = models["mlp"]
            assert sorted(v["version"] for v in mlp["versions"]) == ["1", "2"]
            assert all(v["state"] == "READY" for v in mlp["versions"])
            assert mlp["requests_total"] >= 20 and mlp["errors"] == 0
            assert 0 < mlp["latency_ms"]["p50"] <= mlp["latency_ms"]["p99"]
            assert mlp["mean_batch_size"] >= 1
            infer(30)
            second = ui.get_json("/api/models")
            mlp2 = {m["name"]: m for m in second["servers"][0]["models"]}["mlp"]
            assert mlp2["requests_total"] >= 50 and mlp2["requests_per_second"] > 0
        finally:
            assert ui.stop() == 0
    finally:
        serve.terminate()
        serve.wait(timeout=30)
        out.close()


def test_tensorboard_starts_on_request_and_ends_with_the_ui(shoal_bin, jobs_dir, tmp_path, write_job,
                                                            run_shoal):
    import framework_examples as fx
    import urllib.request
    tensorboard = fx.require_venv("tensorboard").parent / "tensorboard"
    job = write_job(f"""
        name: tb
        tensorboard: {{command: [{tensorboard}]}}
        roles:
          worker:
            instances: 1
            command: ["/bin/true"]
        """)
    assert run_shoal("run", "-q", job, timeout=120).returncode == 0
    ui = Ui(shoal_bin, jobs_dir, tmp_path)
    try:
        job_id = ui.get_json("/api/jobs")["jobs"][0]["job_id"]
        assert ui.get_json(f"/api/jobs/{job_id}")["tensorboard"] is None
        url = ui.post_json(f"/api/jobs/{job_id}/tensorboard", 200)["url"]
        assert url.startswith("http://127.0.0.1:"), url
        with urllib.request.urlopen(url + "data/runs", timeout=30) as r:
            assert r.status == 200
        assert ui.post_json(f"/api/jobs/{job_id}/tensorboard", 200)["url"] == url
        assert ui.get_json(f"/api/jobs/{job_id}")["tensorboard"] == {"url": url}
        pid = next(p.pid for p, _, _ in e2e._all_processes() if str(tensorboard) in p.cmdline)
    finally:
        assert ui.stop() == 0
    e2e.wait_until(lambda: e2e._stat(pid) is None, 10, "TensorBoard to end with shoal ui")
