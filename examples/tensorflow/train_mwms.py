"""Synchronous data-parallel Keras training with tf.distribute.MultiWorkerMirroredStrategy.

Every task runs this same script. It learns its place only from TF_CONFIG, as Shoal's
`framework: tensorflow` (or any TensorFlow launcher) sets it, e.g. for 2 workers:

  TF_CONFIG={"cluster":{"worker":["127.0.0.1:29500","127.0.0.1:29501"]},"task":{"type":"worker","index":0}}

Worker 0 is the chief (or the `chief` task, when the cluster has one). Without TF_CONFIG it
trains alone as a single worker.

The data is a synthetic 4-class problem made with numpy from a fixed seed (nothing is read or
downloaded); every worker builds the same arrays and Keras shards each global batch among the
workers. Each worker prints one line per epoch; after training every worker evaluates on the
held-out set (a collective, so all must take part) and the chief prints, as its last line,

  final_accuracy=0.968

Exit status: 0; 1 when the held-out accuracy is below --min-accuracy; 2 for bad arguments.

With --model-dir (default: $SHOAL_JOB_DIR/model when Shoal sets SHOAL_JOB_DIR) the trained
model is saved there as model.keras (Keras' own format; a SavedModel took ~10 s more). As
TensorFlow's MultiWorkerMirroredStrategy guide asks, every worker saves, but only the chief to
that path: the others write to a temporary directory of their own and remove it, so that no two
workers ever write the same files.
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

# TensorFlow's C++ INFO and WARNING lines (oneDNN notices, CPU feature notes, gRPC server
# start-up) go to stderr at import; 2 keeps errors only. Set before TensorFlow is imported.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

NUM_CLASSES = 4
NUM_FEATURES = 20


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=32, help="per worker")
    p.add_argument("--lr", type=float, default=0.01, help="Adam's learning rate")
    p.add_argument("--min-accuracy", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model-dir", default=None,
                   help="where the chief saves the model (default: $SHOAL_JOB_DIR/model if set, "
                        "else not saved)")
    args = p.parse_args()
    if args.epochs < 1 or args.batch_size < 1 or not 0 <= args.min_accuracy <= 1:
        p.error("--epochs and --batch-size must be >= 1, --min-accuracy within [0, 1]")
    if args.model_dir is None and os.environ.get("SHOAL_JOB_DIR"):
        args.model_dir = os.path.join(os.environ["SHOAL_JOB_DIR"], "model")
    return args


def threads():
    """CPU threads for this task: OMP_NUM_THREADS (Shoal sets it to the role's cpus), else 1."""
    try:
        return max(1, int(os.environ.get("OMP_NUM_THREADS", "1")))
    except ValueError:
        return 1


def make_data(seed, train=2000, test=500):
    """Gaussian blobs: 4 classes in 20 dimensions, centres ~5 standard deviations apart, mixed
    by a fixed random linear map. Same seed, same arrays on every worker."""
    rng = np.random.RandomState(seed)
    centres = rng.normal(scale=0.8, size=(NUM_CLASSES, NUM_FEATURES))
    mix = rng.normal(size=(NUM_FEATURES, NUM_FEATURES)) / np.sqrt(NUM_FEATURES)

    def draw(n):
        y = rng.randint(0, NUM_CLASSES, size=n)
        x = (centres[y] + rng.normal(size=(n, NUM_FEATURES))) @ mix
        return x.astype(np.float32), y.astype(np.int32)

    x_train, y_train = draw(train)
    x_test, y_test = draw(test)
    mean, std = x_train.mean(axis=0), x_train.std(axis=0)
    return (x_train - mean) / std, y_train, (x_test - mean) / std, y_test


def main():
    args = parse_args()
    try:
        config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    except ValueError as e:
        print(f"TF_CONFIG is not JSON: {e}", file=sys.stderr)
        return 2
    task = config.get("task") or {}
    task_type, task_index = task.get("type", "worker"), int(task.get("index", 0))
    cluster = config.get("cluster") or {}
    is_chief = task_type == "chief" or (task_type == "worker" and task_index == 0
                                        and "chief" not in cluster)
    t0 = time.perf_counter()

    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")
    # Ops run on OMP_NUM_THREADS threads. The inter-op pool (ops waiting on peers, the input
    # pipeline) keeps TensorFlow's default: a single thread there can deadlock a step.
    tf.config.threading.set_intra_op_parallelism_threads(threads())
    tf.keras.utils.set_random_seed(args.seed)  # Python, numpy and TF seeds: same initial weights
    tf.config.experimental.enable_op_determinism()

    # The strategy must be made before any other TensorFlow op: it starts this task's gRPC
    # server on its TF_CONFIG port and joins the others.
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    workers = strategy.num_replicas_in_sync

    x_train, y_train, x_test, y_test = make_data(args.seed)
    global_batch = args.batch_size * workers
    options = tf.data.Options()
    # Every worker holds the whole (in-memory) dataset: shard each batch by element.
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    train = (tf.data.Dataset.from_tensor_slices((x_train, y_train))
             .shuffle(len(x_train), seed=args.seed, reshuffle_each_iteration=True)
             .batch(global_batch).with_options(options))
    test = tf.data.Dataset.from_tensor_slices((x_test, y_test)).batch(global_batch) \
        .with_options(options)

    with strategy.scope():
        model = tf.keras.Sequential([
            tf.keras.layers.Input(shape=(NUM_FEATURES,)),
            tf.keras.layers.Dense(32, activation="relu"),
            tf.keras.layers.Dense(NUM_CLASSES),
        ])
        model.compile(optimizer=tf.keras.optimizers.Adam(args.lr),
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])

    class EpochLine(tf.keras.callbacks.Callback):
        # The logs are already averaged over all workers, so every worker prints the same numbers.
        def on_epoch_end(self, epoch, logs=None):
            logs = logs or {}
            print(f"epoch {epoch + 1}/{args.epochs} loss={logs.get('loss', 0):.4f} "
                  f"accuracy={logs.get('accuracy', 0):.4f}", flush=True)

    class StepTimes(tf.keras.callbacks.Callback):
        # Wall time of each training step (one global batch: forward, backward, the
        # all-reduce, the update), after the first epoch (tracing and warm-up).
        def __init__(self):
            super().__init__()
            self.epoch, self.start, self.times = 0, 0.0, []

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_begin(self, batch, logs=None):
            self.start = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            if self.epoch > 0 or args.epochs == 1:
                self.times.append(time.perf_counter() - self.start)

    print(f"training: {workers} worker(s), global batch {global_batch}, "
          f"{threads()} thread(s)", flush=True)
    steps = StepTimes()
    model.fit(train, epochs=args.epochs, verbose=0, callbacks=[EpochLine(), steps])
    _, accuracy = model.evaluate(test, verbose=0)

    if args.model_dir:
        # Everyone saves; only the chief keeps what it wrote.
        folder = args.model_dir if is_chief else tempfile.mkdtemp(prefix=f"mwms-{task_index}-")
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, "model.keras")
        model.save(path)
        if not is_chief:
            shutil.rmtree(folder, ignore_errors=True)
        else:
            print(f"saved the model to {path}", flush=True)

    print(f"done in {time.perf_counter() - t0:.1f}s, held-out accuracy {accuracy:.4f}",
          flush=True)
    if accuracy < args.min_accuracy:
        print(f"held-out accuracy {accuracy:.4f} is below --min-accuracy "
              f"{args.min_accuracy}", file=sys.stderr, flush=True)
        code = 1
    else:
        code = 0
    if is_chief:
        mean_step_ms = 1000.0 * sum(steps.times) / len(steps.times) if steps.times else None
        print(json.dumps({"metric": "accuracy", "value": round(float(accuracy), 4),
                          "mean_step_ms": None if mean_step_ms is None else round(mean_step_ms, 4),
                          "steps": len(steps.times), "world_size": workers}), flush=True)
        print(f"final_accuracy={accuracy:.3f}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
