"""An image folder's class names in Unicode: a name spelled NFC in one split
and NFD in another (as macOS writes it) is one class with one label; two
spellings of one name in one split are refused, naming both."""

import io
import unicodedata

import numpy as np
import pytest

from jaxfeed import loaders

NFC = unicodedata.normalize("NFC", "ñandú")
NFD = unicodedata.normalize("NFD", "ñandú")


def _png(value: int) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.full((2, 2), value, np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def _folder(root, split: str, classes: list[str]) -> None:
    for value, name in enumerate(classes):
        (root / split / name).mkdir(parents=True)
        (root / split / name / "0.png").write_bytes(_png(value))


def test_one_name_in_two_spellings_across_splits_is_one_class(tmp_path):
    assert NFC != NFD
    _folder(tmp_path, "train", ["emu", NFC])
    _folder(tmp_path, "test", [NFD, "emu"])
    train = loaders.load_dataset(str(tmp_path), "train")
    test = loaders.load_dataset(str(tmp_path), "test")
    assert list(train.classes) == list(test.classes) == ["emu", NFC]  # sorted by NFC name
    assert list(train["label"][np.arange(2)]) == list(test["label"][np.arange(2)]) == [0, 1]
    assert test["image"][np.arange(2)][1] == _png(0)  # test's ñandú directory, read


def test_two_spellings_of_one_name_in_one_split_are_refused(tmp_path):
    _folder(tmp_path, "train", [NFC, NFD])
    with pytest.raises(ValueError, match=r"one name .* in two Unicode spellings") as refused:
        loaders.load_dataset(str(tmp_path), "train")
    assert ascii(NFC) in str(refused.value) and ascii(NFD) in str(refused.value)
