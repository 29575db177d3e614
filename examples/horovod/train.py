#!/usr/bin/env python3
"""Horovod demo: data-parallel PyTorch training of a small MLP on scikit-learn's 8x8 digits.

Horovod with PyTorch on CPU, gloo controller and gloo CPU operations (no MPI). The
process learns its place in the job from Horovod itself (hvd.init()), i.e. from the
environment that `horovodrun --gloo` (or, later, Shoal's `framework: horovod`) gives
every rank: HOROVOD_RANK, HOROVOD_SIZE, HOROVOD_LOCAL_RANK, HOROVOD_LOCAL_SIZE,
HOROVOD_CROSS_RANK, HOROVOD_CROSS_SIZE, HOROVOD_HOSTNAME, HOROVOD_GLOO_RENDEZVOUS_ADDR,
HOROVOD_GLOO_RENDEZVOUS_PORT, HOROVOD_CONTROLLER=gloo, HOROVOD_CPU_OPERATIONS=gloo,
HOROVOD_GLOO_IFACE (see docs/design/horovod-gloo-rendezvous-notes.md).

Run it with (2 ranks on this machine, no ssh needed for localhost):

    /var/cache/shoal/venvs/horovod/bin/horovodrun --gloo -np 2 -H localhost:2 \\
        /var/cache/shoal/venvs/horovod/bin/python train.py

Deterministic: fixed seeds and a fixed stratified 80/20 train/held-out split
(random_state=0). Every epoch shuffles the training set with seed SEED + epoch (the same
order on every rank); rank r of W takes every W-th sample of each global batch, from r on.
Rank 0's initial weights and optimizer state are broadcast (hvd.broadcast_parameters,
hvd.broadcast_optimizer_state); hvd.DistributedOptimizer averages the gradients over the
ranks (allreduce through gloo) at every step.

Output: every rank prints a `rank R/W ...` line at start; rank 0 prints one
`epoch E/N loss L` line per epoch (the loss averaged over all ranks), then a JSON line
    {"metric": "accuracy", "value": ..., "mean_step_ms": ..., "steps": ..., "world_size": ...}
and, as its very last line, `final_accuracy=0.xxx`.

Exit status: 0 on success; 1 when held-out accuracy is below --min-accuracy (every rank
computes the same accuracy, so all agree); 2 on bad arguments.
"""

import argparse
import json
import math
import os
import sys
import time

SEED = 0


def log(msg):
    print(msg, flush=True)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=10, help="training epochs (default 10)")
    p.add_argument("--batch-size", type=int, default=32,
                   help="per-rank mini-batch size (default 32)")
    p.add_argument("--lr", type=float, default=0.05, help="SGD learning rate (default 0.05)")
    p.add_argument("--min-accuracy", type=float, default=0.9,
                   help="exit 1 when held-out accuracy is below this (default 0.9)")
    args = p.parse_args()
    if args.epochs < 1 or args.batch_size < 1 or args.lr <= 0:
        p.error("--epochs and --batch-size must be >= 1 and --lr > 0")
    return args


def main():
    args = parse_args()

    import numpy as np
    import torch
    import torch.nn as nn
    import horovod.torch as hvd
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    hvd.init()
    rank, world_size = hvd.rank(), hvd.size()

    threads = os.environ.get("OMP_NUM_THREADS", "")
    torch.set_num_threads(int(threads) if threads.isdigit() and int(threads) > 0 else 1)
    torch.manual_seed(SEED)
    np.random.seed(SEED)
    log(f"rank {rank}/{world_size} (local rank {hvd.local_rank()}/{hvd.local_size()}, "
        f"cross rank {hvd.cross_rank()}/{hvd.cross_size()}) up, gloo built: "
        f"{hvd.gloo_built()}, gloo enabled: {hvd.gloo_enabled()}, "
        f"mpi enabled: {hvd.mpi_enabled()}, {torch.get_num_threads()} thread(s)")

    # The same split on every rank: stratified 80/20, random_state=0. Pixels are 0..16.
    digits = load_digits()
    x = digits.data.astype(np.float32) / 16.0
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.2, stratify=y, random_state=0)
    x_train, y_train = torch.from_numpy(x_train), torch.from_numpy(y_train)
    x_test, y_test = torch.from_numpy(x_test), torch.from_numpy(y_test)

    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    # Start every rank from rank 0's weights and optimizer state.
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    # Averages the gradients over all ranks (gloo allreduce) before every step.
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    loss_fn = nn.CrossEntropyLoss()

    n_train = len(x_train)
    global_batch = args.batch_size * world_size
    steps_per_epoch = math.ceil(n_train / global_batch)
    step_times = []
    for epoch in range(args.epochs):
        g = torch.Generator()
        g.manual_seed(SEED + epoch)
        order = torch.randperm(n_train, generator=g)
        model.train()
        total, batches = 0.0, 0
        for k in range(steps_per_epoch):
            chunk = order[k * global_batch:(k + 1) * global_batch]
            b = chunk[rank::world_size]
            t0 = time.perf_counter()
            opt.zero_grad()
            if len(b) > 0:
                # Horovod averages the ranks' gradients; weighting each rank's mean by its
                # share of the chunk makes that the mean over the whole chunk.
                loss = loss_fn(model(x_train[b]), y_train[b]) * (len(b) * world_size / len(chunk))
            else:  # a last chunk smaller than the world: still take part in the allreduce
                loss = model(x_train[:1]).sum() * 0.0
            loss.backward()
            opt.step()  # waits for the allreduce of every gradient, then steps
            if epoch > 0 or args.epochs == 1:
                step_times.append(time.perf_counter() - t0)
            total += loss.item()
            batches += 1
        mean_loss = hvd.allreduce(torch.tensor(total / max(batches, 1)), op=hvd.Average,
                                  name=f"epoch_loss_{epoch}").item()
        if rank == 0:
            log(f"epoch {epoch + 1}/{args.epochs} loss {mean_loss:.3f}")

    # The weights are identical on every rank; each evaluates the whole held-out set, so
    # all agree on the outcome and the exit status.
    model.eval()
    with torch.no_grad():
        accuracy = (model(x_test).argmax(dim=1) == y_test).float().mean().item()
    # Check that the ranks really agree (a failed broadcast/allreduce would show here).
    acc_min = hvd.allreduce(torch.tensor(accuracy), op=hvd.Min, name="acc_min").item()
    acc_max = hvd.allreduce(torch.tensor(accuracy), op=hvd.Max, name="acc_max").item()

    ok = accuracy >= args.min_accuracy and acc_min == acc_max
    if rank == 0:
        mean_step_ms = 1000.0 * sum(step_times) / len(step_times) if step_times else None
        log(json.dumps({
            "metric": "accuracy",
            "value": round(accuracy, 4),
            "mean_step_ms": None if mean_step_ms is None else round(mean_step_ms, 4),
            "steps": len(step_times),
            "world_size": world_size,
        }))
        if acc_min != acc_max:
            log(f"error: the ranks disagree on the accuracy ({acc_min} .. {acc_max})")
        elif not ok:
            log(f"error: held-out accuracy {accuracy:.3f} is below --min-accuracy "
                f"{args.min_accuracy}")
        log(f"final_accuracy={accuracy:.3f}")
    elif not ok:
        log(f"error: held-out accuracy {accuracy:.3f} is below --min-accuracy "
            f"{args.min_accuracy}, or the ranks disagree")
    hvd.shutdown()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
