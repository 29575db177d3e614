#!/usr/bin/python3
"""Shoal's MPI example: data-parallel softmax regression with mpi4py, launched by mpirun.

Every rank holds the same weights, computes the gradient of its own shard of each global
batch, and MPI_Allreduce sums the gradients, so every rank applies the same update; the
ranks' weights stay identical, which the end checks with an Allgather of a checksum (they
could not be identical without the all-reduce: each rank saw different data).

The program knows nothing of Shoal: its place in the world comes from MPI alone
(COMM_WORLD's rank and size), as under any mpirun. Shoal's `framework: mpi` provides the
hostfile and the remote shell that mpirun uses to start the ranks in the worker tasks.

Data: a fixed-seed synthetic 4-class problem (8 features, Gaussian clusters), 4096 training
and 1024 held-out samples, made by numpy on every rank; nothing is downloaded.

Output: rank 0 prints `epoch E/N loss L` per epoch, a JSON line
    {"metric": "accuracy", "value": ..., "world_size": ..., "hosts": [...], ...}
and, as its very last line, `final_accuracy=0.xxx`. Exit status 0 on success, 1 when the
held-out accuracy is below --min-accuracy or the ranks' weights differ.
"""

import argparse
import json
import os
import socket
import sys
import time

import numpy as np
from mpi4py import MPI

N_FEATURES, N_CLASSES = 8, 4
N_TRAIN, N_TEST = 4096, 1024


def make_data():
    rng = np.random.default_rng(7)
    centers = rng.normal(0.0, 2.0, size=(N_CLASSES, N_FEATURES))
    def draw(n):
        y = rng.integers(0, N_CLASSES, size=n)
        x = centers[y] + rng.normal(0.0, 1.6, size=(n, N_FEATURES))
        return x, y
    return draw(N_TRAIN), draw(N_TEST)


def softmax(z):
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=64, help="per-rank mini-batch size")
    p.add_argument("--lr", type=float, default=0.2)
    p.add_argument("--min-accuracy", type=float, default=0.85)
    args = p.parse_args()

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    (x, y), (xt, yt) = make_data()
    w = np.zeros((N_FEATURES, N_CLASSES))
    b = np.zeros(N_CLASSES)
    global_batch = args.batch_size * size
    steps_per_epoch = N_TRAIN // global_batch
    start = time.perf_counter()
    steps = 0
    for epoch in range(args.epochs):
        order = np.random.default_rng(epoch).permutation(N_TRAIN)
        total_loss = 0.0
        for s in range(steps_per_epoch):
            batch = order[s * global_batch:(s + 1) * global_batch][rank::size]
            xb, yb = x[batch], y[batch]
            prob = softmax(xb @ w + b)
            loss = -np.log(prob[np.arange(len(yb)), yb] + 1e-12).sum()
            prob[np.arange(len(yb)), yb] -= 1.0
            local = np.concatenate([(xb.T @ prob).ravel(), prob.sum(axis=0), [loss, len(yb)]])
            summed = np.empty_like(local)
            comm.Allreduce(local, summed, op=MPI.SUM)
            n = summed[-1]
            gw = summed[:w.size].reshape(w.shape) / n
            gb = summed[w.size:w.size + b.size] / n
            w -= args.lr * gw
            b -= args.lr * gb
            total_loss += summed[-2] / n
            steps += 1
        if rank == 0:
            print(f"epoch {epoch + 1}/{args.epochs} loss {total_loss / steps_per_epoch:.4f}",
                  flush=True)
    elapsed = time.perf_counter() - start

    checksums = comm.allgather(float(np.abs(w).sum() + np.abs(b).sum()))
    hosts = comm.gather({"rank": rank, "host": socket.gethostname(),
                         "shoal_task": f"{os.environ.get('SHOAL_ROLE')}:{os.environ.get('SHOAL_INDEX')}"},
                        root=0)
    accuracy = float((np.argmax(xt @ w + b, axis=1) == yt).mean())
    if rank != 0:
        return 0
    identical = all(c == checksums[0] for c in checksums)
    print(json.dumps({"metric": "accuracy", "value": accuracy, "world_size": size,
                      "steps": steps, "mean_step_ms": 1000.0 * elapsed / max(steps, 1),
                      "weights_identical": identical, "hosts": hosts}), flush=True)
    print(f"final_accuracy={accuracy:.3f}", flush=True)
    if not identical:
        print("the ranks' weights differ: the all-reduce did not happen", file=sys.stderr)
        return 1
    return 0 if accuracy >= args.min_accuracy else 1


if __name__ == "__main__":
    sys.exit(main())
