#!/var/cache/shoal/venvs/jax/bin/python
"""Shoal's JAX example: data-parallel training of a small MLP across processes, on CPU.

Multi-controller JAX: every process calls jax.distributed.initialize() and then sees the
devices of all processes (one CPU device each) as one global mesh. Each training step runs a
jitted shard_map over that mesh: every process computes the gradient of its own shard of the
global batch and `jax.lax.pmean` averages the gradients across the processes (an all-reduce
over XLA's gloo TCP collectives, JAX's default on CPU), so every process applies the same
update. At the end the processes all-gather a checksum of their weights and check that they
are identical, which they could not be without that all-reduce: each saw different data.

The process learns its place in the job only from what Shoal's `framework: jax` sets:

    JAX_COORDINATOR_ADDRESS   host:port of process 0's coordinator service
    JAX_NUM_PROCESSES         the number of processes
    JAX_PROCESS_ID            this process's id, 0 .. JAX_NUM_PROCESSES-1

jax.distributed.initialize() reads only JAX_COORDINATOR_ADDRESS by itself (jax 0.10.2,
jax/_src/distributed.py), so the three are passed explicitly, with cluster auto-detection
turned off ("deactivate") so that Slurm or Open MPI variables inherited from the
environment cannot override them.

Data: a fixed-seed synthetic 4-class problem (8 features, Gaussian clusters), 2048 training
and 512 held-out samples, made by numpy on every process; nothing is downloaded. Epoch e
shuffles the training set with seed e; each step takes the next global batch of
--batch-size x JAX_NUM_PROCESSES samples, of which process p uses rows p, p+W, p+2W, ...

Output: rank 0 prints `epoch E/N loss L` per epoch (the global mean loss), a JSON line
    {"metric": "accuracy", "value": ..., "mean_step_ms": ..., "steps": ..., "world_size": ...}
and, as its very last line, `final_accuracy=0.xxx`. Exit status 0 on success, 1 when
held-out accuracy is below --min-accuracy (or the processes' weights differ), 2 on bad
arguments or missing environment variables.
"""

import argparse
import json
import os
import sys
import time

REQUIRED_ENV = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")
N_FEATURES, N_CLASSES, HIDDEN = 8, 4, 32
N_TRAIN, N_TEST = 2048, 512


def log(msg):
    print(msg, flush=True)


def progress_reporter():
    """shoal.progress from Shoal's SDK (the shoal-sdk package, which setup.sh installs into
    this venv); a no-op when it is not installed or the process was not started by Shoal."""
    try:
        import shoal
    except ImportError:
        return lambda step: None
    return shoal.progress


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=10, help="training epochs (default 10)")
    p.add_argument("--batch-size", type=int, default=32,
                   help="per-process mini-batch size (default 32)")
    p.add_argument("--lr", type=float, default=0.1, help="SGD learning rate (default 0.1)")
    p.add_argument("--min-accuracy", type=float, default=0.9,
                   help="exit 1 when held-out accuracy is below this (default 0.9)")
    args = p.parse_args()
    if args.epochs < 1 or args.batch_size < 1 or args.lr <= 0:
        p.error("--epochs and --batch-size must be >= 1 and --lr > 0")
    return args


def read_env():
    missing = [k for k in REQUIRED_ENV if not os.environ.get(k)]
    if missing:
        log("error: missing environment variable(s) " + ", ".join(missing)
            + "; run under `shoal run job.yaml` or set JAX_COORDINATOR_ADDRESS,"
            " JAX_NUM_PROCESSES and JAX_PROCESS_ID by hand (see README.md)")
        sys.exit(2)
    try:
        num_processes = int(os.environ["JAX_NUM_PROCESSES"])
        process_id = int(os.environ["JAX_PROCESS_ID"])
    except ValueError as e:
        log(f"error: bad JAX_NUM_PROCESSES / JAX_PROCESS_ID: {e}")
        sys.exit(2)
    if num_processes < 1 or not 0 <= process_id < num_processes:
        log(f"error: JAX_PROCESS_ID={process_id} is not within JAX_NUM_PROCESSES={num_processes}")
        sys.exit(2)
    return os.environ["JAX_COORDINATOR_ADDRESS"], num_processes, process_id


def make_data(np):
    """The same fixed-seed data set on every process: one Gaussian cluster per class, the
    centres drawn once, unit-variance noise around them."""
    rng = np.random.default_rng(0)
    centres = rng.normal(0.0, 1.3, size=(N_CLASSES, N_FEATURES))
    n = N_TRAIN + N_TEST
    y = rng.integers(0, N_CLASSES, size=n)
    x = centres[y] + rng.normal(0.0, 1.0, size=(n, N_FEATURES))
    x, y = x.astype(np.float32), y.astype(np.int32)
    return x[:N_TRAIN], y[:N_TRAIN], x[N_TRAIN:], y[N_TRAIN:]


def collectives_impl(jax):
    try:
        return jax.config.jax_cpu_collectives_implementation
    except AttributeError:
        return "unknown"


def init_params(np):
    rng = np.random.default_rng(1)
    return {
        "w1": (rng.normal(size=(N_FEATURES, HIDDEN)) / np.sqrt(N_FEATURES)).astype(np.float32),
        "b1": np.zeros(HIDDEN, np.float32),
        "w2": (rng.normal(size=(HIDDEN, N_CLASSES)) / np.sqrt(HIDDEN)).astype(np.float32),
        "b2": np.zeros(N_CLASSES, np.float32),
    }


def main():
    args = parse_args()
    coordinator, num_processes, process_id = read_env()

    # XLA's CPU backend sizes its thread pools by the machine's cores, not OMP_NUM_THREADS:
    # with one CPU per task, keep its Eigen work on the calling thread.
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads == "1" and "xla_cpu_multi_thread_eigen" not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                                   + " --xla_cpu_multi_thread_eigen=false").strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

    import numpy as np
    import jax
    import jax.numpy as jnp
    from jax.experimental import multihost_utils
    from jax.flatten_util import ravel_pytree
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    progress = progress_reporter()

    jax.distributed.initialize(coordinator_address=coordinator,
                               num_processes=num_processes,
                               process_id=process_id,
                               cluster_detection_method="deactivate")
    devices = jax.devices()
    log(f"process {jax.process_index()}/{jax.process_count()} joined {coordinator}: "
        f"{len(jax.local_devices())} local / {len(devices)} global {devices[0].platform} "
        f"device(s), CPU collectives {collectives_impl(jax)}")
    if jax.process_count() != num_processes or jax.process_index() != process_id:
        log(f"error: JAX reports process {jax.process_index()} of {jax.process_count()}")
        return 2

    # A cross-process sanity check: every process contributes its id.
    ids = multihost_utils.process_allgather(np.array([process_id], np.int32))
    if sorted(np.asarray(ids).ravel().tolist()) != list(range(num_processes)):
        log(f"error: process_allgather returned {ids}")
        return 2

    mesh = Mesh(np.array(devices), ("data",))
    replicated = NamedSharding(mesh, P())
    by_row = NamedSharding(mesh, P("data"))

    def global_replicated(a):
        return jax.make_array_from_callback(a.shape, replicated, lambda idx: a[idx])

    def logits_fn(params, x):
        h = jnp.tanh(x @ params["w1"] + params["b1"])
        return h @ params["w2"] + params["b2"]

    def loss_fn(params, x, y):
        logp = jax.nn.log_softmax(logits_fn(params, x))
        return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))

    lr, momentum = args.lr, 0.9

    @jax.jit
    @jax.shard_map(mesh=mesh, in_specs=(P(), P(), P("data"), P("data")), out_specs=(P(), P(), P()))
    def train_step(params, velocity, x, y):
        # Runs once per device, i.e. once per process, on that process's rows.
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        # The cross-process all-reduce: gradients and loss packed into one vector, so that
        # each step makes one collective call rather than one per array.
        flat, unravel = ravel_pytree((grads, loss))
        grads, loss = unravel(jax.lax.pmean(flat, "data"))
        velocity = jax.tree.map(lambda v, g: momentum * v + g, velocity, grads)
        params = jax.tree.map(lambda p, v: p - lr * v, params, velocity)
        return params, velocity, loss

    x_train, y_train, x_test, y_test = make_data(np)
    host_params = init_params(np)
    params = {k: global_replicated(v) for k, v in host_params.items()}
    velocity = {k: global_replicated(np.zeros_like(v)) for k, v in host_params.items()}

    world, per_proc = num_processes, args.batch_size
    global_batch = per_proc * world
    steps_per_epoch = N_TRAIN // global_batch
    step, step_times = 0, []
    for epoch in range(args.epochs):
        order = np.random.default_rng(epoch).permutation(N_TRAIN)
        total = 0.0
        for k in range(steps_per_epoch):
            rows = order[k * global_batch:(k + 1) * global_batch][process_id::world]
            t0 = time.perf_counter()
            # Each process hands over only its own rows; together they form the global batch.
            x = jax.make_array_from_process_local_data(by_row, x_train[rows])
            y = jax.make_array_from_process_local_data(by_row, y_train[rows])
            params, velocity, loss = train_step(params, velocity, x, y)
            loss = float(loss.addressable_data(0))
            if epoch > 0 or args.epochs == 1:
                step_times.append(time.perf_counter() - t0)
            total += loss
            step += 1
            progress(step)
        if process_id == 0:
            log(f"epoch {epoch + 1}/{args.epochs} loss {total / steps_per_epoch:.4f}")

    # The weights of this process (its local copy of the replicated arrays).
    final = {k: np.asarray(v.addressable_data(0)) for k, v in params.items()}
    checksum = np.array([sum(float(np.abs(v).sum()) for v in final.values())], np.float64)
    sums = np.asarray(multihost_utils.process_allgather(checksum)).ravel()
    same = bool(np.all(sums == sums[0]))

    h = np.tanh(x_test @ final["w1"] + final["b1"])
    accuracy = float(np.mean(np.argmax(h @ final["w2"] + final["b2"], axis=1) == y_test))
    multihost_utils.sync_global_devices("done")
    ok = same and accuracy >= args.min_accuracy

    if not same:
        log(f"error: the processes' weights differ (checksums {sums.tolist()})")
    if process_id == 0:
        mean_step_ms = 1000.0 * sum(step_times) / len(step_times) if step_times else None
        log(json.dumps({
            "metric": "accuracy",
            "value": round(accuracy, 4),
            "mean_step_ms": None if mean_step_ms is None else round(mean_step_ms, 4),
            "steps": len(step_times),
            "world_size": world,
            "weights_identical": same,
        }))
        if accuracy < args.min_accuracy:
            log(f"error: held-out accuracy {accuracy:.3f} is below --min-accuracy "
                f"{args.min_accuracy}")
        log(f"final_accuracy={accuracy:.3f}")
    elif accuracy < args.min_accuracy:
        log(f"error: held-out accuracy {accuracy:.3f} is below --min-accuracy "
            f"{args.min_accuracy}")
    jax.distributed.shutdown()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
