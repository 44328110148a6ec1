"""A directory of `.npy` files gives only the splits it holds: training rows
are never served as the test split (they were, silently, with a `test_acc`
measured on training data)."""

import numpy as np
import pytest
from jaxfeed.loaders.data.on_disk import MissingSplitError

from jaxfeed import loaders


def _save(directory, rows: int, first: int = 0) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    np.save(directory / "x.npy", np.arange(first, first + rows, dtype=np.float32)[:, None])
    np.save(directory / "label.npy", np.zeros(rows, np.int32))


def test_a_flat_directory_is_the_train_split_only(tmp_path):
    _save(tmp_path, 10)
    assert len(loaders.load_dataset(tmp_path, "train")) == 10
    with pytest.raises(MissingSplitError, match=r"no 'test' split: its \.npy files are one split"):
        loaders.load_dataset(tmp_path, "test")
    with pytest.raises(MissingSplitError, match="no 'test' split"):
        loaders.make("numpy", dataset=tmp_path, split="test", batch_size=2)


def test_files_beside_split_subdirectories_belong_to_no_split(tmp_path):
    _save(tmp_path / "train", 10)
    _save(tmp_path, 4, first=100)  # stray files at the top: not a test split
    train = loaders.load_dataset(tmp_path, "train")
    np.testing.assert_array_equal(train["x"][:, 0], np.arange(10))
    with pytest.raises(MissingSplitError, match=r"its \.npy splits are \['train'\]"):
        loaders.load_dataset(tmp_path, "test")


def test_a_directory_with_both_splits_gives_each(tmp_path):
    _save(tmp_path / "train", 10)
    _save(tmp_path / "test", 3, first=50)
    test = loaders.load_dataset(tmp_path, "test")
    assert test.name == "test/test"
    np.testing.assert_array_equal(test["x"][:, 0], [50, 51, 52])
    with pytest.raises(MissingSplitError):  # the train/ directory itself is one split
        loaders.load_dataset(tmp_path / "train", "test")


def test_npy_files_beside_files_of_another_format_are_refused_not_left_out(tmp_path):
    # The Parquet file was silently left out: the directory read as .npy only.
    _save(tmp_path / "train", 10)
    (tmp_path / "train" / "notes.txt").write_text("not data: ignored")
    assert len(loaders.load_dataset(tmp_path, "train")) == 10
    (tmp_path / "train" / "more-00000.parquet").write_bytes(b"PAR1")
    with pytest.raises(ValueError, match=r"<field>\.npy files and files of another format"):
        loaders.load_dataset(tmp_path, "train")
