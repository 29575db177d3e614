#!/usr/bin/env python3
"""A trivial rank for the fault benchmarks' torchrun anchors: records where it stands, then
sleeps until killed.

    python3 _sleep_worker.py OUT_DIR

Writes OUT_DIR/w-g<G>-r<RANK>.json (atomically) with {"pid", "rank", "world_size", "gen",
"t_start"}; t_start is time.time() at the first line of the script (after the interpreter's own
start-up), G is TORCHELASTIC_RESTART_COUNT under torchrun, else SHOAL_GENERATION, else 0.
"""

import time

T_START = time.time()

import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402


def generation():
    for key in ("TORCHELASTIC_RESTART_COUNT", "SHOAL_GENERATION"):
        if os.environ.get(key):
            return int(os.environ[key])
    return 0


def main():
    out = sys.argv[1]
    rank = int(os.environ.get("RANK", "0"))
    gen = generation()
    info = {"pid": os.getpid(), "rank": rank, "world_size": int(os.environ.get("WORLD_SIZE", "1")),
            "gen": gen, "t_start": T_START}
    tmp = os.path.join(out, f".w-g{gen}-r{rank}.{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump(info, f)
    os.replace(tmp, os.path.join(out, f"w-g{gen}-r{rank}.json"))
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
