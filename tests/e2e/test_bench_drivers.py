"""Benchmark drivers as tools: bench/step_time.py checks its options before anything runs,
a short real run reports every mode, stops at its time budget, and the background load it adds
is gone when it ends; bench/step_time_concurrent.py refuses lanes it cannot run and pairs its
rounds' ratios by kind; both say how many rounds a +-1 % interval would need on the machine they
ran on; bench/log_forwarding.py shows every line in both of its modes; bench/shoal_overhead.py
tells Shoal's processes from the demo's; bench/ab.py runs two builds interleaved and calls B worse
only beyond the same-build spread. No timing is asserted."""

import json
import math
import os
import subprocess
import sys

import shoal_e2e as e2e

BENCH = e2e.REPO_ROOT / "bench" / "step_time.py"
HOG_SCRIPT = "while :; do :; done"


def run_bench(*args, timeout=300):
    return subprocess.run([sys.executable, str(BENCH), "--shoal", e2e.SHOAL_BIN, *args],
                          capture_output=True, text=True, timeout=timeout)


def busy_loops():
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if HOG_SCRIPT.encode() in argv:
            pids.append(int(entry))
    return pids


def test_bad_options_exit_2_before_anything_runs(tmp_path):
    r = run_bench("--background-load", "-1")
    assert r.returncode == 2 and "--background-load" in r.stderr, r.stderr
    r = run_bench("--shoal-baseline", str(tmp_path / "missing"))
    assert r.returncode == 2 and "is not an executable file" in r.stderr, r.stderr
    r = run_bench("--shoal-baseline", str(tmp_path))  # a directory
    assert r.returncode == 2 and "is not an executable file" in r.stderr, r.stderr
    r = run_bench("--time-budget", "-5")
    assert r.returncode == 2 and "--time-budget" in r.stderr, r.stderr
    r = run_bench("--modes", "hand,shoal,hnad")
    assert r.returncode == 2 and "unknown mode 'hnad'" in r.stderr, r.stderr
    assert r.stdout == ""


def test_a_short_run_reports_every_mode_and_stops_its_background_load():
    assert busy_loops() == [], "a busy loop of another run is still alive"
    # A budget spent during the first round: that round finishes, no other starts.
    r = run_bench("--reps", "3", "--time-budget", "0.001", "--epochs", "2",
                  "--background-load", "1", "--shoal-baseline", e2e.SHOAL_BIN)
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert result["background_load"] == 1
    assert result["rounds_done"] == 1
    # Hand-started ranks share the cores Shoal gives the job: the first two the driver may use.
    assert result["hand_cpus"] == sorted(os.sched_getaffinity(0))[:2]
    assert result["shoal_baseline_binary"] == os.path.abspath(e2e.SHOAL_BIN)
    for mode in ("hand", "shoal", "pinned", "hand_again", "shoal_baseline"):
        assert "error" not in result[mode], (mode, result[mode])
        runs = result[mode]["runs"]
        assert len(runs) == 1 and runs[0]["median_step_ms"] > 0, (mode, runs)
    # One round: one paired ratio, too few for an interval.
    assert result["step_median_ratio_shoal_shoal_baseline"] > 0
    assert result["step_median_ratio_shoal_shoal_baseline_ci95"] is None
    assert result["aa_resolution"] is None  # and too few to say what the machine resolves
    assert result["seconds_per_round"] > 0
    assert busy_loops() == [], "the benchmark left its background load running"


def test_resolution_says_how_many_rounds_a_1_percent_interval_needs():
    sys.path.insert(0, str(BENCH.parent))
    try:
        import step_time
    finally:
        sys.path.pop(0)
    # Log ratios -10 %, -5 %, 0, +5 %, +10 %: median absolute deviation 5 %, so a robust
    # spread of 1.4826 * 0.05 per round, and (1.96 * 1.2533 * 7.413) ** 2 = 331.6 rounds.
    ratios = [math.exp(x) for x in (-0.1, -0.05, 0.0, 0.05, 0.1)]
    got = step_time.resolution(ratios, seconds_per_round=36.0)
    assert got == {"aa_rounds": 5, "spread_per_round": 0.0741,
                   "rounds_for_interval_within_1_percent": 332,
                   "hours_for_interval_within_1_percent": 3.32}, got
    # A quarter of the spread needs a sixteenth of the rounds.
    quiet = step_time.resolution([math.exp(x / 4) for x in (-0.1, -0.05, 0.0, 0.05, 0.1)])
    assert quiet["rounds_for_interval_within_1_percent"] == 21, quiet
    assert "hours_for_interval_within_1_percent" not in quiet
    # One stalled run moves the spread little; a noiseless pair still needs an interval's 3.
    stalled = step_time.resolution(ratios + [3.0])
    assert stalled["spread_per_round"] < 2 * got["spread_per_round"], stalled
    assert step_time.resolution([1.0, 1.0, 1.0])["rounds_for_interval_within_1_percent"] == 3
    assert step_time.resolution([1.0, 1.02]) is None


CONCURRENT = e2e.REPO_ROOT / "bench" / "step_time_concurrent.py"


def test_concurrent_step_time_refuses_lanes_it_cannot_run():
    cpus = sorted(os.sched_getaffinity(0))
    beyond = max(cpus) + 1
    for lanes, says in [("0-1,1-2", "overlaps another lane"),
                        ("0-1", "even number of lanes"),
                        ("0,1", "fewer than 2 CPUs"),
                        ("3-1,4-5", "ends before it starts"),
                        ("0-1,x", "is not a CPU range"),
                        (f"{beyond}-{beyond + 1},{beyond + 2}-{beyond + 3}",
                         f"CPU {beyond} is not one this process may use")]:
        r = subprocess.run([sys.executable, str(CONCURRENT), "--shoal", e2e.SHOAL_BIN,
                            "--lanes", lanes], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and says in r.stderr, (lanes, r.stderr)
        assert r.stdout == ""


def test_concurrent_step_time_ratios_pair_runs_of_one_round_by_kind():
    sys.path.insert(0, str(CONCURRENT.parent))
    try:
        import step_time_concurrent as conc
    finally:
        sys.path.pop(0)
    rounds = [{"kind": "ab", "median_step_ms": [2.2, 2.0]},
              {"kind": "aa", "median_step_ms": [2.0, 2.5]},
              {"kind": "ab", "median_step_ms": [3.0, None]},  # a run without the figure
              {"kind": "ab", "median_step_ms": [1.8, 2.0]}]
    assert [round(x, 3) for x in conc.ratios(rounds, "ab", "median_step_ms")] == [1.1, 0.9]
    assert conc.ratios(rounds, "aa", "median_step_ms") == [0.8]
    assert conc.summary([1.1, 0.9])["median"] == 1.0
    assert conc.summary([1.1, 0.9])["ci95"] is None  # too few rounds for an interval


LOG_BENCH = e2e.REPO_ROOT / "bench" / "log_forwarding.py"


def test_log_forwarding_shows_every_line_batched_and_per_read():
    r = subprocess.run([sys.executable, str(LOG_BENCH), "--shoal", e2e.SHOAL_BIN, "--reps", "1",
                        "--rate", "300", "--seconds", "4"],
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    for mode in ("batched", "per_read"):
        assert result[mode]["every_line_shown"], result["runs"][mode]
        run = result["runs"][mode][0]
        assert run["shoal_processes"] == 3, run  # client, master, agent
        assert run["lines_printed"] > 0 and run["lines_shown"] == run["lines_printed"], run


OVERHEAD = e2e.REPO_ROOT / "bench" / "shoal_overhead.py"


def test_overhead_splits_the_cpu_of_a_training_job_between_shoal_and_the_demo():
    r = subprocess.run([sys.executable, str(OVERHEAD), "--shoal", e2e.SHOAL_BIN, "--workers", "2",
                        "--epochs", "30"], capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert result["shoal"] == os.path.abspath(e2e.SHOAL_BIN)
    entry = result["results"]["2"]
    assert "error" not in entry, entry
    run = entry["runs"][0]
    # Shoal's processes by kind; the two training processes are the demo's, none of Shoal's.
    assert {"client", "master", "agent"} <= set(run["per_process_kind"]), run
    assert "demo" not in run["per_process_kind"]
    assert run["per_process_kind"]["client"]["processes"] == 1
    assert run["demo_processes"] == 2
    assert run["task_exited_in_window"] == []  # the window ends before any task does
    assert run["window_s"] > 0 and run["demo_cpu_s"] > 0, run
    assert result["sdk_progress_call_us"] > 0
    assert "progress" in result["data_path"]


AB = e2e.REPO_ROOT / "bench" / "ab.py"


def test_ab_refuses_bad_options_before_anything_runs(tmp_path):
    build = os.path.dirname(os.path.abspath(e2e.SHOAL_BIN))
    for args, says in [(["--b", str(tmp_path / "missing")], "not a directory"),
                       (["--b", str(tmp_path)], "no shoal in"),
                       (["--b", build, "--pattern", "AB"], "at least two A"),
                       (["--b", build, "--pattern", "ABC"], "letters A and B only"),
                       (["--b", build, "--only", "launch,lanuch"], "unknown benchmark(s) lanuch")]:
        r = subprocess.run([sys.executable, str(AB), "--a", build, *args], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 2 and says in r.stderr, (args, r.stderr)
        assert r.stdout == ""


def test_ab_runs_both_builds_interleaved_and_reports_the_aa_spread(tmp_path):
    # Both sides the build under test (the directory of SHOAL_BIN, a flat build): an A/B/A'.
    build = os.path.dirname(os.path.abspath(e2e.SHOAL_BIN))
    r = subprocess.run([sys.executable, str(AB), "--a", build, "--b", build, "--only", "launch",
                        "--sizes", "smoke", "--pattern", "ABA", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    launch = result["benchmarks"]["launch"]
    # Each run got its build's binary through SHOAL_BIN (ab.py checks what the driver ran).
    assert [(x["label"], x["build"]) for x in launch["runs"]] == [("A", "A"), ("B", "B"),
                                                                   ("A'", "A")]
    assert all("error" not in x for x in launch["runs"]), launch["runs"]
    metric = launch["metrics"]["N=8 shoal median ms"]
    assert all(metric[x] > 0 for x in ("A", "B", "A'")), metric
    assert metric["aa_spread"] == round(abs(metric["A"] - metric["A'"]), 4)
    assert metric["verdict"] in ("within A/A spread", "worse beyond A/A spread",
                                 "better beyond A/A spread")
    assert (tmp_path / "ab.json").is_file() and (tmp_path / "launch-Ap.json").is_file()


def test_ab_calls_b_worse_only_beyond_both_builds_own_spread():
    sys.path.insert(0, str(AB.parent))
    try:
        import ab
    finally:
        sys.path.pop(0)

    def verdict(direction, a, b, b2, a2):
        runs = [{"label": label, "build": label[0], "json": {"x": v}}
                for label, v in (("A", a), ("B", b), ("B'", b2), ("A'", a2))]
        return ab.compare(("x", ["x"], direction), runs)[1]["verdict"]

    assert verdict("lower", 10, 20, 21, 11) == "worse beyond A/A spread"
    assert verdict("higher", 10, 20, 21, 11) == "better beyond A/A spread"
    # B's runs overlap A's: noise, whatever the means say.
    assert verdict("lower", 10, 30, 10.5, 11) == "within A/A spread"
    # Separated, but by less than B differs from itself.
    assert verdict("lower", 10, 11.2, 14, 11) == "within A/A spread"
    assert verdict("info", 10, 20, 21, 11) == "info"
    runs = [{"label": lab, "build": lab[0], "json": {"ok": v}}
            for lab, v in (("A", True), ("B", False), ("B'", True), ("A'", True))]
    assert ab.compare(("ok", ["ok"], "true"), runs)[1]["verdict"] == "FAILS in B"
