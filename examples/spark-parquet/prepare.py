#!/var/cache/shoal/venvs/spark/bin/python
"""Prepares scikit-learn's 8x8 digits with PySpark and writes them as Parquet, the way a Spark
job hands data to training: a training set in several Parquet files (one Shoal shard each) and
a held-out test set.

    /var/cache/shoal/venvs/spark/bin/python prepare.py                 # local[2]
    /var/cache/shoal/venvs/spark/bin/python prepare.py --master spark://host:7077

Writes <out>/digits-train.parquet/ (--partitions part files, _SUCCESS, .crc files) and
<out>/digits-test.parquet/. Columns: `pixels` (array<float>, 64 values scaled to [0, 1]) and
`label` (long). The split is fixed (stratified 80/20, random_state=0), so the training set is
the same on every run. Runs in Shoal's spark venv: PySpark and pyarrow from PyPI, scikit-learn
from Debian (python3-sklearn), seen through --system-site-packages.
"""

import argparse
import os
import sys


def parse_args():
    here = os.path.dirname(os.path.abspath(__file__))
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--master", default="local[2]",
                   help="the Spark master: local[N] (default local[2]) or spark://host:port")
    p.add_argument("--out", default=os.path.join(here, "data"),
                   help="where to write the two Parquet datasets (default: data/ beside this "
                        "script, where job.yaml reads them)")
    p.add_argument("--partitions", type=int, default=6,
                   help="Parquet files of the training set, i.e. Shoal shards (default 6)")
    p.add_argument("--driver-memory", default="1g", help="spark.driver.memory (default 1g)")
    args = p.parse_args()
    if args.partitions < 1:
        p.error("--partitions must be >= 1")
    return args


def main():
    args = parse_args()
    try:
        from pyspark.sql import SparkSession
        from pyspark.sql import types as T
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split
    except ImportError as e:
        sys.exit(f"{e}: run this with Shoal's spark venv, /var/cache/shoal/venvs/spark/bin/python "
                 f"(./setup.sh makes it)")

    digits = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(
        digits.data / 16.0, digits.target, test_size=0.2, stratify=digits.target,
        random_state=0)

    # The executors' Python workers run this same interpreter unless told otherwise (the same
    # venv path on every machine, as Shoal's setup.sh makes it).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder.master(args.master).appName("shoal-digits-prepare")
             .config("spark.driver.memory", args.driver_memory)
             .config("spark.executor.memory", "512m")
             .config("spark.ui.enabled", "false")
             # Spark's progress bar redraws with carriage returns: noise in a log or a pipe.
             .config("spark.ui.showConsoleProgress", str(sys.stderr.isatty()).lower())
             .getOrCreate())
    try:
        schema = T.StructType([T.StructField("pixels", T.ArrayType(T.FloatType()), False),
                               T.StructField("label", T.LongType(), False)])

        def frame(x, y, slices):
            rows = [([float(v) for v in features], int(label)) for features, label in zip(x, y)]
            # parallelize with a fixed number of slices: one part file per slice, the same
            # rows in the same file on every run.
            return spark.createDataFrame(spark.sparkContext.parallelize(rows, slices), schema)

        train_dir = os.path.join(args.out, "digits-train.parquet")
        test_dir = os.path.join(args.out, "digits-test.parquet")
        frame(x_train, y_train, args.partitions).write.mode("overwrite").parquet(train_dir)
        frame(x_test, y_test, 1).write.mode("overwrite").parquet(test_dir)
        written = sorted(f for f in os.listdir(train_dir) if f.endswith(".parquet"))
        print(f"wrote {len(x_train)} training samples in {len(written)} Parquet files to "
              f"{train_dir} and {len(x_test)} test samples to {test_dir}", flush=True)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
