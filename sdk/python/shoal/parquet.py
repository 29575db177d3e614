"""Reading one leased Parquet shard (`dataset: {parquet: ...}`): only that file, never the
whole dataset.

    for shard in shoal.shards(epoch):
        arrays = shard.read_numpy(columns=["pixels", "label"])   # or shard.read_table()
        ...
        shard.done(step)

A local file is memory-mapped (`pyarrow.parquet.read_table(path, memory_map=True)`): its pages
are the page cache's, shared by every task of the machine that reads the same file. An
hdfs://namenode/path file is read through WebHDFS (shoal.webhdfs: $SHOAL_WEBHDFS, else the
NameNode's host on port 9870) into this process's memory, that file alone.

pyarrow is imported on first use. Debian's python3 has none: Shoal's `spark` venv
(/var/cache/shoal/venvs/spark, made by ./setup.sh) has pyarrow and sees Debian's NumPy and
torch, so a job whose tasks read Parquet runs them with its python.
"""

import os
import sys

SPARK_VENV_PYTHON = "/var/cache/shoal/venvs/spark/bin/python"


def _pyarrow():
    """(pyarrow, pyarrow.parquet), or ImportError saying where pyarrow is."""
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError as e:
        raise ImportError(
            f"reading Parquet shards needs pyarrow, which this Python ({sys.executable}) "
            f"does not have: run the task with {SPARK_VENV_PYTHON} (Shoal's spark venv, made "
            f"by ./setup.sh; it also sees Debian's NumPy and torch), or pip install pyarrow "
            f"({e})") from e
    return pyarrow, pyarrow.parquet


def read_table(path, columns=None):
    """The Parquet file `path` (a local path or hdfs://namenode[:port]/path) as a
    pyarrow.Table, with only `columns` (names; None for all). Local files are memory-mapped."""
    pa, pq = _pyarrow()
    text = os.fspath(path)
    if text.startswith("hdfs://"):
        from .webhdfs import HdfsLocation, WebHdfsClient
        location = HdfsLocation.parse(text)
        data = WebHdfsClient.for_location(location).read(location.path)
        return pq.read_table(pa.BufferReader(data), columns=columns)
    return pq.read_table(text, columns=columns, memory_map=True)


def table_to_numpy(table):
    """{column name: numpy array} for a pyarrow.Table. A list column whose rows all have the
    same length (Spark's array<float> features, say) becomes one 2-D array (rows, length); other
    columns become 1-D arrays (no copy where Arrow allows it: numeric columns without nulls)."""
    pa, _ = _pyarrow()
    arrays = {}
    for name in table.column_names:
        column = table.column(name).combine_chunks()
        if pa.types.is_list(column.type) or pa.types.is_large_list(column.type) or \
                pa.types.is_fixed_size_list(column.type):
            lengths = column.value_lengths().to_numpy(zero_copy_only=False)
            if column.null_count == 0 and len(lengths) > 0 and (lengths == lengths[0]).all():
                # flatten() honours the array's offset and slices; values() would not.
                flat = column.flatten().to_numpy(zero_copy_only=False)
                arrays[name] = flat.reshape(len(column), int(lengths[0]))
                continue
        arrays[name] = column.to_numpy(zero_copy_only=False)
    return arrays


def read_numpy(path, columns=None):
    """`read_table(path, columns)` as `table_to_numpy` gives it: {column name: numpy array}."""
    return table_to_numpy(read_table(path, columns))
