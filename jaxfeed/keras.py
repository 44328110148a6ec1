"""Keras 3 on the JAX backend, fed by any `BatchSource`: ``fit``, ``evaluate``, ``predict``.

``keras_data(source, x="image", y="label")`` is a ``keras.utils.PyDataset``
of ``(x, y, sample_weight)`` tuples: the fields named, and the source's
``mask`` as the weight, so padding rows weigh nothing in the loss and in
``weighted_metrics`` (Keras's plain ``metrics`` ignore sample weights);
``padding="drop"`` cuts them off instead (docs/keras.md). The first padded
batch a model compiled with plain ``metrics`` reads draws a warning that names
them (`warn_unweighted_metrics`).

Why a PyDataset read as a stream. Keras 3 takes Python data in two forms:

* A generator is read in order, but Keras knows no length (``fit`` then needs
  ``steps_per_epoch=``, validation ``validation_steps=``, ``evaluate``
  ``steps=``), one generator must serve every epoch of a ``fit``, and fit's
  default ``shuffle=True`` draws a warning.
* A ``PyDataset`` has a length (``num_batches``), and Keras calls its
  ``on_epoch_end`` after each pass; but Keras asks for batches by index, in a
  shuffled order under ``shuffle=True``, and restarting a stream at every
  index is slow and leaves the source's order.

So this PyDataset ignores the index: each call hands out the next batch of
the epoch being read. Keras (one worker, the PyDataset default) asks for
each index once per pass, one at a time, so a pass gets each batch of one
epoch once, in the source's order, whatever ``shuffle`` says; the pass's
``on_epoch_end`` closes that epoch and the next pass reads the next one
(``iter_epoch(epoch + 1)``: a new order per Keras epoch). A pass that stops
early (``steps_per_epoch=``, ``steps=``) leaves the rest of its epoch unread.
One exception: before a model's first ``fit``, ``evaluate`` or ``predict``,
Keras reads a batch (two on an accelerator) to build the model and its
metrics, then ends that pass; so a pass that read at most `PEEK_BATCHES` of a
longer epoch is not counted, and the next pass begins with those batches.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from jaxfeed.loaders._doors import keras as keras_door
from jaxfeed.loaders.checks import check_position
from jaxfeed.loaders.protocol import MASK_KEY, Batch, BatchSource, SkipsDataState
from jaxfeed.sharding import DeviceFeed

PADDINGS = ("weight", "drop")
PEEK_BATCHES = 2
"""The most batches Keras reads to build a model before its first pass: one,
and one more read ahead on an accelerator (Keras 3.15's JAX epoch iterator
places the next batch while the step runs)."""

Fields = str | Sequence[str] | Mapping[str, str]
"""Which batch fields make Keras's ``x`` (or ``y``): one name (an array), a
tuple or list of names (a tuple of arrays, for a model with several inputs),
or ``{input name: field}`` (a dict of arrays, for named inputs)."""


def keras_data(
    source: BatchSource,
    *,
    x: Fields,
    y: Fields | None = None,
    epoch: int = 0,
    padding: str = "weight",
) -> Any:
    """A ``keras.utils.PyDataset`` reading ``source`` epoch by epoch, in order.

    Each pass Keras makes (a ``fit`` epoch, a validation run, an ``evaluate``
    or ``predict`` call) reads the next epoch of the source; the length is
    ``source.num_batches``, so Keras needs no ``steps_per_epoch``. Batches
    are ``(x, y, mask as float32)`` for a source that pads, ``(x, y)`` for
    one that does not (``drop_remainder``) or with ``padding="drop"``,
    ``(x,)`` without ``y``.

    Args:
      source: any `BatchSource` (``jaxfeed.make`` or ``jaxfeed.wrap``) that
        knows its ``num_batches``.
      x, y: the fields Keras gets as inputs and targets (see `Fields`).
      epoch: the source epoch of the first pass; later passes count up.
      padding: ``"weight"``: padded batches keep their static shape and the
        mask is the sample weight (compile with ``weighted_metrics``).
        ``"drop"``: padding rows are cut off, so the last batch is short, as
        from Keras's own inputs: every metric is exact, and Keras compiles its
        step once more for that shape.

    Returns:
      The PyDataset; pass it as ``x`` (or ``validation_data``). ``close()``
      stops reading the epoch in progress.

    Raises:
      ValueError: a field the source lacks, or ``mask``; a source with no
        known length; an unknown ``padding``; Keras on another backend than
        JAX. While reading, with ``padding="drop"``: a batch of padding only.
      TypeError: not a `BatchSource` (a `DeviceFeed` is one epoch of one:
        pass its source); ``x``/``y`` of another type than `Fields`.

    Example:
      >>> train = jaxfeed.make("numpy", dataset="mnist-sample", batch_size=128)
      >>> model.fit(keras_data(train, x="image", y="label"), epochs=3)
    """
    if isinstance(source, DeviceFeed):
        raise TypeError(
            "keras_data got a DeviceFeed, which is one epoch of placed batches; Keras reads "
            "an epoch per pass and places each batch itself (keras.distribution.DataParallel "
            "for several devices). Pass the feed's BatchSource: keras_data(source, x=..., y=...)"
        )
    if not isinstance(source, BatchSource):
        raise TypeError(
            f"keras_data takes a BatchSource (from jaxfeed.make or jaxfeed.wrap), got "
            f"{type(source).__name__}; wrap a loader first: keras_data(jaxfeed.wrap(obj), ...)"
        )
    if source.num_batches is None:
        raise ValueError(
            "the source does not know its epoch length (num_batches is None: a wrapped "
            "stream whose framework cannot say, e.g. a tf.data pipeline over TFRecord files, "
            "which tf.data cannot count without reading them), and Keras needs it to end an "
            "epoch; count the batches once, N = sum(1 for _ in source.iter_epoch(0)), and "
            "wrap it with jaxfeed.wrap(obj, steps_per_epoch=N)"
        )
    fields = [f for f in source.element_spec if f != MASK_KEY]
    _check_fields("x", x, fields)
    if y is not None:
        _check_fields("y", y, fields)
    epoch, _ = check_position(epoch, 0, None)
    if padding not in PADDINGS:
        raise ValueError(f"padding must be one of {PADDINGS}, got {padding!r}")
    return _dataset_class(jax_keras())(source, x, y, epoch, padding)


def jax_keras() -> Any:
    """The ``keras`` module, checked to run on JAX."""
    import keras

    if keras.backend.backend() != "jax":
        raise ValueError(
            f"Keras runs on the {keras.backend.backend()!r} backend here, not 'jax': set "
            f"KERAS_BACKEND=jax before keras is imported (importing tensorflow imports it)"
        )
    return keras


def warn_unweighted_metrics(keras: Any, padding_rows: int) -> bool:
    """Warns when the Keras model reading this batch has plain ``metrics``, which
    count the batch's ``padding_rows`` (Keras applies sample weights to
    ``weighted_metrics`` only). Returns whether a model was found to ask.

    Keras 3 reads a one-worker ``PyDataset`` in the calling thread, inside the
    model's ``fit`` / ``evaluate`` / ``predict``: the model is the ``self`` of a
    frame up the stack. The keras door says what it was compiled with.
    """
    frame = inspect.currentframe()
    model, method = None, None
    while frame is not None and model is None:
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, keras.Model):
            model, method = candidate, frame.f_code.co_name
        frame = frame.f_back
    del frame  # frames hold their locals: no cycle through this one
    if model is None or method == "predict":  # predict computes no metrics
        return False
    plain, _ = keras_door.compiled_metrics(model)
    names = [m if isinstance(m, str) else getattr(m, "name", type(m).__name__) for m in plain]
    if names:
        warnings.warn(
            f"model {model.name!r} was compiled with metrics={names}, which Keras computes "
            f"without sample weights, so the {padding_rows} padding rows of this batch count "
            f"in them (keras_data weighs them 0 in the loss); compile them as "
            f"weighted_metrics={names} instead, or pass keras_data(..., padding='drop')",
            UserWarning,
            stacklevel=2,
        )
    return True


def _check_fields(role: str, chosen: object, fields: list[str]) -> None:
    if isinstance(chosen, str):
        names = [chosen]
    elif isinstance(chosen, Mapping):
        names = list(chosen.values())
    elif isinstance(chosen, list | tuple) and chosen:
        names = list(chosen)
    else:
        raise TypeError(
            f"{role} must be a field name, a tuple or list of names, or a dict "
            f"{{input name: field}}; got {chosen!r}"
        )
    for name in names:
        if name == MASK_KEY:
            raise ValueError(
                f"{role} names {MASK_KEY!r}, which marks padding rows (keras_data turns it "
                f"into sample weights); pick from the data fields {fields}"
            )
        if name not in fields:
            raise ValueError(f"{role} names {name!r}, which the source lacks; its fields: {fields}")


def _pick(batch: Batch, chosen: Fields) -> Any:
    if isinstance(chosen, str):
        return batch[chosen]
    if isinstance(chosen, Mapping):
        return {key: batch[name] for key, name in chosen.items()}
    return tuple(batch[name] for name in chosen)


class _Passes:
    """The reading; `_dataset_class` puts it in front of ``keras.utils.PyDataset``."""

    def __init__(self, source: BatchSource, x: Fields, y: Fields | None, epoch: int, padding: str):
        super().__init__()  # PyDataset's defaults: one worker, the calling thread
        if isinstance(source, SkipsDataState):
            source = source.without_data_state()  # Keras never asks for a data position
        self.source = source
        self.epoch = epoch  # the epoch the current (or next) pass reads
        self._x, self._y = x, y
        self._masked = MASK_KEY in source.element_spec  # the source pads
        self._drop = padding == "drop"
        self._batches: Iterator[Any] | None = None
        self._taken = 0  # batches taken from the open epoch
        self._served: list[tuple] = []  # handed to Keras in its current pass (the first few)
        self._replay: list[tuple] = []  # to hand out again, first, in the next pass
        self._metrics_checked = False  # whether the model's metrics were asked about padding

    @property
    def num_batches(self) -> int:
        return self.source.num_batches

    def __len__(self) -> int:
        return self.source.num_batches

    def __getitem__(self, index: int) -> tuple:
        del index  # a stream: the next batch, in the source's order (module docstring)
        item = self._replay.pop(0) if self._replay else self._keras_batch(self._next_batch())
        if len(self._served) <= PEEK_BATCHES:
            self._served.append(item)
        return item

    def __iter__(self) -> Iterator[tuple]:
        """One pass, as Keras makes one: the next epoch's batches."""
        try:
            for index in range(self.num_batches):
                yield self[index]
        finally:
            self.on_epoch_end()

    def on_epoch_end(self) -> None:
        served, self._served = self._served, []
        if len(served) <= PEEK_BATCHES and self._taken < self.num_batches:
            self._replay = served + self._replay  # Keras's look before a model's first pass
        elif served:
            self.close()

    def close(self) -> None:
        """Stops reading the open epoch (its loader's workers); the next pass reads the next."""
        batches, self._batches = self._batches, None
        self._served, self._replay = [], []
        if batches is None:
            return
        self.epoch += 1
        close = getattr(batches, "close", None)  # a generator's stops its loader
        if close is not None:
            close()

    def _next_batch(self) -> Any:
        if self._batches is None:
            self._batches = self.source.iter_epoch(self.epoch)
            self._taken = 0
        batch = next(self._batches, None)
        if batch is None:
            n = self.num_batches
            if self._taken < n:
                raise ValueError(
                    f"epoch {self.epoch} of the source ended after {self._taken} batches, but "
                    f"its num_batches is {n}"
                )
            raise IndexError(
                f"all {n} batches of epoch {self.epoch} have been read; each pass (a Keras "
                f"epoch, or a for loop over this dataset) reads one epoch"
            )
        self._taken += 1
        return batch

    def _keras_batch(self, batch: Batch) -> tuple:
        weight = None
        if self._masked and self._drop:
            real = batch[MASK_KEY]
            if not real.any():
                raise ValueError(
                    f"batch {self._taken - 1} of epoch {self.epoch} holds padding only (this "
                    f"process's share of the last global batch); use padding='weight'"
                )
            if not real.all():
                batch = {name: array[real] for name, array in batch.items()}
        elif self._masked:
            weight = batch[MASK_KEY].astype(np.float32)
            padding_rows = int(weight.size - np.count_nonzero(weight))
            if padding_rows and not self._metrics_checked:
                self._metrics_checked = warn_unweighted_metrics(jax_keras(), padding_rows)
        x = _pick(batch, self._x)
        if self._y is None:
            return (x,)
        y = _pick(batch, self._y)
        return (x, y) if weight is None else (x, y, weight)


@functools.cache
def _dataset_class(keras: Any) -> type:
    """The PyDataset subclass, made once Keras is imported (never at jaxfeed's import)."""
    return type(
        "KerasBatches",
        (_Passes, keras.utils.PyDataset),
        {"__module__": __name__, "__doc__": "`keras_data`'s PyDataset: one source epoch per pass."},
    )
