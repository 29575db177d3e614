"""The bare anchor of bench/spark_submit.py: a PySpark driver whose one barrier stage starts N
task processes, as a Spark user without Shoal would start a gang.

  spark-submit --master URL bench/spark/bare_barrier.py N COMMAND

Each of the N barrier tasks (all scheduled together, or none) runs COMMAND with /bin/sh -c and
RANK set to its partition index, waits for it, and fails when it fails. Nothing else: no agent,
no master, no barrier() call (the stage's gang scheduling is the only synchronisation).
Exit status: 0 when every command exited 0, 1 otherwise, 2 for bad arguments.
"""

import os
import subprocess
import sys


def main():
    if len(sys.argv) != 3 or not sys.argv[1].isdigit() or int(sys.argv[1]) < 1:
        print("usage: bare_barrier.py N COMMAND", file=sys.stderr)
        return 2
    n, command = int(sys.argv[1]), sys.argv[2]
    from pyspark import SparkConf, SparkContext

    def run_task(index, _rows):
        env = dict(os.environ, RANK=str(index))
        rc = subprocess.call(["/bin/sh", "-c", command], env=env, stdin=subprocess.DEVNULL)
        if rc != 0:
            raise RuntimeError(f"task {index}: exit status {rc}")
        yield rc

    sc = SparkContext(conf=SparkConf().setAppName(f"bare-barrier-{n}"))
    try:
        sc.parallelize(range(n), n).barrier().mapPartitionsWithIndex(run_task).collect()
    except Exception as e:  # noqa: BLE001 - Spark wraps the task's error in a Py4J one
        print(f"bare_barrier.py: the barrier stage failed: {str(e).splitlines()[0]}",
              file=sys.stderr)
        return 1
    finally:
        sc.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
