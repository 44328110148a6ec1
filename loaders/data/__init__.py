"""Datasets: named ones (MNIST and its variants), IDX files, downloads and the cache."""

from jaxfeed.loaders.data.catalog import DATASETS, SPLITS, DatasetLike, load_dataset

__all__ = ["DATASETS", "SPLITS", "DatasetLike", "load_dataset"]
