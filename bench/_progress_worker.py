#!/usr/bin/env python3
"""A trivial Shoal task for the hang benchmark: reports progress through the SDK every PERIOD
seconds, forever.

    python3 _progress_worker.py OUT_DIR PERIOD_S      (sdk/python on PYTHONPATH)

The step it reports is the wall-clock time of the report in microseconds (an increasing
integer, as progress() asks), so the journal's task_hung record (last_step) says exactly when
the last report was sent. After its first report it writes OUT_DIR/ready-<SHOAL_INDEX>.json
(atomically): {"pid", "attempt", "t_first_progress_us"}; the driver stops a task only once that
file names the task's current process, so that the watchdog is armed.
"""

import json
import os
import sys
import time

import shoal


def main():
    out, period = sys.argv[1], float(sys.argv[2])
    index = os.environ.get("SHOAL_INDEX", "0")
    first = True
    while True:
        t_us = int(time.time() * 1e6)
        shoal.progress(t_us)
        if first:
            first = False
            info = {"pid": os.getpid(), "attempt": int(os.environ.get("SHOAL_RESTART_COUNT", "0")),
                    "t_first_progress_us": t_us}
            tmp = os.path.join(out, f".ready-{index}.{os.getpid()}")
            with open(tmp, "w") as f:
                json.dump(info, f)
            os.replace(tmp, os.path.join(out, f"ready-{index}.json"))
        time.sleep(period)


if __name__ == "__main__":
    main()
