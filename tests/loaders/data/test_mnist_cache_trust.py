"""MNIST files in jaxfeed's cache are checked against MNIST's md5s before they
are read, not only when downloaded: a cache may be shared, and a planted
``t10k-labels`` shifted by one trained on 8,000 wrong labels."""

import hashlib

import numpy as np
import pytest
from conftest import sample_digits
from jaxfeed.loaders.data import cache, mnist
from jaxfeed.loaders.data.idx import write_idx

from jaxfeed import loaders


@pytest.fixture
def planted_cache(tmp_path, monkeypatch):
    """A cache whose t10k files are valid IDX files: the images the mirror's
    (their md5 is taken as MNIST's), the labels shifted by one by a neighbour."""
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path))
    monkeypatch.delenv(mnist.DATA_DIR_ENV, raising=False)
    images, labels = sample_digits()
    directory = tmp_path / "mnist"
    directory.mkdir()
    write_idx(directory / mnist.T10K_IMAGES, images)
    write_idx(directory / mnist.T10K_LABELS, labels)
    for name in (mnist.T10K_IMAGES, mnist.T10K_LABELS):
        md5 = hashlib.md5((directory / name).read_bytes()).hexdigest()
        monkeypatch.setitem(mnist.CHECKSUMS, name, md5)
    assert len(loaders.load_dataset("mnist-10k", "test")) == 1000  # the downloaded files read
    write_idx(directory / mnist.T10K_LABELS, np.roll(labels, 1))  # then planted
    return directory


def test_a_cached_file_changed_after_its_download_is_refused_by_name(planted_cache):
    labels = planted_cache / mnist.T10K_LABELS
    with pytest.raises(ValueError, match=rf"{labels} in jaxfeed's cache has md5 .* delete it"):
        loaders.load_dataset("mnist-10k", "train")
