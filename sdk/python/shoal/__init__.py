"""Shoal's training SDK: progress reports, crash-safe checkpoints, leased data shards, and
publishing trained models for `shoal serve` (`shoal.publish_model`).

    import shoal

    ckpt = shoal.Checkpointer()              # SHOAL_CHECKPOINT_DIR, keep SHOAL_CHECKPOINT_KEEP
    step, state = ckpt.load_latest()         # (0, None) on the first launch
    for epoch in range(epochs):
        for shard in shoal.shards(epoch):
            for i in shard.range():
                ...                          # one training step
                step += 1
                shoal.progress(step)
                if step % 100 == 0:
                    ckpt.save(step, {...})
            shard.done(step)

The SDK talks only to the Shoal agent of its node, over the Unix socket in SHOAL_AGENT_SOCKET
(docs/sdk-protocol.md). Without it (a script run by hand) progress and checkpoint reports are
no-ops, checkpoints work locally, and data shards raise AgentUnavailable. See docs/sdk.md.
"""

# The distribution shoal-sdk takes its version from here (sdk/python/pyproject.toml).
__version__ = "0.1.0"

from . import env
from .checkpoint import (Checkpointer, CheckpointStorage, LocalDirStorage, WebHdfsStorage,
                         checkpoint_name,
                         checkpoint_step)
from .data import LeaseReply, Shard, lease, shards
from .parquet import read_numpy, read_table
from .errors import (AgentError, AgentTimeout, AgentUnavailable, LeaseLost, ShoalError)
from .publish import PublishError, publish_model
from .reports import checkpointed, progress, resumed

__all__ = [
    "AgentError", "AgentTimeout", "AgentUnavailable", "CheckpointStorage", "Checkpointer",
    "LeaseLost", "LeaseReply", "LocalDirStorage", "PublishError", "WebHdfsStorage", "Shard", "ShoalError", "checkpoint_name",
    "checkpoint_step", "checkpointed", "env", "lease", "progress", "publish_model", "read_numpy", "read_table", "resumed",
    "shards",
]
