#!/usr/bin/python3
"""Writes a model repository for `shoal serve` with TorchScript example models.

    /usr/bin/python3 examples/serving/export_models.py --out /tmp/models
    shoal serve --model-repository /tmp/models

Run it with Debian's python3 (python3-torch): the files it writes are read by the server's
libtorch, which is the same version. The repository it writes:

    identity/1/model.pt      returns its input; no config.yaml: any datatype and shape
    add_sub/1/model.pt       forward(a, b) -> {"sum": a + b, "difference": a - b}; no config
    mlp/1/model.pt           16 features -> 32 (ReLU) -> 4 scores; config.yaml: batches up to
    mlp/2/model.pt             8 requests, warmed up; version 2 has other weights
    mlp/config.yaml
    batch_probe/1/model.pt   returns 2 * x and, for every row, how many rows the batch it
    batch_probe/config.yaml    ran in had: shows dynamic batching at work

docs/serving.md explains the layout and every config key.
"""

import argparse
import textwrap
from pathlib import Path
from typing import Dict

import torch


class Identity(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class AddSub(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> Dict[str, torch.Tensor]:
        return {"sum": a + b, "difference": a - b}


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = torch.nn.Linear(16, 32)
        self.out = torch.nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.hidden(x)))


class BatchProbe(torch.nn.Module):
    def forward(self, x: torch.Tensor):
        rows = x.size(0)
        return x * 2, torch.full([rows, 1], rows, dtype=torch.long)


MLP_CONFIG = """\
    # A small MLP: 16 features in, 4 scores out.
    inputs:
      - {name: x, datatype: FP32, dims: [16]}
    outputs:
      - {name: scores, datatype: FP32, dims: [4]}
    # Requests are batched on dimension 0: up to 8 rows, waiting at most 0.5 ms for company.
    max_batch_size: 8
    batch_delay_us: 500
    instances: 1
    # Serve both versions (the default, latest, serves only the highest, 2).
    version_policy: all
    # Run twice before the version is ready: TorchScript's profiling executor optimises the
    # graph on its second run, so the first client request already gets the fast path.
    warmup:
      - count: 2
        inputs:
          x: {dims: [1, 16], fill: random}
    """

BATCH_PROBE_CONFIG = """\
    inputs:
      - {name: x, datatype: FP32, dims: [-1]}
    outputs:
      - {name: doubled, datatype: FP32, dims: [-1]}
      - {name: batch_rows, datatype: INT64, dims: [1]}
    max_batch_size: 16
    # A long window (50 ms) so that requests sent together are seen together.
    batch_delay_us: 50000
    """


def save(module, path):
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.jit.script(module.eval()).save(str(path))


def export(out):
    out = Path(out)
    save(Identity(), out / "identity" / "1" / "model.pt")
    save(AddSub(), out / "add_sub" / "1" / "model.pt")
    for version, seed in ((1, 1), (2, 2)):
        torch.manual_seed(seed)
        save(Mlp(), out / "mlp" / str(version) / "model.pt")
    (out / "mlp" / "config.yaml").write_text(textwrap.dedent(MLP_CONFIG))
    save(BatchProbe(), out / "batch_probe" / "1" / "model.pt")
    (out / "batch_probe" / "config.yaml").write_text(textwrap.dedent(BATCH_PROBE_CONFIG))
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="the model repository to write")
    args = parser.parse_args()
    out = export(args.out)
    print(f"wrote {out}: " + ", ".join(sorted(p.name for p in out.iterdir() if p.is_dir())))


if __name__ == "__main__":
    main()
