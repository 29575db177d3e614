"""The task's identity, read from the variables Shoal sets (docs/environment.md).

Each helper reads the environment when called. Outside Shoal they return what a single local
process would be: rank 0 of a world of 1, index 0, restart count 0, and None for names.
"""

import os
from typing import Optional


def _int(name, default):
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not an integer") from None


def _str(name) -> Optional[str]:
    return os.environ.get(name) or None


def under_shoal() -> bool:
    """True when this process was started by Shoal (SHOAL_JOB_ID is set)."""
    return _str("SHOAL_JOB_ID") is not None


def job_id() -> Optional[str]:
    return _str("SHOAL_JOB_ID")


def role() -> Optional[str]:
    return _str("SHOAL_ROLE")


def index() -> int:
    """The task's index within its role (SHOAL_INDEX), 0 outside Shoal."""
    return _int("SHOAL_INDEX", 0)


def task() -> Optional[str]:
    """`role:index` as the agent knows the task, None outside Shoal."""
    r = role()
    return None if r is None else f"{r}:{index()}"


def rank() -> int:
    """The task's rank over the whole job (SHOAL_RANK), 0 outside Shoal."""
    return _int("SHOAL_RANK", 0)


def world_size() -> int:
    """How many tasks the job has (SHOAL_WORLD_SIZE), 1 outside Shoal."""
    return _int("SHOAL_WORLD_SIZE", 1)


def restart_count() -> int:
    """The task's attempt (SHOAL_RESTART_COUNT): 0 for the first launch."""
    return _int("SHOAL_RESTART_COUNT", 0)


def checkpoint_dir() -> Optional[str]:
    return _str("SHOAL_CHECKPOINT_DIR")


def checkpoint_keep() -> Optional[int]:
    return _int("SHOAL_CHECKPOINT_KEEP", None)


def agent_socket() -> Optional[str]:
    return _str("SHOAL_AGENT_SOCKET")
