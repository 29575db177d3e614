"""The command line every peer launcher of bench/serving_peers.py takes, and the row <-> tensor
conversions they share. Imported by the launchers, each under its own peer's Python."""

import argparse

import torch

DTYPES = {"FP32": torch.float32, "INT64": torch.int64}


def parse(description, argv=None):
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--model", required=True, help="the name the model is served under")
    p.add_argument("--model-file", required=True, help="the TorchScript model.pt")
    p.add_argument("--dtype", required=True, choices=sorted(DTYPES),
                   help="the input's datatype (rows are flat lists of numbers)")
    p.add_argument("--port", type=int, required=True, help="the HTTP port")
    p.add_argument("--workers", type=int, default=2, help="worker processes / replicas")
    p.add_argument("--max-batch-size", type=int, default=64, help="1: no batching")
    p.add_argument("--batch-delay-ms", type=float, default=5.0,
                   help="how long a batch may wait to fill")
    p.add_argument("--work-dir", required=True, help="where to write configs and logs")
    return p.parse_args(argv)


def one_thread():
    """One intra-op and one inter-op torch thread: the worker processes are the parallelism."""
    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set in this process, or work already ran
        pass


def load(path):
    module = torch.jit.load(str(path), map_location="cpu")
    module.eval()
    return module


def run_rows(module, rows, dtype):
    """rows: a list of flat rows -> a list of flat output rows."""
    with torch.inference_mode():
        out = module(torch.tensor(rows, dtype=DTYPES[dtype]))
    return out.reshape(out.shape[0], -1).tolist()
