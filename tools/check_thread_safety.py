#!/usr/bin/env python3
"""Checks the locking annotations (ABSL_GUARDED_BY and friends) with clang's -Wthread-safety.

gcc, which builds Shoal, ignores these annotations: without this check an ABSL_GUARDED_BY is
only a comment. Every translation unit under src/ whose source or own header annotates its
locking, or uses absl::Mutex, is compiled with clang -fsyntax-only and the flags the build uses
for it (from compile_commands.json); any thread-safety warning fails the check.

  check_thread_safety.py --build-dir build --clang clang++-14      the annotated sources
  check_thread_safety.py ... --only FILE... --expect-violation     FILE must fail the check

Exit codes: 0 clean, 1 a warning (or, with --expect-violation, none), 2 the check cannot run.
"""

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys

ANNOTATED = re.compile(
    r"ABSL_(PT_)?GUARDED_BY|ABSL_(EXCLUSIVE|SHARED)_LOCKS_REQUIRED|ABSL_LOCKS_EXCLUDED|"
    r"ABSL_(EXCLUSIVE|SHARED)_LOCK_FUNCTION|ABSL_UNLOCK_FUNCTION|absl::Mutex\b")

# Sources whose annotations name a std::mutex. libstdc++ does not annotate std::mutex or
# std::lock_guard, so clang can check nothing there (it says the attribute names no
# capability); they are checked once they move to absl::Mutex, as the agent, the local and
# the YARN backends did.
NOT_YET_CHECKABLE = {
    "src/backends/slurm/slurm_backend.cc",
    "src/serve/repository/model_manager.cc",
    "src/serve/repository/repository_watcher.cc",
    "src/serve/scheduling/model_scheduler.cc",
    "src/serve/scheduling/worker_pool.cc",
}

CHECK_FLAGS = ["-Wno-everything", "-Wthread-safety", "-Werror=thread-safety"]


def read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def is_annotated(source):
    header = os.path.splitext(source)[0] + ".h"
    return bool(ANNOTATED.search(read(source)) or ANNOTATED.search(read(header)))


def clang_command(clang, entry):
    """The build's command for `entry` with clang, checking only, thread-safety warnings only."""
    args = entry["arguments"] if "arguments" in entry else shlex.split(entry["command"])
    out = [clang]
    skip_next = False
    for arg in args[1:]:
        if skip_next:
            skip_next = False
            continue
        if arg == "-o":
            skip_next = True
            continue
        if arg == "-c" or arg.startswith("-W"):
            continue
        out.append(arg)
    return out[:-1] + ["-fsyntax-only"] + CHECK_FLAGS + out[-1:]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build-dir", required=True)
    parser.add_argument("--clang", required=True, help="clang++ to check with")
    parser.add_argument("--source-dir", default=os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))
    parser.add_argument("--only", nargs="+", help="check these files instead")
    parser.add_argument("--expect-violation", action="store_true",
                        help="succeed only if every file checked has a thread-safety warning")
    opts = parser.parse_args()

    if not shutil.which(opts.clang):
        print(f"check_thread_safety: no clang++ at '{opts.clang}': install Debian's clang "
              "(setup.sh does)", file=sys.stderr)
        return 2
    db_path = os.path.join(opts.build_dir, "compile_commands.json")
    try:
        with open(db_path, encoding="utf-8") as f:
            entries = json.load(f)
    except (OSError, ValueError) as e:
        print(f"check_thread_safety: cannot read {db_path}: {e} (configure with CMake first)",
              file=sys.stderr)
        return 2
    src_root = os.path.join(os.path.abspath(opts.source_dir), "src") + os.sep

    checks = []  # (name, command, working directory)
    if opts.only:
        by_file = {os.path.abspath(e["file"]): e for e in entries}
        for path in opts.only:
            path = os.path.abspath(path)
            entry = by_file.get(path) or {
                "directory": opts.build_dir,
                "command": shlex.join(["c++", "-std=c++20", "-I",
                                       os.path.join(opts.source_dir, "src"), "-c", path]),
                "file": path}
            checks.append((path, clang_command(opts.clang, entry), entry["directory"]))
    else:
        for entry in entries:
            path = os.path.abspath(os.path.join(entry["directory"], entry["file"]))
            if not path.startswith(src_root) or not is_annotated(path):
                continue
            rel = os.path.relpath(path, opts.source_dir)
            if rel in NOT_YET_CHECKABLE:
                print(f"not checkable yet (std::mutex): {rel}")
                continue
            checks.append((rel, clang_command(opts.clang, entry), entry["directory"]))
        if not checks:
            print("check_thread_safety: found no annotated source under src/", file=sys.stderr)
            return 2

    failed = []
    caught = []  # flagged by the analysis itself, not by a compile error
    for name, command, cwd in sorted(checks):
        result = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
        output = (result.stdout + result.stderr).strip()
        flagged = result.returncode != 0 or "warning:" in output
        print(f"{'FLAGGED' if flagged else 'clean'}: {name}")
        if flagged:
            if output:
                print(output)
            failed.append(name)
        if "-Wthread-safety" in output:
            caught.append(name)
    if opts.expect_violation:
        missed = [name for name, _, _ in checks if name not in caught]
        if missed:
            print("check_thread_safety: no violation found in " + ", ".join(missed),
                  file=sys.stderr)
            return 1
        return 0
    if failed:
        print(f"check_thread_safety: {len(failed)} of {len(checks)} sources break their "
              "locking annotations: " + ", ".join(failed), file=sys.stderr)
        return 1
    print(f"check_thread_safety: {len(checks)} annotated sources checked, no warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
