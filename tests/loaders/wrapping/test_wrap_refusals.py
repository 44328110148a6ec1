"""`loaders.wrap` refuses bad input early and by name, and reads the first batch once.

Covers: the first batch read at `wrap()` and served by the first
``iter_epoch(0)``; non-numeric leaves (refused, or carried as ``host_fields``
through `DeviceFeed`); lengths that vary between batches (refused, or fixed
with ``pad_to``); a user field named ``mask``; bad numeric arguments.
"""

import re

import jax
import numpy as np
import pytest

from jaxfeed import loaders, sharding

B = 4


def _mesh(devices: int) -> jax.sharding.Mesh:
    return sharding.data_mesh(jax.devices()[:devices])


class CountingLoader:
    """A re-iterable of ``num`` batches that counts the batches read."""

    def __init__(self, num: int = 3, fail_at: int | None = None):
        self.num, self.fail_at, self.reads = num, fail_at, 0

    def __len__(self) -> int:
        return self.num

    def __iter__(self):
        for i in range(self.num):
            if i == self.fail_at:
                raise OSError(f"disk gone at batch {i}")
            self.reads += 1
            yield {"x": np.full((B, 2), i, np.float32), "label": np.arange(B) + B * i}


# --- the first batch: read once ---------------------------------------------------------


def test_first_batch_read_once_across_wrap_properties_isinstance_and_epoch_0():
    loader = CountingLoader()
    source = loaders.wrap(loader)
    assert loader.reads == 1  # read by wrap(), to check it
    assert isinstance(source, loaders.BatchSource)
    assert source.batch_size == B and source.num_batches == 3
    assert set(source.element_spec) == {"x", "label", "mask"}
    assert loader.reads == 1  # none of these read again
    batches = list(source.iter_epoch(0))
    assert loader.reads == 3  # the first batch was served, not re-read
    assert [int(b["x"][0, 0]) for b in batches] == [0, 1, 2]
    assert isinstance(source, loaders.BatchSource) and loader.reads == 3
    # Later epochs (and epoch 0 again) read afresh.
    assert [int(b["x"][0, 0]) for b in source.iter_epoch(0)] == [0, 1, 2]
    assert loader.reads == 6


def test_first_batch_is_dropped_when_another_position_is_read_first():
    loader = CountingLoader()
    source = loaders.wrap(loader, resume="replay")
    assert [int(b["x"][0, 0]) for b in source.iter_epoch(0, start=1)] == [1, 2]
    assert loader.reads == 1 + 2  # reads on from the held batch: nothing twice
    assert [int(b["x"][0, 0]) for b in source.iter_epoch(0)] == [0, 1, 2]
    assert loader.reads == 1 + 2 + 3


def test_a_torch_dataset_reads_each_row_once_in_the_first_epoch():
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Rows(Dataset):
        def __init__(self):
            self.reads = 0

        def __len__(self):
            return 4 * B  # whole batches: no padding row is read twice

        def __getitem__(self, i):
            self.reads += 1
            return {"x": torch.full((3,), float(i)), "label": i}

    rows = Rows()
    source = loaders.wrap(DataLoader(rows, batch_size=B))
    assert rows.reads == B
    assert isinstance(source, loaders.BatchSource) and source.element_spec["x"].shape == (B, 3)
    labels = np.concatenate([b["label"] for b in source.iter_epoch(0)])
    assert rows.reads == 4 * B and sorted(labels) == list(range(4 * B))


def test_isinstance_never_reads_even_when_the_loader_fails_later():
    loader = CountingLoader(fail_at=1)
    source = loaders.wrap(loader)
    for _ in range(3):
        assert isinstance(source, loaders.BatchSource)
    assert loader.reads == 1
    batches = source.iter_epoch(0)
    assert int(next(batches)["x"][0, 0]) == 0
    with pytest.raises(OSError, match="disk gone at batch 1"):
        next(batches)
    assert isinstance(source, loaders.BatchSource)


def test_a_loader_failing_at_its_first_batch_fails_in_wrap():
    with pytest.raises(OSError, match="disk gone at batch 0"):
        loaders.wrap(CountingLoader(fail_at=0))


# --- non-numeric leaves and host_fields --------------------------------------------------


def _text_batches(widths=(16, 17, 16), rows=B):
    """Batches whose ``text`` rows are as wide as ``widths`` (<U16, <U17, ...)."""
    out = []
    for i, width in enumerate(widths):
        text = np.array([f"{i}-{r}".ljust(width, "x") for r in range(rows)])
        out.append({"text": text, "label": np.arange(rows, dtype=np.int32) + rows * i})
    return out


def test_a_string_leaf_is_refused_at_wrap_by_name():
    batches = _text_batches()
    message = (
        "batch 0 of epoch 0: field 'text' is <U16 (strings); JAX arrays hold numbers only: "
        "drop it with transform=, tokenize it, or pass host_fields=('text',) to carry it "
        "with the batch as numpy"
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        loaders.wrap(batches)


@pytest.mark.parametrize(
    ("value", "described"),
    [
        (np.array([b"ab"] * B), "|S2 (bytes)"),
        (np.array([{"a": 1}] * B, dtype=object), "object (Python objects)"),
        (np.array(["2024-01-01"] * B, dtype="datetime64[D]"), "datetime64[D] (datetimes)"),
        (np.zeros(B, dtype=[("a", np.int32)]), "void32 (raw bytes or records)"),
    ],
)
def test_every_non_numeric_kind_is_named(value, described):
    batch = {"meta": value, "label": np.arange(B)}
    with pytest.raises(ValueError, match=re.escape(f"field 'meta' is {described}")):
        loaders.wrap([batch])


def test_a_non_numeric_leaf_in_a_later_batch_names_the_batch():
    good = {"label": np.arange(B, dtype=np.int32)}
    bad = {"label": np.array([None] * B, dtype=object)}
    source = loaders.wrap([good, bad])
    with pytest.raises(ValueError, match=r"^batch 1 of epoch 0: field 'label' is object"):
        list(source.iter_epoch(0))


def test_an_hf_text_column_is_refused_or_carried_on_the_host():
    import datasets

    rows = 10
    table = datasets.Dataset.from_dict(
        {"text": [f"row {i}" for i in range(rows)], "label": list(range(rows))}
    )
    with pytest.raises(ValueError, match=r"field 'text' is <U\d+ \(strings\).*host_fields"):
        loaders.wrap(table, batch_size=B)
    source = loaders.wrap(table, batch_size=B, host_fields=("text",))
    assert source.host_fields == ("text",) and set(source.element_spec) == {"label", "mask"}
    batches = list(source.iter_epoch(0))
    texts = np.concatenate([b["text"][b["mask"]] for b in batches])
    labels = np.concatenate([b["label"][b["mask"]] for b in batches])
    assert [f"row {i}" for i in labels] == texts.tolist() and sorted(labels) == list(range(rows))
    assert batches[-1]["text"][rows % B :].tolist() == [""] * (B - rows % B)  # padding rows


@pytest.mark.parametrize("devices", [1, 8])
def test_host_fields_travel_through_the_device_feed(devices):
    batches = _text_batches(rows=8)
    batches.append({k: v[:6] for k, v in batches[0].items()})  # short: padded and masked
    source = loaders.wrap(batches, host_fields=["text"])
    assert source.host_fields == ("text",) and "text" not in source.element_spec
    expected = list(source.iter_epoch(0))
    with sharding.DeviceFeed(source, _mesh(devices)) as feed:
        got = list(feed)
    assert len(got) == len(expected) == 4
    for placed, host in zip(got, expected, strict=True):
        assert set(placed) == {"text", "label", "mask"}
        assert isinstance(placed["text"], np.ndarray)  # not placed: this process's numpy
        np.testing.assert_array_equal(placed["text"], host["text"])
        assert isinstance(placed["label"], jax.Array)
        assert len(placed["label"].sharding.device_set) == devices
        np.testing.assert_array_equal(np.asarray(placed["label"]), host["label"])
        np.testing.assert_array_equal(np.asarray(placed["mask"]), host["mask"])
    assert got[0]["text"].dtype == np.dtype("<U16") and got[1]["text"].dtype == np.dtype("<U17")
    assert got[0]["text"][:2].tolist() == ["0-0" + "x" * 13, "0-1" + "x" * 13]
    assert got[-1]["text"][6:].tolist() == ["", ""]  # the padding rows
    np.testing.assert_array_equal(np.asarray(got[-1]["mask"]), [True] * 6 + [False] * 2)


def test_host_fields_with_steps_per_transfer_come_as_lists():
    source = loaders.wrap(_text_batches(), host_fields=("text",))
    expected = list(source.iter_epoch(0))
    with sharding.DeviceFeed(source, _mesh(4), steps_per_transfer=2) as feed:
        got = list(feed)
    assert [len(t["text"]) for t in got] == [2, 1]
    assert got[0]["label"].shape == (2, B) and isinstance(got[0]["label"], jax.Array)
    for transfer, group in zip(got, (expected[:2], expected[2:]), strict=True):
        assert all(isinstance(t, np.ndarray) for t in transfer["text"])
        assert [t.tolist() for t in transfer["text"]] == [b["text"].tolist() for b in group]


def test_host_fields_and_pad_to_name_fields_the_batches_have():
    with pytest.raises(ValueError, match=r"has no field 'txt', which host_fields= names"):
        loaders.wrap(_text_batches(), host_fields=("txt",))
    with pytest.raises(ValueError, match=r"has no field 'tokns', which pad_to= names"):
        loaders.wrap(_text_batches(), host_fields=("text",), pad_to={"tokns": 8})
    with pytest.raises(ValueError, match="'text' is in both host_fields and pad_to"):
        loaders.wrap(_text_batches(), host_fields=("text",), pad_to={"text": 8})
    with pytest.raises(TypeError, match=r"host_fields must be a sequence of field names"):
        loaders.wrap(_text_batches(), host_fields="text")
    with pytest.raises(TypeError, match=r"pad_to must be a dict like"):
        loaders.wrap(_text_batches(), pad_to=[("tokens", 8)])
    with pytest.raises(ValueError, match=re.escape("pad_to['tokens'] must be an int >= 1, got 0")):
        loaders.wrap(_text_batches(), pad_to={"tokens": 0})
    with pytest.raises(TypeError, match=re.escape("pad_to['tokens'] must be an int >= 1")):
        loaders.wrap(_text_batches(), pad_to={"tokens": "8"})


# --- lengths that vary: refused, or padded with pad_to ---------------------------------


def _token_batches(lengths=(5, 7, 3)):
    """Batch i holds B rows of ``lengths[i]`` tokens (values 1.., so padding zeros show)."""
    return [
        {"tokens": np.tile(np.arange(1, n + 1, dtype=np.int32), (B, 1)), "label": np.arange(B)}
        for n in lengths
    ]


def test_a_length_that_varies_is_refused_with_both_shapes_and_the_fix():
    source = loaders.wrap(_token_batches())
    message = (
        "batch 1 of epoch 0: 'tokens' is int32 (4, 7), but batch 0 of epoch 0 had int32 (4, 5); "
        "every batch needs the same keys, shapes and dtypes (pad 'tokens' to a fixed length "
        "with pad_to={'tokens': N}, or make them agree with transform=)"
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        list(source.iter_epoch(0))


def test_pad_to_right_pads_the_last_axis_with_zeros():
    source = loaders.wrap(_token_batches(), pad_to={"tokens": 8})
    assert source.element_spec["tokens"] == loaders.ArraySpec((B, 8), np.dtype(np.int32))
    batches = list(source.iter_epoch(0))
    for batch, n in zip(batches, (5, 7, 3), strict=True):
        row = [*range(1, n + 1), *[0] * (8 - n)]
        np.testing.assert_array_equal(batch["tokens"], np.tile(row, (B, 1)))
    longer = "batch 1 of epoch 0: 'tokens' has a row of length 7, longer than pad_to['tokens']=6"
    with pytest.raises(ValueError, match=re.escape(longer)):
        list(loaders.wrap(_token_batches(), pad_to={"tokens": 6}).iter_epoch(0))
    with pytest.raises(ValueError, match=r"pad_to pads the last axis of 'label', but it is \(4,\)"):
        loaders.wrap(_token_batches(), pad_to={"label": 6})


def test_pad_to_pads_ragged_rows_from_lists_and_hf():
    import datasets

    ragged = {"tokens": [[1, 2], [3], [4, 5, 6], []], "label": np.arange(B)}
    expected = [[1, 2, 0, 0], [3, 0, 0, 0], [4, 5, 6, 0], [0, 0, 0, 0]]
    with pytest.raises(ValueError, match=r"field 'tokens' is object \(rows of different lengths\)"):
        loaders.wrap([ragged])
    batch = next(loaders.wrap([ragged], pad_to={"tokens": 4}).iter_epoch(0))
    np.testing.assert_array_equal(batch["tokens"], expected)
    assert batch["tokens"].dtype == np.int32  # JAX's width of the Python ints
    table = datasets.Dataset.from_dict({k: list(v) for k, v in ragged.items()})
    with pytest.raises(ValueError, match=r"field 'tokens' is object \(rows of different"):
        loaders.wrap(table, batch_size=B)
    batch = next(loaders.wrap(table, batch_size=B, pad_to={"tokens": 4}).iter_epoch(0))
    order = np.argsort(batch["label"])  # whatever order the wrap reads the table in
    np.testing.assert_array_equal(batch["tokens"][order], expected)


def test_every_field_that_needs_pad_to_is_named_in_one_refusal():
    # A tokenizer's output without padding: two fields of ragged rows, and a string.
    ids = [[101, 7, 102], [101, 102], [101, 5, 6, 102], [101, 102]]
    ragged = {
        "text": np.array(["a b", "", "c d e", ""]),
        "input_ids": ids,
        "attention_mask": [[1] * len(row) for row in ids],
        "label": np.arange(B),
    }
    message = (
        "batch 0 of epoch 0: fields 'input_ids', 'attention_mask' are object (rows of "
        "different lengths); pad them to a fixed length with pad_to={'input_ids': N, "
        "'attention_mask': N}, or carry them as numpy with host_fields=('input_ids', "
        "'attention_mask')"
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        loaders.wrap([ragged])
    # Then the string field, whose fix is another; then it reads.
    pads = {"input_ids": 4, "attention_mask": 4}
    with pytest.raises(ValueError, match=r"field 'text' is <U5 \(strings\)"):
        loaders.wrap([ragged], pad_to=pads)
    batch = next(loaders.wrap([ragged], pad_to=pads, host_fields=("text",)).iter_epoch(0))
    assert batch["attention_mask"].tolist()[1] == [1, 1, 0, 0]
    # Lengths that vary from batch to batch (a collate that pads to the batch's longest).
    varying = [
        {key: np.ones((B, n), np.int32) for key in ("input_ids", "attention_mask")} for n in (5, 7)
    ]
    message = (
        "batch 1 of epoch 0: 'attention_mask' is int32 (4, 7), but batch 0 of epoch 0 had "
        "int32 (4, 5); 'input_ids' is int32 (4, 7), but batch 0 of epoch 0 had int32 (4, 5); "
        "every batch needs the same keys, shapes and dtypes (pad 'attention_mask', "
        "'input_ids' to a fixed length with pad_to={'attention_mask': N, 'input_ids': N}, "
        "or make them agree with transform=)"
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        list(loaders.wrap(varying).iter_epoch(0))
    padded = loaders.wrap(varying, pad_to={"input_ids": 8, "attention_mask": 8})
    assert [b["input_ids"].shape for b in padded.iter_epoch(0)] == [(B, 8)] * 2


def test_tf_padded_batch_without_shapes_is_refused_then_fixed_with_pad_to():
    import tensorflow as tf

    lengths = [3, 5, 2, 4, 7, 1, 6, 2, 1, 2, 3, 1]  # longest per batch of 4: 5, 7, 3

    def rows():
        for i, n in enumerate(lengths):
            yield {"tokens": np.arange(1, n + 1, dtype=np.int32), "label": np.int32(i)}

    signature = {
        "tokens": tf.TensorSpec([None], tf.int32),
        "label": tf.TensorSpec([], tf.int32),
    }
    dataset = tf.data.Dataset.from_generator(rows, output_signature=signature).padded_batch(B)
    source = loaders.wrap(dataset)
    with pytest.raises(ValueError) as caught:
        list(source.iter_epoch(0))
    message = str(caught.value)
    assert message.startswith(
        "batch 1 of epoch 0: 'tokens' is int32 (4, 7), but batch 0 of epoch 0 had int32 (4, 5)"
    )
    assert "pad_to={'tokens': N}" in message and "first batch" not in message
    padded = list(loaders.wrap(dataset, pad_to={"tokens": 8}).iter_epoch(0))
    assert [b["tokens"].shape for b in padded] == [(B, 8)] * 3
    for i, n in enumerate(lengths):
        row = padded[i // B]["tokens"][i % B]
        assert row.tolist() == [*range(1, n + 1), *[0] * (8 - n)]


# --- the row mask's name ------------------------------------------------------------------


def test_a_user_field_named_mask_is_refused_with_the_rename():
    attention = {"x": np.ones((B, 3), np.float32), "mask": np.ones((B, 3), bool)}
    fix = "rename yours, e.g. transform=lambda b: {'attention_mask' if k == 'mask' else k: v"
    for kwargs in ({}, {"drop_remainder": True}):
        with pytest.raises(ValueError, match=r"have a field 'mask', the name wrap gives its row"):
            loaders.wrap([attention], **kwargs)
    with pytest.raises(ValueError, match=re.escape(fix)):
        loaders.wrap([attention])
    pair = (np.ones((B, 3), np.float32), np.ones(B, bool))
    with pytest.raises(ValueError, match=r"field 'mask'.*or keys=\(\.\.\.\) for tuple batches"):
        loaders.wrap([pair], keys=("x", "mask"))
    # The rename the message gives works, and the row mask is wrap's own.
    short = {k: v[:3] for k, v in attention.items()}
    renamed = loaders.wrap(
        [attention, short],
        transform=lambda b: {"attention_mask" if k == "mask" else k: v for k, v in b.items()},
    )
    assert set(renamed.element_spec) == {"x", "attention_mask", "mask"}
    last = list(renamed.iter_epoch(0))[-1]
    np.testing.assert_array_equal(last["mask"], [True, True, True, False])
    assert last["attention_mask"].shape == (B, 3) and not last["attention_mask"][3].any()


# --- bad numbers -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"seed": -1}, ValueError, "seed must be an int in [0, 4294967295], got -1"),
        ({"seed": 2**32}, ValueError, "seed must be an int in [0, 4294967295], got 4294967296"),
        ({"seed": 1.5}, TypeError, "seed must be an int in [0, 4294967295], got 1.5 (float)"),
        ({"seed": True}, TypeError, "seed must be an int in [0, 4294967295], got True (bool)"),
        ({"process_index": -1}, ValueError, "process_index must be an int >= 0, got -1"),
        ({"process_index": "0"}, TypeError, "process_index must be an int >= 0, got '0' (str)"),
        ({"process_count": 0}, ValueError, "process_count must be an int >= 1, got 0"),
        (
            {"process_index": 2, "process_count": 2},
            ValueError,
            "process_index=2 is not in [0, process_count=2)",
        ),
        ({"steps_per_epoch": 0}, ValueError, "steps_per_epoch must be an int >= 1, got 0"),
        ({"steps_per_epoch": 2.0}, TypeError, "steps_per_epoch must be an int >= 1, got 2.0"),
        ({"batch_size": 0}, ValueError, "batch_size must be an int >= 1, got 0"),
        ({"shuffle": "yes"}, TypeError, "shuffle must be None, True or False, got 'yes'"),
    ],
)
def test_bad_numbers_are_refused_by_name(kwargs, error, message):
    loader = CountingLoader()
    with pytest.raises(error, match=re.escape(message)):
        loaders.wrap(loader, **kwargs)
    assert loader.reads == 0  # refused before reading


def test_a_batch_source_takes_no_new_options():
    source = loaders.wrap(CountingLoader())
    for kwargs in ({"host_fields": ("x",)}, {"pad_to": {"x": 4}}):
        with pytest.raises(TypeError, match="already a BatchSource; wrap takes no options"):
            loaders.wrap(source, **kwargs)


def _corrupt_at_13(i):
    if int(i) == 13:
        raise ValueError("corrupt record")
    return {"x": np.int32(i)}


def test_a_record_that_fails_to_read_is_named_by_row_and_epoch():
    import grain
    import torch

    class Records(torch.utils.data.Dataset):
        def __len__(self):
            return 20

        def __getitem__(self, i):
            return _corrupt_at_13(i)

    grain_rows = grain.MapDataset.source(list(range(20))).map(_corrupt_at_13)
    for obj, kind in ((grain_rows, "grain.MapDataset"), (Records(), "torch Dataset")):
        source = loaders.wrap(obj, batch_size=4)
        with pytest.raises(ValueError, match="corrupt record") as raised:
            list(source.iter_epoch(1))
        assert f"(raised reading row 13 of epoch 1 of the wrapped {kind})" in raised.value.__notes__
