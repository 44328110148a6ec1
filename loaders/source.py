"""Shared base of the built-in backends: sampler order in, protocol batches out.

A backend only says how to fetch full batches for a list of index arrays
with its own framework; padding, masks and dtypes are handled once, here.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from loaders.datasets import ArrayDataset
from loaders.protocol import ArraySpec, Batch
from loaders.sampler import Sampler


class SampledSource(abc.ABC):
    """A `BatchSource` over an `ArrayDataset` in the shared sampler's order.

    Args:
      dataset: the split to read.
      sampler: the index plan (batch size, seed, processes, remainder).
    """

    def __init__(self, dataset: ArrayDataset, sampler: Sampler):
        if sampler.num_examples != len(dataset):
            raise ValueError(
                f"sampler covers {sampler.num_examples} examples but dataset "
                f"{dataset.name} has {len(dataset)}"
            )
        self.dataset = dataset
        self.sampler = sampler

    @property
    def batch_size(self) -> int:
        return self.sampler.batch_size

    @property
    def num_batches(self) -> int:
        return self.sampler.num_batches

    @property
    def element_spec(self) -> Mapping[str, ArraySpec]:
        b = self.batch_size
        spec = {
            "image": ArraySpec((b, *self.dataset.images.shape[1:]), np.dtype(np.uint8)),
            "label": ArraySpec((b,), np.dtype(np.int32)),
        }
        if not self.sampler.drop_remainder:
            spec["mask"] = ArraySpec((b,), np.dtype(np.bool_))
        return spec

    def iter_epoch(self, epoch: int = 0, *, start: int = 0) -> Iterator[Batch]:
        plan = list(self.sampler.epoch_plan(epoch, start))
        fetched = self._fetch([indices for indices, _ in plan])
        for (_, num_valid), batch in zip(plan, fetched, strict=True):
            yield self._finish(batch, num_valid)

    def __iter__(self) -> Iterator[Batch]:
        return self.iter_epoch(0)

    def __len__(self) -> int:
        return self.num_batches

    def __repr__(self) -> str:
        s = self.sampler
        return (
            f"{type(self).__name__}({self.dataset.name}, batch_size={s.batch_size}, "
            f"num_batches={s.num_batches}, seed={s.seed}, shuffle={s.shuffle}, "
            f"drop_remainder={s.drop_remainder}, process={s.process_index}/{s.process_count})"
        )

    @abc.abstractmethod
    def _fetch(self, index_batches: Sequence[np.ndarray]) -> Iterator[Mapping[str, np.ndarray]]:
        """Yields one ``{"image", "label"}`` batch per index array, in order,
        read through the backend's own framework."""

    def _finish(self, batch: Mapping[str, np.ndarray], num_valid: int) -> Batch:
        """Casts to the protocol's dtypes; zeroes padding rows and adds ``mask``."""
        image = np.asarray(batch["image"], dtype=np.uint8)
        label = np.asarray(batch["label"], dtype=np.int32)
        assert len(image) == len(label) == self.batch_size, (len(image), len(label))
        if self.sampler.drop_remainder:
            return {"image": image, "label": label}
        mask = np.arange(self.batch_size) < num_valid
        if num_valid < self.batch_size:
            # Zeroed padding is backend-independent, so padded batches are
            # byte-identical across backends too.
            image, label = image.copy(), label.copy()
            image[num_valid:] = 0
            label[num_valid:] = 0
        return {"image": image, "label": label, "mask": mask}
