#!/usr/bin/env python3
"""A/B of two builds of Shoal on the standing benchmarks, interleaved in one run, with an A/A
pair so that a regression can be told from this machine's noise.

    python3 bench/ab.py --a /work/baseline --b build [--sizes full|smoke] [--pattern ABBA]
        [--only launch,detection,...] [--out DIR] [--dry-run]

A build is a directory holding `shoal`, `control_plane_bench` and `serve_load`, either flat (a
copy such as /work/baseline, whose COMMIT file names its commit) or a CMake build tree
(src/cli/shoal, bench/control_plane_bench, bench/serve_load). Each benchmark runs as its own
driver, pointed at one build by SHOAL_BIN (every Python driver reads it; bench/_common.py) and
with that build's directory first on PATH; control_plane_bench is each build's own binary.
serving_bench's load generator is A's serve_load for both builds, so that only the server
differs.

Per benchmark, the builds run back to back in --pattern order (default ABBA: A, B, B', A'),
before the next benchmark starts, so the figures compared are minutes apart at most and a
linear drift of the machine weighs on A and B alike. For every metric:
    A, A', B, B'   the values of each run (A' is A's second run)
    aa_spread      max - min over A's runs: what this machine varies by between two runs of the
                   same build; aa_spread_rel is that over A's mean
    ba_diff        mean(B) - mean(A); ba_ratio = mean(B) / mean(A)
    verdict        "worse beyond A/A spread" when every B run is worse than every A run (in the
                   metric's direction) and mean(B) - mean(A) exceeds the larger of the A/A and
                   B/B spreads; "better beyond A/A spread" likewise; else "within A/A
                   spread". Correctness checks (booleans) must hold in every run ("FAILS
                   in B" otherwise); the drivers' timing targets are shown, not judged.
One JSON object on stdout (each run's own JSON is kept under --out); a table on stderr.

Sizes (--sizes full; each driver's own defaults are larger, for the standing figures). The
seconds are one run's, measured at a load average of ~11 on the 2-core VM (five builds
running): one pass of all seven takes ~4.3 min, so the whole ABBA run ~17 min, less on a quiet
machine.
    launch      launch_overhead --n 8,32 --reps 10 --no-mpirun                      7 s a run
    detection   fault_detection --faults 500 --hung-faults 15 --silent-faults 12
                --no-torchrun                                                       30 s
    recovery    recovery_time --faults 200 --torch-faults 4 --no-torchrun            47 s
    elastic     elastic_membership --faults 100 --limit 3                            30 s
    control     control_plane_bench --agents 1024 --reps 3 --hb-agents 1000
                --hb-tasks 10 --hb-seconds 10                                        37 s
    serving     serving_bench --servers shoal,shoal_unbatched --models identity,mlp
                --concurrency 1,32 --duration 2.5 --warmup 0.5 --floor-concurrency 0 44 s
    overhead    shoal_overhead --workers 2,8 --epochs 200 --epochs-8 150 (training
                windows of ~20 s each)                                               61 s
--sizes smoke runs each of them for a few seconds (to check the drivers, not for figures).
The anchors that have no Shoal in them (torchrun, mpirun, FastAPI, the bare libtorch loop, the
floor server) are left out: they are the same for both builds.
"""

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as c  # noqa: E402

PY = c.DEFAULT_PYTHON
BENCH = c.BENCH_DIR


def driver(name):
    return [PY, str(BENCH / name)]


# Each benchmark: how to run it (argv per size; "{cp}" is the build's control_plane_bench,
# "{serve_load}" A's serve_load), its limit in seconds, and its metrics: (label, path in the
# driver's JSON, direction: "lower" / "higher" is better, "true" a correctness check that must
# hold in every run, "target" a driver's timing target (shown: it flips with the machine's
# load, so it is no verdict on B), "info" no verdict).
NO_TORCH_LOOP = "/nonexistent/serve_libtorch_loop"  # the bare-loop anchor: no Shoal in it

SERVING_MODELS = ("identity", "mlp")
SERVING_SERVERS = ("shoal", "shoal_unbatched")


def serving_metrics():
    out = []
    for m in SERVING_MODELS:
        for s in SERVING_SERVERS:
            base = ["models", m, "servers", s]
            out += [(f"{s} {m} closed 1 p50 ms", base + ["closed", "1", "p50_ms"], "lower"),
                    (f"{s} {m} closed 32 req/s", base + ["closed", "32", "throughput_rps"],
                     "higher"),
                    (f"{s} {m} closed 32 p99 ms", base + ["closed", "32", "p99_ms"], "lower"),
                    (f"{s} {m} open p99 ms", base + ["open", "p99_ms"], "lower")]
    return out


BENCHMARKS = {
    "launch": {
        "argv": {
            "full": driver("launch_overhead.py") + ["--n", "8,32", "--reps", "10", "--no-mpirun"],
            "smoke": driver("launch_overhead.py") + ["--n", "8,32", "--reps", "2",
                                                     "--no-mpirun"],
        },
        "timeout": 300,
        "metrics": [
            ("N=8 shoal median ms", ["results", "8", "shoal", "median_ms"], "lower"),
            ("N=32 shoal median ms", ["results", "32", "shoal", "median_ms"], "lower"),
            ("N=32 shoal p90 ms", ["results", "32", "shoal", "p90_ms"], "lower"),
            ("N=32 shoal - shell ms", ["results", "32", "diff_shoal_shell_ms"], "lower"),
            ("N=32 shell median ms (anchor)", ["results", "32", "shell", "median_ms"], "info"),
        ],
    },
    "detection": {
        "argv": {
            "full": driver("fault_detection.py") + ["--faults", "500", "--hung-faults", "15",
                                                    "--silent-faults", "12", "--no-torchrun"],
            "smoke": driver("fault_detection.py") + ["--faults", "20", "--hung-faults", "2",
                                                     "--silent-faults", "2", "--no-torchrun"],
        },
        "timeout": 400,
        "metrics": [
            ("process exit detect median ms", ["process_exit", "detect", "median_ms"], "lower"),
            ("process exit detect p99 ms", ["process_exit", "detect", "p99_ms"], "lower"),
            ("process kill -> running again median ms",
             ["process_exit", "kill_to_running_again", "median_ms"], "lower"),
            ("hung: after last progress + timeout, median ms",
             ["hung_task", "latency_from_last_progress", "median_ms"], "lower"),
            ("hung: p99 ms", ["hung_task", "latency_from_last_progress", "p99_ms"], "lower"),
            ("silent agent: after the limit, median ms",
             ["silent_agent", "latency_after_limit", "median_ms"], "lower"),
            ("silent agent: p99 ms", ["silent_agent", "latency_after_limit", "p99_ms"], "lower"),
            ("process exit target met", ["process_exit", "target_met"], "target"),
            ("hung target met", ["hung_task", "target_met"], "target"),
            ("silent target met", ["silent_agent", "target_met"], "target"),
        ],
    },
    "recovery": {
        "argv": {
            "full": driver("recovery_time.py") + ["--faults", "200", "--torch-faults", "4",
                                                  "--no-torchrun"],
            "smoke": driver("recovery_time.py") + ["--faults", "10", "--torch-faults", "1",
                                                   "--no-torchrun"],
        },
        "timeout": 500,
        "metrics": [
            ("trivial kill -> all running median ms",
             ["trivial", "kill_to_all_running", "median_ms"], "lower"),
            ("trivial kill -> all running p99 ms",
             ["trivial", "kill_to_all_running", "p99_ms"], "lower"),
            ("trivial kill -> failure recorded median ms",
             ["trivial", "kill_to_failure_recorded", "median_ms"], "lower"),
            ("pytorch kill -> all scripts started median ms",
             ["pytorch", "shoal", "kill_to_all_ranks_script_start", "median_ms"], "lower"),
            # Mostly `import torch` (2-3 s, which swings by a second under load): shown, not
            # judged; the two figures around it are Shoal's part.
            ("pytorch kill -> all first step median ms",
             ["pytorch", "shoal", "kill_to_all_ranks_first_step", "median_ms"], "info"),
            ("pytorch Shoal's own part median ms", ["pytorch", "shoal_own_part_median_ms"],
             "lower"),
            ("trivial target met", ["trivial", "target_met"], "target"),
        ],
    },
    "elastic": {
        "argv": {
            "full": driver("elastic_membership.py") + ["--faults", "100", "--limit", "3"],
            "smoke": driver("elastic_membership.py") + ["--faults", "5", "--limit", "1"],
        },
        "timeout": 400,
        "metrics": [
            ("kill -> consistent world median ms",
             ["elastic", "kill_to_consistent_world", "median_ms"], "lower"),
            ("kill -> consistent world p99 ms",
             ["elastic", "kill_to_consistent_world", "p99_ms"], "lower"),
            ("capacity back -> world of 4 median ms",
             ["elastic", "capacity_back_to_world_of_4", "median_ms"], "lower"),
            ("checks passed (no hang, orphan, inconsistency)", ["elastic", "checks_passed"],
             "true"),
            ("restart limit kept: elastic", ["restart_limit", "elastic", "ok"], "true"),
            ("restart limit kept: restart-group", ["restart_limit", "restart-group", "ok"],
             "true"),
            ("restart limit kept: restart-task", ["restart_limit", "restart-task", "ok"], "true"),
        ],
    },
    "control": {
        "argv": {
            "full": ["{cp}", "--agents", "1024", "--reps", "3", "--hb-agents", "1000",
                     "--hb-tasks", "10", "--hb-seconds", "10"],
            "smoke": ["{cp}", "--agents", "128", "--reps", "1", "--hb-agents", "100",
                      "--hb-tasks", "10", "--hb-seconds", "2"],
        },
        "timeout": 400,
        "metrics": [
            ("rendezvous median ms", ["rendezvous", "median_ms"], "lower"),
            ("rendezvous max ms", ["rendezvous", "max_ms"], "lower"),
            ("heartbeat: master % of one core",
             ["heartbeat", "master_cpu_percent_of_one_core"], "lower"),
            ("heartbeat: agents declared silent", ["heartbeat", "agents_declared_silent"],
             "lower"),
        ],
    },
    "serving": {
        "argv": {
            "full": driver("serving_bench.py") + [
                "--servers", ",".join(SERVING_SERVERS), "--models", ",".join(SERVING_MODELS),
                "--concurrency", "1,32", "--duration", "2.5", "--warmup", "0.5",
                "--floor-concurrency", "0", "--serve-load", "{serve_load}",
                "--libtorch-loop", NO_TORCH_LOOP],
            "smoke": driver("serving_bench.py") + [
                "--servers", ",".join(SERVING_SERVERS), "--models", ",".join(SERVING_MODELS),
                "--concurrency", "1,32", "--duration", "0.5", "--warmup", "0.2",
                "--floor-concurrency", "0", "--serve-load", "{serve_load}",
                "--libtorch-loop", NO_TORCH_LOOP],
        },
        "timeout": 400,
        "metrics": serving_metrics(),
    },
    "overhead": {
        "argv": {
            "full": driver("shoal_overhead.py") + ["--workers", "2,8", "--epochs", "200",
                                                   "--epochs-8", "150"],
            "smoke": driver("shoal_overhead.py") + ["--workers", "2,8", "--epochs", "20",
                                                    "--epochs-8", "10"],
        },
        "timeout": 500,
        "metrics": [
            ("2 workers: Shoal % of one core (ticks)",
             ["results", "2", "shoal_percent_of_one_core_median"], "lower"),
            ("2 workers: Shoal % of one core (threads' ns)",
             ["results", "2", "shoal_percent_of_one_core_threads_ns_median"], "lower"),
            ("2 workers: demo % of one core", ["results", "2", "demo_percent_of_one_core_median"],
             "info"),
            ("8 workers: Shoal % of one core (ticks)",
             ["results", "8", "shoal_percent_of_one_core_median"], "lower"),
            ("8 workers: Shoal % of one core (threads' ns)",
             ["results", "8", "shoal_percent_of_one_core_threads_ns_median"], "lower"),
            ("8 workers: demo % of one core", ["results", "8", "demo_percent_of_one_core_median"],
             "info"),
        ],
    },
}

# Seconds of one run at --sizes full on the 2-core VM at a load average of ~11 (for --dry-run's
# estimate only).
FULL_SECONDS = {"launch": 7, "detection": 30, "recovery": 47, "elastic": 30, "control": 37,
                "serving": 44, "overhead": 61}


# ------------------------------------------------------------------------------- builds

class Build:
    """The binaries of one build: flat (DIR/shoal) or a CMake tree (DIR/src/cli/shoal)."""

    def __init__(self, label, directory):
        self.label = label
        self.dir = Path(directory).resolve()
        self.errors = []
        self.shoal = self._find("shoal", ["shoal", "src/cli/shoal"])
        self.control_plane_bench = self._find(
            "control_plane_bench", ["control_plane_bench", "bench/control_plane_bench"])
        self.serve_load = self._find("serve_load", ["serve_load", "bench/serve_load"])
        self.commit = self._commit()

    def _find(self, name, candidates):
        for rel in candidates:
            p = self.dir / rel
            if p.is_file() and os.access(p, os.X_OK):
                return str(p)
        self.errors.append(f"{self.label}: no {name} in {self.dir} (looked at "
                           + ", ".join(candidates) + ")")
        return None

    def _commit(self):
        commit_file = self.dir / "COMMIT"
        if commit_file.is_file():
            return commit_file.read_text().strip()
        cache = self.dir / "CMakeCache.txt"
        if cache.is_file():
            for line in cache.read_text(errors="replace").splitlines():
                if line.startswith("CMAKE_HOME_DIRECTORY:"):
                    src = line.split("=", 1)[1]
                    head = subprocess.run(["git", "-C", src, "rev-parse", "HEAD"],
                                          capture_output=True, text=True)
                    dirty = subprocess.run(["git", "-C", src, "status", "--porcelain",
                                            "--untracked-files=no"],
                                           capture_output=True, text=True)
                    if head.returncode == 0:
                        return head.stdout.strip() + (" (+ uncommitted changes)"
                                                      if dirty.stdout.strip() else "")
        return None

    def describe(self):
        return {"dir": str(self.dir), "commit": self.commit, "shoal": self.shoal,
                "control_plane_bench": self.control_plane_bench,
                "serve_load": self.serve_load}

    def env(self):
        env = dict(os.environ)
        if self.shoal:
            env["SHOAL_BIN"] = self.shoal
            env["PATH"] = str(Path(self.shoal).parent) + os.pathsep + env.get("PATH", "")
        return env


# ------------------------------------------------------------------------------- running

def get_path(obj, path):
    for key in path:
        if not isinstance(obj, dict) or key not in obj:
            return None
        obj = obj[key]
    return obj


def run_one(bench, spec, build, a_build, sizes, label, out_dir):
    """Runs one benchmark against one build; returns {"label", "seconds", "json"|"error"}."""
    argv = [a.replace("{cp}", build.control_plane_bench or "control_plane_bench")
             .replace("{serve_load}", a_build.serve_load or "serve_load")
            for a in spec["argv"][sizes]]
    stem = out_dir / f"{bench}-{label.replace(chr(39), 'p')}"
    c.log(f"ab: {bench} {label} ({build.dir}): {' '.join(argv[1:] if argv[0] == PY else argv)}")
    t0 = time.monotonic()
    with open(f"{stem}.err", "w") as err:
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, text=True,
                             env=build.env(), start_new_session=True)
        try:
            out, _ = p.communicate(timeout=spec["timeout"])
            rc = p.returncode
        except subprocess.TimeoutExpired:
            # SIGINT first: the drivers stop their jobs on KeyboardInterrupt.
            for sig, grace in ((signal.SIGINT, 30), (signal.SIGKILL, None)):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, sig)
                try:
                    out, _ = p.communicate(timeout=grace)
                    break
                except subprocess.TimeoutExpired:
                    continue
            rc = None
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGINT)
            raise
    seconds = round(time.monotonic() - t0, 1)
    Path(f"{stem}.json").write_text(out)
    run = {"label": label, "build": build.label, "seconds": seconds, "stderr": f"{stem}.err"}
    if rc is None:
        run["error"] = f"timed out after {spec['timeout']} s"
    else:
        try:
            run["json"] = json.loads(out)
        except ValueError:
            run["error"] = f"exit status {rc}, no JSON on stdout (see {stem}.err)"
    if "json" in run:
        used = run["json"].get("shoal") or run["json"].get("shoal_binary")
        if used and build.shoal and Path(used).resolve() != Path(build.shoal).resolve():
            run["error"] = f"the driver ran {used}, not {build.shoal}"
    c.log(f"ab:   {seconds:.0f} s" + (f", {run['error']}" if "error" in run else ""))
    return run


def labels_for(pattern):
    """ABBA -> [("A","A"), ("B","B"), ("B","B'"), ("A","A'")]."""
    seen, out = {}, []
    for ch in pattern:
        n = seen.get(ch, 0)
        seen[ch] = n + 1
        out.append((ch, ch + "'" * n))
    return out


def compare(metric, runs):
    label, path, direction = metric
    values = {r["label"]: get_path(r.get("json"), path) for r in runs}
    a = [v for r, v in zip(runs, values.values()) if r["build"] == "A" and v is not None]
    b = [v for r, v in zip(runs, values.values()) if r["build"] == "B" and v is not None]
    entry = {"path": ".".join(path), "better": direction, **values}
    if direction == "target":
        entry["verdict"] = ("missing" if not a and not b
                            else "met in every run" if all(v is True for v in a + b)
                            else "missed in A too" if any(v is not True for v in a)
                            else "missed in B only")
        return label, entry
    if direction == "true":
        entry["verdict"] = ("missing" if not a and not b
                            else "ok" if a and b and all(v is True for v in a + b)
                            else "A fails too" if any(v is not True for v in a)
                            else "FAILS in B")
        return label, entry
    numeric = lambda xs: [float(x) for x in xs if isinstance(x, (int, float))
                          and not isinstance(x, bool)]
    a, b = numeric(a), numeric(b)
    if not a or not b:
        entry["verdict"] = "missing"
        return label, entry
    mean_a, mean_b = sum(a) / len(a), sum(b) / len(b)
    spread = max(a) - min(a) if len(a) > 1 else None
    entry.update({
        "mean_a": round(mean_a, 4), "mean_b": round(mean_b, 4),
        "aa_spread": None if spread is None else round(spread, 4),
        "aa_spread_rel": None if spread is None or mean_a == 0 else round(spread / abs(mean_a), 4),
        "bb_spread": round(max(b) - min(b), 4) if len(b) > 1 else None,
        "ba_diff": round(mean_b - mean_a, 4),
        "ba_ratio": None if mean_a <= 0 or mean_b < 0 else round(mean_b / mean_a, 4),
    })
    if direction == "info" or spread is None:
        entry["verdict"] = "info" if direction == "info" else "no A/A pair"
        return label, entry
    # Worse only when every B run is worse than every A run and the means differ by more than
    # the larger same-build spread (A/A, and B/B when B ran twice): with identical builds the
    # first alone happens in 1 of 6 ABBA runs per metric (any 2 of 4 exchangeable values).
    noise = max(spread, (max(b) - min(b)) if len(b) > 1 else 0.0)
    above, below = min(b) > max(a), max(b) < min(a)  # B's runs all above / all below A's
    if direction == "lower":
        worse, separated_worse, separated_better = mean_b - mean_a, above, below
    else:
        worse, separated_worse, separated_better = mean_a - mean_b, below, above
    entry["verdict"] = ("worse beyond A/A spread" if separated_worse and worse > noise
                        else "better beyond A/A spread" if separated_better and -worse > noise
                        else "within A/A spread")
    return label, entry


def fmt(v):
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if isinstance(v, (int, float)):
        return f"{v:.4g}"
    return str(v)


def table(result, order):
    cols = [lab for _, lab in order]
    head = f"{'benchmark / metric':58} " + " ".join(f"{x:>9}" for x in cols) + \
        f" {'B/A':>7} {'A/A spr':>8}  verdict"
    lines = [head, "-" * len(head)]
    for bench, entry in result["benchmarks"].items():
        took = ", ".join(f"{r['label']} {r['seconds']:.0f}s" for r in entry["runs"])
        lines.append(f"{bench}  ({took})")
        for r in entry["runs"]:
            if "error" in r:
                lines.append(f"    {r['label']}: {r['error']}")
        for name, m in entry["metrics"].items():
            lines.append(f"  {name[:56]:56} " + " ".join(f"{fmt(m.get(x)):>9}" for x in cols)
                         + f" {fmt(m.get('ba_ratio')):>7} {fmt(m.get('aa_spread')):>8}  "
                         + m["verdict"])
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--a", required=True, metavar="DIR", help="the build before (e.g. "
                    "/work/baseline)")
    ap.add_argument("--b", required=True, metavar="DIR", help="the build after (e.g. build)")
    ap.add_argument("--sizes", choices=("full", "smoke"), default="full")
    ap.add_argument("--pattern", default="ABBA",
                    help="order of the builds per benchmark, at least two A (default ABBA)")
    ap.add_argument("--only", default=",".join(BENCHMARKS),
                    help="comma-separated benchmarks (default: all of "
                         + ",".join(BENCHMARKS) + ")")
    ap.add_argument("--out", metavar="DIR", help="where each run's JSON and stderr go "
                    "(default: a new /tmp/shoal-ab-* directory, kept)")
    ap.add_argument("--dry-run", action="store_true",
                    help="print the plan and the estimated duration; run nothing")
    args = ap.parse_args()
    only = [x.strip() for x in args.only.split(",") if x.strip()]
    unknown = [x for x in only if x not in BENCHMARKS]
    if unknown:
        ap.error(f"--only: unknown benchmark(s) {', '.join(unknown)}; known: "
                 + ", ".join(BENCHMARKS))
    if set(args.pattern) - {"A", "B"} or args.pattern.count("A") < 2 or "B" not in args.pattern:
        ap.error(f"--pattern {args.pattern!r}: letters A and B only, at least two A and one B")

    builds = {"A": Build("A", args.a), "B": Build("B", args.b)}
    for b in builds.values():
        if not b.dir.is_dir():
            ap.error(f"--{b.label.lower()} {b.dir}: not a directory")
        if b.shoal is None:
            ap.error(b.errors[0])
    order = labels_for(args.pattern)
    if args.dry_run:
        est = sum(FULL_SECONDS[x] for x in only) * len(order)
        for x in only:
            c.log(f"{x}: " + " ".join(BENCHMARKS[x]["argv"][args.sizes]))
        c.log(f"pattern {args.pattern}: {len(order)} runs per benchmark; --sizes full takes "
              f"about {est / 60:.0f} min on the 2-core VM")
        json.dump({"a": builds["A"].describe(), "b": builds["B"].describe()}, sys.stdout,
                  indent=2)
        print()
        return 0

    out_dir = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="shoal-ab-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    result = {
        "benchmark": "ab",
        "a": builds["A"].describe(),
        "b": builds["B"].describe(),
        "build_errors": builds["A"].errors + builds["B"].errors,
        "sizes": args.sizes,
        "pattern": args.pattern,
        "machine": c.machine_info(),
        "out_dir": str(out_dir),
        "benchmarks": {},
    }
    t_all = time.monotonic()
    for bench in only:
        spec = BENCHMARKS[bench]
        runs = [run_one(bench, spec, builds[which], builds["A"], args.sizes, label, out_dir)
                for which, label in order]
        result["benchmarks"][bench] = {
            "argv": spec["argv"][args.sizes],
            "runs": [{k: v for k, v in r.items() if k != "json"} for r in runs],
            "metrics": dict(compare(m, runs) for m in spec["metrics"]),
        }
        (out_dir / "ab.json").write_text(json.dumps(result, indent=2))  # partial, as it goes
    result["seconds"] = round(time.monotonic() - t_all, 1)
    result["machine_after"] = c.machine_info()
    worse = [f"{b}: {m}" for b, e in result["benchmarks"].items()
             for m, v in e["metrics"].items()
             if v["verdict"] in ("worse beyond A/A spread", "FAILS in B")]
    result["worse_beyond_aa_spread"] = worse
    (out_dir / "ab.json").write_text(json.dumps(result, indent=2))
    c.log("")
    c.log(table(result, order))
    c.log(f"\nab: {result['seconds'] / 60:.1f} min; {len(worse)} metric(s) worse beyond the "
          f"A/A spread; runs kept in {out_dir}")
    c.emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
