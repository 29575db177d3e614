"""The launch benchmark's breakdown (bench/launch_overhead.py): where one `shoal run` spends its
time, read from the job's events journal. Structure and order only; no timing is asserted."""

import importlib.util
import json
import subprocess
import sys

import shoal_e2e as e2e

BENCH = e2e.REPO_ROOT / "bench" / "launch_overhead.py"


def load_bench():
    sys.path.insert(0, str(BENCH.parent))
    spec = importlib.util.spec_from_file_location("launch_overhead", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_phases_split_a_run_at_its_journal_events():
    bench = load_bench()
    events = [
        {"type": "job_submitted", "ts_us": 1_010_000},
        {"type": "task_state", "to": "pending", "ts_us": 1_010_100},
        {"type": "agent_registered", "ts_us": 1_020_000},
        {"type": "task_state", "to": "running", "ts_us": 1_023_000},
        {"type": "task_state", "to": "running", "ts_us": 1_024_000},
        {"type": "job_state", "to": "running", "ts_us": 1_030_000},
        {"type": "outcome_decided", "ts_us": 1_030_500},
        {"type": "job_finished", "ts_us": 1_034_000},
    ]
    phases = bench.run_phases(events, 1_000_000, 1_038_000)
    assert phases == {"start_to_submitted": 10.0, "to_agent_registered": 10.0,
                      "to_first_task_running": 3.0, "to_all_tasks_running": 7.0,
                      "to_outcome_decided": 0.5, "to_job_finished": 3.5, "to_client_exit": 4.0}
    # A run whose journal lacks a step has no breakdown rather than a wrong one.
    assert bench.run_phases([e for e in events if e["type"] != "agent_registered"],
                            1_000_000, 1_038_000) == {}


def test_the_bench_reports_the_phases_of_real_runs(tmp_path):
    r = subprocess.run([sys.executable, str(BENCH), "--shoal", e2e.SHOAL_BIN, "--n", "2",
                        "--reps", "2"], capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    entry = result["results"]["2"]
    assert "error" not in entry["shoal"], entry
    phases = entry["shoal_phases_median_ms"]
    assert list(phases) == ["start_to_submitted", "to_agent_registered", "to_first_task_running",
                            "to_all_tasks_running", "to_outcome_decided", "to_job_finished",
                            "to_client_exit"]
    assert all(v >= 0 for v in phases.values()), phases
