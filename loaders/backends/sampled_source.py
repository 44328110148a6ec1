"""Shared base of the built-in backends: sampler order in, protocol batches out.

A backend only says how to fetch full batches for a list of index arrays
with its own framework; padding, masks and dtypes are handled once, here.
"""

from __future__ import annotations

import abc
import itertools
from collections.abc import Iterator, Mapping, Sequence

import numpy as np
from jaxfeed.loaders._io.on_disk_fields import OnDiskFields, check_unchanged, file_identities
from jaxfeed.loaders._workers.record_pool import RecordPool, RowReader
from jaxfeed.loaders.array_dataset import ArrayDataset
from jaxfeed.loaders.bytes_field import BytesField
from jaxfeed.loaders.checks import check_workers
from jaxfeed.loaders.data.ranged_ahead import RangedReadAhead
from jaxfeed.loaders.protocol import MASK_KEY, ArraySpec, Batch
from jaxfeed.loaders.remote_field import RemoteField
from jaxfeed.loaders.rows import pad_rows
from jaxfeed.loaders.sampler import Sampler
from jaxfeed.loaders.transform import RecordTransform


class SampledSource(abc.ABC):
    """A `BatchSource` over an `ArrayDataset` in the shared sampler's order.

    Args:
      dataset: the split to read.
      sampler: the index plan (batch size, seed, processes, remainder).
      order: ``"sampler"`` (default): the shared order, byte-identical across
        backends. ``"native"``: the framework's own shuffling, seeded by
        ``seed`` and the epoch; reproducible for one backend but NOT
        comparable across backends.
      transform: a `RecordTransform` each backend runs on every record it
        reads, where its framework runs per-record work; the batches are its
        output (``element_spec`` too).

    Raises:
      ValueError: unknown ``order``, a sampler that does not fit the dataset,
        a transform with ``order="native"``, or a bytes field without one.
    """

    ORDERS = ("sampler", "native")

    def __init__(
        self,
        dataset: ArrayDataset,
        sampler: Sampler,
        order: str = "sampler",
        transform: RecordTransform | None = None,
    ):
        if sampler.num_examples != len(dataset):
            raise ValueError(
                f"sampler covers {sampler.num_examples} examples but dataset "
                f"{dataset.name} has {len(dataset)}"
            )
        if order not in self.ORDERS:
            raise ValueError(f"order must be one of {self.ORDERS}, got {order!r}")
        if order == "native" and sampler.shuffle == "blocks":
            raise ValueError(
                "shuffle='blocks' is the shared sampler's order; order='native' shuffles "
                "with the framework's own full shuffle. Pick one of them"
            )
        if order == "native" and transform is not None:
            raise ValueError(
                "a transform runs in the shared sampler's order, where every row's random "
                "draw is known; order='native' is the framework's own. Pick one of them"
            )
        encoded = dataset.bytes_fields()
        if encoded and transform is None:
            raise ValueError(
                f"dataset {dataset.name}: field(s) {encoded} hold encoded bytes, which cannot "
                "reach a device; pass transform=fn, a function fn(record, rng) that decodes "
                "them into arrays (see docs/data.md)"
            )
        self.dataset = dataset
        self.sampler = sampler
        self.order = order
        self.transform = transform
        self._pool: RecordPool | None = None  # worker processes reading in its place
        # The dataset's files as the source was made from them: checked at every
        # epoch's start (a `deferred` dataset's head is in memory: nothing to check).
        self._files = file_identities(
            {k: v.content() if isinstance(v, BytesField) else (v,) for k, v in dataset.head.items()}
        )
        # Each field's row shape and dtype in the batches: the transform's output, or the data.
        self._rows = (
            {key: (a.shape[1:], a.dtype) for key, a in dataset.head.items()}
            if transform is None
            else transform.spec
        )

    @property
    def batch_size(self) -> int:
        return self.sampler.batch_size

    @property
    def num_batches(self) -> int:
        return self.sampler.num_batches

    @property
    def process_index(self) -> int:
        return self.sampler.process_index

    @property
    def process_count(self) -> int:
        return self.sampler.process_count

    @property
    def element_spec(self) -> Mapping[str, ArraySpec]:
        """The dataset's own fields, ``[batch_size, *row_shape]``, plus ``mask``
        unless short batches are dropped."""
        b = self.batch_size
        spec = {k: ArraySpec((b, *shape), dtype) for k, (shape, dtype) in self._rows.items()}
        if not self.sampler.drop_remainder:
            spec[MASK_KEY] = ArraySpec((b,), np.dtype(np.bool_))
        return spec

    def iter_epoch(self, epoch: int = 0, *, start: int = 0) -> Iterator[Batch]:
        # Checked now, not at the first batch, and the same way in both orders.
        epoch, start = self.sampler.check_position(epoch, start)
        disk = self._checked_disk()
        if self.order == "native":
            return self._iter_native(epoch, start, disk)
        return self._iter_sampler(epoch, start, disk)

    def _checked_disk(self) -> OnDiskFields:
        """The arrays this source reads (`_on_disk`), their files checked: still
        whole, and still the files the source was made from.

        Raises:
          ValueError: a file cut short, rewritten or replaced, named.
        """
        disk = self._on_disk()
        disk.check_whole()
        check_unchanged(self.dataset.name, self._files)
        if self.dataset.origin is not None:  # fetched from a store: its objects too
            self.dataset.origin.check()
        return disk

    def _iter_sampler(self, epoch: int, start: int, disk: OnDiskFields) -> Iterator[Batch]:
        plan = list(self.sampler.epoch_plan(epoch, start))
        index_batches = [indices for indices, _ in plan]
        # Blocks too: the read-ahead asks for each window's rows, and the kernel's
        # read-around of a fault that came first read blocks outside it.
        disk.advise(random_order=self.sampler.shuffle is True or self.sampler.shuffle == "blocks")
        ahead = disk.read_ahead(index_batches, populate=self._gathers_here())
        # Fields read in place from a store: the next batches' blocks asked for early.
        ranged = RangedReadAhead(self._ranged_fields(), index_batches)
        try:
            if self._pool is not None:
                fetched = self._pool.batches(index_batches, epoch)
            else:
                fetched = self._fetch(index_batches, epoch)
            for step, ((_, num_valid), batch) in enumerate(zip(plan, fetched, strict=True)):
                ahead.reached(step)
                ranged.reached(step)
                yield self._finish(batch, num_valid)
        finally:
            ahead.close()
            ranged.close()

    def _iter_native(self, epoch: int, start: int, disk: OnDiskFields) -> Iterator[Batch]:
        disk.advise(random_order=bool(self.sampler.shuffle))
        for batch in itertools.islice(self._native_batches(epoch), start, None):
            yield self._finish(batch, len(next(iter(batch.values()))))

    def __iter__(self) -> Iterator[Batch]:
        return self.iter_epoch(0)

    def _start_pool(self, backend: str, read: RowReader, num_workers: int) -> None:
        """With ``num_workers``, batches of the sampler order are read and
        transformed by a `RecordPool` of that many processes, not `_fetch`.

        Raises:
          ValueError: ``num_workers`` is not an int >= 0, or > 0 without a transform.
        """
        if check_workers(backend, num_workers, self.transform):
            self._pool = RecordPool(read, self.transform, num_workers)

    def close(self) -> None:
        """Stops the worker processes (if any); the next epoch starts new ones."""
        if self._pool is not None:
            self._pool.close()

    def _gathers_here(self) -> bool:
        """Whether this process gathers the rows (not worker processes, whose
        mappings are their own)."""
        return self._pool is None

    def _ranged_fields(self) -> list[np.ndarray | BytesField | RemoteField]:
        """The fields this process gathers batches from (those read in place
        from a store are read ahead): none where workers gather them, each
        from a cache of its own."""
        return list(self._read_fields().values()) if self._gathers_here() else []

    def _read_fields(self) -> Mapping[str, np.ndarray | BytesField]:
        """The dataset's fields this source reads (none where the backend reads
        the user's files itself, so a `deferred` dataset's are never built)."""
        return self.dataset.arrays

    def _on_disk(self) -> OnDiskFields:
        """The arrays this source reads, for the I/O room (a backend that reads
        its own mapped copy, hf, adds that)."""
        fields = self._read_fields()
        in_files, mapped = {}, []
        for name, array in fields.items():
            if isinstance(array, BytesField):
                mapped.extend(array.content())
                if array.places is not None:  # read in place from the user's files
                    in_files[name] = array.data
            elif not isinstance(array, RemoteField):  # a store's: its origin checks it
                mapped.append(array)
                in_files[name] = array
        nbytes = sum(array.nbytes for array in fields.values())
        return OnDiskFields(self.dataset.name, len(self.dataset), in_files, mapped, nbytes)

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
    def _fetch(
        self, index_batches: Sequence[np.ndarray], epoch: int
    ) -> Iterator[Mapping[str, np.ndarray]]:
        """Yields one batch per index array of ``epoch``, in order, read through
        the backend's own framework: every field of the dataset, or, with a
        transform, of its output (``self.transform.batch``)."""

    def _native_batches(self, epoch: int) -> Iterator[Mapping[str, np.ndarray]]:
        """`_native_epoch`, capped at and padded up to ``num_batches``: a
        framework's shards may differ by a row, but every process must yield
        the same number of batches (the missing ones are all padding)."""
        count = 0
        for batch in itertools.islice(self._native_epoch(epoch), self.num_batches):
            count += 1
            yield batch
        empty = {key: array[:0] for key, array in self.dataset.head.items()}
        for _ in range(count, self.num_batches):
            yield empty

    def _native_epoch(self, epoch: int) -> Iterator[Mapping[str, np.ndarray]]:
        """Yields this process's batches of ``epoch`` in the framework's own
        shuffled order; the last may be short (it is padded here). Backends
        that offer ``order="native"`` override this."""
        raise ValueError(f"{type(self).__name__} has no native order; use order='sampler'")

    def _finish(self, batch: Mapping[str, np.ndarray], num_valid: int) -> Batch:
        """Casts each field to the dataset's dtype and row shape; pads to
        ``batch_size`` with zero rows and adds ``mask``."""
        out = {
            key: np.asarray(batch[key], dtype=dtype).reshape(-1, *shape)
            for key, (shape, dtype) in self._rows.items()
        }
        if self.sampler.drop_remainder:
            return out
        if num_valid < self.batch_size:
            # Zeroed padding is backend-independent, so padded batches are
            # byte-identical across backends too.
            out = {key: pad_rows(value[:num_valid], self.batch_size) for key, value in out.items()}
        out[MASK_KEY] = np.arange(self.batch_size) < num_valid
        return out
