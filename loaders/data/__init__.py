"""Datasets: named ones, directories of arrays, the user's files, and the cache.
Its modules are internal.

- `catalog`: `load_dataset` and the dataset names.
- `named`: the named MNIST datasets.
- `mnist`: MNIST's files, checksums and downloads.
- `idx`: the IDX format.
- `encoded`: the ``digits-png`` records and their augmentation.
- `on_disk`: directories of ``.npy`` files, their splits and content digests.
- `cache`: the cache, and what it is trusted with.
- `remote`: datasets at URLs (``s3://``, ``gs://``, ...), fetched into the cache.
- `object_cache`: the bounded cache of a store's objects.
- `ranged_npy`: ``.npy`` objects read in place by ranged reads, through a bounded block cache.
- `ranged_parquet`: Parquet objects read in place, a row group per ranged read, through that cache.
- `ranged_tfrecord`: TFRecord shards read in place from an offset index per object version.
- `ranged_arrayrecord`: ArrayRecord files read in place, runs of chunks, from a chunk index.
- `ranged_values`: their bytes and ragged fields read in place, a batch's values at a time.
- `ranged_ahead`: the next batches' blocks of fields read in place, asked for ahead.
- `superseded`: copies a newer one of the same source replaces.
- `formats`: the user's files (TFRecord, ArrayRecord, Parquet, ...).
"""

from jaxfeed.loaders.data.catalog import DATASETS, SPLITS, DatasetLike, load_dataset

__all__ = ["DATASETS", "DatasetLike", "SPLITS", "load_dataset"]
