"""The Keras MultiWorkerMirroredStrategy example (examples/tensorflow/train_mwms.py) trained
under TensorFlowOnSpark 2.2.5: the anchor of bench/spark_recovery.py. A Spark driver, run with
spark-submit and the peer-tfos venv's Python (bench/spark/requirements-tfos.txt):

  spark-submit --master spark://HOST:PORT --conf spark.cores.max=N --conf spark.executor.cores=1 \\
      --conf spark.pyspark.python=/var/cache/shoal/venvs/peer-tfos/bin/python \\
      bench/spark/tfos_mwms.py --cluster-size N -- TRAIN_ARGS...

TFCluster.run (InputMode.TENSORFLOW, master_node "chief", as TensorFlowOnSpark's own Keras MWMS
example does) starts one Spark task per node; each reserves a port, waits for the others through
TensorFlowOnSpark's reservation server, and exports TF_CONFIG. The node function then runs
train_mwms.py, unchanged, as a child process of the Spark Python worker with that environment:
the same script and arguments as under Shoal, so that both sides time the same training (and
bench/_first_step.py, installed as sitecustomize through PYTHONPATH, can stamp its first step).
A child that fails makes the node function raise, which fails the Spark task: what happens
next is TensorFlowOnSpark's and Spark's (task retry), not this file's.

Exit status: 0 when TFCluster.shutdown returns, 1 when TensorFlowOnSpark reports a failure.
"""

import argparse
import os
import subprocess
import sys
from pathlib import Path

TRAIN = Path(__file__).resolve().parents[2] / "examples" / "tensorflow" / "train_mwms.py"


def node_main(train_args, ctx):
    # TF_CONFIG is in os.environ (TFSparkNode exports it when the cluster has a chief); the port
    # TensorFlowOnSpark reserved is released before this runs (release_port=True).
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    argv = [sys.executable, str(TRAIN)] + list(train_args)
    print(f"tfos node {ctx.job_name}:{ctx.task_index} (executor {ctx.executor_id}): "
          f"{' '.join(argv)}", file=sys.stderr, flush=True)
    rc = subprocess.call(argv, env=env, cwd=str(TRAIN.parent))
    if rc != 0:
        raise RuntimeError(f"train_mwms.py {ctx.job_name}:{ctx.task_index} exited with {rc}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cluster-size", type=int, default=2)
    ap.add_argument("train_args", nargs=argparse.REMAINDER,
                    help="after --: train_mwms.py's arguments")
    args = ap.parse_args()
    train_args = args.train_args[1:] if args.train_args[:1] == ["--"] else args.train_args
    from pyspark import SparkConf, SparkContext
    from tensorflowonspark import TFCluster

    sc = SparkContext(conf=SparkConf().setAppName("tfos-mwms"))
    cluster = TFCluster.run(sc, node_main, train_args, args.cluster_size, num_ps=0,
                            tensorboard=False, input_mode=TFCluster.InputMode.TENSORFLOW,
                            master_node="chief")
    cluster.shutdown()  # waits for the nodes; sys.exit(1) when one failed
    sc.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
