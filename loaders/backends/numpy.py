"""The reference backend: in-memory arrays, one vectorised gather per batch."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import numpy as np
from jaxfeed.loaders.backends.sampled_source import SampledSource
from jaxfeed.loaders.data.catalog import ArrayDataset
from jaxfeed.loaders.sampler import Sampler


class NumpySource(SampledSource):
    """Batches gathered with numpy fancy indexing straight from the arrays.

    The fastest possible host loader: the ceiling the other backends are
    measured against.
    """

    def _fetch(self, index_batches: Sequence[np.ndarray]) -> Iterator[Mapping[str, np.ndarray]]:
        arrays = self.dataset.arrays
        for indices in index_batches:
            yield {key: array[indices] for key, array in arrays.items()}


OPTIONS: tuple[str, ...] = ()


def build(dataset: ArrayDataset, sampler: Sampler) -> NumpySource:
    """The backend's `BatchSource` (it takes no options)."""
    return NumpySource(dataset, sampler)
