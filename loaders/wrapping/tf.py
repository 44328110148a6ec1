"""A tf.data pipeline as a wrapped stream, resumed with tf.data's own checkpoint.

Each new iterator of a dataset that shuffles with ``reshuffle_each_iteration``
draws its order from random state the dataset keeps in the process, shared by
all its iterators: a fresh process's first iterator shuffles as epoch 0 did.
tf.data's checkpoint of an iterator (``tf.train.Checkpoint(iterator=...)``)
holds that state and its buffers, and restoring it sets the shared state
back, so the iterators made after it reshuffle as they did in the first run.

The checkpoint holds whole buffers (a shuffle buffer's rows), so it is taken
once per pass, at its start, and a position in the pass is reached by
reading the batches before it again (docs/resuming.md).
Another iterator of the same dataset, made elsewhere while training, draws
from the same random state and changes the passes after it.
"""

from __future__ import annotations

import base64
import os
import re
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from jaxfeed.loaders._doors import tf as tf_door
from jaxfeed.loaders.wrapping.epochs import Epochs, WrapSettings
from jaxfeed.loaders.wrapping.random_access import RandomAccess, sampled_epochs, stack
from jaxfeed.loaders.wrapping.raw_batches import map_leaves
from jaxfeed.loaders.wrapping.streams import MIXTURE, own_order, stream_epochs


def _leading_dim(spec: Any) -> int | None:
    """None: unknown (batched by ``.batch(n)``); 0: a scalar (unbatched)."""
    rank = spec.shape.rank
    return None if rank is None else 0 if rank == 0 else spec.shape[0]


def _leaves(tree: Any) -> list[Any]:
    leaves: list[Any] = []
    map_leaves(leaves.append, tree)
    return leaves


def wrap_dataset(dataset: Any, settings: WrapSettings, **_: Any) -> Epochs:
    """A tf.data pipeline, in its own order. On several processes it is
    sharded with ``Dataset.shard(process_count, process_index)``: its rows
    before wrap batches them, or, for a pipeline that batches itself, its
    batches (process ``p`` reads batches ``p, p + P, ...``); a known length
    gives every process the same number of batches (padding ones masked)."""
    kind = "tf.data.Dataset"
    own_order(kind, settings, "it is a stream")
    batch_size, drop_remainder = settings.batch_size, settings.drop_remainder
    count, index = settings.process_count, settings.process_index
    if count > 1:
        _check_shardable(dataset)
    dims = {_leading_dim(spec) for spec in _leaves(dataset.element_spec)}
    rows = None
    batched = _yields_batches(dataset)
    if batched:
        if len(dims) == 1 and None not in dims and 0 not in dims:
            (native,), full = dims, True  # .batch(n, drop_remainder=True)
            if batch_size not in (None, native):
                raise ValueError(
                    f"the tf.data.Dataset yields batches of {native} but batch_size="
                    f"{batch_size}; omit batch_size, or build it with .batch({batch_size})"
                )
        else:  # .batch(n): the last batch may be short
            native, full = None, False
    elif batched is None:
        raise ValueError(
            "wrap cannot tell whether this tf.data.Dataset yields rows or batches: its "
            "pipeline has no .batch() and does not start from from_tensor_slices, range or "
            "files (a from_generator, from_tensors or interleave may yield either). If its "
            "elements are rows, end it with .batch(N); if they are batches, end it with "
            ".unbatch() and pass batch_size=N"
        )
    elif batch_size is not None:
        rows = int(dataset.cardinality())
        if count > 1:
            dataset = dataset.shard(count, index)
        dataset = dataset.batch(batch_size, drop_remainder=drop_remainder)
        native, full = batch_size, drop_remainder
    else:
        raise ValueError(
            "this tf.data.Dataset yields single examples (rows); pass batch_size= to batch "
            "them, or call .batch() on it first"
        )
    cardinality = int(dataset.cardinality())  # -1 infinite, -2 unknown
    num = cardinality if cardinality >= 0 and (full or not drop_remainder) else None
    if count > 1 and rows is None:  # batched by the user: shard its batches
        dataset = dataset.shard(count, index)
    pad_to = None
    if count > 1 and cardinality >= 0:
        num = pad_to = _shard_batches(rows, cardinality, settings, full)
    cursor = TfCursor(dataset, pad_to)
    rows = rows if rows is not None and rows >= 0 else None
    return stream_epochs(
        kind,
        cursor,
        settings,
        endless=cardinality == -1,
        num_batches=num,
        batch_size=native,
        num_rows=rows,
    )


def _yields_batches(dataset: Any) -> bool | None:
    """Whether the pipeline's elements are batches (a batching op is the last
    one that changes what an element is), rows (it starts from a source of
    rows or ends in ``.unbatch()``), or None when wrap cannot tell.

    TF has no public way to walk a pipeline: the tf door reads its inputs."""
    node = dataset
    while True:
        name = type(node).__name__
        if name in tf_door.BATCHING:
            return True
        if name in tf_door.ROWS:
            return False
        inputs = tf_door.pipeline_inputs(node)
        if len(inputs) == 1 and name not in tf_door.NESTED:
            node = inputs[0]
            continue
        answers = {_yields_batches(child) for child in inputs}  # zip, concatenate, ...
        return answers.pop() if len(answers) == 1 else None


def _shard_batches(rows: int | None, batches: int, settings: WrapSettings, full: bool) -> int:
    """Batches per epoch on every process, the fewest (short batches dropped)
    or the most (the missing ones padded) that any process's shard holds."""
    count, drop = settings.process_count, settings.drop_remainder
    if rows is not None and rows >= 0:  # rows sharded, then batched by wrap
        size, most = settings.batch_size, -(-rows // count)
        return (rows // count) // size if drop else -(-most // size)
    if drop and not full:  # the last batch may be short: only the ones before it count
        return (batches - 1) // count
    return batches // count if drop else -(-batches // count)


class TfCursor:
    """tf.data's passes, resumed with tf.data's own checkpoint (see the module
    docstring).

    A finite pipeline is read with a new iterator per pass, checkpointed as it
    is made. Restoring that checkpoint also sets the shuffle's random state,
    so the passes after it reshuffle as they did. (A checkpoint taken once a
    pass's shuffle iterator is used up would not hold that state: tf.data
    drops it, so a checkpoint is never taken there.) An endless one is one
    iterator, checkpointed where asked.

    Args:
      dataset: one pass (this process's shard, batched), or the endless stream.
      pad_to: batches per pass, the missing ones empty (several processes).
    """

    per_batch = False
    restartable = False

    def __init__(self, dataset: Any, pad_to: int | None):
        import tensorflow as tf  # the user has it: they made the dataset

        self._tf, self._dataset, self._pad_to = tf, dataset, pad_to
        self._spec = dataset.element_spec
        self._endless = int(dataset.cardinality()) == -1
        # Why tf.data cannot checkpoint this pipeline; None: it can.
        self._cannot: str | None = (
            _shuffle_state_lost(dataset) if self._endless else _fresh_shuffle(dataset)
        )
        self.keep_state = True  # False: no checkpoints taken (nothing will ask for one)
        self._iterator: Any = None
        self._start: dict[str, str] | None = None  # the checkpoint of this pass's start
        self._served = 0  # batches of this pass served, padding ones too
        self._template: Any = None  # a real batch, shaped like the empty padding ones

    @property
    def refusal(self) -> str | None:
        if self._cannot is None and not self.keep_state:
            return (
                "it kept no tf.data checkpoints for an epoch read through "
                "without_data_state() (as jaxfeed.fit reads when it does not checkpoint); "
                "read the epoch to resume from through the source itself"
            )
        return self._cannot

    def begin(self, pass_: int, state: Any, in_pass: int) -> int:
        self._iterator = None  # its buffers are let go before the next ones fill
        self._iterator = self._dataset.as_numpy_iterator()
        self._served = 0
        if state is None:
            self._start = None if self._endless else self._checkpoint()
            return 0
        self._restore(state["files"])
        self._served = state["at"]
        self._start = None if self._endless else state["files"]
        return state["at"]  # the stream reads on up to in_pass again

    def next(self) -> Any:
        if self._pad_to is not None and self._served >= self._pad_to:
            raise StopIteration  # (several processes: this shard has more batches than all)
        try:
            batch = next(self._iterator)
            self._template = batch if self._template is None else self._template
        except StopIteration:
            if self._pad_to is None or self._served >= self._pad_to:
                raise
            batch = _empty_like(self._template, self._spec)
        self._served += 1
        return batch

    def state(self) -> Any:
        if self._endless:
            files = self._checkpoint()
            return None if files is None else {"files": files, "at": self._served}
        return None if self._start is None else {"files": self._start, "at": 0}

    def _checkpoint(self) -> dict[str, str] | None:
        """tf.data's checkpoint of the iterator, its files base64; None (and
        a refusal) if tf.data cannot checkpoint this pipeline."""
        if self.refusal is not None:
            return None
        try:
            with tempfile.TemporaryDirectory(prefix="jaxfeed-tf-") as directory:
                prefix = self._tf.train.Checkpoint(iterator=self._iterator).write(
                    os.path.join(directory, "iterator")
                )
                return {
                    os.path.basename(path): base64.b64encode(_read(path)).decode("ascii")
                    for path in self._tf.io.gfile.glob(prefix + "*")
                }
        except self._tf.errors.OpError as error:
            # "{{function_node ...}} EagerPyFunc is stateful. [Op:SerializeIterator] name:"
            reason = re.sub(r"\{\{.*?\}\}|\[Op:.*", "", str(error.message)).strip(" .\n")
            self._cannot = (
                f"tf.data cannot checkpoint this pipeline ({reason}); stateful ops such as "
                f"tf.py_function or unseeded random ops in .map() keep state outside it. "
                f"Use stateless ops (tf.random.stateless_*), or a random-access dataset"
            )
            return None

    def _restore(self, files: Mapping[str, str]) -> None:
        with tempfile.TemporaryDirectory(prefix="jaxfeed-tf-") as directory:
            for name, data in files.items():
                with open(os.path.join(directory, os.path.basename(name)), "wb") as out:
                    out.write(base64.b64decode(data))
            checkpoint = self._tf.train.Checkpoint(iterator=self._iterator)
            checkpoint.read(os.path.join(directory, "iterator")).assert_consumed()


def _read(path: str) -> bytes:
    with open(path, "rb") as file:
        return file.read()


def _shuffle_state_lost(dataset: Any) -> str | None:
    """Why an endless pipeline cannot be checkpointed exactly: a step between
    a ``.repeat()`` and a reshuffling ``.shuffle()`` below it may hold the
    used-up shuffle iterator when a checkpoint is taken, and tf.data's
    checkpoint then leaves out the random state the next pass draws from.
    None when there is no such step.

    TF has no public way to walk a pipeline: the tf door reads its inputs
    and whether a shuffle reshuffles.
    """
    todo = [(dataset, None)]  # (node, the first non-pass-through step under a repeat)
    while todo:
        node, held = todo.pop()
        name = type(node).__name__
        if held and tf_door.reshuffles_each_iteration(node):
            return (
                f"its .repeat() is above a reshuffling .shuffle() with {held.strip('_')} "
                f"between them, and tf.data's checkpoint at the end of a pass there would "
                f"leave out the random state the next pass draws; put .repeat() right "
                f"after .shuffle() (e.g. .shuffle(n).repeat().batch(b)), or pass the "
                f"finite dataset without .repeat() and steps_per_epoch"
            )
        if name == tf_door.REPEAT:
            held = ""
        elif held == "" and name not in tf_door.PASS_THROUGH:
            held = name
        todo.extend((child, held) for child in tf_door.pipeline_inputs(node))
    return None


def _fresh_shuffle(dataset: Any) -> str | None:
    """Why a pass-by-pass pipeline cannot be resumed exactly: an unseeded
    ``.shuffle()`` (or mixture, `_unseeded_random`) draws the order of every
    pass after a resume from a fresh process's random seed, so those epochs
    would differ from the run's (the interrupted epoch itself is restored).
    None when every random step is seeded."""
    what = _unseeded_random(dataset)
    if what is None:
        return None
    if what == _MIXING:
        return (
            f"its {what} draws without a seed, so after a resume (a fresh process) every "
            f"later epoch would mix the sources in another order than the run it continues; "
            f"{_SEED_THE_MIX}"
        )
    example = " (e.g. .shuffle(1000, seed=0): each epoch still reshuffles)"
    return (
        f"its {what} has no seed, so after a resume (a fresh process) every later epoch "
        f"would be shuffled differently from the run it continues; pass seed= to {what}"
        f"{example if what == '.shuffle()' else ''}, or call tf.random.set_seed(...) before "
        f"building the pipeline"
    )


def _empty_like(tree: Any, spec: Any) -> Any:
    """A batch of no rows shaped like ``tree`` (or, with no batch read yet,
    like ``spec`` with unknown dims 0). Another iterator would draw from the
    random state the live one shares, so none is made for a template."""
    if tree is None:
        tree = map_leaves(_zeros_of, spec)
    return map_leaves(lambda leaf: np.asarray(leaf)[:0], tree)


def _zeros_of(spec: Any) -> np.ndarray:
    shape = [0 if d is None else d for d in spec.shape]
    return np.zeros(shape, spec.dtype.as_numpy_dtype)


def _check_shardable(dataset: Any) -> None:
    """Refuses a pipeline whose order may differ between processes (an
    unseeded shuffle or mixture), which ``Dataset.shard`` would split into
    overlapping rows."""
    what = _unseeded_random(dataset)
    if what == _MIXING:
        raise ValueError(
            f"the wrapped tf.data.Dataset mixes its sources without a seed (its {what}), so "
            f"each process would mix them differently and Dataset.shard(process_count, "
            f"process_index) would give processes overlapping rows; {_SEED_THE_MIX}"
        )
    if what is not None:
        raise ValueError(
            f"the wrapped tf.data.Dataset shuffles without a seed (its {what}), so each "
            f"process would shuffle differently and Dataset.shard(process_count, "
            f"process_index) would give processes overlapping rows; pass seed= to {what} "
            f"(the same on every process), or shard it yourself before shuffling and pass "
            f"process_count=1"
        )


_MIXING = "sample_from_datasets() / choose_from_datasets() choice of source"
_SEED_THE_MIX = (
    "pass seed= to sample_from_datasets() (for choose_from_datasets(), to the random op "
    "of its choice dataset), or call tf.random.set_seed(...) before building the "
    f"pipeline; or mix with jaxfeed itself, which resumes exactly on every backend: {MIXTURE}"
)


def _unseeded_random(dataset: Any) -> str | None:
    """What in the pipeline draws random numbers without a seed (neither its
    own nor one from ``tf.random.set_seed``), so another order in every
    process: ``.shuffle()``, ``Dataset.random()``, or a mixture's choice of
    source (`_MIXING`); None when nothing does.

    TF has no public way to walk a pipeline: the tf door reads its inputs
    and a random step's seeds (both 0 when unseeded).
    """
    todo = [(dataset, None)]  # (node, _MIXING under a mixture's choice of source)
    while todo:
        node, mixing = todo.pop()
        name = type(node).__name__
        inputs = tf_door.pipeline_inputs(node)
        seeds = tf_door.shuffle_seeds(node)
        unseeded = all(s is not None and int(s) == 0 for s in seeds)
        if "Shuffle" in name and unseeded:
            return mixing or ".shuffle()"
        if name == tf_door.RANDOM and unseeded:
            return mixing or "Dataset.random()"
        if name == tf_door.OPAQUE and tf_door.unseeded_in_graph(node):
            return mixing or "Dataset.random()"
        if name == tf_door.MIX and inputs:
            todo.append((inputs[0], _MIXING))
            inputs = inputs[1:]
        todo.extend((child, mixing) for child in inputs)
    return None


# --- TFDS data sources: random access, read in the shared sampler's order ---------------


def _tfds_access(source: Any) -> RandomAccess:
    """A TFDS data source (``tfds.data_source(...)``, ``builder.as_data_source``):
    records read with ``__getitems__`` per index batch, every leaf stacked."""

    def getitems(keys: list[int]) -> Sequence[Any]:
        if hasattr(source, "__getitems__"):
            return source.__getitems__(keys)
        return [source[key] for key in keys]

    def read(epoch: int, plan: Sequence[np.ndarray]) -> Iterator[Any]:
        for indices in plan:
            yield stack(getitems(indices.tolist()))

    return RandomAccess(len(source), False, read)


def wrap_tfds_source(source: Any, settings: WrapSettings, **_: Any) -> Epochs:
    """A TFDS data source, in the shared sampler's order."""
    return sampled_epochs("TFDS data source", _tfds_access(source), settings)
