"""Reports from the training loop to the agent: `progress`, `checkpointed`, `resumed`.

All three are no-ops when the process was not started by Shoal (SHOAL_AGENT_SOCKET unset).
"""

from . import _client
from .errors import AgentError


def progress(step):
    """Reports that training step `step` (any increasing integer) completed.

    Fire-and-forget and cheap: call it every step. Under a Shoal agent it is three stores into
    the task's progress board (SHOAL_PROGRESS_FILE), which sends nothing and wakes no one;
    without a board, one `send` of a few dozen bytes on the process's cached connection. It
    arms the role's hang watchdog and extends the leases of the shards this task holds. Never
    raises for a socket problem: a broken connection is re-made once, then reports are disabled
    for the process with one warning on stderr.
    """
    board = _client.progress_board()
    if board is not None:
        board.write(int(step))
        return
    client = _client.client()
    if client is not None:
        client.report("progress", int(step))


def checkpointed(step):
    """Reports that a complete checkpoint of `step` was just made durable (fire-and-forget).

    `Checkpointer.save` sends it; call it yourself only if you write checkpoints another way.
    """
    client = _client.client()
    if client is not None:
        client.report("checkpointed", int(step))


def resumed(step):
    """Reports that the task loaded the checkpoint of `step` (0: none) and waits for the reply.

    `Checkpointer.load_latest` sends it. After a group restart the master hands out no data
    shard until it arrives. Raises AgentError when refused (e.g. a stale attempt),
    AgentUnavailable / AgentTimeout when the agent cannot be reached.
    """
    client = _client.client()
    if client is None:
        return
    reply = client.request({"op": "resumed", "step": int(step)})
    if not reply.get("ok"):
        raise AgentError(f"the Shoal agent refused 'resumed' (step {int(step)}): "
                         f"{reply.get('error', 'no reason given')}")
