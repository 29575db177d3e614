#!/usr/bin/python3
"""Online trainer of the online-training example: trains a small classifier on CSV files as
they arrive in a directory and publishes the model to a `shoal serve` repository every N steps.

    python3 train.py --data-dir /tmp/shoal-online/incoming [--publish-every 40] [--idle-exit 0]

Under Shoal (job.yaml) the repository is $SHOAL_MODEL_REPOSITORY (the job's `publish:` section)
and checkpoints go to $SHOAL_CHECKPOINT_DIR (its `checkpoint:` section); by hand, pass
--repository and --checkpoint-dir.

Each file `*.csv` (names starting with '.' are ignored: a writer's file in progress) holds rows
`label,f0,...,f15`. Files are taken in name order. A file is **consumed once**: after its
rows are trained on, the model, the optimizer and the set of consumed files are saved together
in one checkpoint, and only then is the file reported as consumed. A trainer killed while it
trains a file restarts from the checkpoint before it (those steps are undone) and trains on
the file again; a file whose checkpoint was saved is never trained on again, even across
restarts and across runs that share --checkpoint-dir. A file that cannot be parsed is reported
and recorded as consumed (rejected), so that it is not retried forever.

Output: `consumed data-000007.csv rows 256 step 56 accuracy_before 0.812` per file (the model's
accuracy on the file before training on it: how well the model served until now does on new
data), `published version 3 at step 80` per publication, and at exit (after --idle-exit
seconds without a new file, with a last publication of what was not published yet) one JSON
line {"consumed": [...], "rejected": [...], "rows": N, "steps": S, "last_version": V}.
"""

import argparse
import copy
import json
import os
import sys
import time

import numpy as np
import torch

import shoal

FEATURES = 16
CLASSES = 4


class Classifier(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = torch.nn.Linear(FEATURES, 32)
        self.out = torch.nn.Linear(32, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.hidden(x)))


# The serving config of every published version: batching, and a warmup so that the first
# request after the switch does not pay TorchScript's first-run optimisation. inputs and
# outputs are derived by publish_model from a call on example_inputs.
SERVING_CONFIG = {
    "max_batch_size": 32,
    "warmup": [{"count": 2, "inputs": {"x": {"dims": [1, FEATURES], "fill": "random"}}}],
}


def pending_files(data_dir, consumed):
    try:
        names = os.listdir(data_dir)
    except FileNotFoundError:
        return []
    return sorted(n for n in names if n.endswith(".csv") and not n.startswith(".")
                  and n not in consumed)


def read_rows(path):
    """(features float32 [n, 16], labels int64 [n]) of one file; ValueError saying what is
    wrong with it."""
    try:
        table = np.loadtxt(path, delimiter=",", dtype=np.float32, ndmin=2)
    except ValueError as e:
        raise ValueError(f"not CSV numbers: {e}") from None
    if table.shape[0] == 0:
        raise ValueError("no rows")
    if table.shape[1] != FEATURES + 1:
        raise ValueError(f"{table.shape[1]} columns, expected {FEATURES + 1} (label, then "
                         f"{FEATURES} features)")
    labels = table[:, 0]
    if not np.all((labels >= 0) & (labels < CLASSES) & (labels == np.round(labels))):
        raise ValueError(f"labels must be integers 0..{CLASSES - 1}")
    return torch.from_numpy(table[:, 1:].copy()), torch.from_numpy(labels.astype(np.int64))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default="/tmp/shoal-online/incoming",
                        help="where the data files arrive")
    parser.add_argument("--model-name", default="online", help="the model's name when served")
    parser.add_argument("--repository", default=None,
                        help="the model repository (default: $SHOAL_MODEL_REPOSITORY)")
    parser.add_argument("--checkpoint-dir", default=None,
                        help="default: $SHOAL_CHECKPOINT_DIR")
    parser.add_argument("--publish-every", type=int, default=40,
                        help="publish a new version after this many training steps")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--poll", type=float, default=0.2,
                        help="seconds between looks at --data-dir when nothing is pending")
    parser.add_argument("--idle-exit", type=float, default=0,
                        help="exit after this many seconds without a new file (0: never)")
    parser.add_argument("--step-delay", type=float, default=0,
                        help="sleep this long after every step (0: none), to stretch training "
                             "so that a test can kill the trainer in the middle of a file")
    args = parser.parse_args()
    if args.publish_every < 1 or args.batch_size < 1 or args.poll <= 0 or args.idle_exit < 0 \
            or args.step_delay < 0:
        print("train.py: --publish-every and --batch-size must be >= 1, --poll > 0, "
              "--idle-exit and --step-delay >= 0", file=sys.stderr)
        return 2
    try:
        checkpointer = shoal.Checkpointer(dir=args.checkpoint_dir)
    except ValueError as e:
        print(f"train.py: {e}", file=sys.stderr)
        return 2
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1") or 1))
    torch.manual_seed(0)

    model = Classifier()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    step, state = checkpointer.load_latest()
    consumed, rejected, rows = set(), [], 0
    published_step, last_version = 0, None
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        consumed, rejected, rows = set(state["consumed"]), state["rejected"], state["rows"]
        published_step, last_version = state["published_step"], state["last_version"]
        print(f"resumed from checkpoint step {step}: {len(consumed)} files consumed",
              flush=True)

    def save():
        checkpointer.save(step, {
            "model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "consumed": sorted(consumed), "rejected": rejected, "rows": rows,
            "published_step": published_step, "last_version": last_version})

    last_accuracy = None  # on the newest file, before training on it

    def publish():
        nonlocal published_step, last_version
        # A copy: the published module must not share parameters with the one being trained.
        served = copy.deepcopy(model).eval()
        last_version = shoal.publish_model(served, args.model_name, repository=args.repository,
                                           example_inputs=torch.zeros(1, FEATURES),
                                           config=SERVING_CONFIG, step=step,
                                           metrics=({"accuracy_before": last_accuracy}
                                                    if last_accuracy is not None else None))
        published_step = step
        print(f"published version {last_version} at step {step}", flush=True)

    idle_since = time.monotonic()
    while True:
        names = pending_files(args.data_dir, consumed)
        if not names:
            if args.idle_exit and time.monotonic() - idle_since >= args.idle_exit:
                break
            time.sleep(args.poll)
            continue
        for name in names:
            path = os.path.join(args.data_dir, name)
            try:
                features, labels = read_rows(path)
            except (OSError, ValueError) as e:
                print(f"rejected {path}: {e}", file=sys.stderr, flush=True)
                consumed.add(name)
                rejected.append(name)
                save()
                continue
            model.eval()
            with torch.no_grad():
                accuracy = (model(features).argmax(1) == labels).float().mean().item()
            last_accuracy = accuracy
            model.train()
            for start in range(0, len(labels), args.batch_size):
                x = features[start:start + args.batch_size]
                y = labels[start:start + args.batch_size]
                optimizer.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                optimizer.step()
                step += 1
                shoal.progress(step)
                if args.step_delay:
                    time.sleep(args.step_delay)
            consumed.add(name)
            rows += len(labels)
            save()  # the file counts as consumed from here on, with the steps it caused
            print(f"consumed {name} rows {len(labels)} step {step} "
                  f"accuracy_before {accuracy:.3f}", flush=True)
            if step - published_step >= args.publish_every:
                publish()
                save()
        idle_since = time.monotonic()

    if step > published_step:
        publish()
        save()
    print(json.dumps({"consumed": sorted(set(consumed) - set(rejected)), "rejected": rejected,
                      "rows": rows, "steps": step, "last_version": last_version}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
