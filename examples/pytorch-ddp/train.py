#!/usr/bin/python3
"""Shoal's demo job: data-parallel training of a small MLP on scikit-learn's 8x8 digits.

Real PyTorch DistributedDataParallel on CPU with the gloo backend. The process learns
its place in the job only from the torchrun environment contract, which Shoal's
pytorch framework (or a person, by hand) sets for every worker:

    MASTER_ADDR, MASTER_PORT   where rank 0 listens for the rendezvous
    RANK, WORLD_SIZE           this process's rank and the number of processes
    LOCAL_RANK                 its rank among the processes on this machine

Deterministic: fixed seeds, a fixed stratified 80/20 train/held-out split
(random_state=0). The data schedule is a function of the global step only: epoch e
shuffles the training set with seed SEED + e (exactly as DistributedSampler does),
pads it to a multiple of the world size the schedule was made for, and global step k
of the epoch trains on the k-th chunk of `global batch` samples of that order; rank r
of a world of W takes every W-th sample of the chunk, starting at r. With a fixed world
this is exactly DistributedSampler's split with --batch-size per rank.

Fault tolerance, through Shoal's training SDK (sdk/python/shoal, docs/sdk.md):
- every step is reported with shoal.progress(step) (the hang watchdog of a role with
  progress_timeout);
- at start the newest complete checkpoint in SHOAL_CHECKPOINT_DIR (or --checkpoint-dir)
  is loaded: model, optimizer, global step and the schedule (global batch and padding);
  the run goes on from that step with whatever RANK/WORLD_SIZE it has now, so an elastic
  job that shrank or grew continues the very same sample order;
- with --checkpoint-every N, rank 0 saves a checkpoint every N global steps.
Without checkpoints (the default) it behaves as it always did.

Output: every rank prints one `epoch E/N loss L` line per epoch. Rank 0 then prints a
JSON line
    {"metric": "accuracy", "value": ..., "mean_step_ms": ..., "steps": ..., "world_size": ...}
and, as its very last line, `final_accuracy=0.xxx`. mean_step_ms is the mean wall time
of one optimizer step (forward + backward, which includes DDP's allreduce, + step),
measured with time.perf_counter over every step after the first epoch (the first epoch
is warmup; with --epochs 1 all steps are used); steps is how many steps were averaged.
A resumed run also prints `resumed from checkpoint step S (world size W)`.

Exit status: 0 on success; 1 when held-out accuracy is below --min-accuracy;
2 on bad arguments or a missing environment variable.
"""

import argparse
import json
import math
import os
import sys
import time

REQUIRED_ENV = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")
SEED = 0


def log(msg):
    print(msg, flush=True)


def import_sdk():
    """Shoal's training SDK, the shoal-sdk package (setup.sh installs it; docs/sdk.md)."""
    try:
        import shoal
    except ImportError as e:
        raise SystemExit(f"{e}: the training SDK is not installed for {sys.executable}; run "
                         "./setup.sh, or pip install --no-build-isolation sdk/python") from e
    return shoal


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=10, help="training epochs (default 10)")
    p.add_argument("--batch-size", type=int, default=32,
                   help="per-rank mini-batch size (default 32); the global batch is this "
                        "times WORLD_SIZE at the first launch, and is kept across resumes")
    p.add_argument("--lr", type=float, default=0.05, help="SGD learning rate (default 0.05)")
    p.add_argument("--min-accuracy", type=float, default=0.9,
                   help="exit 1 when held-out accuracy is below this (default 0.9)")
    p.add_argument("--checkpoint-every", type=int, default=0, metavar="N",
                   help="rank 0 saves a checkpoint every N global steps (default 0: never)")
    p.add_argument("--checkpoint-dir", default=None,
                   help="where checkpoints are saved and loaded from (default: "
                        "SHOAL_CHECKPOINT_DIR, which Shoal sets)")
    p.add_argument("--step-delay", type=float, default=0.0, metavar="SECONDS",
                   help="sleep this long after every step (default 0), to stretch a run so "
                        "that failures can be injected into it")
    args = p.parse_args()
    if args.epochs < 1 or args.batch_size < 1 or args.lr <= 0:
        p.error("--epochs and --batch-size must be >= 1 and --lr > 0")
    if args.checkpoint_every < 0 or args.step_delay < 0:
        p.error("--checkpoint-every and --step-delay must be >= 0")
    args.checkpoint_dir = args.checkpoint_dir or os.environ.get("SHOAL_CHECKPOINT_DIR") or None
    if args.checkpoint_every > 0 and args.checkpoint_dir is None:
        p.error("--checkpoint-every needs --checkpoint-dir (or SHOAL_CHECKPOINT_DIR, which "
                "Shoal sets)")
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


def epoch_order(torch, n, epoch, pad_to):
    """Epoch `epoch`'s sample order: DistributedSampler's shuffle (seed SEED + epoch), padded
    with its own head to a multiple of `pad_to`, as DistributedSampler pads for `pad_to`
    replicas."""
    g = torch.Generator()
    g.manual_seed(SEED + epoch)
    order = torch.randperm(n, generator=g).tolist()
    total = math.ceil(n / pad_to) * pad_to
    while len(order) < total:
        order += order[:total - len(order)]
    return order


def tensorboard_writer(rank):
    """A SummaryWriter into SHOAL_TENSORBOARD_LOGDIR (set when the job has a `tensorboard:`
    section) for rank 0, or None: without that variable, or where the Python running this
    has no `tensorboard` package (Debian's python3 has none; see tensorboard.yaml)."""
    logdir = os.environ.get("SHOAL_TENSORBOARD_LOGDIR")
    if not logdir or rank != 0:
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as e:
        log(f"warning: not writing TensorBoard logs: {e}")
        return None
    return SummaryWriter(os.path.join(logdir, os.environ.get("SHOAL_JOB_ID", "run")))


def main():
    args = parse_args()
    rank, world_size, local_rank = read_env()
    writer = tensorboard_writer(rank)
    shoal = import_sdk()

    import numpy as np
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    from torch.nn.parallel import DistributedDataParallel as DDP

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
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    # The schedule: the global batch and the padding are fixed by the first launch and kept
    # in every checkpoint, so a resume with another world size trains on the same chunks.
    schedule = {"global_batch": args.batch_size * world_size, "pad_to": world_size}
    step = 0
    ckpt = None
    if args.checkpoint_dir is not None:
        ckpt = shoal.Checkpointer(dir=args.checkpoint_dir)
        # Every rank reads the same newest checkpoint; tells Shoal which step it resumes from.
        step, state = ckpt.load_latest()
        if state is not None:
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["optimizer"])
            schedule = dict(state["schedule"])
            log(f"resumed from checkpoint step {step} (world size {world_size})")
    ddp = DDP(model)

    n_train = len(x_train)
    global_batch, pad_to = schedule["global_batch"], schedule["pad_to"]
    steps_per_epoch = math.ceil(math.ceil(n_train / pad_to) * pad_to / global_batch)
    total_steps = steps_per_epoch * args.epochs

    step_times, step_cpu = [], []
    while step < total_steps:
        epoch, first = divmod(step, steps_per_epoch)
        order = torch.tensor(epoch_order(torch, n_train, epoch, pad_to), dtype=torch.int64)
        ddp.train()
        total, batches = 0.0, 0
        for k in range(first, steps_per_epoch):
            chunk = order[k * global_batch:(k + 1) * global_batch]
            b = chunk[rank::world_size]
            t0, c0 = time.perf_counter(), time.process_time()
            opt.zero_grad(set_to_none=True)
            if len(b) > 0:
                # DDP averages the ranks' gradients; weighting each rank's mean by its share
                # of the chunk makes that the mean over the whole chunk (a factor of exactly
                # 1 when the ranks' shares are equal).
                loss = loss_fn(ddp(x_train[b]), y_train[b]) * (len(b) * world_size / len(chunk))
            else:  # a chunk smaller than the world: still take part in the allreduce
                loss = ddp(x_train[:1]).sum() * 0.0
            loss.backward()  # DDP allreduces the gradients here
            opt.step()
            dt, dc = time.perf_counter() - t0, time.process_time() - c0
            if epoch > 0 or args.epochs == 1:
                step_times.append(dt)
                step_cpu.append(dc)
            total += loss.item()
            batches += 1
            step += 1
            shoal.progress(step)
            if ckpt is not None and args.checkpoint_every and step % args.checkpoint_every == 0 \
                    and rank == 0:
                ckpt.save(step, {"model": model.state_dict(), "optimizer": opt.state_dict(),
                                 "step": step, "epoch": epoch, "schedule": schedule})
            if args.step_delay:
                time.sleep(args.step_delay)
        log(f"epoch {epoch + 1}/{args.epochs} loss {total / max(batches, 1):.3f}")
        if writer is not None:
            writer.add_scalar("loss", total / max(batches, 1), epoch + 1)
            writer.flush()

    # Weights are identical on every rank after DDP training; each rank evaluates the
    # whole held-out set so that they all agree on the outcome and exit status.
    ddp.eval()
    with torch.no_grad():
        accuracy = (model(x_test).argmax(dim=1) == y_test).float().mean().item()
    dist.barrier()
    dist.destroy_process_group()

    ok = accuracy >= args.min_accuracy
    if writer is not None:
        writer.add_scalar("accuracy", accuracy, args.epochs)
        writer.close()
    if rank == 0:
        mean_step_ms = 1000.0 * sum(step_times) / len(step_times) if step_times else None
        # CPU time of this process (all its threads) per step: what the step itself costs,
        # far less sensitive than wall time to other load on a shared machine.
        mean_cpu_ms = 1000.0 * sum(step_cpu) / len(step_cpu) if step_cpu else None
        # The median step: what a step costs when nothing else on the machine interrupts it.
        median_step_ms = 1000.0 * sorted(step_times)[len(step_times) // 2] if step_times else None
        log(json.dumps({
            "metric": "accuracy",
            "value": round(accuracy, 4),
            "mean_step_ms": None if mean_step_ms is None else round(mean_step_ms, 4),
            "mean_step_cpu_ms": None if mean_cpu_ms is None else round(mean_cpu_ms, 4),
            "median_step_ms": None if median_step_ms is None else round(median_step_ms, 4),
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
