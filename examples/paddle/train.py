#!/var/cache/shoal/venvs/paddle/bin/python
"""Shoal's PaddlePaddle example: collective data-parallel training of a small MLP on CPU.

Real `paddle.DataParallel` over the gloo backend: every trainer computes the gradient of its
own shard of each global batch and DataParallel all-reduces (averages) the gradients across
the trainers, so every trainer applies the same update. At the end the trainers all-gather a
checksum of their weights and check that they are identical, which they could not be
without that all-reduce: each saw different data.

The process learns its place in the job only from the variables of Paddle's launcher
(`python -m paddle.distributed.launch`), which Shoal's `framework: paddle` also sets:

    PADDLE_TRAINER_ID          this trainer's rank, 0 .. PADDLE_TRAINERS_NUM-1
    PADDLE_TRAINERS_NUM        the number of trainers
    PADDLE_TRAINER_ENDPOINTS   every trainer's host:port, comma-separated, in rank order
    PADDLE_CURRENT_ENDPOINT    this trainer's host:port
    PADDLE_DISTRI_BACKEND      `gloo` for CPU training (else Paddle picks nccl when built
                               with CUDA); this script defaults it to gloo when unset
    PADDLE_MASTER              optional: host:port of the rendezvous TCP store; without it
                               Paddle uses the first of PADDLE_TRAINER_ENDPOINTS

paddle.distributed.init_parallel_env() reads them itself (paddle/distributed/parallel.py);
the TCP store is opened by trainer 0 on PADDLE_MASTER, else on its own endpoint.

Data: a fixed-seed synthetic 4-class problem (8 features, Gaussian clusters), 2048 training
and 512 held-out samples, made by numpy on every trainer; nothing is downloaded. Epoch e
shuffles the training set with seed e; each step takes the next global batch of
--batch-size x PADDLE_TRAINERS_NUM samples, of which trainer r uses rows r, r+W, r+2W, ...

With DUMP_ENV=1 every trainer first prints, sorted, the environment variables whose names
start with PADDLE, FLAGS, TRAINING, POD, GLOO, MASTER or COLLECTIVE, as
`env rank=R NAME=VALUE`.

Output: rank 0 prints `epoch E/N loss L` per epoch (its shard's mean loss), a JSON line
    {"metric": "accuracy", "value": ..., "mean_step_ms": ..., "steps": ..., "world_size": ...}
and, as its very last line, `final_accuracy=0.xxx`. Exit status 0 on success, 1 when
held-out accuracy is below --min-accuracy (or the trainers' weights differ), 2 on bad
arguments or missing environment variables.
"""

import argparse
import json
import os
import sys
import time

REQUIRED_ENV = ("PADDLE_TRAINER_ID", "PADDLE_TRAINERS_NUM", "PADDLE_TRAINER_ENDPOINTS",
                "PADDLE_CURRENT_ENDPOINT")
DUMP_PREFIXES = ("PADDLE", "FLAGS", "TRAINING", "POD", "GLOO", "MASTER", "COLLECTIVE")
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
                   help="per-trainer mini-batch size (default 32)")
    p.add_argument("--lr", type=float, default=0.1, help="SGD learning rate (default 0.1)")
    p.add_argument("--min-accuracy", type=float, default=0.9,
                   help="exit 1 when held-out accuracy is below this (default 0.9)")
    args = p.parse_args()
    if args.epochs < 1 or args.batch_size < 1 or args.lr <= 0:
        p.error("--epochs and --batch-size must be >= 1 and --lr > 0")
    return args


def read_env():
    if os.environ.get("DUMP_ENV") == "1":
        rank = os.environ.get("PADDLE_TRAINER_ID", "?")
        for k in sorted(os.environ):
            if k.startswith(DUMP_PREFIXES):
                log(f"env rank={rank} {k}={os.environ[k]}")
    missing = [k for k in REQUIRED_ENV if not os.environ.get(k)]
    if missing:
        log("error: missing environment variable(s) " + ", ".join(missing)
            + "; run under `shoal run job.yaml` or `python -m paddle.distributed.launch`,"
            " or set them by hand (see README.md)")
        sys.exit(2)
    try:
        rank = int(os.environ["PADDLE_TRAINER_ID"])
        world_size = int(os.environ["PADDLE_TRAINERS_NUM"])
    except ValueError as e:
        log(f"error: bad PADDLE_TRAINER_ID / PADDLE_TRAINERS_NUM: {e}")
        sys.exit(2)
    endpoints = os.environ["PADDLE_TRAINER_ENDPOINTS"].split(",")
    if world_size < 2 or not 0 <= rank < world_size or len(endpoints) != world_size:
        log(f"error: PADDLE_TRAINER_ID={rank}, PADDLE_TRAINERS_NUM={world_size} and "
            f"{len(endpoints)} PADDLE_TRAINER_ENDPOINTS do not fit (at least 2 trainers)")
        sys.exit(2)
    # CPU training: gloo. Without it Paddle's 'auto' picks nccl on a CUDA build.
    os.environ.setdefault("PADDLE_DISTRI_BACKEND", "gloo")
    return rank, world_size


def make_data(np):
    """The same fixed-seed data set on every trainer: one Gaussian cluster per class, the
    centres drawn once, unit-variance noise around them."""
    rng = np.random.default_rng(0)
    centres = rng.normal(0.0, 1.3, size=(N_CLASSES, N_FEATURES))
    n = N_TRAIN + N_TEST
    y = rng.integers(0, N_CLASSES, size=n)
    x = centres[y] + rng.normal(0.0, 1.0, size=(n, N_FEATURES))
    x, y = x.astype(np.float32), y.astype(np.int64)
    return x[:N_TRAIN], y[:N_TRAIN], x[N_TRAIN:], y[N_TRAIN:]


def main():
    args = parse_args()
    rank, world_size = read_env()

    import warnings
    # `import paddle` warns that ccache (for building C++ extensions) is missing: irrelevant here.
    warnings.filterwarnings("ignore", message="No ccache found")
    import numpy as np
    import paddle
    import paddle.distributed as dist
    import paddle.nn as nn

    progress = progress_reporter()
    paddle.set_device("cpu")
    paddle.seed(0)  # the same initial weights on every trainer

    dist.init_parallel_env()
    if dist.get_rank() != rank or dist.get_world_size() != world_size:
        log(f"error: Paddle reports rank {dist.get_rank()} of {dist.get_world_size()}")
        return 2
    log(f"trainer {rank}/{world_size} joined ({os.environ['PADDLE_CURRENT_ENDPOINT']}, "
        f"store at {os.environ.get('PADDLE_MASTER') or os.environ['PADDLE_TRAINER_ENDPOINTS'].split(',')[0]}, "
        f"backend {os.environ['PADDLE_DISTRI_BACKEND']}), paddle {paddle.__version__}")

    x_train, y_train, x_test, y_test = make_data(np)
    model = nn.Sequential(nn.Linear(N_FEATURES, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, N_CLASSES))
    dp = paddle.DataParallel(model)
    opt = paddle.optimizer.Momentum(learning_rate=args.lr, momentum=0.9,
                                    parameters=model.parameters())
    loss_fn = nn.CrossEntropyLoss()

    global_batch = args.batch_size * world_size
    steps_per_epoch = N_TRAIN // global_batch
    step, step_times = 0, []
    for epoch in range(args.epochs):
        order = np.random.default_rng(epoch).permutation(N_TRAIN)
        dp.train()
        total = 0.0
        for k in range(steps_per_epoch):
            rows = order[k * global_batch:(k + 1) * global_batch][rank::world_size]
            t0 = time.perf_counter()
            x = paddle.to_tensor(x_train[rows])
            y = paddle.to_tensor(y_train[rows])
            loss = loss_fn(dp(x), y)
            loss.backward()          # DataParallel all-reduces (averages) the gradients here
            opt.step()
            opt.clear_grad()
            loss = float(loss)
            if epoch > 0 or args.epochs == 1:
                step_times.append(time.perf_counter() - t0)
            total += loss
            step += 1
            progress(step)
        if rank == 0:
            log(f"epoch {epoch + 1}/{args.epochs} loss {total / steps_per_epoch:.4f}")

    # Each trainer checks the weights of all: identical only if the gradients were all-reduced.
    checksum = paddle.to_tensor(
        [float(sum(np.abs(p.numpy()).sum() for p in model.parameters()))], dtype="float64")
    gathered = []
    dist.all_gather(gathered, checksum)
    sums = [float(t.numpy()[0]) for t in gathered]
    same = all(s == sums[0] for s in sums)

    model.eval()
    with paddle.no_grad():
        pred = model(paddle.to_tensor(x_test)).numpy().argmax(axis=1)
    accuracy = float(np.mean(pred == y_test))
    dist.barrier()
    ok = same and accuracy >= args.min_accuracy

    if not same:
        log(f"error: the trainers' weights differ (checksums {sums})")
    if rank == 0:
        mean_step_ms = 1000.0 * sum(step_times) / len(step_times) if step_times else None
        log(json.dumps({
            "metric": "accuracy",
            "value": round(accuracy, 4),
            "mean_step_ms": None if mean_step_ms is None else round(mean_step_ms, 4),
            "steps": len(step_times),
            "world_size": world_size,
            "weights_identical": same,
        }))
        if accuracy < args.min_accuracy:
            log(f"error: held-out accuracy {accuracy:.3f} is below --min-accuracy "
                f"{args.min_accuracy}")
        log(f"final_accuracy={accuracy:.3f}")
    elif accuracy < args.min_accuracy:
        log(f"error: held-out accuracy {accuracy:.3f} is below --min-accuracy "
            f"{args.min_accuracy}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
