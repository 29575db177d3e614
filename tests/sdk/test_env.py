"""shoal.env: the task's identity from SHOAL_* variables, and local defaults without them."""

import pytest

from shoal import env


def test_outside_shoal_a_script_is_rank_zero_of_one():
    assert not env.under_shoal()
    assert (env.role(), env.index(), env.task(), env.rank(), env.world_size(),
            env.restart_count(), env.job_id(), env.checkpoint_dir(), env.checkpoint_keep(),
            env.agent_socket()) == (None, 0, None, 0, 1, 0, None, None, None, None)


def test_under_shoal_the_variables_are_read(monkeypatch):
    for key, value in {"SHOAL_JOB_ID": "j-1", "SHOAL_ROLE": "worker", "SHOAL_INDEX": "3",
                       "SHOAL_RANK": "4", "SHOAL_WORLD_SIZE": "8", "SHOAL_RESTART_COUNT": "2",
                       "SHOAL_CHECKPOINT_DIR": "/ckpt", "SHOAL_CHECKPOINT_KEEP": "5",
                       "SHOAL_AGENT_SOCKET": "@agent"}.items():
        monkeypatch.setenv(key, value)
    assert env.under_shoal()
    assert (env.role(), env.index(), env.task(), env.rank(), env.world_size(),
            env.restart_count(), env.job_id(), env.checkpoint_dir(), env.checkpoint_keep(),
            env.agent_socket()) == ("worker", 3, "worker:3", 4, 8, 2, "j-1", "/ckpt", 5, "@agent")


def test_a_malformed_number_names_the_variable(monkeypatch):
    monkeypatch.setenv("SHOAL_RANK", "zero")
    with pytest.raises(ValueError, match="SHOAL_RANK"):
        env.rank()
