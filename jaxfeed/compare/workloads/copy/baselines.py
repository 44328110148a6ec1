"""What `jaxfeed compare` measures the adapters against.

* The in-memory ceiling: batches materialised as numpy arrays before timing
  starts, so "loading" is a list walk; nothing can feed a step faster.
* Each framework's tutorial loop, written the way its documentation teaches
  it (per-record reads, default collation), with ``jax.device_put`` on every
  batch as the JAX tutorials do.

Framework packages are imported inside the builders, so a missing one only
removes its baselines.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax
import numpy as np

from jaxfeed import loaders
from jaxfeed.loaders.protocol import ArraySpec, Batch, BatchSource

EpochFn = Callable[[int], Iterator[Batch]]


@dataclasses.dataclass(frozen=True)
class Baseline:
    """One reference loop.

    Attributes:
      name: row label, e.g. ``"torch-dataloader"``.
      framework: the backend it is the tutorial for (``None`` for the ceiling).
      description: the loop, in a line.
      batches: ``batches(epoch)`` yields host batches ``{"image", "label"}``.
      placed: ``placed(epoch)`` yields device batches; default ``jax.device_put``
        of every host batch.
      obj: the framework's own loader object the loop iterates (a torch
        ``DataLoader``, a ``tf.data.Dataset``, ...), for rows that hand the
        same object to `loaders.wrap` or Keras; None for the ceiling.
    """

    name: str
    framework: str | None
    description: str
    batches: EpochFn
    placed: Callable[[int], Iterator[dict[str, jax.Array]]] | None = None
    obj: Any = None

    def wrap(self, batch_size: int, **options: Any) -> BatchSource:
        """``loaders.wrap`` of the loop's object, as a user would call it."""
        if self.framework == "hf":  # a datasets.Dataset is a table of rows
            options["batch_size"] = batch_size
        return loaders.wrap(self.obj, **options)

    def device_batches(self, epoch: int) -> Iterator[dict[str, jax.Array]]:
        if self.placed is not None:
            return self.placed(epoch)
        return (jax.device_put(batch) for batch in self.batches(epoch))


class MaterializedSource:
    """A `BatchSource` over batches built ahead of time (the in-memory ceiling).

    Args:
      epochs: ``epochs[e]`` is the list of batches of epoch ``e``; epochs past
        the end reuse the lists cyclically.
    """

    def __init__(self, epochs: list[list[Batch]]):
        if not epochs or not epochs[0]:
            raise ValueError("MaterializedSource needs at least one epoch of batches")
        self.epochs = epochs

    @property
    def batch_size(self) -> int:
        return len(self.epochs[0][0]["label"])

    @property
    def num_batches(self) -> int:
        return len(self.epochs[0])

    @property
    def element_spec(self) -> Mapping[str, ArraySpec]:
        return {k: ArraySpec(v.shape, v.dtype) for k, v in self.epochs[0][0].items()}

    def iter_epoch(self, epoch: int = 0, *, start: int = 0) -> Iterator[Batch]:
        return iter(self.epochs[epoch % len(self.epochs)][start:])


def materialize(source: BatchSource, epochs: int, max_batches: int | None) -> MaterializedSource:
    """Reads ``epochs`` epochs of ``source`` into memory (at most ``max_batches`` each)."""
    lists = [
        [
            {k: np.array(v) for k, v in b.items()}
            for b in itertools.islice(source.iter_epoch(e), max_batches)
        ]
        for e in range(epochs)
    ]
    return MaterializedSource(lists)


def in_memory(source: MaterializedSource) -> Baseline:
    return Baseline(
        "in-memory",
        None,
        "pre-materialised numpy batches (a list built before timing), no loader",
        source.iter_epoch,
    )


def _torch(images: np.ndarray, labels: np.ndarray, batch_size: int, seed: int) -> Baseline:
    import torch
    from torch.utils.data import DataLoader, Dataset

    class MnistDataset(Dataset):
        def __len__(self) -> int:
            return len(labels)

        def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
            return images[index], labels[index]

    generator = torch.Generator().manual_seed(seed)
    loader = DataLoader(MnistDataset(), batch_size=batch_size, shuffle=True, generator=generator)

    def batches(epoch: int) -> Iterator[Batch]:
        for x, y in loader:
            yield {"image": x.numpy(), "label": y.numpy()}

    return Baseline(
        "torch-dataloader",
        "torch",
        "DataLoader(map-style Dataset, per-sample __getitem__, shuffle=True, default collate)",
        batches,
        obj=loader,
    )


def _tf(images: np.ndarray, labels: np.ndarray, batch_size: int, seed: int) -> Baseline:
    from jaxfeed.loaders._doors.tf import import_tensorflow  # quiet, GPU-free

    tf = import_tensorflow()
    ds = (
        tf.data.Dataset.from_tensor_slices((images, labels))
        .shuffle(len(labels), seed=seed)
        .batch(batch_size)
        .prefetch(tf.data.AUTOTUNE)
    )

    def batches(epoch: int) -> Iterator[Batch]:
        for x, y in ds.as_numpy_iterator():
            yield {"image": x, "label": y}

    return Baseline(
        "tf-data",
        "tf",
        "from_tensor_slices((x, y)).shuffle(N, seed).batch(B).prefetch(AUTOTUNE)",
        batches,
        obj=ds,
    )


def _grain(images: np.ndarray, labels: np.ndarray, batch_size: int, seed: int) -> list[Baseline]:
    import grain

    from jaxfeed.loaders.rows import ArrayRows

    # Per-record __getitem__, as Grain's tutorials write.
    records = ArrayRows({"image": images, "label": labels})

    sampler = grain.samplers.IndexSampler(
        num_records=len(records),
        shuffle=True,
        seed=seed,
        num_epochs=1,
        shard_options=grain.sharding.NoSharding(),
    )
    loader = grain.DataLoader(
        data_source=records,
        sampler=sampler,
        operations=[grain.transforms.Batch(batch_size)],
        worker_count=0,
    )
    dataset = grain.MapDataset.source(records).shuffle(seed=seed).batch(batch_size)
    iter_dataset = dataset.to_iter_dataset()

    def map_placed(epoch: int) -> Iterator[dict[str, jax.Array]]:
        # Grain 0.2.18 has grain.experimental.device_put (a CPU buffer, a
        # device_put map, a device buffer); older versions do not.
        device_put = getattr(getattr(grain, "experimental", None), "device_put", None)
        if device_put is None:
            return (jax.device_put(b) for b in iter_dataset)
        return iter(device_put(iter_dataset, jax.devices()[0]))

    return [
        Baseline(
            "grain-dataloader",
            "grain",
            "grain.DataLoader(per-record source, IndexSampler(shuffle), Batch(B), worker_count=0)",
            lambda epoch: iter(loader),
            obj=loader,
        ),
        Baseline(
            "grain-mapdataset",
            "grain",
            "MapDataset.source(src).shuffle(seed).batch(B).to_iter_dataset()"
            " + grain.experimental.device_put",
            lambda epoch: iter(iter_dataset),
            map_placed,
            obj=iter_dataset,
        ),
    ]


def _hf(images: np.ndarray, labels: np.ndarray, batch_size: int, seed: int) -> Baseline:
    import datasets

    # Fixed-shape Array3D features: the fastest layout a user would store. A
    # plain from_dict of the 4-D array infers nested lists, ~1000x slower to
    # read, which would make this baseline a straw man.
    features = datasets.Features(
        {
            "image": datasets.Array3D(shape=images.shape[1:], dtype="uint8"),
            "label": datasets.Value("int32"),
        }
    )
    ds = datasets.Dataset.from_dict({"image": images, "label": labels}, features=features)
    ds = ds.with_format("numpy")

    def batches(epoch: int) -> Iterator[Batch]:
        return ds.iter(batch_size=batch_size)

    return Baseline(
        "hf-iter",
        "hf",
        'Dataset.from_dict(arrays, Array3D features).with_format("numpy")'
        ".iter(batch_size=B), dataset order",
        batches,
        obj=ds,
    )


_TUTORIALS: dict[str, tuple[str, Callable[..., Baseline | list[Baseline]]]] = {
    "torch": ("torch", _torch),
    "tf": ("tensorflow", _tf),
    "grain": ("grain", _grain),
    "hf": ("datasets", _hf),
}


def tutorials(
    frameworks: list[str], images: np.ndarray, labels: np.ndarray, batch_size: int, seed: int
) -> list[Baseline]:
    """The tutorial loops of ``frameworks`` (names without one, or not installed, are skipped).

    The loops get writable copies of the arrays, as a user's own would be.
    """
    images, labels = np.array(images), np.array(labels)
    out: list[Baseline] = []
    for name in frameworks:
        if name not in _TUTORIALS or importlib.util.find_spec(_TUTORIALS[name][0]) is None:
            continue
        made = _TUTORIALS[name][1](images, labels, batch_size, seed)
        out.extend(made if isinstance(made, list) else [made])
    return out
