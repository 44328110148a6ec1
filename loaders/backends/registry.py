"""Backends by name, imported lazily; a missing package becomes a clear error."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import importlib.util
import os
from collections.abc import Mapping, Sequence
from typing import Any

from jaxfeed.loaders.checks import check_batch_size, check_bool, check_seed
from jaxfeed.loaders.data.catalog import DatasetLike, load_dataset
from jaxfeed.loaders.host_fields import HostFieldSource, split_host_fields
from jaxfeed.loaders.mixture_plan import Mixture
from jaxfeed.loaders.protocol import BatchSource
from jaxfeed.loaders.sampler import Sampler, default_block_rows
from jaxfeed.loaders.sequence_plan import Bucket, Pack, Pad, as_layout
from jaxfeed.loaders.transform import RecordFn, RecordTransform


@dataclasses.dataclass(frozen=True)
class Backend:
    """A registered backend.

    Attributes:
      name: what users pass to ``make`` / ``--loader``.
      module: the adapter module; it defines ``OPTIONS`` (the option names it
        takes) and ``build(dataset, sampler, **options)``.
      requires: import names the adapter needs.
      dists: their distributions on PyPI (whose versions ``available`` shows).
      description: one line for listings.
      extra: jaxfeed's pip extra that installs them; None for core packages.
      on_request: run only when named, not by "every backend" runs (compare's
        default, the quickstart): it starts or joins a cluster.
    """

    name: str
    module: str
    requires: tuple[str, ...]
    dists: tuple[str, ...]
    description: str
    extra: str | None = None
    on_request: bool = False

    def install_line(self) -> str:
        """What to run to get this backend's packages."""
        if self.extra is None:
            return f"pip install {' '.join(self.dists)}"
        return f'pip install "jaxfeed[{self.extra}]"'

    def missing(self) -> str | None:
        """The first required package that cannot be imported, or None."""
        for package in self.requires:
            if importlib.util.find_spec(package) is None:
                return package
        return None

    def version(self) -> str:
        return ", ".join(f"{d} {importlib.metadata.version(d)}" for d in self.dists)


BACKENDS: dict[str, Backend] = {}


def register(backend: Backend) -> None:
    BACKENDS[backend.name] = backend


for _backend in (
    Backend(
        "numpy", "jaxfeed.loaders.backends.numpy", ("numpy",), ("numpy",), "in-memory numpy arrays"
    ),
    Backend(
        "torch",
        "jaxfeed.loaders.backends.torch",
        ("torch",),
        ("torch",),
        "torch DataLoader",
        "torch",
    ),
    Backend(
        "tf",
        "jaxfeed.loaders.backends.tf",
        ("tensorflow", "tensorflow_datasets"),
        ("tensorflow", "tensorflow-datasets"),
        "tf.data over a TFDS dataset directory",
        "tf",
    ),
    Backend(
        "grain",
        "jaxfeed.loaders.backends.grain",
        ("grain",),
        ("grain",),
        "Grain MapDataset",
        "grain",
    ),
    Backend(
        "hf",
        "jaxfeed.loaders.backends.hf",
        ("datasets",),
        ("datasets",),
        "HF datasets (Arrow)",
        "hf",
    ),
    Backend(
        "ray",
        "jaxfeed.loaders.backends.ray",
        ("ray",),
        ("ray",),
        "Ray tasks on a Ray cluster (local or joined)",
        "ray",
        on_request=True,
    ),
):
    register(_backend)


def get(name: str) -> Backend:
    """The backend called ``name``, its packages checked.

    Raises:
      ValueError: unknown name (the message lists the known ones).
      ImportError: a package the backend needs is not installed.
    """
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; choose one of {sorted(BACKENDS)}")
    backend = BACKENDS[name]
    missing = backend.missing()
    if missing is not None:
        raise ImportError(
            f"backend {name!r} needs the package {missing!r}, which is not installed; "
            f"run: {backend.install_line()}"
        )
    return backend


def available() -> dict[str, str]:
    """Each backend with its package version, or why it cannot be used here.

    Example:
      >>> loaders.available()["numpy"]
      'numpy 2.4.6'
    """
    status = {}
    for name, backend in BACKENDS.items():
        missing = backend.missing()
        if missing is None:
            status[name] = backend.version()
        else:
            status[name] = f"unavailable: {backend.install_line()}"
    return status


def everyday() -> list[str]:
    """The installed backends that "every backend" runs use (all but those
    run on request, which start or join a cluster)."""
    return [n for n, b in BACKENDS.items() if not b.on_request and b.missing() is None]


def make(
    backend: str = "numpy",
    *,
    dataset: DatasetLike = "mnist",
    split: str = "train",
    batch_size: int = 128,
    seed: int = 0,
    shuffle: bool | str = True,
    drop_remainder: bool = False,
    data_dir: str | os.PathLike | None = None,
    process_index: int = 0,
    process_count: int = 1,
    block_rows: int | None = None,
    window_blocks: int | None = None,
    transform: RecordFn | None = None,
    format: str | None = None,
    host_fields: Sequence[str] = (),
    pad: int | Pad | None = None,
    bucket: Sequence[int] | Bucket | bool | None = None,
    pack: int | Pack | None = None,
    storage_options: Mapping[str, Any] | None = None,
    **backend_options: Any,
) -> BatchSource:
    """A `BatchSource` reading ``dataset``/``split`` through ``backend``.

    Every built-in backend yields byte-identical batches for the same
    ``seed``, ``batch_size``, ``shuffle`` and ``drop_remainder``, for any
    dataset: each builds its native pipeline from the data's own field
    names, dtypes and row shapes, and ``element_spec`` comes from the data.

    Args:
      backend: a name from ``available()``.
      dataset: your data (a dict of numpy arrays sharing a row axis, or an
        `ArrayDataset`), ``"mnist"``, ``"mnist-sample"``, ``"mnist-10k"``, an
        IDX directory, or your files: a directory, glob or list of TFRecord,
        ArrayRecord, Parquet or Arrow files, an image folder, a prepared TFDS
        or Hugging Face directory (see `load_dataset`).
      split: ``"train"`` or ``"test"`` (for names and directories).
      batch_size: process-local batch size.
      seed: with the epoch number, defines the order.
      shuffle: ``True``: a new full permutation every epoch. ``"blocks"``: a
        new block permutation every epoch, for data on disk that is bigger
        than memory: blocks of ``block_rows`` contiguous rows (default: about
        1 MiB of rows) in a random order, with the rows of each
        ``window_blocks`` consecutive blocks (default 16) shuffled together,
        so reads are long and contiguous (see docs/data.md). For your files,
        no block straddles two shards or Parquet row groups. ``False``:
        dataset order.
      drop_remainder: drop the last partial batch instead of padding it.
      data_dir: directory holding the IDX files (else resolved; see docs/data.md).
      process_index, process_count: this process's slice of each global batch.
      block_rows, window_blocks: the blocks of ``shuffle="blocks"``.
      transform: ``fn(record, rng) -> dict``, run on every record: one row's
        values in (numpy rows; ``bytes`` for an encoded field), fixed-shape
        numbers out (they are the batches and ``element_spec``). ``rng`` is
        a ``numpy.random.Generator`` seeded from ``(seed, epoch, row)``, so
        a random augmentation is byte-identical across backends, process
        counts and resumes, and new every epoch. Each backend runs it where
        its framework runs per-record work, in ``num_workers`` processes
        (tf: parallel ``map`` calls); see docs/data.md. Needed by a dataset
        with an encoded bytes field.
      format: what the files hold (``"tfrecord"``, ``"arrayrecord"``,
        ``"parquet"``, ``"arrow"``, ``"imagefolder"``, ``"tfds"``, ``"hf"``);
        None: detected from the files.
      host_fields: fields kept on the host, never placed on a device (e.g. a
        text column: ``("text",)``): each batch carries their rows as numpy
        (``bytes`` fields as object arrays of ``bytes``), in the shared order,
        outside ``element_spec`` and ``transform`` (see
        `jaxfeed.loaders.host_fields`).
      pad, bucket, pack: how rows of different lengths (a `RaggedField`:
        token ids, frames) become static ``[B, L]`` batches: ``pad=L`` (or
        `Pad`), ``bucket=(64, 128, 256)`` (or `Bucket`, ``True`` for lengths
        from the histogram), ``pack=L`` (or `Pack`); one of them, needed by
        a dataset with such a field (see `jaxfeed.loaders.sequence_plan` and
        docs/sequences.md). A ``transform`` then runs once over every row
        (epoch 0's generator) before the lengths are planned.
      storage_options: for a dataset URL (``s3://``, ``gs://``, ``hf://``,
        ``https://``), the store's options as fsspec takes them
        (``{"anon": True}``, ``{"endpoint_url": ...}``); see docs/storage.md.
      **backend_options: passed to the backend (e.g. ``num_workers``).

    Returns:
      A `BatchSource`.

    Raises:
      ValueError: unknown backend, dataset or split; a bad field in your data
        (named); a bytes field without a ``transform``; a batch size below 1
        or larger than the split; a seed outside ``[0, 2**32 - 1]``.
      TypeError: an option the backend does not take; a transform that is
        not callable, or not picklable while worker processes need it; a batch size or seed
        that is not an int (numpy integers are fine; bools and floats are not); a
        ``drop_remainder`` that is not a bool.
      ImportError: the backend's package is missing.
      TransformError: the transform fails on row 0 or returns anything but
        a dict of numbers.

    Example:
      >>> source = loaders.make("numpy", dataset="mnist-sample", batch_size=32)
      >>> batch = next(source.iter_epoch(0))
      >>> batch["image"].shape, batch["label"].dtype
      ((32, 28, 28, 1), dtype('int32'))
      >>> mine = {"x": np.zeros((100, 3, 32, 32), np.float32), "y": np.arange(100)}
      >>> loaders.make("torch", dataset=mine, batch_size=16).element_spec["x"]
      ArraySpec(shape=(16, 3, 32, 32), dtype=dtype('float32'))
    """
    spec = get(backend)
    # Before the dataset loads (which may download): bad numbers fail at once.
    check_batch_size(batch_size)
    check_seed(seed)
    check_bool("drop_remainder", drop_remainder)
    layout = as_layout(pad, bucket, pack)
    if isinstance(dataset, Mixture):
        return _mixture(spec, dataset, locals(), backend_options)
    data = load_dataset(
        dataset, split, data_dir=data_dir, format=format, storage_options=storage_options
    )
    if layout is not None:  # the plan needs every row's length: the fields as they are
        data = data.with_fields()
    transform = data.transform if transform is None else transform
    if layout is not None and transform is not None:
        from jaxfeed.loaders.backends.sequence_source import transformed

        data, transform = transformed(data, transform, seed), None
    ragged = data.ragged_fields()
    if ragged and layout is None:
        raise ValueError(
            f"dataset {data.name}: field(s) {ragged} hold rows of different lengths; pass "
            "pad=L (every row padded to L), bucket=(64, 128, ...) (a few lengths) or pack=L "
            "(rows packed into rows of L) to batch them (docs/sequences.md)"
        )
    if layout is not None and not ragged:
        raise ValueError(
            f"dataset {data.name} has no field of rows of different lengths for {layout} to "
            "batch; leave pad=/bucket=/pack= out"
        )
    if shuffle == "blocks" and block_rows is None:
        block_rows = default_block_rows(sum(a.nbytes for a in data.head.values()))
    try:
        sampler = Sampler(
            num_examples=len(data),
            batch_size=batch_size,
            seed=seed,
            shuffle=shuffle,
            drop_remainder=drop_remainder,
            process_index=process_index,
            process_count=process_count,
            block_rows=block_rows,
            window_blocks=window_blocks,
            # Blocks follow the files / row groups the rows were read from.
            units=(data.units or None) if shuffle == "blocks" else None,
        )
    except ValueError as err:  # the sampler knows sizes, not names: say which split
        raise ValueError(f"dataset {data.name.rsplit('/', 1)[0]}, {split} split: {err}") from None
    module = _module(spec, backend_options)
    if layout is not None:
        if host_fields or backend_options.get("order", "sampler") != "sampler":
            raise ValueError(
                f"{layout} batches follow the plan of the shared sampler's order; "
                "drop host_fields= and order="
            )
        from jaxfeed.loaders.backends.sequence_source import SequenceSource

        return SequenceSource(module, data, sampler, layout, backend_options)
    host: dict = {}
    if host_fields:
        if backend_options.get("order", "sampler") != "sampler":
            raise ValueError("host_fields follow the shared sampler's order; drop order=")
        data, host = split_host_fields(data, host_fields)
    if transform is not None:
        backend_options["transform"] = RecordTransform(transform, seed, data)
    source = module.build(data, sampler, **backend_options)
    return HostFieldSource(source, host, sampler) if host else source


def _mixture(spec: Backend, mixture: Mixture, args: Mapping[str, Any], options: dict) -> Any:
    """`make` of a `Mixture`: its components loaded as ``dataset`` would be;
    with ``pad=``/``bucket=``/``pack=``, laid out in the mixture's order."""
    if args["host_fields"]:
        raise ValueError("a Mixture takes no host_fields= yet; leave it out")
    if options.get("order", "sampler") != "sampler":
        raise ValueError("a Mixture follows its own plan; drop order=")
    module = _module(spec, options)
    split, data_dir, format = args["split"], args["data_dir"], args["format"]
    storage = args["storage_options"]

    def load(dataset: Any) -> Any:
        return load_dataset(
            dataset, split, data_dir=data_dir, format=format, storage_options=storage
        )

    sampler_args = {
        k: args[k]
        for k in (
            "batch_size",
            "seed",
            "shuffle",
            "drop_remainder",
            "process_index",
            "process_count",
            "block_rows",
            "window_blocks",
        )
    }
    if args["layout"] is not None:
        from jaxfeed.loaders.backends.mixed_sequences import mixed_sequence_source

        return mixed_sequence_source(
            module, mixture, load, args["transform"], sampler_args, args["layout"], options
        )
    from jaxfeed.loaders.backends.mixture_source import mixture_source

    return mixture_source(module, mixture, load, args["transform"], sampler_args, options)


def _module(spec: Backend, options: Mapping[str, Any]) -> Any:
    """The backend's adapter module, once ``options`` are known to be its own.

    Raises:
      TypeError: an option the backend does not take.
    """
    module = importlib.import_module(spec.module)
    unknown = sorted(set(options) - set(module.OPTIONS))
    if unknown:
        raise TypeError(
            f"the {spec.name} backend got unknown option(s) {unknown}; "
            f"it takes {list(module.OPTIONS)}"
        )
    return module
