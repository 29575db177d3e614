"""Data shards leased from the job's master (through the agent): `shards`, `lease`, `Shard`.

A shard is a file of the job's dataset or a range of sample indices. The master leases each
shard of an epoch to one task at a time; `Shard.done(step)` records that its samples went into
training up to and including `step`. A lease the holder loses (it expired, the task failed or
was restarted) goes back to the todo list, and `done` is then refused with `LeaseLost`.

    for shard in shoal.shards(epoch):
        for i in shard.range():
            ...
            shoal.progress(step)
        shard.done(step)

Shards need the agent: outside Shoal (SHOAL_AGENT_SOCKET unset) `lease` and `shards` raise
AgentUnavailable.
"""

import time
from dataclasses import dataclass
from typing import Iterator, Optional

from . import _client, parquet
from .errors import AgentError, AgentUnavailable, LeaseLost


@dataclass(frozen=True)
class Shard:
    """One leased shard: `file` for file shards, `start`/`end` (end exclusive) for index ranges."""

    id: int
    epoch: int
    file: Optional[str] = None
    start: Optional[int] = None
    end: Optional[int] = None

    def range(self):
        """The shard's sample indices, `range(start, end)`. Raises TypeError for a file shard."""
        if self.start is None or self.end is None:
            raise TypeError(f"shard {self.id} of epoch {self.epoch} is a file shard "
                            f"({self.file!r}), not an index range")
        return range(self.start, self.end)

    def read_table(self, columns=None):
        """The shard's Parquet file (a `dataset: {parquet: ...}` shard) as a pyarrow.Table with
        only `columns` (None: all); memory-mapped when local, that file alone read through
        WebHDFS when hdfs://. Needs pyarrow (Shoal's spark venv has it; shoal.parquet)."""
        return parquet.read_table(self._parquet_file(), columns)

    def read_numpy(self, columns=None):
        """The shard's Parquet file as {column name: numpy array}; a list column of equal-length
        rows (Spark's array<float>) is one 2-D array. See `read_table` and shoal.parquet."""
        return parquet.read_numpy(self._parquet_file(), columns)

    def _parquet_file(self):
        if self.file is None:
            raise TypeError(f"shard {self.id} of epoch {self.epoch} is an index range "
                            f"[{self.start}, {self.end}), not a Parquet file")
        return self.file

    def done(self, step):
        """Records that the shard's samples went into training up to and including `step`.

        Waits for the agent's reply. Raises LeaseLost when the task no longer holds the lease:
        the shard must then be treated as not processed.
        """
        reply = _require_client("done").request(
            {"op": "done", "epoch": self.epoch, "shard": self.id, "step": int(step)})
        if not reply.get("ok"):
            raise LeaseLost(reply.get("error") or
                            f"the lease on shard {self.id} of epoch {self.epoch} was lost")


@dataclass(frozen=True)
class LeaseReply:
    """What one `lease` call got: exactly one of `shard`, `retry_ms` or `exhausted` is set."""

    shard: Optional[Shard] = None
    retry_ms: Optional[int] = None
    exhausted: bool = False


def _require_client(op):
    client = _client.client()
    if client is None:
        raise AgentUnavailable(
            f"{op!r} needs the Shoal agent, but SHOAL_AGENT_SOCKET is not set: data shards are "
            f"only available to tasks started by Shoal for a job with a `dataset` section")
    return client


def _parse_shard(fields):
    def optional_int(key):
        return int(fields[key]) if fields.get(key) is not None else None

    try:
        return Shard(id=int(fields["id"]), epoch=int(fields["epoch"]), file=fields.get("file"),
                     start=optional_int("start"), end=optional_int("end"))
    except (KeyError, TypeError, ValueError) as e:
        raise AgentError(f"malformed shard in the agent's lease reply: {fields!r}") from e


def lease(epoch, wait=True):
    """Asks the agent for one shard of `epoch`; returns a LeaseReply.

    `wait=True`: `exhausted` only once every shard of the epoch is done (others' leases may
    still come back). `wait=False` (synchronous data-parallel loops): `exhausted` as soon as no
    shard is waiting to be leased. Raises AgentError when refused (no dataset, epoch out of
    range, stale attempt), AgentUnavailable outside Shoal.
    """
    reply = _require_client("lease").request(
        {"op": "lease", "epoch": int(epoch), "wait": bool(wait)})
    if not reply.get("ok"):
        raise AgentError(f"the Shoal agent refused to lease a shard of epoch {int(epoch)}: "
                         f"{reply.get('error', 'no reason given')}")
    if isinstance(reply.get("shard"), dict):
        return LeaseReply(shard=_parse_shard(reply["shard"]))
    if reply.get("exhausted"):
        return LeaseReply(exhausted=True)
    if reply.get("retry_ms") is not None:
        return LeaseReply(retry_ms=max(0, int(reply["retry_ms"])))
    raise AgentError(f"unexpected reply from the Shoal agent to 'lease': {reply!r}")


def shards(epoch, wait=True) -> Iterator[Shard]:
    """Yields the shards of `epoch` leased to this task until the epoch is exhausted.

    Sleeps `retry_ms` whenever the agent says so. Call `shard.done(step)` after each shard.
    """
    while True:
        reply = lease(epoch, wait)
        if reply.shard is not None:
            yield reply.shard
        elif reply.exhausted:
            return
        else:
            time.sleep(reply.retry_ms / 1000.0)
