#!/usr/bin/python3
"""A small, self-contained PyTorch DDP rank for the recovery benchmarks (recovery_time.py,
lost_work.py): real torch.distributed (gloo, CPU) and DistributedDataParallel on synthetic
data, so that a restart pays what a real job pays (interpreter, `import torch`, the process
group's rendezvous, the first forward/backward/allreduce), without depending on the demo.

    python3 _ddp_worker.py --out DIR [--steps 0] [--step-sleep 0] [--ckpt-every 0]

Needs the torchrun variables (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE), which Shoal's
pytorch framework, torchrun or a person sets. The generation G is TORCHELASTIC_RESTART_COUNT
under torchrun, else SHOAL_GENERATION, else 0.

Records, in DIR:
  w-g<G>-r<RANK>.json   written (atomically) once the first training step of this process is
                        done: {"pid", "rank", "world_size", "gen", "t_start" (time.time() at the
                        script's first line), "t_torch" (after `import torch`), "t_pg" (process
                        group up), "t_first_step", "resumed_step"}
  steps-g<G>-r<RANK>.log  one line per completed step: "<step> <wall-clock microseconds>"

With --ckpt-every N (under Shoal, sdk/python on PYTHONPATH), every rank loads the latest
checkpoint through shoal.Checkpointer at start (reported to Shoal as `resumed`), and rank 0
saves one every N steps (reported as `checkpoint`). Every step is reported with
shoal.progress() when the SDK can be imported. --steps 0 trains until killed.
"""

import time

T_START = time.time()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402


def generation():
    for key in ("TORCHELASTIC_RESTART_COUNT", "SHOAL_GENERATION"):
        if os.environ.get(key):
            return int(os.environ[key])
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=0, help="stop after this step (0: never)")
    ap.add_argument("--step-sleep", type=float, default=0.0, help="seconds after each step")
    ap.add_argument("--ckpt-every", type=int, default=0, help="rank 0 saves every N steps")
    ap.add_argument("--batch", type=int, default=32)
    args = ap.parse_args()

    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    gen = generation()
    try:
        import shoal
    except ImportError:
        shoal = None

    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    t_torch = time.time()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    t_pg = time.time()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    step, ckpt = 0, None
    if args.ckpt_every > 0 and shoal is not None and os.environ.get("SHOAL_CHECKPOINT_DIR"):
        ckpt = shoal.Checkpointer()
        step, state = ckpt.load_latest()
        if state is not None:
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["opt"])
    resumed_step = step
    ddp = DDP(model)
    g = torch.Generator().manual_seed(1234 + rank)
    xs = torch.randn(4096, 64, generator=g)
    ys = torch.randint(0, 10, (4096,), generator=g)

    steplog = open(os.path.join(args.out, f"steps-g{gen}-r{rank}.log"), "a", buffering=1)
    first = True
    while args.steps == 0 or step < args.steps:
        i = (step * args.batch) % (4096 - args.batch)
        loss = F.cross_entropy(ddp(xs[i:i + args.batch]), ys[i:i + args.batch])
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        t = time.time()
        steplog.write(f"{step} {int(t * 1e6)}\n")
        if shoal is not None:
            shoal.progress(step)
        if first:
            first = False
            info = {"pid": os.getpid(), "rank": rank, "world_size": world, "gen": gen,
                    "t_start": T_START, "t_torch": t_torch, "t_pg": t_pg, "t_first_step": t,
                    "resumed_step": resumed_step}
            tmp = os.path.join(args.out, f".w-g{gen}-r{rank}.{os.getpid()}")
            with open(tmp, "w") as f:
                json.dump(info, f)
            os.replace(tmp, os.path.join(args.out, f"w-g{gen}-r{rank}.json"))
        if ckpt is not None and rank == 0 and step % args.ckpt_every == 0:
            ckpt.save(step, {"model": model.state_dict(), "opt": opt.state_dict()})
        if args.step_sleep > 0:
            time.sleep(args.step_sleep)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
