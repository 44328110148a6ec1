"""`wrap` of text pipelines: dynamic padding and buckets with ``pad_to=``.

Covers: ``pad_to={field: (lengths...)}`` over a torch ``DataLoader`` with a
``pad_sequence`` collate, a tf.data ``bucket_by_sequence_length`` pipeline
and an HF ``with_transform`` tokenizer (bounded shapes, tokens in place,
zeros as padding, masks, an exact resume); `padding_report`; the refusals
that name their fix (a row too long, a batch larger than ``batch_size``, a
tuple batch's fields named by position).
"""

import re

import numpy as np
import pytest

from jaxfeed import loaders, sharding

BUCKETS = (32, 64, 128)
N = 203  # a short last batch


def _rows(n: int = N, seed: int = 0) -> list[np.ndarray]:
    """Token ids 1..999 (never 0, so padding shows), 5..60 tokens a row,
    most short: sentence lengths, median 16."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(np.rint(rng.lognormal(np.log(16), 0.5, n)), 5, 60).astype(int)
    return [rng.integers(1, 1000, length).astype(np.int64) for length in lengths]


def _check_rows(batches, rows, fields=("input_ids",)):
    """Every real row's tokens in place and zeros after; padding rows all zero.
    Returns the indices of the real rows, in order."""
    seen = []
    for batch in batches:
        for r, (real, index) in enumerate(zip(batch["mask"], batch["index"], strict=True)):
            for field in fields:
                got = batch[field][r]
                if not real:
                    assert not got.any()
                    continue
                row = rows[index] if field == "input_ids" else np.ones(len(rows[index]))
                np.testing.assert_array_equal(got[: len(row)], row)
                assert not got[len(row) :].any()
            if real:
                seen.append(int(index))
    return seen


def _torch_loader(rows, batch_size=8):
    import torch
    from torch.nn.utils.rnn import pad_sequence
    from torch.utils.data import DataLoader

    class Sentences(torch.utils.data.Dataset):
        def __len__(self):
            return len(rows)

        def __getitem__(self, i):
            return torch.from_numpy(rows[i]), i

    def collate(items):  # dynamic padding, as DataCollatorWithPadding does
        ids = [x for x, _ in items]
        return {
            "input_ids": pad_sequence(ids, batch_first=True),
            "attention_mask": pad_sequence([torch.ones_like(x) for x in ids], batch_first=True),
            "index": torch.tensor([i for _, i in items]),
        }

    return DataLoader(Sentences(), batch_size=batch_size, shuffle=True, collate_fn=collate)


def test_a_dataloader_with_dynamic_padding_is_served_in_bucketed_shapes():
    rows = _rows()
    pad_to = {"input_ids": BUCKETS, "attention_mask": BUCKETS}
    source = loaders.wrap(_torch_loader(rows), pad_to=pad_to, seed=1)
    assert source.element_spec["input_ids"].shape == (8, 128)  # the longest bucket
    epochs = [list(source.iter_epoch(epoch)) for epoch in (0, 1)]
    shapes = set()
    for batches in epochs:
        assert sorted(_check_rows(batches, rows, ("input_ids", "attention_mask"))) == list(range(N))
        for batch in batches:
            assert batch["input_ids"].shape == batch["attention_mask"].shape  # aligned
            assert batch["input_ids"].shape[1] in BUCKETS
            shapes.add(batch["input_ids"].shape)
    assert 1 < len(shapes) <= len(BUCKETS)
    report = source.padding_report()
    assert report.batches == 2 * len(epochs[0]) and report.rows == 2 * N
    assert report.padding_rows == 2 * (8 * len(epochs[0]) - N)
    assert report.real["input_ids"] == 2 * sum(map(len, rows))
    assert len(report.shapes) == len(shapes)
    fixed = loaders.wrap(_torch_loader(rows), pad_to={"input_ids": 128, "attention_mask": 128})
    for _ in (0, 1):
        list(fixed.iter_epoch(_))
    assert report.padding_fraction() < fixed.padding_report().padding_fraction()
    assert len(fixed.padding_report().shapes) == 1


def test_a_bucketed_dataloader_resumes_mid_epoch_exactly():
    rows = _rows()
    pad_to = {"input_ids": BUCKETS, "attention_mask": BUCKETS}
    source = loaders.wrap(_torch_loader(rows), pad_to=pad_to, seed=1)
    whole = list(source.iter_epoch(1))
    state = source.data_state(1, 5)
    fresh = loaders.wrap(_torch_loader(rows), pad_to=pad_to, seed=1)
    fresh.restore_data_state(state)
    resumed = list(fresh.iter_epoch(1, start=5))
    assert len(resumed) == len(whole) - 5
    for a, b in zip(whole[5:], resumed, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])


def _grain_packed(rows):
    import grain

    records = [{"input_ids": row} for row in rows]
    shuffled = grain.MapDataset.source(records).shuffle(seed=1).to_iter_dataset()
    packed = grain.experimental.FirstFitPackIterDataset(
        shuffled, length_struct={"input_ids": 64}, num_packing_bins=8
    )
    return packed.batch(4)


def test_a_grain_packer_pipeline_is_served_in_one_shape_and_resumes_exactly():
    # Grain's packers give rows of one length: one shape, its own segment ids and
    # positions kept as fields; Grain's iterator state resumes it mid-epoch.
    rows = _rows()
    source = loaders.wrap(_grain_packed(rows))
    whole = list(source.iter_epoch(0))
    assert {b["input_ids"].shape for b in whole} == {(4, 64)}
    assert {"input_ids_segment_ids", "input_ids_positions"} <= set(whole[0])
    real = sum(int((b["input_ids_segment_ids"] > 0).sum()) for b in whole)
    assert real == sum(len(r) for r in rows)  # every token, once
    state = source.data_state(0, 5)
    fresh = loaders.wrap(_grain_packed(rows))
    fresh.restore_data_state(state)
    resumed = list(fresh.iter_epoch(0, start=5))
    assert len(resumed) == len(whole) - 5
    for a, b in zip(whole[5:], resumed, strict=True):
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])


def test_a_tf_bucket_by_sequence_length_pipeline_is_served_with_bounded_shapes_and_masks():
    from jaxfeed.loaders._doors.tf import import_tensorflow

    tf = import_tensorflow()
    rows = _rows(120)

    lengths = [len(row) for row in rows]
    dense = np.zeros((len(rows), max(lengths)), np.int32)
    for i, row in enumerate(rows):
        dense[i, : len(row)] = row
    ds = tf.data.Dataset.from_tensor_slices(
        {"ids": dense, "length": lengths, "index": np.arange(len(rows))}
    ).map(lambda x: {"input_ids": x["ids"][: x["length"]], "index": x["index"]})
    ds = ds.bucket_by_sequence_length(
        lambda x: tf.shape(x["input_ids"])[0],
        bucket_boundaries=[17, 33],
        bucket_batch_sizes=[16, 8, 4],
    )
    sizes = [len(b["index"]) for b in ds.as_numpy_iterator()]
    assert set(sizes) > {4, 8} and max(sizes) == 16  # per-bucket batch sizes
    source = loaders.wrap(ds, batch_size=16, pad_to={"input_ids": BUCKETS})
    batches = list(source.iter_epoch(0))
    assert [int(b["mask"].sum()) for b in batches] == sizes  # padded up to 16 rows
    assert sorted(_check_rows(batches, rows)) == list(range(len(rows)))
    assert {b["input_ids"].shape for b in batches} <= {(16, n) for n in BUCKETS}
    report = source.padding_report()
    assert report.rows == len(rows) and report.padding_rows == 16 * len(sizes) - len(rows)
    assert 1 < len(report.shapes) <= len(BUCKETS)
    # A DeviceFeed places each shape as it comes (one transfer per step).
    with sharding.DeviceFeed(source, sharding.data_mesh()) as feed:
        placed = [b["input_ids"].shape for b in feed]
    assert placed == [b["input_ids"].shape for b in batches]


def test_an_hf_dataset_tokenized_by_with_transform_is_served_with_bounded_shapes():
    import datasets

    rows = _rows(60)
    texts = [" ".join(f"w{t}" for t in row) for row in rows]
    table = datasets.Dataset.from_dict({"text": texts, "index": list(range(len(texts)))})

    def tokenize(batch):  # a toy whitespace tokenizer: variable-length input_ids
        ids = [[int(word[1:]) for word in text.split()] for text in batch["text"]]
        return {"input_ids": ids, "index": batch["index"]}

    source = loaders.wrap(
        table.with_transform(tokenize), batch_size=8, pad_to={"input_ids": BUCKETS}
    )
    for epoch in (0, 1):
        batches = list(source.iter_epoch(epoch))
        assert sorted(_check_rows(batches, rows)) == list(range(len(rows)))
        assert {b["input_ids"].shape for b in batches} <= {(8, n) for n in BUCKETS}
    assert len(source.padding_report().shapes) <= len(BUCKETS)


def test_a_row_longer_than_every_bucket_is_refused_by_name_never_cut():
    batches = [
        {"input_ids": [[1] * 10, [2] * 20], "attention_mask": [[1] * 10, [1] * 20]},
        {"input_ids": [[3] * 40, [4] * 5], "attention_mask": [[1] * 40, [1] * 5]},
    ]
    source = loaders.wrap(batches, pad_to={"input_ids": (16, 32), "attention_mask": (16, 32)})
    message = (
        "batch 1 of epoch 0: 'input_ids' has a row of length 40, longer than the longest of "
        "pad_to['input_ids']=(16, 32); add a length of 40 or more, or cut the rows in transform="
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        list(source.iter_epoch(0))
    with pytest.raises(ValueError, match=re.escape("pad_to['input_ids'] is empty")):
        loaders.wrap(batches, pad_to={"input_ids": ()})
    with pytest.raises(TypeError, match=re.escape("pad_to['input_ids'][1] must be an int >= 1")):
        loaders.wrap(batches, pad_to={"input_ids": (16, "32")})


def test_a_batch_larger_than_batch_size_says_to_pass_the_largest_bucket_batch_size():
    ids = np.ones((4, 8), np.int32)
    batches = [{"input_ids": ids[:2]}, {"input_ids": ids}]
    message = (
        "batch 1 of epoch 0 has 4 rows, more than batch_size 2; pass the largest batch the "
        "loader makes as batch_size= (for batches of several sizes, e.g. tf.data's "
        "bucket_by_sequence_length, the largest of its bucket_batch_sizes): a smaller batch "
        "gets padding rows, False in 'mask'"
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        list(loaders.wrap(batches).iter_epoch(0))
    served = list(loaders.wrap(batches, batch_size=4).iter_epoch(0))
    assert [b["mask"].tolist() for b in served] == [[True, True, False, False], [True] * 4]


def test_a_tuple_batchs_parts_are_named_with_keys_the_message_spells_out():
    import torch
    from torch.nn.utils.rnn import pad_sequence
    from torch.utils.data import DataLoader

    rows = _rows(40)
    pairs = [(torch.from_numpy(row), i % 2) for i, row in enumerate(rows)]

    def collate(items):
        return pad_sequence([x for x, _ in items], True), torch.tensor([y for _, y in items])

    loader = DataLoader(pairs, batch_size=8, collate_fn=collate)
    message = (
        "batch 0 of epoch 0 has no field 'tokens', which pad_to= names; its fields are "
        "['image', 'label'] (the batches are tuples, whose parts are named by position: "
        "'image' is part 0, 'label' is part 1; name them with keys=, e.g. "
        "keys=('tokens', 'label'))"
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        loaders.wrap(loader, pad_to={"tokens": BUCKETS})
    source = loaders.wrap(loader, keys=("tokens", "label"), pad_to={"tokens": BUCKETS})
    assert {b["tokens"].shape[1] for b in source.iter_epoch(0)} <= set(BUCKETS)
