"""`loaders.wrap`: users' own loaders of every framework, as BatchSources.

One table of kinds drives the shared contract (order, padding, mask, spec,
start, drop_remainder); the tests after it cover per-kind quirks, key naming
and errors.
"""

import collections
import math
import subprocess
import sys

import numpy as np
import pytest

from jaxfeed import loaders

N, B = 100, 32  # 3 full batches and a short one of 4


@pytest.fixture(scope="module")
def arrays():
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (N, 28, 28, 1), dtype=np.uint8)
    return images, np.arange(N, dtype=np.int32)  # distinct labels make order visible


def _torch(images, labels):
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    dataset = TensorDataset(torch.from_numpy(images), torch.from_numpy(labels))
    return DataLoader(dataset, batch_size=B, shuffle=False), {}


def _tf(images, labels, batched=True):
    import tensorflow as tf

    dataset = tf.data.Dataset.from_tensor_slices({"image": images, "label": labels})
    return (dataset.batch(B), {}) if batched else (dataset, {"batch_size": B})


def _tf_unbatched(images, labels):
    return _tf(images, labels, batched=False)


def _grain_rows(images, labels):
    import grain

    return grain.MapDataset.range(N).map(lambda i: {"image": images[i], "label": labels[i]})


def _grain_map(images, labels):
    return _grain_rows(images, labels).batch(B), {}


def _grain_iter(images, labels):
    return _grain_rows(images, labels).to_iter_dataset().batch(B), {}


def _grain_loader(images, labels):
    import grain

    rows = [{"image": images[i], "label": labels[i]} for i in range(N)]
    sampler = grain.samplers.IndexSampler(
        N, shard_options=grain.sharding.NoSharding(), shuffle=False, num_epochs=1
    )
    batch = [grain.transforms.Batch(B)]
    return grain.DataLoader(data_source=rows, sampler=sampler, operations=batch), {}


def _hf(images, labels):
    import datasets

    # Array3D, not nested lists: the numpy formatter is ~1000x slower on lists.
    features = datasets.Features(
        {"image": datasets.Array3D((28, 28, 1), "uint8"), "label": datasets.Value("int32")}
    )
    return datasets.Dataset.from_dict({"image": images, "label": labels}, features=features)


def _hf_table(images, labels):
    return _hf(images, labels), {"batch_size": B}


def _hf_stream(images, labels):
    return _hf(images, labels).to_iterable_dataset(), {"batch_size": B}


def _list(images, labels):
    return [{"image": images[i : i + B], "label": labels[i : i + B]} for i in range(0, N, B)], {}


def _callable(images, labels):
    batches, _ = _list(images, labels)
    # A callable may not repeat itself: resuming by replay is the user's call.
    return (lambda: iter(batches)), {"resume": "replay"}


# name -> (factory, num_batches padded, num_batches with drop_remainder)
KINDS = {
    "torch": (_torch, 4, 3),
    "tf-batched": (_tf, 4, None),
    "tf-unbatched": (_tf_unbatched, 4, 3),
    "grain-map": (_grain_map, 4, 3),
    "grain-iter": (_grain_iter, 4, 3),  # a MapDataset's rows, batched: counted
    "grain-loader": (_grain_loader, 4, 3),
    "hf-dataset": (_hf_table, 4, 3),
    "hf-iterable": (_hf_stream, None, None),
    "list": (_list, 4, None),
    "callable": (_callable, None, None),
}


@pytest.mark.parametrize("kind", KINDS)
def test_contract_padded(kind, arrays):
    factory, num_batches, _ = KINDS[kind]
    obj, kwargs = factory(*arrays)
    source = loaders.wrap(obj, **kwargs)
    assert isinstance(source, loaders.BatchSource)
    assert source.num_batches == num_batches
    assert source.batch_size == B
    spec = source.element_spec
    assert spec == {
        "image": loaders.ArraySpec((B, 28, 28, 1), np.dtype(np.uint8)),
        "label": loaders.ArraySpec((B,), np.dtype(np.int32)),
        "mask": loaders.ArraySpec((B,), np.dtype(np.bool_)),
    }
    batches = list(source.iter_epoch(0))
    assert len(batches) == math.ceil(N / B)
    for batch in batches:
        assert {k: (v.shape, v.dtype) for k, v in batch.items()} == {
            k: tuple(s) for k, s in spec.items()
        }
    assert [int(b["mask"].sum()) for b in batches] == [B, B, B, N - 3 * B]
    last = batches[-1]
    assert not last["image"][N - 3 * B :].any() and not last["label"][N - 3 * B :].any()
    valid = {k: np.concatenate([b[k][b["mask"]] for b in batches]) for k in ("image", "label")}
    np.testing.assert_array_equal(valid["image"], arrays[0])
    np.testing.assert_array_equal(valid["label"], arrays[1])
    # Epochs repeat (none of these loaders shuffles) and start= resumes.
    np.testing.assert_array_equal(next(source.iter_epoch(1))["label"], batches[0]["label"])
    resumed = list(source.iter_epoch(0, start=2))
    assert [b["label"][0] for b in resumed] == [b["label"][0] for b in batches[2:]]


@pytest.mark.parametrize("kind", KINDS)
def test_contract_drop_remainder(kind, arrays):
    factory, _, num_batches = KINDS[kind]
    obj, kwargs = factory(*arrays)
    source = loaders.wrap(obj, drop_remainder=True, **kwargs)
    assert source.num_batches == num_batches
    batches = list(source.iter_epoch(0))
    assert len(batches) == N // B
    assert all(set(b) == {"image", "label"} and len(b["label"]) == B for b in batches)
    np.testing.assert_array_equal(np.concatenate([b["label"] for b in batches]), np.arange(96))


def test_torch_distributed_sampler_gets_the_epoch(arrays):
    import torch
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    dataset = TensorDataset(torch.from_numpy(arrays[0]), torch.from_numpy(arrays[1]))
    sampler = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=0)
    source = loaders.wrap(DataLoader(dataset, batch_size=B, sampler=sampler))

    def order(epoch):
        return np.concatenate([b["label"][b["mask"]] for b in source.iter_epoch(epoch)])

    first, again, second = order(0), order(0), order(1)
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, second)
    assert sorted(first) == sorted(second) == list(range(N))
    assert sampler.epoch == 1


def test_torch_batch_size_must_match_the_loader(arrays):
    loader, _ = _torch(*arrays)
    with pytest.raises(ValueError, match="yields batches of 32 but batch_size=64"):
        loaders.wrap(loader, batch_size=64)


def test_torch_tensors_needing_grad_become_numpy():
    import torch

    batch = {"image": torch.ones(2, 3, requires_grad=True), "label": torch.zeros(2)}
    out = next(loaders.wrap([batch]).iter_epoch(0))
    assert isinstance(out["image"], np.ndarray) and out["image"].dtype == np.float32


def test_tf_tuple_dataset_and_unbatched_without_batch_size(arrays):
    import tensorflow as tf

    dataset = tf.data.Dataset.from_tensor_slices(arrays)
    batch = next(loaders.wrap(dataset.batch(B)).iter_epoch(0))
    assert set(batch) == {"image", "label", "mask"}
    with pytest.raises(ValueError, match=r"single examples.*pass batch_size="):
        loaders.wrap(dataset)


def test_hf_needs_batch_size_and_takes_columns(arrays):
    dataset = _hf(*arrays)
    with pytest.raises(ValueError, match="pass batch_size="):
        loaders.wrap(dataset)
    for obj in (dataset, dataset.to_iterable_dataset()):
        source = loaders.wrap(obj, batch_size=B, columns=["label"])
        assert set(source.element_spec) == {"label", "mask"}
    with pytest.raises(TypeError, match=r"takes options \['columns'\], got \['colums'\]"):
        loaders.wrap(dataset, batch_size=B, colums=["label"])
    with pytest.raises(TypeError, match=r"takes options \[\], got \['columns'\]"):
        loaders.wrap(_list(*arrays)[0], columns=["label"])


def test_hf_iterable_dataset_reshuffles_per_epoch(arrays):
    stream = _hf(*arrays).to_iterable_dataset(num_shards=4).shuffle(seed=0, buffer_size=N)
    source = loaders.wrap(stream, batch_size=B)

    def order(epoch):
        return np.concatenate([b["label"][b["mask"]] for b in source.iter_epoch(epoch)])

    np.testing.assert_array_equal(order(0), order(0))
    assert not np.array_equal(order(0), order(1))


def test_key_naming():
    x, y = np.zeros((2, 3), np.float32), np.ones(2, np.int64)
    first = lambda obj, **kw: next(loaders.wrap(obj, **kw).iter_epoch(0))  # noqa: E731
    assert set(first([(x, y)])) == {"image", "label", "mask"}
    assert set(first([[x, y]], keys=("x", "y"))) == {"x", "y", "mask"}
    assert set(first([x])) == {"image", "mask"}
    Pair = collections.namedtuple("Pair", ["features", "target"])
    assert set(first([Pair(x, y)])) == {"features", "target", "mask"}
    nested = {"a": {"b": x, "c": {"d": y}}, "e": (x, x), "label": [0, 1]}
    batch = first([nested])
    assert set(batch) == {"a/b", "a/c/d", "e/0", "e/1", "label", "mask"}
    np.testing.assert_array_equal(batch["label"], [0, 1])
    with pytest.raises(ValueError, match=r"3 parts but the keys are \('image', 'label'\)"):
        first([(x, y, y)])
    with pytest.raises(ValueError, match="names the parts of tuple batches"):
        first([{"x": x}], keys=("x",))


def test_callable_is_called_per_epoch_and_generators_are_refused():
    def batches():
        yield {"image": np.zeros((4, 28, 28, 1), np.uint8), "label": np.arange(4)}

    source = loaders.wrap(batches)
    assert len(list(source.iter_epoch(0))) == len(list(source.iter_epoch(1))) == 1
    with pytest.raises(TypeError, match="single-use"):
        loaders.wrap(batches())


def test_unsupported_objects_list_what_is_supported():
    pattern = r"got a builtins\.int; it supports: datasets\.Dataset.*torch\.utils\.data\.DataLoader"
    with pytest.raises(TypeError, match=pattern):
        loaders.wrap(3)
    with pytest.raises(TypeError, match=r"got a numpy\.ndarray"):
        loaders.wrap(np.zeros((4, 2)))
    with pytest.raises(TypeError, match=r"got a builtins\.dict"):
        loaders.wrap({"image": np.zeros((4, 2))})


def test_inconsistent_batches_name_the_key():
    good = {"image": np.zeros((4, 2), np.uint8), "label": np.zeros(4, np.int32)}
    cases = {
        r"batch 1 of epoch 0: 'label' is int16 \(4,\), but batch 0 of epoch 0 had int32 \(4,\)": {
            **good,
            "label": np.zeros(4, np.int16),
        },
        r"'image' is uint8 \(4, 3\), but batch 0 of epoch 0 had uint8 \(4, 2\)": {
            **good,
            "image": np.zeros((4, 3), np.uint8),
        },
        r"'extra' is bool \(4,\), but batch 0 of epoch 0 had missing": {
            **good,
            "extra": np.zeros(4, bool),
        },
        "batch 1 of epoch 0 has 5 rows, more than batch_size 4": {
            k: np.zeros((5, *v.shape[1:]), v.dtype) for k, v in good.items()
        },
        r"disagree on the number of rows: \{'image': 4, 'label': 3\}": {
            **good,
            "label": np.zeros(3, np.int32),
        },
        "'label' is a scalar": {**good, "label": np.int32(0)},
    }
    for message, bad in cases.items():
        with pytest.raises(ValueError, match=message):
            list(loaders.wrap([good, bad]).iter_epoch(0))


def test_batch_size_and_spec_from_the_first_batch():
    batches = [{"label": np.arange(3)}, {"label": np.arange(2)}]
    source = loaders.wrap(batches)
    assert source.batch_size == 3 and set(source.element_spec) == {"label", "mask"}
    out = list(source.iter_epoch(0))
    np.testing.assert_array_equal(out[0]["mask"], [True, True, True])
    np.testing.assert_array_equal(out[1]["mask"], [True, True, False])
    np.testing.assert_array_equal(out[1]["label"], [0, 1, 0])
    # The first batch is read by wrap() itself, so an empty loader fails there.
    with pytest.raises(ValueError, match="yielded no batches"):
        loaders.wrap(lambda: iter([]))
    with pytest.raises(ValueError, match=r"the wrapped a re-iterable .* is empty"):
        loaders.wrap([])


def test_transform_makes_torch_layout_mnist(arrays):
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    nchw = torch.from_numpy(arrays[0].transpose(0, 3, 1, 2).astype(np.float32) / 255)
    loader = DataLoader(TensorDataset(nchw, torch.from_numpy(arrays[1])), batch_size=B)

    def to_mnist(batch):
        image = np.rint(batch["image"].transpose(0, 2, 3, 1) * 255).astype(np.uint8)
        return {"image": image, "label": batch["label"]}

    batch = next(loaders.wrap(loader, transform=to_mnist).iter_epoch(0))
    np.testing.assert_array_equal(batch["image"], arrays[0][:B])


def test_a_batch_source_passes_through():
    source = loaders.make("numpy", dataset="mnist-sample", batch_size=8)
    assert loaders.wrap(source) is source
    with pytest.raises(TypeError, match="already a BatchSource"):
        loaders.wrap(source, batch_size=8)


def test_wrap_and_import_load_no_framework():
    code = (
        "import sys, numpy as np, loaders\n"
        "heavy = {'torch', 'tensorflow', 'grain', 'datasets'}\n"
        "assert not heavy & set(sys.modules), heavy & set(sys.modules)\n"
        "batch = {'image': np.zeros((2, 28, 28, 1), np.uint8), 'label': np.zeros(2, np.int32)}\n"
        "source = loaders.wrap([batch])\n"
        "assert len(list(source.iter_epoch(0))) == 1 and source.element_spec\n"
        "assert not heavy & set(sys.modules), heavy & set(sys.modules)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_wrapped_torch_loader_trains_end_to_end():
    import jax
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    import jaxfeed
    from jaxfeed import sharding

    data = loaders.load_dataset("mnist-sample", "train")
    dataset = TensorDataset(
        torch.from_numpy(data["image"].copy()), torch.from_numpy(data["label"].copy())
    )
    source = loaders.wrap(DataLoader(dataset, batch_size=96, shuffle=True))
    with sharding.DeviceFeed(source) as feed:
        batch = next(feed)
        assert batch["image"].shape == (96, 28, 28, 1) and batch["image"].dtype == np.uint8
        assert len(batch["label"].sharding.device_set) == len(jax.devices())
    _, history = jaxfeed.mnist.train(
        source, None, jaxfeed.mnist.TrainConfig(epochs=1), progress=False
    )
    assert np.isfinite(history[0]["loss"]) and history[0]["train_accuracy"] > 0.5


def test_tf_rows_as_wide_as_the_batch_are_batched_not_taken_for_batches():
    import tensorflow as tf

    rows = tf.data.Dataset.from_tensor_slices(np.arange(12).reshape(6, 2))  # rows of width 2
    batches = list(loaders.wrap(rows, batch_size=2).iter_epoch(0))
    assert [b["image"].tolist() for b in batches] == [
        [[0, 1], [2, 3]],
        [[4, 5], [6, 7]],
        [[8, 9], [10, 11]],
    ]
    # The same rows batched in the pipeline: its batches, as they are.
    native = list(loaders.wrap(rows.batch(6)).iter_epoch(0))
    assert len(native) == 1 and native[0]["image"].shape == (6, 2)


@pytest.mark.parametrize("batch_size", [None, 4])
def test_a_tf_pipeline_that_may_yield_rows_or_batches_is_asked_about(batch_size):
    import tensorflow as tf

    def sequences():  # rows of varying length, or batches? wrap cannot see
        for n in (3, 5, 2):
            yield np.arange(n, dtype=np.int32)

    spec = tf.TensorSpec([None], tf.int32)
    data = tf.data.Dataset.from_generator(sequences, output_signature=spec)
    with pytest.raises(ValueError, match=r"cannot tell whether .* rows or batches.*\.unbatch\(\)"):
        loaders.wrap(data, batch_size=batch_size)
    # Said to be batches of rows: each of its elements holds rows, batched by wrap.
    told = loaders.wrap(data.unbatch().map(lambda x: {"x": x}), batch_size=4)
    assert [b["x"].tolist() for b in told.iter_epoch(0)] == [
        [0, 1, 2, 0],
        [1, 2, 3, 4],
        [0, 1, 0, 0],
    ]
