"""Bad numbers given to the loaders fail at once, with a message that names them.

Issue 12, point 5: batch sizes, seeds, epochs and starts are checked where
they are given (``make``, ``Sampler``, ``wrap``, ``iter_epoch``), wrapped
64-bit leaves are reported with the dtype the device receives, and an epoch
with no batch is an error. Per-backend epoch/start checks are in
test_contract.py.
"""

import jax
import numpy as np
import pytest
from jaxfeed.loaders import Sampler

import jaxfeed
from jaxfeed import loaders, sharding

DATASET = dict(dataset="mnist-sample", split="train")
NOWHERE = "/nonexistent/jaxfeed-idx-dir"  # loading it would fail: checks come first


@pytest.mark.parametrize(
    ("batch_size", "error", "match"),
    [
        (2.5, TypeError, r"batch_size must be an int >= 1, got 2\.5 \(float\)"),
        (True, TypeError, r"batch_size must be an int >= 1, got True \(bool\)"),
        ("32", TypeError, r"batch_size must be an int >= 1, got '32' \(str\)"),
        (0, ValueError, r"batch_size must be an int >= 1, got 0"),
        (-4, ValueError, r"batch_size must be an int >= 1, got -4"),
    ],
)
def test_bad_batch_size_is_refused_by_make_sampler_and_wrap(batch_size, error, match):
    with pytest.raises(error, match=match):
        loaders.make("numpy", dataset=NOWHERE, batch_size=batch_size)
    with pytest.raises(error, match=match):
        Sampler(num_examples=100, batch_size=batch_size)
    with pytest.raises(error, match=match):
        loaders.wrap([{"label": np.zeros(4, np.int32)}], batch_size=batch_size)


def test_numpy_integer_batch_size_and_seed_are_accepted_as_ints():
    source = loaders.make("numpy", **DATASET, batch_size=np.int64(8), seed=np.uint32(3))
    assert type(source.batch_size) is int and source.batch_size == 8
    assert type(source.sampler.seed) is int
    assert next(source.iter_epoch(0))["image"].shape == (8, 28, 28, 1)
    assert loaders.wrap([{"label": np.zeros(4, np.int32)}], batch_size=np.int32(4)).batch_size == 4


@pytest.mark.parametrize(
    ("seed", "error", "match"),
    [
        (-1, ValueError, r"seed must be an int in \[0, 4294967295\], got -1; pick a seed"),
        (2**32, ValueError, r"seed must be an int in \[0, 4294967295\], got 4294967296"),
        (2**64, ValueError, r"seed must be an int in \[0, 4294967295\], got 18446744073709551616"),
        (1.5, TypeError, r"seed must be an int in \[0, 4294967295\], got 1\.5 \(float\)"),
    ],
)
def test_bad_seed_is_refused_before_any_data_is_read(seed, error, match):
    with pytest.raises(error, match=match):
        Sampler(num_examples=100, batch_size=10, seed=seed)
    with pytest.raises(error, match=match):
        loaders.make("numpy", dataset=NOWHERE, seed=seed)


def test_largest_seed_reads_an_epoch():
    source = loaders.make("numpy", **DATASET, batch_size=1000, seed=2**32 - 1)
    labels = np.concatenate([b["label"] for b in source.iter_epoch(0)])
    assert len(labels) == 4000


def _wrapped(rows=10, batch=4, **kwargs):
    data = [{"label": np.arange(i, min(i + batch, rows))} for i in range(0, rows, batch)]
    return loaders.wrap(data, **kwargs)


def test_wrapped_epoch_and_start_are_checked_at_the_call():
    source = _wrapped()  # a list: 3 batches, a known length
    assert source.num_batches == 3
    with pytest.raises(ValueError, match=r"epoch must be an int in \[0, 4294967295\], got -1"):
        source.iter_epoch(-1)
    with pytest.raises(ValueError, match=r"start=4 is outside \[0, 3\], the batches of one epoch"):
        source.iter_epoch(0, start=4)
    with pytest.raises(ValueError, match=r"start must be an int >= 0, got -2"):
        source.iter_epoch(0, start=-2)
    assert list(source.iter_epoch(0, start=3)) == []


def test_wrapped_64_bit_leaves_are_reported_and_delivered_as_32_bit():
    # 8 rows: one per CPU device of the test setup.
    batch = {"image": np.linspace(0, 1, 16).reshape(8, 2), "label": np.arange(8, dtype=np.int64)}
    source = loaders.wrap([batch])
    spec = source.element_spec
    assert spec["image"].dtype == np.float32 and spec["label"].dtype == np.int32
    host = next(source.iter_epoch(0))
    assert {k: v.dtype for k, v in host.items()} == {k: s.dtype for k, s in spec.items()}
    np.testing.assert_array_equal(host["label"], np.arange(8))
    with sharding.DeviceFeed(source) as feed:
        placed = next(feed)
    assert {k: v.dtype for k, v in placed.items()} == {k: s.dtype for k, s in spec.items()}


def test_wrapped_64_bit_leaves_stay_64_bit_with_x64():
    batch = {"label": np.arange(4, dtype=np.int64) * 2**40}
    with jax.enable_x64(True):
        assert loaders.wrap([batch]).element_spec["label"].dtype == np.int64


def test_wrapped_int64_that_does_not_fit_int32_is_refused_not_wrapped_around():
    batch = {"label": np.array([0, 1, 2**40, 3], np.int64)}
    with pytest.raises(ValueError, match=r"'label' holds 0\.\.1099511627776, which does not fit"):
        list(loaders.wrap([batch]).iter_epoch(0))


def test_wrapped_loader_with_less_than_one_batch_is_refused_at_wrap():
    import datasets
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    loader = DataLoader(TensorDataset(torch.zeros(3, 2)), batch_size=4)
    with pytest.raises(ValueError, match=r"DataLoader has no batches in an epoch: .* batch of 4"):
        loaders.wrap(loader, drop_remainder=True)
    table = datasets.Dataset.from_dict({"label": [0, 1, 2]})
    with pytest.raises(ValueError, match=r"3 rows, fewer than one batch of 4, and short"):
        loaders.wrap(table, batch_size=4, drop_remainder=True)


def test_wrapped_stream_with_less_than_one_batch_fails_at_wrap_and_its_epoch():
    match = r"epoch 0 of the wrapped .* its 3 rows are fewer than batch_size 4"
    with pytest.raises(ValueError, match=match):  # wrap() reads epoch 0's first batch
        loaders.wrap(lambda: iter([np.zeros((3, 2))]), batch_size=4, drop_remainder=True)
    with pytest.raises(ValueError, match=r"each of its 2 batches \(rows \[3, 3\]\) is fewer"):
        loaders.wrap(lambda: iter([np.zeros((3, 2))] * 2), batch_size=4, drop_remainder=True)
    with pytest.raises(ValueError, match=r"yielded no batches in epoch 0"):
        loaders.wrap(lambda: iter([]))
    # A later epoch with no full batch fails that epoch, and train (was a ZeroDivisionError).
    digits = loaders.load_dataset("mnist-sample", "train")
    rows = iter([8, 3])  # epoch 0: one full batch of 8; epoch 1: 3 rows
    shrinking = loaders.wrap(
        lambda: iter([(digits["image"][: (n := next(rows))], digits["label"][:n])]),
        batch_size=8,
        drop_remainder=True,
    )
    with pytest.raises(ValueError, match=r"epoch 1 of .* its 3 rows are fewer than batch_size 8"):
        jaxfeed.mnist.train(shrinking, None, jaxfeed.mnist.TrainConfig(epochs=2), progress=False)


# Issue 42, item 16: a wrong type is named, with what was expected and what came.

_NUMBERS = {"x": np.zeros((16, 3), np.float32), "y": np.arange(16, dtype=np.int32)}


def _step(state, batch):
    return state, {"count": jax.numpy.sum(batch["mask"])}


@pytest.mark.parametrize(
    ("call", "name", "given"),
    [
        (
            lambda: loaders.make("numpy", dataset=NOWHERE, drop_remainder="no"),
            "drop_remainder",
            "no",
        ),
        (
            lambda: Sampler(num_examples=100, batch_size=10, drop_remainder="no"),
            "drop_remainder",
            "no",
        ),
        (lambda: loaders.wrap([_NUMBERS], drop_remainder="no"), "drop_remainder", "no"),
        (lambda: jaxfeed.Logging(records="no"), "Logging.records", "no"),
        (
            lambda: jaxfeed.Checkpointing("ckpt", accept_changed_data="no"),
            "Checkpointing.accept_changed_data",
            "no",
        ),
    ],
)
def test_a_truthy_string_is_no_bool(call, name, given):
    with pytest.raises(TypeError, match=rf"^{name} must be True or False, got '{given}' \(str\)$"):
        call()


def test_convert_and_fit_refuse_a_truthy_string_for_a_bool(tmp_path):
    from jaxfeed.loaders.data.formats.convert import convert

    with pytest.raises(TypeError, match=r"overwrite must be True or False, got 'no' \(str\)"):
        convert("mnist-sample", tmp_path / "out", "npy", overwrite="no")
    assert not (tmp_path / "out").exists()
    source = loaders.make("numpy", dataset=_NUMBERS, batch_size=8)
    with pytest.raises(TypeError, match=r"resume must be True or False, got 'no' \(str\)"):
        jaxfeed.fit(_step, {}, source, epochs=1, resume="no")


def test_device_feed_names_a_source_or_sharding_of_the_wrong_kind():
    source = loaders.make("numpy", dataset=_NUMBERS, batch_size=8)
    mesh = sharding.data_mesh()
    not_a_source = (
        r"^source must be a BatchSource \(from jaxfeed.make or jaxfeed.wrap\), got None "
        r"\(NoneType\); wrap a loader first"
    )
    with pytest.raises(TypeError, match=not_a_source):
        sharding.DeviceFeed(None, mesh)
    not_a_mesh = (
        r"^sharding must be a jax.sharding.Mesh, a NamedSharding or None \(all devices\), "
        r"got 'mesh' \(str\)$"
    )
    with pytest.raises(TypeError, match=not_a_mesh):
        sharding.DeviceFeed(source, "mesh")


def test_fit_names_a_step_source_or_mesh_of_the_wrong_kind():
    source = loaders.make("numpy", dataset=_NUMBERS, batch_size=8)
    with pytest.raises(TypeError, match=r"^step must be a function step\(state, batch\) -> "):
        jaxfeed.fit(None, {}, source, epochs=1)
    with pytest.raises(TypeError, match=r"^train must be a BatchSource .*, got 'src' \(str\)"):
        jaxfeed.fit(_step, {}, "src", epochs=1)
    with pytest.raises(TypeError, match=r"^eval must be a BatchSource .*, got \[1\] \(list\)"):
        jaxfeed.fit(_step, {}, source, epochs=1, eval=[1], eval_step=lambda s, b: {})
    with pytest.raises(TypeError, match=r"^mesh must be a jax.sharding.Mesh.*got 'mesh' \(str\)"):
        jaxfeed.fit(_step, {}, source, epochs=1, mesh="mesh")


@pytest.mark.parametrize("rows", [[np.arange(3), np.arange(5)], np.array([[1, 2, 3], [4]], object)])
def test_rows_of_different_lengths_need_a_sequence_layout_named(rows):
    data = {"input_ids": rows, "label": np.arange(2)}
    match = (
        r"^dataset arrays: field\(s\) \['input_ids'\] hold rows of different lengths; pass "
        r"pad=L .*, bucket=\(64, 128, \.\.\.\) .* or pack=L .*"
    )
    with pytest.raises(ValueError, match=match):
        loaders.make("numpy", dataset=data, batch_size=1)
    assert loaders.make("numpy", dataset=data, batch_size=1, pad=5).shapes == (5,)


def test_rows_of_different_frame_shapes_are_named_not_numpys_sequence_error():
    data = {"frames": [np.zeros((3, 2)), np.zeros((5, 4))], "label": np.arange(2)}
    match = (
        r"^dataset 'arrays', field 'frames' has rows of different shapes \(row 0: \(3, 2\), row 1: "
        r"\(5, 4\)\); rows may differ only in their first axis \(a sequence's length; then pass "
        r"pad=, bucket= or pack= to make\): pad or cut them to one shape first$"
    )
    with pytest.raises(ValueError, match=match):
        loaders.make("numpy", dataset=data, batch_size=1)


def test_a_tuple_batchs_default_names_say_how_to_name_them():
    pairs = [(np.zeros((4, 3), np.int32), np.arange(4))]
    assert sorted(loaders.wrap(pairs).element_spec) == ["image", "label", "mask"]  # documented
    positions = (
        r"\(the batches are tuples, whose parts are named by position: 'image' is part 0, "
        r"'label' is part 1; name them with keys=, e.g. keys=\('input_ids', 'label'\)\)$"
    )
    missing = r"has no field 'input_ids', which pad_to= names; its fields are \['image', 'label'\] "
    with pytest.raises(ValueError, match=missing + positions):
        loaders.wrap(pairs, pad_to={"input_ids": 8})
    ragged = [([[0, 1, 2], [3, 4]], np.arange(2))]  # token ids of two lengths
    with pytest.raises(ValueError, match=r"field 'image' is object .*" + positions):
        loaders.wrap(ragged)
    named = loaders.wrap(pairs, keys=("input_ids", "label"), pad_to={"input_ids": 8})
    assert named.element_spec["input_ids"].shape == (4, 8)
    with pytest.raises(ValueError, match=r"its fields are \['input_ids', 'label'\]$"):
        loaders.wrap(pairs, keys=("input_ids", "label"), pad_to={"ids": 8})
