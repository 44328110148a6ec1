"""Padded, bucketed and packed batches are byte-identical on every backend,
with and without worker processes, over two epochs, and resume exactly."""

import numpy as np
import pytest

from jaxfeed import loaders
from tests.backend_helpers import assert_same_batches

LAYOUTS = {"pad": {"pad": 64}, "bucket": {"bucket": (16, 32, 64)}, "pack": {"pack": 96}}
# Each backend as users run it: in this process, and with its own worker
# processes (one layout there: the workers read values the same way for all three).
RUNS = [
    ("torch", {}, tuple(LAYOUTS)),
    pytest.param("torch", {"num_workers": 2}, ("bucket",), marks=pytest.mark.slow),
    ("tf", {}, tuple(LAYOUTS)),
    ("grain", {}, tuple(LAYOUTS)),
    pytest.param("grain", {"num_workers": 2}, ("pack",), marks=pytest.mark.slow),
    ("hf", {}, tuple(LAYOUTS)),
]


def _dataset(layout: str) -> dict:
    rng = np.random.default_rng(7)
    rows = [rng.integers(1, 30000, n).astype(np.uint16) for n in rng.integers(1, 61, 300)]
    if layout == "pack":
        return {"input_ids": rows}
    return {"input_ids": rows, "label": np.arange(300, dtype=np.int32)}


def _epochs(backend: str, layout: str, **options) -> list[dict]:
    source = loaders.make(
        backend, dataset=_dataset(layout), batch_size=8, seed=11, **LAYOUTS[layout], **options
    )
    try:
        return [*source.iter_epoch(0), *source.iter_epoch(1), *source.iter_epoch(1, start=5)]
    finally:
        source.close()


@pytest.fixture(scope="module")
def reference() -> dict[str, list[dict]]:
    return {layout: _epochs("numpy", layout) for layout in LAYOUTS}


@pytest.mark.parametrize(("backend", "options", "layouts"), RUNS, ids=str)
def test_every_backend_gives_the_numpy_batches(backend, options, layouts, reference):
    for layout in layouts:
        assert_same_batches(_epochs(backend, layout, **options), reference[layout])


def test_reference_resumes_exactly_and_epochs_differ(reference):
    for layout, batches in reference.items():
        per_epoch = (len(batches) + 5) // 3
        e0, e1, resumed = (
            batches[:per_epoch],
            batches[per_epoch : 2 * per_epoch],
            batches[2 * per_epoch :],
        )
        assert_same_batches(resumed, e1[5:])
        assert not np.array_equal(e0[0]["input_ids"], e1[0]["input_ids"]), layout
        assert {b["input_ids"].dtype for b in batches} == {np.dtype(np.uint16)}


def test_tf_reads_a_ragged_fields_values_as_they_are():
    # A TFDS copy would write one record per value: minutes for a real corpus.
    source = loaders.make("tf", dataset=_dataset("pack"), batch_size=8, pack=96)
    assert source._values.builder_dir is None
