"""Under Debian's python3, which has no pyarrow, reading a Parquet shard says which venv has
it; `import shoal` itself never needs pyarrow (parquet_test.py tests the reading)."""

import pytest

import shoal


def test_reading_a_parquet_shard_without_pyarrow_names_the_spark_venv(tmp_path):
    try:
        import pyarrow  # noqa: F401
        pytest.fail("this test runs under an interpreter without pyarrow (Debian's python3)")
    except ImportError:
        pass
    shard = shoal.Shard(id=0, epoch=0, file=str(tmp_path / "part-00000.parquet"))
    with pytest.raises(ImportError, match=r"needs pyarrow.*/var/cache/shoal/venvs/spark/bin/python"):
        shard.read_numpy()
