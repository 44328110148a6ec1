"""The strict IDX reader on MNIST-format files of real digits and on damaged ones."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest
from conftest import sample_digits
from jaxfeed.loaders.data.idx import read_idx, write_idx


def _header(code: int, shape: tuple[int, ...]) -> bytes:
    return bytes([0, 0, code, len(shape)]) + struct.pack(f">{len(shape)}I", *shape)


def test_mnist_format_images(mnist_dir: Path) -> None:
    images = read_idx(mnist_dir / "t10k-images-idx3-ubyte.gz")
    assert images.shape == (5000, 28, 28)
    assert images.dtype == np.uint8
    assert images.flags.c_contiguous and images.flags.writeable
    np.testing.assert_array_equal(images, sample_digits()[0])


def test_mnist_format_labels(mnist_dir: Path) -> None:
    test = read_idx(mnist_dir / "t10k-labels-idx1-ubyte.gz")
    train = read_idx(mnist_dir / "train-labels-idx1-ubyte.gz")
    assert test.shape == train.shape == (5000,)
    assert test.dtype == train.dtype == np.uint8
    np.testing.assert_array_equal(test, sample_digits()[1])
    assert np.bincount(test).tolist() == [500] * 10


def test_gzip_detected_by_magic_not_name(mnist_dir: Path, tmp_path: Path) -> None:
    renamed = tmp_path / "labels.raw"  # gzip content, misleading name
    renamed.write_bytes((mnist_dir / "t10k-labels-idx1-ubyte.gz").read_bytes())
    raw = tmp_path / "labels.gz"  # raw content, misleading name
    raw.write_bytes(gzip.decompress(renamed.read_bytes()))
    np.testing.assert_array_equal(read_idx(renamed), read_idx(raw))


@pytest.mark.parametrize(
    "array",
    [
        np.arange(24, dtype=np.uint8).reshape(2, 3, 4),
        np.array([-128, 0, 127], dtype=np.int8),
        np.array([[-3000, 7], [1, 2]], dtype=np.int16),
        np.arange(-5, 5, dtype=np.int32),
        np.linspace(-1, 1, 16, dtype=np.float32).reshape(2, 2, 2, 2),
        np.array([np.pi, -np.e], dtype=np.float64),
        np.array([1, 2, 3], dtype=">i4"),  # non-native input is fine too
    ],
    ids=lambda a: str(a.dtype),
)
@pytest.mark.parametrize("name", ["x.idx", "x.idx.gz"])
def test_round_trip(tmp_path: Path, array: np.ndarray, name: str) -> None:
    path = write_idx(tmp_path / name, array)
    assert (path.read_bytes()[:2] == b"\x1f\x8b") == name.endswith(".gz")
    back = read_idx(path)
    assert back.dtype == array.dtype.newbyteorder("=") and back.dtype.isnative
    np.testing.assert_array_equal(back, array)


def test_multibyte_is_big_endian_on_disk(tmp_path: Path) -> None:
    path = write_idx(tmp_path / "x", np.array([1], dtype=np.int32))
    assert path.read_bytes() == _header(0x0C, (1,)) + b"\x00\x00\x00\x01"


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (_header(0x08, (10, 28, 28)) + bytes(7839), r"7839 bytes, expected 7840.*truncated"),
        (_header(0x08, (3,)) + bytes(5), r"payload has 5 bytes, expected 3.*2 bytes of trailing"),
        (_header(0x0C, (2,)) + bytes(7), r"payload has 7 bytes, expected 8 .*int32"),
        (b"\x01\x00" + _header(0x08, (1,))[2:] + b"\x00", r"bad magic 01 00, expected 00 00"),
        (_header(0x07, (1,)) + b"\x00", r"unknown IDX dtype code 0x07"),
        (_header(0x08, ()), r"header says 0 dimensions, expected 1 to 4"),
        (_header(0x08, (1, 1, 1, 1, 1)) + b"\x00", r"header says 5 dimensions"),
        (_header(0x08, (4, 4))[:9], r"expected a 12-byte header .*truncated"),
        (b"\x00\x00", r"file has 2 bytes, expected at least a 4-byte IDX header"),
        (b"", r"file has 0 bytes"),
        (b"<html>404 Not Found</html>", r"bad magic 3c 68"),
    ],
    ids=[
        "truncated",
        "oversized",
        "int32-short",
        "magic",
        "dtype-code",
        "zero-dims",
        "five-dims",
        "short-header",
        "tiny",
        "empty",
        "html",
    ],
)
def test_invalid_files_raise(tmp_path: Path, content: bytes, match: str) -> None:
    path = tmp_path / "bad-idx3-ubyte"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=match) as info:
        read_idx(path)
    assert str(path) in str(info.value)  # every message names the file


def test_invalid_content_inside_gzip(tmp_path: Path) -> None:
    path = tmp_path / "t10k-images-idx3-ubyte.gz"
    path.write_bytes(gzip.compress(_header(0x08, (10000, 28, 28)) + bytes(7839)))
    with pytest.raises(
        ValueError,
        match=r"t10k-images-idx3-ubyte.gz: payload has 7839 bytes, "
        r"expected 7840000 for shape \(10000, 28, 28\) uint8; the file is "
        r"truncated, delete it and download it again",
    ):
        read_idx(path)


def test_corrupt_gzip(mnist_dir: Path, tmp_path: Path) -> None:
    good = (mnist_dir / "t10k-labels-idx1-ubyte.gz").read_bytes()
    cut = tmp_path / "cut.gz"
    cut.write_bytes(good[: len(good) // 2])
    flipped = tmp_path / "flipped.gz"
    flipped.write_bytes(good[:100] + bytes(b ^ 0xFF for b in good[100:200]) + good[200:])
    garbage = tmp_path / "garbage.gz"
    garbage.write_bytes(b"\x1f\x8b" + b"not really gzip at all" * 10)
    for path in (cut, flipped, garbage):
        with pytest.raises(ValueError, match=rf"{path.name}: corrupt gzip data"):
            read_idx(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_idx(tmp_path / "nope")


@pytest.mark.parametrize(
    ("array", "error", "match"),
    [
        (np.array([True]), TypeError, r"dtype bool has no IDX code"),
        (np.zeros(2, dtype=np.uint16), TypeError, r"dtype uint16 has no IDX code"),
        (np.uint8(3), ValueError, r"0 dimensions .*expected 1 to 4"),
        (np.zeros((1,) * 5, dtype=np.uint8), ValueError, r"5 dimensions"),
    ],
)
def test_write_rejects(tmp_path: Path, array: np.ndarray, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        write_idx(tmp_path / "x", array)
