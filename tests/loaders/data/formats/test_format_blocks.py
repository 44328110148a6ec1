"""``shuffle="blocks"`` on the user's files: blocks follow the units the rows
were read from (TFRecord / ArrayRecord shards, Parquet row groups), a unit
longer than ``block_rows`` is cut inside it, and the five backends give the
same batches."""

import numpy as np
import pytest
from backend_helpers import assert_same_batches
from format_files import TRAIN_ROWS, write_all
from jaxfeed.loaders.sampler import Sampler
from transform_helpers import augment_image

from jaxfeed import loaders

BACKENDS = ("numpy", "torch", "tf", "grain", "hf")
# The train split of `write_all`: two TFRecord shards of 12 rows, one
# ArrayRecord file, two Parquet files of 12 rows in row groups of 5.
UNITS = {"tfrecord": (12, 12), "arrayrecord": (24,), "parquet": (5, 5, 2, 5, 5, 2)}


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    return write_all(tmp_path_factory.mktemp("format-blocks"))


def _runs(order: np.ndarray, units: tuple[int, ...]) -> list[set]:
    """``order`` cut into runs of the sizes its units have, in the order they appear."""
    starts = np.concatenate([[0], np.cumsum(units)])
    which = np.searchsorted(starts, order, side="right") - 1  # each row's unit
    runs, at = [], 0
    while at < len(order):
        size = units[which[at]]
        runs.append((int(which[at]), set(order[at : at + size].tolist())))
        at += size
    return runs


@pytest.mark.parametrize("name", sorted(UNITS))
def test_blocks_are_the_shards_and_row_groups(written, name):
    assert loaders.load_dataset(written[name]).units == UNITS[name]
    source = loaders.make(
        "numpy",
        dataset=written[name],
        batch_size=4,
        shuffle="blocks",
        window_blocks=1,
        transform=augment_image,
    )
    starts = np.concatenate([[0], np.cumsum(UNITS[name])])
    for epoch in (0, 1):
        # One block per window: each unit's rows come together, shuffled, whole.
        for unit, rows in _runs(source.sampler.permutation(epoch), UNITS[name]):
            assert rows == set(range(starts[unit], starts[unit + 1]))


def test_a_unit_longer_than_block_rows_is_cut_inside_it():
    sampler = Sampler(24, 4, shuffle="blocks", block_rows=5, units=(12, 12))
    starts, stops = sampler.blocks()
    assert starts.tolist() == [0, 5, 10, 12, 17, 22]
    assert stops.tolist() == [5, 10, 12, 17, 22, 24]
    with pytest.raises(ValueError, match="summing to num_examples=24"):
        Sampler(24, 4, shuffle="blocks", block_rows=5, units=(12, 11))


def test_without_units_the_blocks_are_unchanged():
    plain = Sampler(TRAIN_ROWS, 4, seed=3, shuffle="blocks", block_rows=5)
    whole = Sampler(TRAIN_ROWS, 4, seed=3, shuffle="blocks", block_rows=5, units=(TRAIN_ROWS,))
    np.testing.assert_array_equal(plain.permutation(2), whole.permutation(2))


@pytest.mark.parametrize("name", ["tfrecord", "parquet"])
def test_five_backends_agree_on_block_order(written, name):
    def epoch(backend: str) -> list[dict]:
        source = loaders.make(
            backend, dataset=written[name], batch_size=5, seed=2, shuffle="blocks",
            window_blocks=2, transform=augment_image,
        )  # fmt: skip
        try:
            return list(source.iter_epoch(1))
        finally:
            source.close()

    want = epoch("numpy")
    for backend in BACKENDS[1:]:
        assert_same_batches(epoch(backend), want)
