#!/var/cache/shoal/venvs/spark/bin/python
"""Trains a small PyTorch MLP on the digits that prepare.py wrote as Parquet, under Shoal.

The training set is a `dataset: {parquet: ...}`: each of its Parquet files is one shard, leased
to this task once per epoch (shoal.shards), read as NumPy arrays (Shard.read_numpy: that file
alone, memory-mapped) and confirmed with Shard.done. After each shard the model, optimizer and
epoch are checkpointed before `done`: a task killed anywhere resumes from its newest checkpoint,
and Checkpointer.load_latest reports that step to the master, which hands out again every shard
completed after it (docs/sdk.md), so each file goes into the model once per epoch.

At the end it reads the held-out set (--test, a Parquet directory) and prints
`final_accuracy=0.xxx`; it exits 1 below --min-accuracy.

Runs under Shoal's spark venv (/var/cache/shoal/venvs/spark/bin/python): pyarrow from PyPI,
torch and NumPy from Debian.
"""

import argparse
import os
import sys


def log(msg):
    print(msg, flush=True)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=10,
                   help="epochs, the job's dataset.epochs (default 10)")
    p.add_argument("--test", required=True, help="the held-out Parquet dataset")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--min-accuracy", type=float, default=0.9)
    p.add_argument("--step-delay", type=float, default=0.0, metavar="SECONDS",
                   help="sleep this long after each step, to stretch a run for fault injection")
    return p.parse_args()


def main():
    args = parse_args()
    import numpy as np
    import torch
    import shoal

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    loss_fn = torch.nn.CrossEntropyLoss()

    ckpt = shoal.Checkpointer()
    step, state = ckpt.load_latest()
    epoch = 0
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        epoch = state["epoch"]
        log(f"resumed from checkpoint step {step} in epoch {epoch}")

    while epoch < args.epochs:
        losses = []
        for shard in shoal.shards(epoch):
            data = shard.read_numpy(columns=["pixels", "label"])
            x = torch.from_numpy(np.ascontiguousarray(data["pixels"], dtype=np.float32))
            y = torch.from_numpy(data["label"].astype(np.int64))
            # A different order each epoch and shard, the same on every run.
            order = torch.randperm(len(y), generator=torch.Generator().manual_seed(
                epoch * 1000 + shard.id))
            for i in range(0, len(order), args.batch_size):
                batch = order[i:i + args.batch_size]
                optimizer.zero_grad()
                loss = loss_fn(model(x[batch]), y[batch])
                loss.backward()
                optimizer.step()
                losses.append(loss.item())
                step += 1
                shoal.progress(step)
                if args.step_delay:
                    import time
                    time.sleep(args.step_delay)
            # The shard's samples are in the model at `step`: saved first, then confirmed.
            ckpt.save(step, {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                             "epoch": epoch})
            try:
                shard.done(step)
            except shoal.LeaseLost:
                log(f"lost the lease on shard {shard.id} of epoch {epoch}; it is handed out "
                    f"again")
        log(f"epoch {epoch + 1}/{args.epochs} loss {sum(losses) / max(1, len(losses)):.4f}")
        epoch += 1
        ckpt.save(step, {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                         "epoch": epoch})

    test_files = sorted(os.path.join(args.test, f) for f in os.listdir(args.test)
                        if f.endswith(".parquet") and not f.startswith((".", "_")))
    correct = total = 0
    with torch.no_grad():
        for path in test_files:
            data = shoal.read_numpy(path, columns=["pixels", "label"])
            x = torch.from_numpy(np.ascontiguousarray(data["pixels"], dtype=np.float32))
            predicted = model(x).argmax(dim=1).numpy()
            correct += int((predicted == data["label"]).sum())
            total += len(predicted)
    accuracy = correct / max(1, total)
    log(f"final_accuracy={accuracy:.3f}")
    sys.exit(0 if accuracy >= args.min_accuracy else 1)


if __name__ == "__main__":
    main()
