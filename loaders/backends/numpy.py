"""The reference backend: in-memory arrays, one vectorised gather per batch."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import numpy as np
from jaxfeed.loaders.backends.sampled_source import SampledSource
from jaxfeed.loaders.data.catalog import ArrayDataset
from jaxfeed.loaders.rows import ArrayRows
from jaxfeed.loaders.sampler import Sampler
from jaxfeed.loaders.transform import RecordTransform


class NumpySource(SampledSource):
    """Batches gathered with numpy fancy indexing straight from the arrays.

    The fastest possible host loader: the ceiling the other backends are
    measured against. A transform runs on each gathered record, in this
    process, or in ``num_workers`` processes of a `RecordPool` (which read
    their own rows, so only the finished batches travel back).

    Raises:
      ValueError: ``num_workers`` not an int >= 0, or > 0 without a transform.
    """

    def __init__(
        self,
        dataset: ArrayDataset,
        sampler: Sampler,
        transform: RecordTransform | None = None,
        num_workers: int = 0,
    ):
        super().__init__(dataset, sampler, transform=transform)
        self.rows = ArrayRows(dataset.arrays)
        self._start_pool("numpy", self.rows.read_batch, num_workers)

    def _fetch(
        self, index_batches: Sequence[np.ndarray], epoch: int
    ) -> Iterator[Mapping[str, np.ndarray]]:
        for indices in index_batches:
            rows = self.rows.read_batch(indices)
            yield rows if self.transform is None else self.transform.batch(rows, indices, epoch)


OPTIONS: tuple[str, ...] = ("num_workers",)


def build(dataset: ArrayDataset, sampler: Sampler, **options) -> NumpySource:
    """The backend's `BatchSource`; ``loaders.make`` has checked ``options``
    against `OPTIONS`."""
    return NumpySource(dataset, sampler, **options)
