"""Shared test setup: several CPU devices for JAX, and the real MNIST files."""

import os

# Must happen before anything imports jax: gives multi-device sharding tests
# 8 CPU devices on a machine without an accelerator.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# TensorFlow must neither grab a GPU nor spam the test log.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_MNIST = REPO.parent / "shared" / "data" / "mnist"


@pytest.fixture(scope="session")
def mnist_dir() -> Path:
    """The real MNIST IDX files (10k test digits + 60k train labels)."""
    if not (SHARED_MNIST / "t10k-images-idx3-ubyte.gz").exists():
        raise FileNotFoundError(
            f"real MNIST files not found at {SHARED_MNIST}; the tests expect the "
            "project's shared/ folder beside the repository"
        )
    return SHARED_MNIST


@pytest.fixture(autouse=True, scope="session")
def _session_cache(tmp_path_factory):
    """One throwaway jaxfeed cache per test session: the user's cache is never
    touched, and native-format caches (TFDS, Arrow) are built once per run.
    Tests that need an empty cache set JAXFEED_CACHE_DIR themselves."""
    os.environ["JAXFEED_CACHE_DIR"] = str(tmp_path_factory.mktemp("jaxfeed-cache"))
