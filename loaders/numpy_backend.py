"""The reference backend: in-memory arrays, one vectorised gather per batch."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from loaders.source import SampledSource


class NumpySource(SampledSource):
    """Batches gathered with numpy fancy indexing straight from the arrays.

    The fastest possible host loader: the ceiling the other backends are
    measured against.
    """

    def _fetch(self, index_batches: Sequence[np.ndarray]) -> Iterator[Mapping[str, np.ndarray]]:
        images, labels = self.dataset.images, self.dataset.labels
        for indices in index_batches:
            yield {"image": images[indices], "label": labels[indices]}


def build(dataset, sampler, **options) -> NumpySource:
    if options:
        raise TypeError(f"the numpy backend takes no options, got {sorted(options)}")
    return NumpySource(dataset, sampler)
