#!/usr/bin/python3
"""`torchrun` (torch.distributed.run) for the fault benchmarks' anchors, with two changes that
touch neither its restart logic nor its timing:

1. Debian's python3-torch 1.13 on Python 3.11: `torchrun` dies at start-up with
   `AttributeError: 'NoneType' object has no attribute 'get'` in
   torch/distributed/elastic/multiprocessing/api.py:to_map. Its `Std.from_str("0")` (the default
   of --redirects and --tee) returns None, because Python 3.11 no longer lists the zero-valued
   member of a Flag enum when iterating it. None is read here as Std.NONE, which is what "0"
   means.
2. Every log line starts with its wall-clock time (seconds since the epoch, microseconds), and
   torch.distributed.elastic logs at INFO (LOGLEVEL=INFO), so that a driver can read when the
   elastic agent saw a worker fail and when it started the new worker group.

Usage: exactly torchrun's: python3 bench/_torchrun.py --nproc_per_node 2 ... script.py ARGS
"""

import logging
import os

os.environ.setdefault("LOGLEVEL", "INFO")  # read by torch.distributed.elastic's loggers
logging.basicConfig(level=logging.INFO,
                    format="%(created).6f %(levelname)s %(name)s: %(message)s")

from torch.distributed.elastic.multiprocessing import api as _mp_api  # noqa: E402

_to_map = _mp_api.to_map


def _to_map_none_is_std_none(val_or_map, local_world_size):
    if val_or_map is None:
        val_or_map = _mp_api.Std.NONE
    elif isinstance(val_or_map, dict):
        val_or_map = {k: (_mp_api.Std.NONE if v is None else v) for k, v in val_or_map.items()}
    return _to_map(val_or_map, local_world_size)


_mp_api.to_map = _to_map_none_is_std_none
import torch.distributed.elastic.multiprocessing as _mp  # noqa: E402

_mp.to_map = _to_map_none_is_std_none

from torch.distributed.run import main  # noqa: E402

if __name__ == "__main__":
    main()
