"""On-disk fields travel into workers as where they lie, with their read advice."""

import pickle

import numpy as np
import pytest
from jaxfeed.loaders._io.mapped_files import advise, for_pickle, from_pickle

from jaxfeed import loaders


@pytest.fixture(scope="module")
def on_disk(tmp_path_factory):
    """A directory with a train/ subdirectory of .npy files, and the arrays."""
    root = tmp_path_factory.mktemp("npy")
    rng = np.random.default_rng(0)
    train = {
        "image": rng.integers(0, 256, (1000, 6, 5, 1), dtype=np.uint8),
        "label": rng.integers(0, 10, 1000).astype(np.int32),
        "score": rng.normal(size=(1000, 3)).astype(np.float32),
        "flag": rng.random(1000) < 0.5,
    }
    (root / "train").mkdir()
    for name, array in train.items():
        np.save(root / "train" / f"{name}.npy", array)
    return root, {"train": train}


def test_an_on_disk_field_pickles_as_where_it_lies(on_disk):
    root, fields = on_disk
    data = loaders.load_dataset(root, "train")
    blob = pickle.dumps(for_pickle(dict(data.arrays)))
    assert len(blob) < 2000  # not the ~35 kB of rows
    again = from_pickle(pickle.loads(blob))
    for name, array in fields["train"].items():
        np.testing.assert_array_equal(again[name], array)
        assert isinstance(again[name], np.memmap) and not again[name].flags.writeable


def test_a_random_order_reads_pages_not_read_around_also_in_workers(on_disk):
    # MADV_RANDOM: without it one random 784-byte row read ~3 MB (461 rows/s on
    # 36M rows bigger than memory, against 14,000 with it).
    root, _ = on_disk
    data = loaders.load_dataset(root, "train")
    for random in (True, False):
        advise(data["image"], random)
        (reopened,) = from_pickle(
            pickle.loads(pickle.dumps(for_pickle({"i": data["image"]})))
        ).values()
        assert reopened._jaxfeed_random_reads is random  # a worker's map gets the same advice
