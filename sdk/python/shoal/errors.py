"""The exceptions the Shoal SDK raises. Every one derives from `ShoalError`."""


class ShoalError(Exception):
    """Base class of every error the SDK raises."""


class AgentUnavailable(ShoalError):
    """The agent cannot be reached: SHOAL_AGENT_SOCKET is unset (an operation that needs the
    agent, such as leasing shards), or the connection failed and one reconnect did not help."""


class AgentTimeout(ShoalError):
    """The agent did not answer a request within the reply timeout."""


class AgentError(ShoalError):
    """The agent answered `{"ok": false, "error": ...}`, or something that breaks the protocol."""


class LeaseLost(AgentError):
    """`done` was refused: this task no longer holds the shard's lease (it expired, or the task
    was restarted). The shard must be treated as not processed."""
