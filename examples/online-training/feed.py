#!/usr/bin/python3
"""Data feeder of the online-training example: writes labelled feature rows as CSV files into a
directory, one file every --interval seconds, the way an upstream pipeline would drop batches.

    python3 feed.py --out /tmp/shoal-online/incoming --files 40 --interval 0.5

Each file is `data-<n:06d>.csv` with --rows rows of `label,f0,...,f15`. It is written under a
hidden name (`.tmp-...`) in the same directory, fsync'd and renamed, so a reader listing the
directory sees the whole file or nothing. Numbering continues after the highest file already in
the directory, so running the feeder again never replaces a file the trainer may have consumed.

The labels follow a fixed hidden linear rule (4 classes over 16 features, seed 0) that turns by
--drift radians per file, so that a model trained on old data slowly goes stale: the reason to
train online. The last line on stdout is a JSON summary: {"files": [...], "rows": N}.
"""

import argparse
import json
import os
import re
import sys
import time

import numpy as np

FEATURES = 16
CLASSES = 4
FILE_RE = re.compile(r"^data-(\d{6})\.csv$")


def hidden_rule(index, drift):
    """The weights that label file `index`: a fixed random matrix, rotated by index * drift in
    the plane of its first two features."""
    weights = np.random.default_rng(0).normal(size=(FEATURES, CLASSES))
    angle = index * drift
    rotation = np.eye(FEATURES)
    rotation[:2, :2] = [[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]]
    return rotation @ weights


def write_atomically(directory, name, text):
    tmp = os.path.join(directory, f".tmp-{name}.{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, os.path.join(directory, name))
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="/tmp/shoal-online/incoming",
                        help="the directory the trainer reads (created if missing)")
    parser.add_argument("--files", type=int, default=40, help="how many files to write")
    parser.add_argument("--rows", type=int, default=256, help="rows per file")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between files")
    parser.add_argument("--drift", type=float, default=0.02,
                        help="radians the hidden rule turns per file")
    parser.add_argument("--seed", type=int, default=None,
                        help="seed of the features (default: the first file's number)")
    args = parser.parse_args()
    if args.files < 0 or args.rows < 1 or args.interval < 0:
        print("feed.py: --files must be >= 0, --rows >= 1 and --interval >= 0", file=sys.stderr)
        return 2

    os.makedirs(args.out, exist_ok=True)
    existing = [int(m.group(1)) for m in map(FILE_RE.match, os.listdir(args.out)) if m]
    first = max(existing, default=0) + 1
    rng = np.random.default_rng(first if args.seed is None else args.seed)
    written, start = [], time.monotonic()
    for i in range(args.files):
        index = first + i
        features = rng.normal(size=(args.rows, FEATURES)).astype(np.float32)
        labels = np.argmax(features @ hidden_rule(index, args.drift), axis=1)
        lines = [f"{label}," + ",".join(f"{v:.5f}" for v in row)
                 for label, row in zip(labels, features)]
        name = f"data-{index:06d}.csv"
        write_atomically(args.out, name, "\n".join(lines) + "\n")
        written.append(name)
        print(f"feed: wrote {name} ({args.rows} rows)", file=sys.stderr, flush=True)
        # On a schedule, not after a sleep per file, so that the rate holds when writing is slow.
        delay = start + (i + 1) * args.interval - time.monotonic()
        if delay > 0 and i + 1 < args.files:
            time.sleep(delay)
    print(json.dumps({"files": written, "rows": args.rows * len(written)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
