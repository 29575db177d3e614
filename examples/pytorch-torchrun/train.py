#!/usr/bin/python3
"""A PyTorch script written for torchrun, run unchanged under Shoal.

It uses only what torchrun promises a worker: `init_process_group()` with no arguments (the
env:// rendezvous at MASTER_ADDR:MASTER_PORT with RANK and WORLD_SIZE), LOCAL_RANK and
LOCAL_WORLD_SIZE, and TORCHELASTIC_RUN_ID / TORCHELASTIC_RESTART_COUNT, which only exist
under an elastic launcher (the script refuses to start without them, as a torchrun-only
script might). Run it with either:

    shoal run examples/pytorch-torchrun/job.yaml
    python3 bench/_torchrun.py --standalone --nproc_per_node 2 examples/pytorch-torchrun/train.py

Softmax regression on a fixed-seed synthetic 4-class problem (torch's RNG; every rank builds
the same data and trains on every WORLD_SIZE-th row of each global batch), gradients averaged
by an explicit all_reduce. Rank 0 prints `epoch E/N loss L` per epoch, a JSON metrics line and,
last, `final_accuracy=0.xxx`. Exit 0 on success, 1 below --min-accuracy, 2 outside an elastic
launcher.
"""

import argparse
import json
import os
import sys
import time

REQUIRED = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK",
            "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--min-accuracy", type=float, default=0.9)
    args = p.parse_args()
    missing = [v for v in REQUIRED if v not in os.environ]
    if missing:
        print(f"error: not started by an elastic launcher (torchrun or Shoal): missing "
              f"{', '.join(missing)}", file=sys.stderr)
        return 2

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")  # env://: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    if rank == 0:
        print(f"run {os.environ['TORCHELASTIC_RUN_ID']} restart "
              f"{os.environ['TORCHELASTIC_RESTART_COUNT']}: {world} workers, local rank "
              f"{os.environ['LOCAL_RANK']} of {os.environ['LOCAL_WORLD_SIZE']}", flush=True)

    g = torch.Generator().manual_seed(0)
    centers = torch.randn(4, 8, generator=g) * 2.0
    labels = torch.randint(0, 4, (2560,), generator=g)
    points = centers[labels] + torch.randn(2560, 8, generator=g)
    x_train, y_train, x_test, y_test = points[:2048], labels[:2048], points[2048:], labels[2048:]

    model = torch.nn.Linear(8, 4)
    for param in model.parameters():  # the same start everywhere, as DDP would broadcast
        dist.broadcast(param.data, src=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    global_batch = 64
    step_ms = []
    for epoch in range(args.epochs):
        order = torch.randperm(2048, generator=torch.Generator().manual_seed(epoch))
        total = 0.0
        for k in range(0, 2048, global_batch):
            t0 = time.perf_counter()
            rows = order[k:k + global_batch][rank::world]
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x_train[rows]), y_train[rows])
            loss.backward()
            for param in model.parameters():
                dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)
                param.grad /= world
            opt.step()
            step_ms.append((time.perf_counter() - t0) * 1000)
            total += loss.item()
        if rank == 0:
            print(f"epoch {epoch + 1}/{args.epochs} loss {total / (2048 // global_batch):.3f}",
                  flush=True)

    with torch.no_grad():
        accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
    dist.destroy_process_group()
    if rank == 0:
        print(json.dumps({"metric": "accuracy", "value": round(accuracy, 4),
                          "mean_step_ms": round(sum(step_ms) / len(step_ms), 4),
                          "steps": len(step_ms), "world_size": world}), flush=True)
        print(f"final_accuracy={accuracy:.3f}", flush=True)
    return 0 if accuracy >= args.min_accuracy else 1


if __name__ == "__main__":
    sys.exit(main())
