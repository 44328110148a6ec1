"""Per-record transforms: one function, run by every backend where its
framework runs per-record work, with a random generator that belongs to the row.

``fn(record, rng) -> record`` takes one row's values (numpy rows, or ``bytes``
for an encoded field) and returns a dict of fixed-shape numbers. ``rng`` is
``numpy.random.default_rng((seed, epoch, row))``: the draw depends on the row
and the epoch only, never on the backend, the worker that runs it, the
process count or where a resumed epoch starts. So a random augmentation gives
byte-identical batches on every backend, and a new one every epoch.
A transform that draws from anything else (``np.random.*``, ``random``,
torch's global generator, fresh entropy) gets a `TransformRandomnessWarning`
when the source is made: row 0 is transformed twice and the global generators
are compared around it. Torch code draws from `torch_generator` (``rng``'s
draw seeding one reused ``torch.Generator`` per thread), passed as
``generator=`` to its random ops.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import random
import sys
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from jaxfeed.loaders.array_dataset import NUMERIC_KINDS, ArrayDataset, as_device_dtype
from jaxfeed.loaders.protocol import MASK_KEY
from jaxfeed.loaders.row_generators import row_generators

__all__ = [
    "RecordFn",
    "RecordTransform",
    "TransformError",
    "TransformRandomnessWarning",
    "torch_generator",
]

RecordFn = Callable[[dict[str, Any], np.random.Generator], Mapping[str, Any]]


class TransformError(ValueError):
    """A transform failed or returned what cannot be batched; the message names
    the row (and the field). Raised in a worker, it reaches the reader as is."""


class RecordTransform:
    """``fn`` bound to a seed and the output it must keep to: the fields, row
    shapes and dtypes of its result on row 0 (the source's ``element_spec``).

    Args:
      fn: ``fn(record, rng) -> dict``; picklable (a module-level function)
        when it runs in worker processes.
      seed: the source's seed.
      dataset: the records ``fn`` reads; row 0 (of epoch 0) gives the output.

    Raises:
      TypeError: ``fn`` is not callable.
      TransformError: ``fn`` fails on row 0, or returns anything but a dict of
        numbers (named field by field).
    """

    def __init__(self, fn: RecordFn, seed: int, dataset: ArrayDataset):
        if not callable(fn):
            raise TypeError(f"transform must be a function fn(record, rng), got {fn!r}")
        self.fn, self.seed = fn, seed
        self.spec: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
        record = {key: array[0] for key, array in dataset.head.items()}
        before = _global_random_states()
        first = self._call(record, 0, 0, self.rng(0, 0))
        after = _global_random_states()  # torch's too, if the call imported torch
        moved = [name for name, state in before.items() if after[name] != state]
        for key, value in first.items():
            if key == MASK_KEY or not isinstance(key, str):
                raise TransformError(
                    f"the transform returned a field named {key!r}; {MASK_KEY!r} is "
                    "reserved for the row mask and names must be str"
                )
            value = _numbers(value, key, 0, 0)
            where = f"the transform's field {key!r} (row 0)"
            self.spec[key] = (value.shape, as_device_dtype(value[None], where).dtype)
        _warn_unless_pure(moved, first, self._call(record, 0, 0, self.rng(0, 0)))

    def rng(self, epoch: int, row: int) -> np.random.Generator:
        """The generator of ``row`` in ``epoch``."""
        return np.random.default_rng((self.seed, epoch, row))

    def batch(
        self,
        rows: Mapping[str, Sequence[Any]],
        indices: Sequence[int],
        epoch: int,
        out: Mapping[str, np.ndarray] | None = None,
    ) -> dict[str, np.ndarray]:
        """``fn`` on each of ``rows`` (the gathered values of rows ``indices``),
        stacked into one batch of the spec's shapes and dtypes; each record
        checked against the spec (same fields, shapes, numbers). ``out``: an
        array per field, of the batch's shape and dtype, to stack into (a
        worker's batch file) and return, instead of new ones.

        The loop that calls ``fn`` is all a plain loop would do besides: a
        record that is a dict of as many fields as row 0's passes on. Field
        names, shapes and numbers are checked on each stacked field, and only
        when one is wrong record by record, to name the first row at fault
        (the row a record-by-record check would have named)."""
        indices = np.asarray(indices)
        # Every row's generator at once: seeding row by row cost a tenth of a PNG decode.
        generators = row_generators(self.seed, epoch, indices)
        keys = list(rows)
        # Each row's record made here too, in one tight loop, not between fn's calls.
        inputs = [
            dict(zip(keys, values, strict=True)) for values in zip(*rows.values(), strict=True)
        ]
        fn, fields = self.fn, len(self.spec)
        records: list[Mapping[str, Any]] = []
        append = records.append
        for row, rng, given in zip(indices.tolist(), generators, inputs, strict=True):
            try:
                record = fn(given, rng)
            except Exception as err:
                self._check(records, indices, epoch)  # an earlier row's wrong output comes first
                raise _failed(row, epoch, err) from err
            if type(record) is not dict or len(record) != fields:  # any other: the long way
                try:
                    _dict_of_fields(record, row, epoch, self.spec)
                except TransformError:
                    self._check(records, indices, epoch)
                    raise
            append(record)
        batch = {}
        for key, (shape, dtype) in self.spec.items():
            if not records:
                batch[key] = _fit(np.empty((0,), dtype), dtype, key)
                continue
            target = None if out is None else out[key]
            # A field missing (KeyError), or values that do not stack: checked row by row.
            try:
                values = [record[key] for record in records]
                if target is not None:
                    # Only values of the spec's exact dtype and shape (casting="no");
                    # any other goes the checked way below.
                    with contextlib.suppress(ValueError, TypeError):
                        batch[key] = np.stack(values, out=target, casting="no")
                        continue
                stacked = np.stack(values)
            except (KeyError, ValueError, TypeError):
                stacked = None
            if (
                stacked is None
                or stacked.shape[1:] != shape
                or stacked.dtype.kind not in NUMERIC_KINDS
            ):
                self._check(records, indices, epoch)
                # Nothing at fault after all: its own error, if any.
                stacked = np.stack([record[key] for record in records])
            batch[key] = _fit(stacked, dtype, key)
            if target is not None:
                target[...] = batch[key]
                batch[key] = target
        return batch

    def _check(self, records: Sequence[Any], indices: np.ndarray, epoch: int) -> None:
        """Each of ``records`` (those of the first rows of ``indices``) against
        the spec, row by row: the first that is not a dict of row 0's fields,
        or holds a value that is not numbers or not of row 0's shape, is a
        `TransformError` naming it (and the field)."""
        for row, record in zip(indices.tolist(), records, strict=False):  # records: the first rows
            _dict_of_fields(record, row, epoch, self.spec)
            for key, (shape, _) in self.spec.items():
                value = _numbers(record[key], key, row, epoch)
                if value.shape != shape:
                    raise TransformError(
                        f"the transform returned field {key!r} of shape {value.shape} for "
                        f"row {row} (epoch {epoch}), but {shape} for row 0; every record "
                        "must come out in one shape (crop or pad to a fixed size)"
                    )

    def _call(
        self, record: dict[str, Any], epoch: int, row: int, rng: np.random.Generator
    ) -> Mapping[str, Any]:
        """``fn`` on one record with its ``rng``; a failure, or anything but a
        dict, named by row."""
        try:
            result = self.fn(record, rng)
        except Exception as err:
            raise _failed(row, epoch, err) from err
        _dict_of_fields(result, row, epoch)
        return result

    def check_picklable(self, runner: str, by_value: bool = False) -> None:
        """Refuses a ``fn`` that worker processes cannot receive.

        Args:
          runner: who runs the workers, for the message.
          by_value: the workers receive ``fn`` through cloudpickle, by value
            (Grain does), so lambdas and a notebook's functions travel too.

        Raises:
          TypeError: ``fn`` does not pickle (a lambda, a local function), or
            is defined in an interactive ``__main__``; the message says to
            define it at the top level of a module.
        """
        why = None
        try:
            if by_value:
                import cloudpickle

                cloudpickle.dumps(self.fn)
            else:
                pickle.dumps(self.fn)
        except Exception as err:
            why = f"does not pickle ({err})"
        if why is None and not by_value and _interactive(self.fn):
            # It pickles by name, but a spawned worker has no such __main__ to find it in.
            why = "is defined in an interactive __main__ (a notebook, python -c)"
        if why is not None:
            raise TypeError(
                f"{runner} run the transform in worker processes, which receive it "
                f"pickled, and {self.fn!r} {why}; define it at the top level of a module "
                "(a .py file; not a lambda or a nested function), or use num_workers=0"
            )


class TransformRandomnessWarning(UserWarning):
    """A transform draws from something other than its ``rng``: its batches
    differ between backends, runs and resumes."""


_TORCH_GENERATORS = threading.local()  # one torch.Generator per thread of each process


def torch_generator(rng: np.random.Generator) -> Any:
    """A ``torch.Generator`` seeded from ``rng``: torch's random ops in a
    transform, byte-identical on every backend.

    Pass it as ``generator=`` (``torch.rand(..., generator=g)``,
    ``torch.randint``, ``torch.randperm``, ``tensor.random_``). One generator
    per thread is reused and re-seeded for each record, which costs a fraction
    of ``torch.manual_seed`` (that seeds every device's global generator) and
    leaves torch's global generator untouched. The seed is one draw from
    ``rng``, so the row's other draws from ``rng`` stay its own.

    Example:
      >>> def augment(record, rng):
      ...     g = torch_generator(rng)
      ...     image = torch.from_numpy(record["image"])
      ...     top, left = torch.randint(0, 5, (2,), generator=g).tolist()
      ...     return {"image": image[top : top + 24, left : left + 24].numpy()}
    """
    generator = getattr(_TORCH_GENERATORS, "generator", None)
    if generator is None:
        import torch

        generator = _TORCH_GENERATORS.generator = torch.Generator()
    generator.manual_seed(int(rng.integers(2**63)))
    return generator


def _global_random_states() -> dict[str, bytes]:
    """The global generators a transform might draw from instead of its ``rng``:
    numpy's legacy one, Python's ``random``, and torch's once torch is imported."""
    states = {
        "numpy's global np.random": pickle.dumps(np.random.get_state()),
        "Python's random module": pickle.dumps(random.getstate()),
    }
    if (torch := sys.modules.get("torch")) is not None:
        states["torch's global generator"] = torch.random.get_rng_state().numpy().tobytes()
    return states


def _warn_unless_pure(moved: list[str], first: Mapping[str, Any], second: Mapping[str, Any]):
    """Warns when row 0 drew from a global generator (``moved``), or when two
    calls on row 0 with the same rng disagree (``first``, ``second``): either
    way the records are not a function of ``(record, rng)`` alone."""
    differ = [
        key
        for key in first
        if key not in second
        or np.asarray(first[key]).tobytes() != np.asarray(second[key]).tobytes()
    ]
    if not moved and not differ and second.keys() == first.keys():
        return
    what = (
        f"it drew from {' and '.join(moved)}"
        if moved
        else f"two calls on row 0 with the same rng gave different {differ or sorted(second)}"
    )
    warnings.warn(
        f"the transform is not a function of (record, rng) alone: {what}; its batches will "
        "differ between backends, runs and resumes. Draw every random number from the rng "
        "argument (rng.integers, rng.random, ...); torch code can pass "
        "generator=jaxfeed.loaders.transform.torch_generator(rng) to its random ops",
        TransformRandomnessWarning,
        stacklevel=4,
    )


def _interactive(fn: object) -> bool:
    """Whether ``fn`` is defined in a ``__main__`` with no file (a notebook's
    cells, ``python -c``): spawned processes re-import ``__main__`` from its
    file, so they could not find it."""
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)  # "<stdin>" for python -
    return getattr(fn, "__module__", None) == "__main__" and not (
        main_file and os.path.isfile(main_file)
    )


def _failed(row: int, epoch: int, err: Exception) -> TransformError:
    """``fn``'s exception on ``row``, as the `TransformError` that names it."""
    return TransformError(
        f"the transform failed on row {row} (epoch {epoch}): {type(err).__name__}: {err}"
    )


def _dict_of_fields(
    record: Any, row: int, epoch: int, spec: Mapping[str, Any] | None = None
) -> None:
    """A `TransformError` unless ``record`` is a non-empty mapping, with the
    fields of ``spec`` (row 0's) when given."""
    if not isinstance(record, Mapping) or not record:
        raise TransformError(
            f"the transform returned {type(record).__name__} for row {row}; it must "
            "return a dict of field name -> numbers, e.g. {'image': ..., 'label': ...}"
        )
    if spec is not None and record.keys() != spec.keys():
        raise TransformError(
            f"the transform returned fields {sorted(record)} for row {row} (epoch "
            f"{epoch}), but {sorted(spec)} for row 0; return the same fields always"
        )


def _numbers(value: Any, key: str, row: int, epoch: int) -> np.ndarray:
    """One returned value as an array of numbers, or a `TransformError`."""
    value = np.asarray(value)
    if value.dtype.kind not in NUMERIC_KINDS:
        raise TransformError(
            f"the transform returned field {key!r} of kind {value.dtype.kind!r} for row {row} "
            f"(epoch {epoch}); only numbers and bools can reach a device: decode bytes and "
            "strings into arrays inside the transform"
        )
    return value


def _fit(stacked: np.ndarray, dtype: np.dtype, key: str) -> np.ndarray:
    """One field's stacked records as ``dtype``; an integer that does not fit
    is refused, never wrapped around."""
    if stacked.dtype.kind in "iu" and dtype.kind in "iu" and stacked.size:
        info = np.iinfo(dtype)
        if stacked.min() < info.min or stacked.max() > info.max:
            raise TransformError(
                f"the transform's field {key!r} holds {stacked.min()}..{stacked.max()}, "
                f"outside the {dtype} of row 0"
            )
    return stacked.astype(dtype, copy=False)
