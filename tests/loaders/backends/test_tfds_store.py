"""The TFDS store's cache key, and the tf door's import of tensorflow_datasets."""

import sys
import textwrap

import pytest
from backend_helpers import indexed_dataset
from jaxfeed.loaders._doors import tf as tf_door
from jaxfeed.loaders.backends import tfds_store
from jaxfeed.loaders.data import cache

# What tensorflow_datasets' own __init__ does when one of its imports fails
# (e.g. protobuf's VersionError from a mismatched tensorflow-metadata): it logs
# the error and returns a module without its API.
_SWALLOWING_INIT = """
from absl import logging

class VersionError(Exception):
    pass

try:
    raise VersionError("Detected mismatched Protobuf Gencode/Runtime versions")
    __all__ = ["features"]
except Exception as exception:
    logging.exception(exception)
"""


def test_import_tfds_raises_the_error_tfds_swallowed(tmp_path, monkeypatch):
    package = tmp_path / "tensorflow_datasets"
    package.mkdir()
    (package / "__init__.py").write_text(textwrap.dedent(_SWALLOWING_INIT))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "tensorflow_datasets", raising=False)
    monkeypatch.setattr(tf_door, "import_tensorflow", lambda: None)
    tf_door.import_tfds.cache_clear()
    try:
        with pytest.raises(ImportError, match="VersionError: Detected mismatched Protobuf") as err:
            tf_door.import_tfds()
    finally:
        tf_door.import_tfds.cache_clear()
    assert type(err.value.__cause__).__name__ == "VersionError"
    assert "tensorflow_datasets" not in sys.modules  # a fixed install imports again


def test_store_written_by_another_tfds_version_is_not_reused(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXFEED_CACHE_DIR", str(tmp_path))
    data = indexed_dataset(20)
    monkeypatch.setattr(cache, "writer_version", lambda distribution: "4.9.10")
    newer = tfds_store.store(data)
    monkeypatch.setattr(cache, "writer_version", lambda distribution: "4.9.6")
    older = tfds_store.store(data)
    assert newer != older  # built again, not reused
    assert "-tensorflow-datasets-4.9.10-" in newer.parents[1].name
    assert "-tensorflow-datasets-4.9.6-" in older.parents[1].name
    assert newer.is_dir() and older.is_dir()


def test_a_store_build_leaves_nothing_in_the_temporary_directory(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setenv("JAXFEED_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # this process's $TMPDIR
    built = tfds_store.store(indexed_dataset(12))
    assert built.is_dir()
    assert list((tmp_path / "tmp").iterdir()) == []  # tfds left an empty tmp*tfds here
    assert tempfile.gettempdir() == str(tmp_path / "tmp")  # put back after the build
