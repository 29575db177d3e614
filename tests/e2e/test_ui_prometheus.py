"""`shoal ui`'s /metrics scraped by Debian's real Prometheus server (docs/ui.md, "Prometheus
metrics"): a real job whose task fails once and is restarted, a `shoal ui` over its jobs
directory, and a `prometheus` that scrapes it every second; the figures are read back through
Prometheus' own HTTP API, so the exposition is checked by the parser that matters."""

import json
import os
import signal
import socket
import subprocess
import urllib.parse
import urllib.request

import pytest

import shoal_e2e as e2e
from ui_support import Ui

PROMETHEUS = "/usr/bin/prometheus"

# Attempt 0 exits 3; the restart (attempt 1) succeeds.
FLAKY = """
name: flaky
on_failure: restart-task
max_restarts: 2
backoff: {initial: 200ms, max: 200ms}
roles:
  worker:
    command: ["/bin/sh", "-c", "if [ \\"$SHOAL_RESTART_COUNT\\" = 0 ]; then exit 3; fi; echo recovered"]
    resources: {cpus: 0.5}
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Prometheus:
    def __init__(self, workdir, target):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        config = workdir / "prometheus.yml"
        config.write_text(f"""
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: shoal-ui
    scrape_interval: 1s
    scrape_timeout: 1s
    static_configs:
      - targets: ["{target}"]
""")
        self.log_path = workdir / "prometheus.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)

    def log(self):
        return self.log_path.read_text(errors="replace")[-3000:]

    def get(self, path, **params):
        if self.proc.poll() is not None:
            raise AssertionError(f"prometheus exited with {self.proc.returncode}:\n{self.log()}")
        url = self.base + path + ("?" + urllib.parse.urlencode(params) if params else "")
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                return json.loads(r.read())
        except OSError:
            return None  # not listening yet

    def target_up(self):
        reply = self.get("/api/v1/targets")
        if not reply:
            return None
        targets = reply["data"]["activeTargets"]
        return targets if targets and all(t["health"] == "up" for t in targets) else None

    def query(self, expr):
        """The instant query's samples as [(labels, float value)], or None before Prometheus
        answers."""
        reply = self.get("/api/v1/query", query=expr)
        if not reply:
            return None
        assert reply["status"] == "success", reply
        return [(r["metric"], float(r["value"][1])) for r in reply["data"]["result"]]

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
                raise AssertionError("prometheus did not stop within 30 s of SIGTERM")


def one_value(prom, expr, what, accept):
    """Waits until `expr` has exactly one sample whose value `accept`s (Prometheus ingests the
    scrape a moment after the target turns up), and returns (labels, value)."""
    def answered():
        result = prom.query(expr)
        return result[0] if result and len(result) == 1 and accept(result[0][1]) else None
    try:
        return e2e.wait_until(answered, 30, what)
    except AssertionError:
        raise AssertionError(f"{what}: `{expr}` gives {prom.query(expr)}\n"
                             f"prometheus log:\n{prom.log()}")


def test_prometheus_scrapes_the_restart_and_its_recovery(shoal_bin, write_job, run_shoal,
                                                         jobs_dir, tmp_path):
    # Installed by setup.sh (the prometheus package): its absence is a broken machine, not a
    # reason to skip.
    assert os.access(PROMETHEUS, os.X_OK), (
        f"{PROMETHEUS} is missing: install Debian's prometheus package (setup.sh does)")

    r = run_shoal("run", write_job(FLAKY), timeout=60)
    assert r.returncode == 0, f"rc={r.returncode}\n{r.stdout}\n{r.stderr}"
    (job_dir,) = e2e.job_dirs(jobs_dir)
    job_id = job_dir.name
    assert [e["action"] for e in e2e.events_of(e2e.read_events(job_dir), "failure_handled")] == [
        "restart-task"]

    ui = Ui(shoal_bin, jobs_dir, tmp_path)
    prom = None
    try:
        status, headers, body = ui.request("GET", "/metrics")
        assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
        prom_dir = tmp_path / "prometheus"
        prom_dir.mkdir()
        prom = Prometheus(prom_dir, f"127.0.0.1:{ui.port}")
        targets = e2e.wait_until(prom.target_up, 60, "prometheus to scrape shoal ui (target up)")
        assert targets[0]["labels"]["job"] == "shoal-ui"

        labels, restarts = one_value(prom, f'shoal_job_restarts_total{{job_id="{job_id}"}}',
                                     "the job's restarts", lambda v: v >= 1)
        assert restarts == 1 and labels["role"] == "worker"
        # Our job_id label stays as it is beside Prometheus' own `job` label.
        assert labels["job"] == "shoal-ui" and "exported_job" not in labels
        one_value(prom, 'shoal_jobs{state="succeeded"}', "the succeeded job counted",
                  lambda v: v == 1)
        one_value(prom, f'shoal_job_failures_total{{job_id="{job_id}",cause="exit_code"}}',
                  "the job's failure by cause", lambda v: v == 1)
        one_value(prom, "shoal_failure_recovery_seconds_count", "a recovery observed",
                  lambda v: v >= 1)
        # The recovery took at least the 200 ms backoff: not in the buckets up to 0.1 s, in +Inf.
        _, recovery_sum = one_value(prom, "shoal_failure_recovery_seconds_sum",
                                    "the recovery time", lambda v: v > 0)
        assert recovery_sum >= 0.2
        one_value(prom, 'shoal_failure_recovery_seconds_bucket{le="0.1"}', "the 0.1 s bucket",
                  lambda v: v == 0)
        one_value(prom, 'shoal_failure_recovery_seconds_bucket{le="+Inf"}', "the +Inf bucket",
                  lambda v: v >= 1)
        one_value(prom, "shoal_failure_detection_seconds_count", "a detection observed",
                  lambda v: v >= 1)
        one_value(prom, f'shoal_job_tasks{{job_id="{job_id}",state="succeeded"}}',
                  "the job's tasks by state", lambda v: v == 1)
    finally:
        if prom:
            prom.stop()
        assert ui.stop() == 0
    assert prom.proc.returncode is not None
    assert e2e.pgroup_gone(prom.proc.pid), "prometheus left processes behind"
