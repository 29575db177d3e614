"""images.py's cache: an image's hash ignores what using the venv writes into it, and building
an image leaves one archive of it in the cache."""

import importlib.util
import os
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
spec = importlib.util.spec_from_file_location("images", HERE / "images.py")
images = importlib.util.module_from_spec(spec)
spec.loader.exec_module(images)


def make_venv(root):
    pyspark = root / "lib" / "python3.11" / "site-packages" / "pyspark"
    (pyspark / "jars").mkdir(parents=True)
    (pyspark / "jars" / "spark-core.jar").write_bytes(b"jar")
    (pyspark / "__init__.py").write_text("")
    (root / "bin").mkdir()
    os.symlink("/usr/bin/python3", root / "bin" / "python")
    return pyspark


def test_what_using_the_venv_writes_into_it_changes_neither_the_paths_nor_the_hash(tmp_path):
    venv = tmp_path / "venv"
    pyspark = make_venv(venv)
    before = images.venv_image_paths(str(venv), str(pyspark))
    listing = images.tree_listing(before)
    assert str(pyspark / "jars" / "spark-core.jar") in before

    (pyspark / "__pycache__").mkdir()
    (pyspark / "__pycache__" / "__init__.cpython-311.pyc").write_bytes(b"\0")
    executor = pyspark / "work" / "app-20261207022527-0000" / "0"
    executor.mkdir(parents=True)
    (executor / "stderr").write_text("log")
    after = images.venv_image_paths(str(venv), str(pyspark))
    assert after == before
    assert images.tree_listing(after) == listing

    # A file of the venv itself does change it.
    (pyspark / "jars" / "spark-sql.jar").write_bytes(b"jar")
    assert images.venv_image_paths(str(venv), str(pyspark)) != before


def test_building_an_image_removes_its_older_archives_and_no_other_image(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    old = cache / "shoal-spark-test-0123456789abcdef.tar"
    other_image = cache / "shoal-python-test-0123456789abcdef.tar"
    not_an_archive = cache / "shoal-spark-test-notes.txt"
    for path in (old, other_image, not_an_archive):
        path.write_bytes(b"x")

    def fill(layer):
        layer.add_dir("etc")
        layer.add_bytes("etc/hostname", b"spark\n")

    built = images.build(str(cache), "localhost/shoal-spark:test", "fedcba9876543210", fill)
    assert built == str(cache / "shoal-spark-test-fedcba9876543210.tar")
    assert sorted(p.name for p in cache.iterdir()) == sorted(
        [Path(built).name, other_image.name, not_an_archive.name])
    # Found again, not rebuilt.
    mtime = os.stat(built).st_mtime_ns
    assert images.build(str(cache), "localhost/shoal-spark:test", "fedcba9876543210",
                        pytest.fail) == built
    assert os.stat(built).st_mtime_ns == mtime
