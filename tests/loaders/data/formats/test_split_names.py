"""Which split a file is in: the split its name holds as a word, in any case
(``TRAIN-00002.parquet`` is train, ``contest-00000.parquet`` is not test);
files no split would read beside files that name one are refused by name, and
files a directory's split subdirectories leave out are named in a warning:
never silently in neither split."""

import numpy as np
import pytest
from jaxfeed.loaders.data.formats import locate
from jaxfeed.loaders.data.formats.detect import LeftOutFilesWarning

from jaxfeed import loaders

SPLITS = ("train", "test")


def _write(directory, *names: str) -> None:
    import pyarrow as pa
    from pyarrow import parquet

    for number, name in enumerate(names):
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        parquet.write_table(pa.table({"x": [number]}), directory / name)


def _files(target, split: str) -> list[str]:
    return [p.name for p in locate(target, split, SPLITS).files]


def test_a_split_is_a_word_of_the_name_in_any_case(tmp_path):
    names = ["TRAIN-00002.parquet", "Test-0.parquet", "data_train.parquet", "mnist-test.parquet",
             "train2017.parquet", "train-00000-of-00002.parquet"]  # fmt: skip
    _write(tmp_path, *names)
    assert _files(tmp_path, "train") == [
        "TRAIN-00002.parquet",
        "data_train.parquet",
        "train-00000-of-00002.parquet",
        "train2017.parquet",
    ]
    assert _files(tmp_path, "test") == ["Test-0.parquet", "mnist-test.parquet"]
    np.testing.assert_array_equal(loaders.load_dataset(tmp_path, "test")["x"], [1, 3])


@pytest.mark.parametrize(
    "stray", ["contest-00000.parquet", "attest.parquet", "validation-00000.parquet"]
)
def test_a_file_in_no_split_beside_split_files_is_refused_by_name(tmp_path, stray):
    _write(tmp_path, "train-00000.parquet", "test-00000.parquet", stray)
    for split in SPLITS:
        with pytest.raises(ValueError, match=rf"{stray} would be in no split.*in any case"):
            locate(tmp_path, split, SPLITS)
    with pytest.raises(ValueError, match=rf"{stray} would be in no split"):  # a glob too
        locate(str(tmp_path / "*.parquet"), "train", SPLITS)


def test_validation_is_not_read_as_test(tmp_path):
    _write(tmp_path, "train-00000.parquet", "validation-00000.parquet")
    with pytest.raises(ValueError, match=r"validation split is not read as 'test'.*test-\*"):
        loaders.load_dataset(tmp_path, "test")


def test_a_file_naming_both_splits_is_refused(tmp_path):
    _write(tmp_path, "train-00000.parquet", "train_test_0.parquet")
    with pytest.raises(ValueError, match=r"train_test_0\.parquet would be in no split, or in sev"):
        locate(tmp_path, "train", SPLITS)


def test_files_naming_no_split_are_one_split_unless_they_name_several(tmp_path):
    _write(tmp_path / "one", "contest-0.parquet", "contest-1.parquet")
    assert _files(tmp_path / "one", "train") == ["contest-0.parquet", "contest-1.parquet"]
    _write(tmp_path / "dev", "dev-0.parquet", "dev-1.parquet")  # one set of files, pointed at
    assert _files(tmp_path / "dev", "train") == ["dev-0.parquet", "dev-1.parquet"]
    _write(tmp_path / "two", "training-0.parquet", "testing-0.parquet")
    with pytest.raises(ValueError, match=r"name the splits \['testing', 'training'\]"):
        locate(tmp_path / "two", "train", SPLITS)


def test_files_split_subdirectories_leave_out_are_named_in_a_warning(tmp_path):
    _write(tmp_path, "train/a.parquet", "test/b.parquet", "validation/c.parquet", "stray.parquet")
    with pytest.warns(LeftOutFilesWarning, match=r"stray\.parquet, validation/c\.parquet are in"):
        assert _files(tmp_path, "train") == ["a.parquet"]
    _write(tmp_path / "clean", "train/a.parquet", "test/b.parquet")
    assert _files(tmp_path / "clean", "test") == ["b.parquet"]  # no warning: an error here
