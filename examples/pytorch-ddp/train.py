#!/usr/bin/python3
"""Shoal's demo job: data-parallel training of a small MLP on scikit-learn's 8x8 digits.

Real PyTorch DistributedDataParallel on CPU with the gloo backend. The process learns
its place in the job only from the torchrun environment contract, which Shoal's
pytorch framework (or a person, by hand) sets for every worker:

    MASTER_ADDR, MASTER_PORT   where rank 0 listens for the rendezvous
    RANK, WORLD_SIZE           this process's rank and the number of processes
    LOCAL_RANK                 its rank among the processes on this machine

Deterministic: fixed seeds, a fixed stratified 80/20 train/held-out split
(random_state=0); each rank trains on its DistributedSampler shard of the training set.

Output: every rank prints one `epoch E/N loss L` line per epoch. Rank 0 then prints a
JSON line
    {"metric": "accuracy", "value": ..., "mean_step_ms": ..., "steps": ..., "world_size": ...}
and, as its very last line, `final_accuracy=0.xxx`. mean_step_ms is the mean wall time
of one optimizer step (forward + backward, which includes DDP's allreduce, + step),
measured with time.perf_counter over every step after the first epoch (the first epoch
is warmup; with --epochs 1 all steps are used); steps is how many steps were averaged.

Exit status: 0 on success; 1 when held-out accuracy is below --min-accuracy;
2 on bad arguments or a missing environment variable.
"""

import argparse
import json
import os
import sys
import time

REQUIRED_ENV = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")
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


def read_env():
    missing = [k for k in REQUIRED_ENV if not os.environ.get(k)]
    if missing:
        log("error: missing environment variable(s) " + ", ".join(missing)
            + "; run under `shoal run job.yaml` or set MASTER_ADDR, MASTER_PORT, RANK,"
            " WORLD_SIZE and LOCAL_RANK by hand (see README.md)")
        sys.exit(2)
    try:
        rank = int(os.environ["RANK"])
        world_size = int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ["LOCAL_RANK"])
        int(os.environ["MASTER_PORT"])
    except ValueError as e:
        log(f"error: bad torchrun environment variable: {e}")
        sys.exit(2)
    if world_size < 1 or not 0 <= rank < world_size:
        log(f"error: RANK={rank} is not within WORLD_SIZE={world_size}")
        sys.exit(2)
    return rank, world_size, local_rank


def main():
    args = parse_args()
    rank, world_size, local_rank = read_env()

    import numpy as np
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data.distributed import DistributedSampler

    threads = os.environ.get("OMP_NUM_THREADS", "")
    torch.set_num_threads(int(threads) if threads.isdigit() and int(threads) > 0 else 1)
    torch.manual_seed(SEED)
    np.random.seed(SEED)

    dist.init_process_group(backend="gloo", init_method="env://")
    log(f"rank {rank}/{world_size} (local rank {local_rank}) joined "
        f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}, "
        f"{torch.get_num_threads()} thread(s)")

    # The same split on every rank: stratified 80/20, random_state=0. Pixels are 0..16.
    digits = load_digits()
    x = digits.data.astype(np.float32) / 16.0
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.2, stratify=y, random_state=0)
    x_train, y_train = torch.from_numpy(x_train), torch.from_numpy(y_train)
    x_test, y_test = torch.from_numpy(x_test), torch.from_numpy(y_test)

    # Every rank builds the same initial weights from the seed (DDP also broadcasts rank 0's).
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    # DistributedSampler pads so that every rank gets the same number of samples, hence
    # the same number of steps: each step's allreduce has a partner on every rank.
    sampler = DistributedSampler(range(len(x_train)), num_replicas=world_size, rank=rank,
                                 shuffle=True, seed=SEED)

    step_times, step_cpu = [], []
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        idx = torch.tensor(list(iter(sampler)), dtype=torch.int64)
        ddp.train()
        total, batches = 0.0, 0
        for start in range(0, len(idx), args.batch_size):
            b = idx[start:start + args.batch_size]
            xb, yb = x_train[b], y_train[b]
            t0, c0 = time.perf_counter(), time.process_time()
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(ddp(xb), yb)
            loss.backward()  # DDP allreduces the gradients here
            opt.step()
            dt, dc = time.perf_counter() - t0, time.process_time() - c0
            if epoch > 0 or args.epochs == 1:
                step_times.append(dt)
                step_cpu.append(dc)
            total += loss.item()
            batches += 1
        log(f"epoch {epoch + 1}/{args.epochs} loss {total / max(batches, 1):.3f}")

    # Weights are identical on every rank after DDP training; each rank evaluates the
    # whole held-out set so that they all agree on the outcome and exit status.
    ddp.eval()
    with torch.no_grad():
        accuracy = (model(x_test).argmax(dim=1) == y_test).float().mean().item()
    dist.barrier()
    dist.destroy_process_group()

    ok = accuracy >= args.min_accuracy
    if rank == 0:
        mean_step_ms = 1000.0 * sum(step_times) / len(step_times) if step_times else None
        # CPU time of this process (all its threads) per step: what the step itself costs,
        # far less sensitive than wall time to other load on a shared machine.
        mean_cpu_ms = 1000.0 * sum(step_cpu) / len(step_cpu) if step_cpu else None
        log(json.dumps({
            "metric": "accuracy",
            "value": round(accuracy, 4),
            "mean_step_ms": None if mean_step_ms is None else round(mean_step_ms, 4),
            "mean_step_cpu_ms": None if mean_cpu_ms is None else round(mean_cpu_ms, 4),
            "steps": len(step_times),
            "world_size": world_size,
        }))
        if not ok:
            log(f"error: held-out accuracy {accuracy:.3f} is below --min-accuracy "
                f"{args.min_accuracy}")
        log(f"final_accuracy={accuracy:.3f}")
    elif not ok:
        log(f"error: held-out accuracy {accuracy:.3f} is below --min-accuracy "
            f"{args.min_accuracy}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
