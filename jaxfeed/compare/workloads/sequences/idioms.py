"""Each framework's own way of batching rows of different lengths: the code
a user of that framework writes today, without jaxfeed, on the same token rows.

Each idiom is a function ``(rows, plan) -> epochs``: it builds its pipeline
once (timed as part of the first batch), and ``epochs(e)`` reads epoch ``e``
as numpy batches holding ``input_ids`` (0 on padding; token ids start at 1),
freshly shuffled. A framework's dynamic padding gives each batch the length of
its longest row, so each new length is another shape a jitted step compiles for.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

Batch = dict[str, np.ndarray]
Epochs = Callable[[int], Iterator[Batch]]


@dataclasses.dataclass(frozen=True)
class Plan:
    """What every row of the workload batches to: ``length`` (pad and pack),
    ``buckets`` (jaxfeed's bucket lengths, which tf's buckets get too)."""

    batch_size: int
    seed: int
    length: int
    buckets: tuple[int, ...]


def pad_to_longest(rows: Sequence[Sequence[int]]) -> Batch:
    """A ``DataCollatorWithPadding``-like collate: ``input_ids`` padded with 0
    to the batch's longest row, and ``attention_mask``."""
    lengths = np.array([len(r) for r in rows])
    ids = np.zeros((len(rows), lengths.max()), np.int32)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
    mask = np.arange(ids.shape[1]) < lengths[:, None]
    return {"input_ids": ids, "attention_mask": mask.astype(np.int32)}


def _tf_rows(rows: Sequence[np.ndarray], plan: Plan) -> Any:
    """The rows as tf.data elements, shuffled each epoch: a ragged tensor sliced
    by row, each slice mapped to a plain tensor (``padded_batch`` and
    ``bucket_by_sequence_length`` refuse the ragged slices themselves)."""
    from jaxfeed.loaders._doors.tf import import_tensorflow

    tf = import_tensorflow()
    ragged = tf.RaggedTensor.from_row_lengths(np.concatenate(rows), [len(r) for r in rows])
    ds = tf.data.Dataset.from_tensor_slices(ragged).map(lambda ids: ids)
    return tf, ds.shuffle(len(rows), seed=plan.seed, reshuffle_each_iteration=True)


def _tf_epochs(ds: Any) -> Epochs:
    def epochs(epoch: int) -> Iterator[Batch]:
        for ids in ds.as_numpy_iterator():
            yield {"input_ids": ids}

    return epochs


def tf_padded_batch(rows: Sequence[np.ndarray], plan: Plan) -> Epochs:
    """``shuffle().padded_batch(B)``: each batch padded to its longest row."""
    tf, ds = _tf_rows(rows, plan)
    return _tf_epochs(ds.padded_batch(plan.batch_size).prefetch(tf.data.AUTOTUNE))


def tf_bucket_by_sequence_length(rows: Sequence[np.ndarray], plan: Plan) -> Epochs:
    """``shuffle().bucket_by_sequence_length(...)`` with jaxfeed's bucket
    lengths, each batch padded to its bucket's length (``pad_to_bucket_boundary``:
    tf pads to a boundary less one, so the boundaries are the lengths plus one)."""
    tf, ds = _tf_rows(rows, plan)
    ds = ds.bucket_by_sequence_length(
        lambda ids: tf.shape(ids)[0],
        bucket_boundaries=[n + 1 for n in plan.buckets],
        bucket_batch_sizes=[plan.batch_size] * (len(plan.buckets) + 1),
        pad_to_bucket_boundary=True,
    )
    return _tf_epochs(ds.prefetch(tf.data.AUTOTUNE))


def torch_pad_sequence(rows: Sequence[np.ndarray], plan: Plan) -> Epochs:
    """``DataLoader(shuffle=True, collate_fn=...)`` over a list of tensors,
    collated by ``pad_sequence(batch_first=True)``: padded to the longest row."""
    import torch
    from torch.nn.utils.rnn import pad_sequence

    def collate(batch: list[Any]) -> Any:
        return pad_sequence(batch, batch_first=True, padding_value=0)

    loader = torch.utils.data.DataLoader(
        [torch.from_numpy(row) for row in rows],
        batch_size=plan.batch_size,
        shuffle=True,
        generator=torch.Generator().manual_seed(plan.seed),
        collate_fn=collate,
    )

    def epochs(epoch: int) -> Iterator[Batch]:
        for ids in loader:
            yield {"input_ids": ids.numpy()}

    return epochs


def hf_dynamic_padding(rows: Sequence[np.ndarray], plan: Plan) -> Epochs:
    """A ``datasets.Dataset`` of token lists, ``shuffle(seed)`` each epoch,
    ``iter(batch_size)``, each batch collated by `pad_to_longest` (what
    ``DataCollatorWithPadding`` does, without transformers)."""
    import datasets

    table = datasets.Dataset.from_dict({"input_ids": [row.tolist() for row in rows]})

    def epochs(epoch: int) -> Iterator[Batch]:
        shuffled = table.shuffle(seed=plan.seed + epoch)
        for batch in shuffled.iter(batch_size=plan.batch_size):
            yield pad_to_longest(batch["input_ids"])

    return epochs


def _as_record(row: np.ndarray) -> dict[str, np.ndarray]:
    return {"input_ids": row}


def _grain_packed(packer: str) -> Callable[[Sequence[np.ndarray], Plan], Epochs]:
    def idiom(rows: Sequence[np.ndarray], plan: Plan) -> Epochs:
        import grain
        from grain import experimental

        pack = getattr(experimental, packer)

        def epochs(epoch: int) -> Iterator[Batch]:
            seed = plan.seed + epoch
            ds = grain.MapDataset.source(rows).shuffle(seed=seed).map(_as_record)
            ds = pack(
                ds.to_iter_dataset(),
                length_struct={"input_ids": plan.length},
                num_packing_bins=plan.batch_size,
                seed=seed,
            )
            yield from ds.batch(plan.batch_size)

        return epochs

    idiom.__doc__ = (
        f"``MapDataset.source(rows).shuffle()``, ``experimental.{packer}`` into rows of "
        "the pack length (a batch's worth of bins), ``batch(B)``"
    )
    return idiom


grain_first_fit = _grain_packed("FirstFitPackIterDataset")
grain_best_fit = _grain_packed("BestFitPackIterDataset")


@dataclasses.dataclass(frozen=True)
class Idiom:
    """One framework's way: its row name, its layout in words, and how to open it."""

    name: str
    layout: str
    description: str
    open: Callable[[Sequence[np.ndarray], Plan], Epochs]


IDIOMS: dict[str, tuple[Idiom, ...]] = {
    "torch": (
        Idiom(
            "torch-pad-sequence",
            "pad to longest",
            "DataLoader(shuffle=True) over tensors, collate_fn=pad_sequence(batch_first=True)",
            torch_pad_sequence,
        ),
    ),
    "tf": (
        Idiom(
            "tf-padded-batch",
            "pad to longest",
            "tf.data from_tensor_slices(ragged).shuffle().padded_batch(B)",
            tf_padded_batch,
        ),
        Idiom(
            "tf-bucket-by-length",
            "bucket",
            "tf.data shuffle().bucket_by_sequence_length(jaxfeed's bucket lengths, "
            "pad_to_bucket_boundary=True)",
            tf_bucket_by_sequence_length,
        ),
    ),
    "grain": (
        Idiom(
            "grain-first-fit",
            "pack first-fit",
            "MapDataset.shuffle(), experimental.FirstFitPackIterDataset(num_packing_bins=B), "
            "batch(B)",
            grain_first_fit,
        ),
        Idiom(
            "grain-best-fit",
            "pack best-fit",
            "MapDataset.shuffle(), experimental.BestFitPackIterDataset(num_packing_bins=B), "
            "batch(B)",
            grain_best_fit,
        ),
    ),
    "hf": (
        Idiom(
            "hf-dynamic-padding",
            "pad to longest",
            "datasets.Dataset.shuffle(seed).iter(B), a DataCollatorWithPadding-like collate",
            hf_dynamic_padding,
        ),
    ),
}
"""Each backend's framework's idioms; numpy has none (jaxfeed's numpy rows
are the plain reference)."""
