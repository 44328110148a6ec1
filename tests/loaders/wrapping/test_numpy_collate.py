"""`collate_numpy` makes exactly what torch's ``default_collate`` makes of
numpy records (as numpy), leaves everything else to it, and `wrap` uses it
only where ``default_collate`` would run unchanged in this process."""

import collections

import numpy as np
import pytest
import torch
from jaxfeed.loaders._doors.torch import default_collate_is_torchs
from jaxfeed.loaders.wrapping.numpy_collate import collate_numpy
from torch.utils.data import DataLoader, Dataset, default_collate

import jaxfeed

DTYPES = [np.bool_, np.uint8, np.int8, np.int16, np.int32, np.int64]
DTYPES += [np.float16, np.float32, np.float64, np.complex64, np.complex128]


def _as_numpy(batch):
    """A collated batch with torch tensors as numpy, containers kept."""
    if isinstance(batch, dict):
        return {key: _as_numpy(value) for key, value in batch.items()}
    if isinstance(batch, list):
        return [_as_numpy(value) for value in batch]
    return batch.numpy() if isinstance(batch, torch.Tensor) else batch


def _assert_same(got, want):
    assert type(got) is type(want)
    if isinstance(want, dict):
        assert list(got) == list(want)
        for key in want:
            _assert_same(got[key], want[key])
    elif isinstance(want, list):
        assert len(got) == len(want)
        for a, b in zip(got, want, strict=True):
            _assert_same(a, b)
    else:
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.tobytes() == want.tobytes()


def _rows(dtype, n=5):
    rng = np.random.default_rng(0)
    values = rng.integers(0, 100, (n, 3, 2)) * (1 if np.dtype(dtype).kind in "biu" else 0.37)
    return [np.asarray(v).astype(dtype) for v in values]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_arrays_and_scalars_of_every_dtype_are_collated_as_default_collate_does(dtype):
    arrays = _rows(dtype)
    scalars = [a.flat[1] for a in arrays]  # numpy scalars, e.g. np.float16
    zero_d = [np.asarray(s) for s in scalars]  # 0-d arrays
    for records in (arrays, scalars, zero_d):
        got = collate_numpy(records)
        assert got is not None
        _assert_same(got, _as_numpy(default_collate(records)))


def test_records_of_dicts_tuples_lists_and_python_numbers_keep_default_collates_structure():
    images = _rows(np.uint8)
    cases = [
        [(image, np.int32(i)) for i, image in enumerate(images)],  # the tutorial Dataset
        [
            {"x": image, "label": i, "w": 0.5 * i, "keep": i % 2 == 0}
            for i, image in enumerate(images)
        ],
        [[image, {"y": np.float32(i), "z": [i, i + 1]}] for i, image in enumerate(images)],
        [
            {"b": 1, "a": image, "extra": i} if i else {"b": 1, "a": image}
            for i, image in enumerate(images)
        ],
    ]
    for records in cases:
        got = collate_numpy(records)
        assert got is not None
        _assert_same(got, _as_numpy(default_collate(records)))
        assert not any(isinstance(v, torch.Tensor) for v in _leaves(got))


def test_a_flipped_view_that_torch_refuses_is_stacked_as_its_copy():
    images = _rows(np.float32)
    flipped = [image[:, ::-1] for image in images]  # negative strides: torch.as_tensor refuses
    with pytest.raises(ValueError, match="negative"):
        default_collate(flipped)
    _assert_same(collate_numpy(flipped), _as_numpy(default_collate([f.copy() for f in flipped])))


def _leaves(batch):
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, list):
        return [leaf for value in batch for leaf in _leaves(value)]
    return [batch]


class _Subclass(np.ndarray):
    pass


def test_what_default_collate_makes_otherwise_is_left_to_it():
    image = np.zeros((2, 2), np.float32)
    point = collections.namedtuple("Point", "x y")
    left = {
        "tensors": [torch.zeros(2), torch.zeros(2)],
        "strings": [("a", image), ("b", image)],
        "namedtuples": [point(image, 1), point(image, 2)],
        "int and float": [1, 2.5],
        "int and bool": [1, True],
        "two dtypes": [image, image.astype(np.float64)],
        "two scalar types": [np.int32(1), np.int64(2)],
        "two shapes": [image, np.zeros((3, 2), np.float32)],
        "two ranks": [image, image[None]],
        "an array and a 0-d one": [np.zeros(1, np.float32), np.zeros((), np.float32)],
        "two lengths": [(image, 1), (image,)],
        "a key missing": [{"x": image}, {"y": image}],
        "big-endian": [image.astype(">f4"), image.astype(">f4")],
        "objects": [np.array([1, None]), np.array([2, None])],
        "bytes": [np.array([b"ab"]), np.array([b"cd"])],
        "past int64": [2**63, 1],
        "an ndarray subclass": [image.view(_Subclass), image.view(_Subclass)],
        "tuple of records": ((image, 1), (image, 2)),
        "no records": [],
    }
    for what, records in left.items():
        assert collate_numpy(records) is None, what


class _Tutorial(Dataset):
    """The per-sample Dataset of the PyTorch tutorials, on numpy arrays."""

    def __init__(self, n=40):
        rng = np.random.default_rng(1)
        self.images = rng.integers(0, 256, (n, 4, 4), dtype=np.uint8)
        self.labels = rng.integers(0, 10, n)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.images[i], int(self.labels[i])


def _epochs(loader, **options):
    source = jaxfeed.wrap(loader, seed=5, **options)
    return [list(source.iter_epoch(epoch)) for epoch in range(2)]


def test_wrap_reads_a_default_collate_loader_in_numpy_with_the_same_batches(monkeypatch):
    from jaxfeed.loaders.wrapping import torch as wrap_torch

    made = []
    real = wrap_torch.collate_numpy
    monkeypatch.setattr(wrap_torch, "collate_numpy", lambda r: made.append(1) or real(r))
    dataset = _Tutorial()
    fast = _epochs(DataLoader(dataset, batch_size=8, shuffle=True))
    assert len(made) == 10  # every batch of both epochs
    torchs = _epochs(
        DataLoader(dataset, batch_size=8, shuffle=True, collate_fn=lambda r: default_collate(r))
    )
    assert len(made) == 10  # a collate_fn of the user's own: left alone
    for a, b in zip(*(_batches(epochs) for epochs in (fast, torchs)), strict=True):
        assert a.keys() == b.keys()
        for key in a:
            assert a[key].dtype == b[key].dtype and np.array_equal(a[key], b[key])


def _batches(epochs):
    return [batch for epoch in epochs for batch in epoch]


def test_a_registry_extended_by_the_user_keeps_default_collate(monkeypatch):
    from torch.utils.data._utils import collate

    assert default_collate_is_torchs(), f"torch {torch.__version__} moved default_collate_fn_map"

    def plus_one(batch, *, collate_fn_map=None):
        return torch.as_tensor(np.stack(batch) + 1)

    monkeypatch.setitem(collate.default_collate_fn_map, np.ndarray, plus_one)
    assert not default_collate_is_torchs()
    dataset = _Tutorial()
    (first, *_), _ = _epochs(DataLoader(dataset, batch_size=8))
    assert np.array_equal(first["image"], dataset.images[:8] + 1)  # the user's function ran
