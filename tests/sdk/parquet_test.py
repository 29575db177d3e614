"""Reading leased Parquet shards (shoal.parquet, Shard.read_table / read_numpy).

Run by the spark venv's python (/var/cache/shoal/venvs/spark, which has pyarrow), registered
as the ctest sdk_parquet (tests/sdk/CMakeLists.txt); test_parquet_without_pyarrow.py checks the
message under Debian's python3, which has none.
"""

import http.server
import subprocess
import sys
import threading
import urllib.parse

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import shoal
from shoal import parquet


def write_part(path, first, rows):
    table = pa.table({
        "pixels": pa.array([[float(first + i), float(-(first + i))] for i in range(rows)],
                           type=pa.list_(pa.float32())),
        "label": pa.array([(first + i) % 10 for i in range(rows)], type=pa.int64()),
        "name": pa.array([f"row{first + i}" for i in range(rows)]),
    })
    pq.write_table(table, path)
    return table


def test_read_table_reads_only_the_shards_file_and_the_columns_asked(tmp_path):
    write_part(tmp_path / "part-00000.parquet", 0, 5)
    second = write_part(tmp_path / "part-00001.parquet", 5, 3)
    shard = shoal.Shard(id=1, epoch=0, file=str(tmp_path / "part-00001.parquet"))
    table = shard.read_table()
    assert table.equals(second)
    assert shard.read_table(columns=["label"]).column_names == ["label"]
    assert shard.read_table(columns=["label"]).column("label").to_pylist() == [5, 6, 7]


def test_read_numpy_gives_list_columns_as_two_dimensional_arrays(tmp_path):
    write_part(tmp_path / "p.parquet", 10, 4)
    arrays = shoal.Shard(id=0, epoch=0, file=str(tmp_path / "p.parquet")).read_numpy(
        columns=["pixels", "label"])
    assert sorted(arrays) == ["label", "pixels"]
    assert arrays["pixels"].shape == (4, 2)
    assert arrays["pixels"].dtype == np.float32
    np.testing.assert_array_equal(arrays["pixels"][:, 0], [10, 11, 12, 13])
    np.testing.assert_array_equal(arrays["label"], [0, 1, 2, 3])


def test_table_to_numpy_keeps_ragged_lists_as_objects_and_honours_slices():
    table = pa.table({"v": pa.array([[1, 2], [3], [4, 5, 6]]), "k": [1, 2, 3]})
    arrays = parquet.table_to_numpy(table)
    assert arrays["v"].dtype == object and len(arrays["v"]) == 3
    sliced = parquet.table_to_numpy(pa.table({"v": pa.array([[1, 2], [3, 4], [5, 6]])}).slice(1))
    np.testing.assert_array_equal(sliced["v"], [[3, 4], [5, 6]])


def test_local_files_are_memory_mapped(tmp_path, monkeypatch):
    write_part(tmp_path / "p.parquet", 0, 2)
    seen = {}
    real = pq.read_table

    def spy(source, **kwargs):
        seen.update(kwargs)
        return real(source, **kwargs)
    monkeypatch.setattr(pq, "read_table", spy)
    shoal.read_table(tmp_path / "p.parquet")
    assert seen.get("memory_map") is True


def test_import_shoal_leaves_pyarrow_unimported():
    # Tasks that never read Parquet must not pay for pyarrow's import.
    subprocess.run([sys.executable, "-c",
                    "import sys, shoal; assert 'pyarrow' not in sys.modules, 'imported'"],
                   check=True)


def test_index_range_shard_is_not_a_parquet_file():
    with pytest.raises(TypeError, match=r"index range \[0, 10\), not a Parquet file"):
        shoal.Shard(id=2, epoch=0, start=0, end=10).read_table()


class WebHdfsFiles(http.server.BaseHTTPRequestHandler):
    """A WebHDFS NameNode's OPEN for the files in `files` (path -> bytes), recording every
    request: the other side of the SDK's plain-HTTP client."""

    files = {}
    requests = []

    def do_GET(self):
        parts = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(parts.query)
        path = urllib.parse.unquote(parts.path[len("/webhdfs/v1"):])
        type(self).requests.append((query.get("op", [""])[0], path))
        body = self.files.get(path)
        if body is None or query.get("op") != ["OPEN"]:
            self.send_response(404)
            self.end_headers()
            self.wfile.write(b'{"RemoteException":{"exception":"FileNotFoundException",'
                             b'"message":"File does not exist"}}')
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_hdfs_shard_reads_that_one_file_through_webhdfs(tmp_path, monkeypatch):
    first = write_part(tmp_path / "a.parquet", 0, 3)
    write_part(tmp_path / "b.parquet", 3, 3)
    WebHdfsFiles.files = {"/data/d/part-00000.parquet": (tmp_path / "a.parquet").read_bytes(),
                          "/data/d/part-00001.parquet": (tmp_path / "b.parquet").read_bytes()}
    WebHdfsFiles.requests = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), WebHdfsFiles)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("SHOAL_WEBHDFS", f"http://127.0.0.1:{server.server_address[1]}")
        shard = shoal.Shard(id=0, epoch=1, file="hdfs://nn:8020/data/d/part-00000.parquet")
        assert shard.read_table().equals(first)
        np.testing.assert_array_equal(shard.read_numpy(columns=["label"])["label"], [0, 1, 2])
        assert WebHdfsFiles.requests == [("OPEN", "/data/d/part-00000.parquet")] * 2
        with pytest.raises(FileNotFoundError, match="part-00009.parquet"):
            shoal.read_table("hdfs://nn:8020/data/d/part-00009.parquet")
    finally:
        server.shutdown()
        server.server_close()
