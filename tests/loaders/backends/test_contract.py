"""The contract every backend keeps, driven by one table of backends.

Per-backend quirks live in test_<backend>_backend.py; this file holds only
what must be true of all of them, including byte-identical batches under one
seed.
"""

import numpy as np
import pytest
from backend_helpers import assert_same_batches, indexed_dataset, valid_labels

from jaxfeed import loaders

BACKENDS = ["numpy", "torch", "tf", "grain", "hf"]
DATASET = dict(dataset="mnist-sample", split="train")  # 4,000 real digits, offline


def _epoch(source, epoch=0, start=0):
    return list(source.iter_epoch(epoch, start=start))


@pytest.fixture(scope="module")
def reference():
    """Numpy batches per (seed, batch_size, drop_remainder, epoch), computed once."""
    cache = {}

    def get(seed, batch_size, drop_remainder=False, epoch=0, shuffle=True):
        key = (seed, batch_size, drop_remainder, epoch, shuffle)
        if key not in cache:
            source = loaders.make(
                "numpy",
                **DATASET,
                seed=seed,
                batch_size=batch_size,
                drop_remainder=drop_remainder,
                shuffle=shuffle,
            )
            cache[key] = _epoch(source, epoch)
        return cache[key]

    return get


@pytest.mark.parametrize("backend", BACKENDS)
def test_shapes_dtypes_length_and_padding(backend):
    source = loaders.make(backend, **DATASET, batch_size=384, seed=0)
    assert isinstance(source, loaders.BatchSource)
    spec = dict(source.element_spec)
    assert spec == {
        "image": ((384, 28, 28, 1), np.dtype(np.uint8)),
        "label": ((384,), np.dtype(np.int32)),
        "mask": ((384,), np.dtype(np.bool_)),
    }
    batches = _epoch(source)
    assert len(batches) == source.num_batches == 11  # ceil(4000 / 384)
    for batch in batches:
        assert {k: (v.shape, v.dtype) for k, v in batch.items()} == spec
    assert all(b["mask"].all() for b in batches[:-1])
    last = batches[-1]
    assert last["mask"].sum() == 4000 - 10 * 384 == 160
    assert not last["mask"][160:].any()
    assert not last["image"][160:].any() and not last["label"][160:].any()
    labels = np.concatenate([b["label"][b["mask"]] for b in batches])
    every_label = loaders.load_dataset("mnist-sample")["label"]
    np.testing.assert_array_equal(np.bincount(labels, minlength=10), np.bincount(every_label))


@pytest.mark.parametrize("backend", BACKENDS)
def test_drop_remainder(backend):
    source = loaders.make(backend, **DATASET, batch_size=384, drop_remainder=True)
    assert set(source.element_spec) == {"image", "label"}
    batches = _epoch(source)
    assert len(batches) == source.num_batches == 10
    assert all(set(b) == {"image", "label"} and len(b["label"]) == 384 for b in batches)


@pytest.mark.parametrize("backend", BACKENDS)
def test_epochs_are_deterministic_and_reshuffled(backend):
    source = loaders.make(backend, **DATASET, batch_size=500, seed=11)
    first = _epoch(source, 0)
    assert_same_batches(first, _epoch(source, 0))
    second = _epoch(source, 1)
    assert not np.array_equal(first[0]["image"], second[0]["image"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_start_resumes_mid_epoch(backend):
    source = loaders.make(backend, **DATASET, batch_size=500, seed=2)
    assert_same_batches(_epoch(source, 1)[5:], _epoch(source, 1, start=5))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("processes", [1, 2, 4])
def test_a_resume_on_another_process_count_continues_the_same_global_batches(
    backend, processes, reference
):
    # Elastic resume: written by 1 process x 400 rows, resumed at batch 3 by
    # `processes` x 400/processes. Batch by batch, the processes' valid rows in
    # process order are the global batch the single process would have read.
    local, start = 400 // processes, 3
    shards = [
        loaders.make(backend, **DATASET, seed=5, batch_size=local,
                     process_index=p, process_count=processes)
        for p in range(processes)
    ]  # fmt: skip
    epochs = [_epoch(shard, 1, start=start) for shard in shards]
    expected = reference(5, 400, epoch=1)[start:]
    assert {len(e) for e in epochs} == {len(expected)}
    for step, whole in enumerate(expected):
        for field in ("image", "label"):
            joined = np.concatenate([e[step][field][e[step]["mask"]] for e in epochs])
            np.testing.assert_array_equal(joined, whole[field][whole["mask"]])


@pytest.mark.parametrize("backend", BACKENDS)
def test_block_order_is_byte_identical_across_backends_and_resumes_exactly(backend):
    # shuffle="blocks" is the shared sampler's order, so the whole contract holds.
    blocks = dict(shuffle="blocks", block_rows=300, window_blocks=3)
    source = loaders.make(backend, **DATASET, batch_size=256, seed=4, **blocks)
    numpy = loaders.make("numpy", **DATASET, batch_size=256, seed=4, **blocks)
    epochs = [_epoch(source, 0), _epoch(source, 1)]
    for epoch in (0, 1):
        assert_same_batches(epochs[epoch], _epoch(numpy, epoch))
    assert not np.array_equal(epochs[0][0]["image"], epochs[1][0]["image"])  # a new order
    assert_same_batches(_epoch(source, 1, start=6), epochs[1][6:])
    # Each batch draws from one window (3 blocks of 300 rows), or two where it straddles.
    index = {
        row.tobytes(): i
        for i, row in enumerate(loaders.load_dataset("mnist-sample", "train")["image"])
    }
    for batch in epochs[0][:5]:
        rows = [index[row.tobytes()] for row in batch["image"][batch["mask"]]]
        assert len({r // 300 for r in rows}) <= 6


def test_block_order_refuses_a_framework_shuffle():
    with pytest.raises(ValueError, match=r"shuffle='blocks' is the shared sampler's order"):
        loaders.make("torch", **DATASET, shuffle="blocks", order="native")


@pytest.mark.parametrize("backend", BACKENDS)
def test_unshuffled_order_is_dataset_order(backend):
    source = loaders.make(
        backend, dataset="mnist-sample", split="test", batch_size=300, shuffle=False
    )
    data = loaders.load_dataset("mnist-sample", "test")
    batches = _epoch(source)
    images = np.concatenate([b["image"][b["mask"]] for b in batches])
    np.testing.assert_array_equal(images, data["image"])


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "numpy"])
@pytest.mark.parametrize(
    ("seed", "batch_size", "drop_remainder"),
    [(0, 128, False), (7, 300, False), (123, 1000, False), (7, 300, True)],
)
def test_byte_identical_to_numpy_for_two_epochs(
    backend, seed, batch_size, drop_remainder, reference
):
    source = loaders.make(
        backend, **DATASET, seed=seed, batch_size=batch_size, drop_remainder=drop_remainder
    )
    for epoch in (0, 1):
        assert_same_batches(
            _epoch(source, epoch), reference(seed, batch_size, drop_remainder, epoch)
        )


@pytest.mark.parametrize("backend", BACKENDS)
def test_real_10k_digits_identical_across_backends(backend, mnist_dir):
    kwargs = dict(dataset="mnist-10k", split="train", data_dir=mnist_dir, batch_size=777, seed=3)
    expected = _epoch(loaders.make("numpy", **kwargs), 0)
    batches = _epoch(loaders.make(backend, **kwargs), 0)
    assert_same_batches(batches, expected)
    assert batches[-1]["mask"].sum() == 4000 - 5 * 777


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_options_and_batch_sizes(backend):
    with pytest.raises(TypeError, match="no_such_option"):
        loaders.make(backend, **DATASET, no_such_option=1)
    with pytest.raises(ValueError, match="batch_size must be an int >= 1, got 0"):
        loaders.make(backend, **DATASET, batch_size=0)
    with pytest.raises(ValueError, match="larger than the split's 4000 examples"):
        loaders.make(backend, **DATASET, batch_size=4001)


NATIVE = [b for b in BACKENDS if b != "numpy"]
# Like torch's DistributedSampler, these pad uneven shards with repeated
# examples so every process reads as many; the others leave shards uneven.
NATIVE_PADS_WITH_REPEATS = {"torch", "tf"}


def _native(backend, data, **sampler_args):
    return loaders.make(backend, dataset=data, order="native", **sampler_args)


@pytest.mark.parametrize("backend", NATIVE)
def test_native_order_is_seeded_reshuffled_and_covers_each_sample_once(backend):
    data = indexed_dataset(1000)

    def labels(seed, epoch=0):
        return valid_labels(_native(backend, data, batch_size=64, seed=seed), epoch)

    first = labels(7)
    np.testing.assert_array_equal(first, labels(7))
    np.testing.assert_array_equal(np.sort(first), np.arange(1000))
    second = labels(7, epoch=1)
    np.testing.assert_array_equal(np.sort(second), np.arange(1000))
    assert not np.array_equal(first, second)
    assert not np.array_equal(first, labels(8))
    assert not np.array_equal(first, np.arange(1000))


@pytest.mark.parametrize("backend", NATIVE)
@pytest.mark.parametrize("drop_remainder", [False, True])
def test_native_order_shards_over_processes_with_equal_batch_counts(backend, drop_remainder):
    data = indexed_dataset(1000)  # not a multiple of 3, nor of 3 * 64
    shards = [
        _native(
            backend,
            data,
            batch_size=64,
            seed=2,
            drop_remainder=drop_remainder,
            process_index=p,
            process_count=3,
        )
        for p in range(3)
    ]
    # valid_labels asserts that each process yields exactly num_batches batches.
    seen = np.concatenate([valid_labels(shard, 0) for shard in shards])
    if drop_remainder:
        assert len(seen) == len(np.unique(seen)) == shards[0].num_batches * 64 * 3
    else:
        np.testing.assert_array_equal(np.unique(seen), np.arange(1000))
        assert len(seen) == (1002 if backend in NATIVE_PADS_WITH_REPEATS else 1000)


def test_unknown_backend_lists_the_valid_ones():
    valid = r"\['grain', 'hf', 'numpy', 'ray', 'tf', 'torch'\]"
    with pytest.raises(ValueError, match=r"unknown backend 'jax'; choose one of " + valid):
        loaders.make("jax")


def test_available_reports_a_version_for_every_backend():
    status = loaders.available()
    # ray keeps this contract in test_ray.py (it starts a cluster: slow tier only).
    assert sorted(status) == sorted([*BACKENDS, "ray"])
    for name, text in status.items():
        assert not text.startswith("unavailable"), (name, text)
        assert any(ch.isdigit() for ch in text)


@pytest.mark.parametrize(
    ("backend", "order"), [(b, "sampler") for b in BACKENDS] + [(b, "native") for b in NATIVE]
)
def test_bad_epoch_or_start_is_refused_at_the_call_in_either_order(backend, order):
    options = {} if order == "sampler" else {"order": order}
    source = loaders.make(backend, **DATASET, batch_size=1000, **options)
    assert source.num_batches == 4
    # No next(): the call itself refuses, the same way in both orders.
    with pytest.raises(ValueError, match=r"epoch must be an int in \[0, 4294967295\], got -1"):
        source.iter_epoch(-1)
    with pytest.raises(TypeError, match=r"epoch must be an int .*, got 1\.0 \(float\)"):
        source.iter_epoch(1.0)
    with pytest.raises(ValueError, match=r"start=5 is outside \[0, 4\], the batches of one epoch"):
        source.iter_epoch(0, start=5)
    with pytest.raises(ValueError, match=r"start must be an int >= 0, got -1"):
        source.iter_epoch(0, start=-1)
    assert _epoch(source, np.int64(1), start=4) == []  # resuming at the end is fine


def your_data(n: int = 203) -> dict[str, np.ndarray]:
    """A non-MNIST dataset: CIFAR-shaped floats, int64 labels, a float64
    metadata vector, int token ids and a bool flag. Row ``i`` has label ``i``."""
    rng = np.random.default_rng(5)
    return {
        "x": rng.standard_normal((n, 3, 32, 32), dtype=np.float32),
        "y": np.arange(n, dtype=np.int64),
        "meta": rng.standard_normal((n, 8)),  # float64: stored as float32 (no x64)
        "tokens": rng.integers(0, 30_000, (n, 128), dtype=np.int32),
        "flag": rng.random(n) < 0.5,
    }


YOUR_SPEC = {
    "x": ((32, 3, 32, 32), np.dtype(np.float32)),
    "y": ((32,), np.dtype(np.int32)),
    "meta": ((32, 8), np.dtype(np.float32)),
    "tokens": ((32, 128), np.dtype(np.int32)),
    "flag": ((32,), np.dtype(np.bool_)),
    "mask": ((32,), np.dtype(np.bool_)),
}


@pytest.fixture(scope="module")
def your_reference():
    data = loaders.load_dataset(your_data())
    return data, [
        _epoch(loaders.make("numpy", dataset=data, batch_size=32, seed=4), e) for e in (0, 1)
    ]


@pytest.mark.parametrize("backend", BACKENDS)
def test_your_own_dict_dataset_keeps_the_whole_contract(backend, your_reference):
    data, (epoch0, epoch1) = your_reference
    source = loaders.make(backend, dataset=your_data(), batch_size=32, seed=4)
    assert dict(source.element_spec) == YOUR_SPEC
    # Byte-identical to numpy (and so across all backends), both epochs.
    assert_same_batches(_epoch(source, 0), epoch0)
    assert_same_batches(_epoch(source, 1), epoch1)
    # Each epoch a new permutation covering every row once; rows stay whole.
    for batches in (epoch0, epoch1):
        rows = np.concatenate([b["y"][b["mask"]] for b in batches])
        np.testing.assert_array_equal(np.sort(rows), np.arange(203))
        np.testing.assert_array_equal(
            np.concatenate([b["x"][b["mask"]] for b in batches]), data["x"][rows]
        )
    assert not np.array_equal(epoch0[0]["y"], epoch1[0]["y"])
    # Exact start, and the padded last batch: 203 = 6 * 32 + 11.
    assert_same_batches(_epoch(source, 1, start=4), epoch1[4:])
    last = epoch1[-1]
    assert last["mask"].sum() == 11
    assert all(not last[key][11:].any() for key in YOUR_SPEC if key != "mask")


def test_array_dataset_refuses_bad_fields_by_name():
    good = your_data(4)
    with pytest.raises(
        ValueError, match=r"field 'mask': the name 'mask' is reserved .*attention_mask"
    ):
        loaders.make("numpy", dataset={**good, "mask": np.ones(4, bool)}, batch_size=2)
    with pytest.raises(ValueError, match=r"field 'text' is <U1 .*numbers, bools or encoded bytes"):
        loaders.load_dataset({**good, "text": np.array(list("abcd"))})
    with pytest.raises(ValueError, match=r"fields disagree on the number of rows: .*'short': 3"):
        loaders.load_dataset({**good, "short": np.zeros(3)})
    with pytest.raises(ValueError, match=r"field 'one' is a scalar"):
        loaders.load_dataset({**good, "one": np.float32(1)})
    with pytest.raises(ValueError, match=r"field 'none' has empty rows \(shape \(4, 0\)\)"):
        loaders.load_dataset({**good, "none": np.zeros((4, 0), np.float32)})
    with pytest.raises(ValueError, match=r"field 'big' holds 0\.\.4294967296, which does not fit"):
        loaders.load_dataset({**good, "big": np.array([0, 1, 2, 2**32])})
    with pytest.raises(ValueError, match=r"has no fields"):
        loaders.load_dataset({})
    with pytest.raises(ValueError, match=r"has no rows"):
        loaders.load_dataset({"x": np.zeros((0, 3))})
    with pytest.raises(
        TypeError, match=r"dataset must be a name, a path, an ArrayDataset or a dict"
    ):
        loaders.make("numpy", dataset=[1, 2, 3])
    with pytest.raises(
        ValueError, match=r"dataset arrays, train split: global batch 8 .*4 examples"
    ):
        loaders.make("numpy", dataset=good, batch_size=8)


def test_array_dataset_is_read_only_and_leaves_your_arrays_alone():
    mine = your_data(4)
    data = loaders.ArrayDataset("toy/train", mine)
    with pytest.raises(ValueError, match="read-only"):
        data["x"][0, 0, 0, 0] = 1.0
    mine["x"][0, 0, 0, 0] = 7.0  # yours stay writable (the dataset views them)
    assert data["x"][0, 0, 0, 0] == 7.0
    assert sorted(data) == ["flag", "meta", "tokens", "x", "y"] and len(data) == 4
    assert "toy/train" in repr(data) and "x: float32 [3, 32, 32]" in repr(data)
