"""Hugging Face backend: a `datasets.Dataset` in Arrow, memory-mapped from the cache.

The split is written once as an Arrow dataset directory (``save_to_disk``)
under ``cache_root()/"hf"``, keyed by its content, and read back with
``load_from_disk``. Each batch is one gather: Arrow's ``take`` on the
dataset's table (default), or ``ds[indices]``.

Batches are read in ``"arrow"`` format and turned into numpy zero-copy: the
``"numpy"`` format upcasts every integer column to int64 and is ~6x slower.
Images are stored as a fixed-size list of ``H*W*C`` uint8 (``Array3D``
reads back ~40x slower) and reshaped on the way out, which is free.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pyarrow as pa

from loaders.cache import cache_root, fingerprint, writable_dir
from loaders.datasets import ArrayDataset
from loaders.sampler import Sampler
from loaders.source import SampledSource

OPTIONS = ("order", "read")
READS = ("take", "getitem")
_LAYOUT = "v1"  # bump when the stored columns change: old caches are then not reused


class HFSource(SampledSource):
    """Batches read from an Arrow `datasets.Dataset` memory-mapped from the cache.

    Args:
      dataset, sampler, order: see `SampledSource`. ``order="native"`` uses
        ``Dataset.shuffle`` (a new seed per epoch), ``Dataset.shard(...,
        contiguous=True)`` per process and ``Dataset.iter``.
      read: how a batch is gathered in sampler order. ``"take"`` (default):
        Arrow's ``Table.take`` on the dataset's table, joined into one chunk
        once when the source is made (a copy of the split in memory).
        ``"getitem"``: ``ds[indices]``, the `datasets` row access; it slices
        out every row separately and joins them, ~7x slower.
    """

    def __init__(
        self, dataset: ArrayDataset, sampler: Sampler, order: str = "sampler", read: str = "take"
    ):
        super().__init__(dataset, sampler, order)
        if read not in READS:
            raise ValueError(f"read must be one of {READS}, got {read!r}")
        self.read = read
        self.path = arrow_cache(dataset)
        self.rows = datasets.load_from_disk(str(self.path)).with_format("arrow")
        # The cache file holds 1,000-row record batches, and take() on a chunked
        # table joins all chunks on every call: join them once instead.
        self._table = self.rows[:].combine_chunks() if read == "take" else None

    def _fetch(self, index_batches: Sequence[np.ndarray]) -> Iterator[Mapping[str, np.ndarray]]:
        for indices in index_batches:
            if self._table is None:
                yield self._to_numpy(self.rows[indices])
            else:
                yield self._to_numpy(self._table.take(indices))

    def _native_epoch(self, epoch: int) -> Iterator[Mapping[str, np.ndarray]]:
        s = self.sampler
        ds = self.rows
        # keep_in_memory: the index mappings are tiny; don't write them into the cache.
        if s.shuffle:
            seed = int(np.random.SeedSequence((s.seed, epoch)).generate_state(1)[0])
            ds = ds.shuffle(seed=seed, keep_in_memory=True)
        if s.process_count > 1:
            ds = ds.shard(s.process_count, s.process_index, contiguous=True, keep_in_memory=True)
        for table in ds.iter(batch_size=s.batch_size, drop_last_batch=s.drop_remainder):
            yield self._to_numpy(table)

    def _to_numpy(self, table: pa.Table) -> dict[str, np.ndarray]:
        """Arrow columns to numpy: one copy to join the gathered rows, then views."""
        # ds[indices] returns one chunk per row; joining the whole table at once
        # is cheaper than joining column by column.
        (rows,) = table.combine_chunks().to_batches()
        pixels = rows.column("image").flatten().to_numpy()
        return {
            "image": pixels.reshape(-1, *self.dataset.images.shape[1:]),
            "label": rows.column("label").to_numpy(),
        }


def cache_path(dataset: ArrayDataset) -> Path:
    """Where ``dataset``'s Arrow copy lives: a readable name plus its content key."""
    slug = re.sub(r"[^a-z0-9]+", "-", dataset.name.lower()).strip("-")[:40]
    key = fingerprint(dataset.images, dataset.labels)
    return cache_root() / "hf" / f"{slug}-{key}-{_LAYOUT}"


def arrow_cache(dataset: ArrayDataset) -> Path:
    """The Arrow dataset directory holding ``dataset``, written on first use.

    Written into a scratch directory and renamed into place, so readers never
    see a half-written cache and concurrent builders (several processes of
    one job) can race safely: the loser discards its copy.

    Returns:
      A directory that ``datasets.load_from_disk`` reads.
    """
    path = cache_path(dataset)
    root = writable_dir(path.parent)
    if path.is_dir():
        return path
    pixels = dataset.images.reshape(len(dataset), -1)
    features = datasets.Features(
        {
            "image": datasets.Sequence(datasets.Value("uint8"), length=pixels.shape[1]),
            "label": datasets.Value("int32"),
        }
    )
    # Arrow arrays straight from the buffers: no per-row Python.
    columns = {
        "image": pa.FixedSizeListArray.from_arrays(pa.array(pixels.reshape(-1)), pixels.shape[1]),
        "label": pa.array(dataset.labels),
    }
    scratch = Path(tempfile.mkdtemp(dir=root, prefix=".build-"))
    scratch.chmod(0o755)  # mkdtemp makes it owner-only; the cache is not secret
    try:
        with _no_progress_bars():
            datasets.Dataset.from_dict(columns, features=features).save_to_disk(str(scratch))
        try:
            os.rename(scratch, path)
        except OSError:
            if not path.is_dir():
                raise  # not a lost race: a real failure
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return path


@contextlib.contextmanager
def _no_progress_bars() -> Iterator[None]:
    enabled = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if enabled:
            datasets.enable_progress_bars()


def build(dataset: ArrayDataset, sampler: Sampler, **options: Any) -> HFSource:
    """The backend's `BatchSource`; ``loaders.make`` has checked ``options``
    against `OPTIONS`."""
    return HFSource(dataset, sampler, **options)
