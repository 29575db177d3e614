"""bench/serve_publish.py as a tool: it refuses bad options before anything runs, and a short
real run under load reports every figure (the publication latencies, the failed requests of
the load and of the probe, the server's RSS at each point) with every version seen and no
failed request. No timing is asserted."""

import json
import subprocess
import sys

import shoal_e2e as e2e

BENCH = e2e.REPO_ROOT / "bench" / "serve_publish.py"


def run_bench(*args, timeout=300):
    return subprocess.run([sys.executable, str(BENCH), "--shoal", e2e.SHOAL_BIN, *args],
                          capture_output=True, text=True, timeout=timeout,
                          env=e2e.base_env())


def test_bad_options_exit_2_before_anything_runs():
    r = run_bench("--also", "100:0")
    assert r.returncode == 2
    assert "expected POLL_MS:SETTLE_MS:N, got '100:0'" in r.stderr
    assert r.stdout == ""
    r = run_bench("--publications", "10", "--measured", "20")
    assert r.returncode == 2
    assert "--measured from 1 to --publications" in r.stderr
    assert r.stdout == ""


def test_a_short_run_reports_every_figure_with_no_failed_request():
    r = run_bench("--publications", "4", "--measured", "2", "--warmup-publications", "1",
                  "--warmup-s", "0.5", "--defaults-publications", "0", "--rate", "50",
                  "--hidden", "32", "--jitter-s", "0.1")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert "error" not in out, out
    fast = out["configurations"]["measured"]
    assert "error" not in fast, fast
    assert fast["poll_ms"] == 1000 and fast["settle_ms"] == 2000  # shoal serve's defaults
    assert fast["model_parameter_mib"] > 0
    latency = fast["publication_to_first_response"]
    assert latency["versions_never_seen"] == []
    assert latency["first_measured"]["n"] == 2 and latency["rest_repeat"]["n"] == 2
    assert fast["load"]["requests"] > 0 and fast["load"]["failed"] == 0, fast["load"]
    assert fast["probe"]["failed"] == 0 and fast["probe"]["went_back"] == 0, fast["probe"]
    for point in ("after_warmup", "aa_no_publication", "after_2", "after_4"):
        assert fast["rss_mib"][point]["VmRSS"] > 0, fast["rss_mib"]
    assert set(out["met"]) == {"failed_requests", "publication_to_first_response_p99",
                               "rss_growth"}
