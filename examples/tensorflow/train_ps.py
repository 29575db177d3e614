"""Asynchronous training with tf.distribute.ParameterServerStrategy.

Every task runs this same script and learns its part from TF_CONFIG, as Shoal's
`framework: tensorflow` sets it, e.g.

  TF_CONFIG={"cluster":{"chief":["127.0.0.1:29500"],"worker":["127.0.0.1:29501","127.0.0.1:29502"],
             "ps":["127.0.0.1:29503"]},"task":{"type":"worker","index":1}}

- `worker` and `ps` tasks only start a tf.distribute.Server on their TF_CONFIG port and serve
  until they are stopped (server.join() never returns; SIGTERM ends them at once). They print
  one line when they start serving.
- The `chief` is the coordinator: it waits until every worker and ps port accepts connections,
  makes the strategy (the model's variables live on the ps tasks), and schedules training steps
  on the workers with tf.distribute.coordinator.ClusterCoordinator. It prints one line per epoch
  and, after training, evaluates the model on the held-out set itself and prints, as its last
  line,

    final_accuracy=0.966

  then exits: 0, or 1 when the accuracy is below --min-accuracy (2 for bad arguments or
  TF_CONFIG, 3 when the cluster did not come up within --wait-timeout).

The data is a synthetic 4-class problem made with numpy from a fixed seed; nothing is read or
downloaded. Each worker reads its own shuffled copy of the training set. The updates are
asynchronous, so the exact numbers vary a little from run to run; the accuracy does not fall far.
"""

import argparse
import json
import os
import socket
import sys
import time

# TensorFlow's C++ INFO and WARNING lines (oneDNN notices, CPU feature notes, gRPC server
# start-up) go to stderr at import; 2 keeps errors only. Set before TensorFlow is imported.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# An RPC to a worker that is down fails at once instead of waiting, so that the coordinator can
# schedule its work on another worker (TensorFlow's advice for ParameterServerStrategy).
os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")

import numpy as np  # noqa: E402

NUM_CLASSES = 4
NUM_FEATURES = 20


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--steps-per-epoch", type=int, default=60,
                   help="training steps the chief schedules per epoch, over all workers")
    p.add_argument("--batch-size", type=int, default=32, help="per step")
    p.add_argument("--lr", type=float, default=0.01, help="Adam's learning rate")
    p.add_argument("--min-accuracy", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--wait-timeout", type=float, default=120,
                   help="seconds the chief waits for every worker and ps to listen")
    args = p.parse_args()
    if min(args.epochs, args.steps_per_epoch, args.batch_size) < 1 \
            or not 0 <= args.min_accuracy <= 1:
        p.error("--epochs, --steps-per-epoch and --batch-size must be >= 1, "
                "--min-accuracy within [0, 1]")
    return args


def threads():
    """CPU threads for this task: OMP_NUM_THREADS (Shoal sets it to the role's cpus), else 1."""
    try:
        return max(1, int(os.environ.get("OMP_NUM_THREADS", "1")))
    except ValueError:
        return 1


def make_data(seed, train=2000, test=500):
    """Gaussian blobs: 4 classes in 20 dimensions, centres ~5 standard deviations apart, mixed
    by a fixed random linear map (the same data as train_mwms.py)."""
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


def wait_for_cluster(cluster, timeout):
    """Waits until every worker and ps address accepts a TCP connection. Their servers may start
    after the chief (TensorFlow's import alone takes seconds); this makes the order not matter."""
    deadline = time.monotonic() + timeout
    for role in ("ps", "worker"):
        for address in cluster.get(role, []):
            host, _, port = address.rpartition(":")
            while True:
                try:
                    with socket.create_connection((host.strip("[]"), int(port)), timeout=1):
                        break
                except OSError:
                    if time.monotonic() > deadline:
                        return f"{role} at {address}"
                    time.sleep(0.2)
    return None


def serve(tf, resolver):
    """A worker or ps task: a TensorFlow server on this task's port, until the process is
    stopped."""
    # Only the intra-op pool follows OMP_NUM_THREADS: a step blocks inter-op threads while it
    # waits on the ps and on the input pipeline, and with a single one it deadlocks.
    config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=threads())
    server = tf.distribute.Server(resolver.cluster_spec(), job_name=resolver.task_type,
                                  task_index=resolver.task_id, config=config,
                                  protocol=resolver.rpc_layer or "grpc", start=True)
    print(f"serving on {server.target}", flush=True)
    server.join()  # never returns: Shoal stops this task with SIGTERM when the chief is done
    return 0


def coordinate(tf, resolver, args):
    cluster = resolver.cluster_spec().as_dict()
    if not cluster.get("ps") or not cluster.get("worker"):
        print(f"ParameterServerStrategy needs at least one ps and one worker in "
              f"TF_CONFIG's cluster, got {sorted(cluster)}", file=sys.stderr)
        return 2
    missing = wait_for_cluster(cluster, args.wait_timeout)
    if missing:
        print(f"{missing} did not accept connections within {args.wait_timeout:g}s",
              file=sys.stderr)
        return 3

    t0 = time.perf_counter()
    tf.keras.utils.set_random_seed(args.seed)  # the same initial weights on every run
    # Starts the chief's own server on its TF_CONFIG port and connects to the workers and ps.
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    x_train, y_train, x_test, y_test = make_data(args.seed)

    def dataset_fn(input_context):
        batch = input_context.get_per_replica_batch_size(args.batch_size)
        return (tf.data.Dataset.from_tensor_slices((x_train, y_train))
                .shuffle(len(x_train)).repeat().batch(batch).prefetch(2))

    @tf.function
    def per_worker_dataset_fn():
        return strategy.distribute_datasets_from_function(dataset_fn)

    with strategy.scope():  # the variables are placed on the ps tasks
        model = tf.keras.Sequential([
            tf.keras.layers.Input(shape=(NUM_FEATURES,)),
            tf.keras.layers.Dense(32, activation="relu"),
            tf.keras.layers.Dense(NUM_CLASSES),
        ])
        optimizer = tf.keras.optimizers.legacy.Adam(args.lr)
        train_loss = tf.keras.metrics.Mean()
        train_accuracy = tf.keras.metrics.SparseCategoricalAccuracy()
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction=tf.keras.losses.Reduction.NONE)

    iterator = iter(coordinator.create_per_worker_dataset(per_worker_dataset_fn))

    @tf.function
    def step_fn(iterator):
        def replica_fn(x, y):
            with tf.GradientTape() as tape:
                logits = model(x, training=True)
                loss = tf.nn.compute_average_loss(loss_fn(y, logits))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            train_loss.update_state(loss)
            train_accuracy.update_state(y, logits)
            return loss

        x, y = next(iterator)
        return strategy.run(replica_fn, args=(x, y))

    workers = len(cluster["worker"])
    print(f"coordinating {workers} worker(s) and {len(cluster['ps'])} ps, "
          f"{args.steps_per_epoch} steps of {args.batch_size} per epoch", flush=True)
    for epoch in range(args.epochs):
        train_loss.reset_states()
        train_accuracy.reset_states()
        for _ in range(args.steps_per_epoch):
            coordinator.schedule(step_fn, args=(iterator,))
        coordinator.join()  # waits for every scheduled step; raises if a step failed
        print(f"epoch {epoch + 1}/{args.epochs} loss={train_loss.result().numpy():.4f} "
              f"accuracy={train_accuracy.result().numpy():.4f}", flush=True)

    # Held-out evaluation right here on the chief, with the variables read from the ps.
    logits = model(x_test, training=False).numpy()
    accuracy = float(np.mean(np.argmax(logits, axis=1) == y_test))
    print(f"done in {time.perf_counter() - t0:.1f}s, held-out accuracy {accuracy:.4f}",
          flush=True)
    code = 0
    if accuracy < args.min_accuracy:
        print(f"held-out accuracy {accuracy:.4f} is below --min-accuracy "
              f"{args.min_accuracy}", file=sys.stderr, flush=True)
        code = 1
    print(f"final_accuracy={accuracy:.3f}", flush=True)
    return code


def main():
    args = parse_args()
    try:
        config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    except ValueError as e:
        print(f"TF_CONFIG is not JSON: {e}", file=sys.stderr)
        return 2
    task = config.get("task") or {}
    if task.get("type") not in ("chief", "worker", "ps"):
        print(f"TF_CONFIG must give this task a type of chief, worker or ps "
              f"(TF_CONFIG={os.environ.get('TF_CONFIG', '')!r})", file=sys.stderr)
        return 2

    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if resolver.task_type in ("worker", "ps"):
        return serve(tf, resolver)
    # Ops run on OMP_NUM_THREADS threads. The inter-op pool (ops waiting on peers, the input
    # pipeline) keeps TensorFlow's default: a single thread there can deadlock a step.
    tf.config.threading.set_intra_op_parallelism_threads(threads())
    return coordinate(tf, resolver, args)


if __name__ == "__main__":
    sys.exit(main())
