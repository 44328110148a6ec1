"""The batch plans of variable-length rows: every value placed once, in
static shapes, and the same global batches for any process count."""

import numpy as np
import pytest
from jaxfeed.loaders import Bucket, Pack, Pad, RaggedField
from jaxfeed.loaders.sequence_plan import as_layout, plan_epoch

from jaxfeed import loaders

LAYOUTS = [
    Pad(64),
    Bucket((16, 32, 64)),
    Pack(128),
    Pack(128, method="first_fit", window=50),
    Pack(40, split=True),
    Pad(30, truncate=True),
]


def _rows(n: int = 700, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    # Row i holds i * 1000 + its positions: where each value came from is visible.
    return [i * 1000 + np.arange(m, dtype=np.int32) for i, m in enumerate(rng.integers(1, 61, n))]


def _segments(batches: list[dict]) -> list[tuple[int, ...]]:
    """Every segment's values, in batch order."""
    out = []
    for batch in batches:
        for ids, seg, pos in zip(
            batch["input_ids"], batch["segment_ids"], batch["positions"], strict=True
        ):
            for s in range(1, int(seg.max()) + 1):
                assert np.array_equal(pos[seg == s], np.arange((seg == s).sum())), "positions"
                out.append(tuple(ids[seg == s].tolist()))
            assert not ids[seg == 0].any(), "padding is 0"
    return out


@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_every_value_lands_once_in_static_shapes(layout):
    rows = _rows()
    source = loaders.make("numpy", dataset={"input_ids": rows}, batch_size=8, seed=3, **_kw(layout))
    batches = list(source.iter_epoch(0))
    assert len(batches) == source.batches_in(0)
    assert {b["input_ids"].shape for b in batches} == {(8, n) for n in source.shapes}
    got = sorted(_segments(batches))
    cut = getattr(layout, "truncate", False)
    length = layout.length if hasattr(layout, "length") else None
    if isinstance(layout, Pack) and layout.split:
        # A long row arrives in pieces of `length`: joined back, the row.
        joined = {}
        for seg in got:
            joined.setdefault(seg[0] // 1000, []).extend(seg)
        assert sorted(tuple(sorted(v)) for v in joined.values()) == sorted(
            tuple(r.tolist()) for r in rows
        )
    else:
        want = sorted(tuple(r[:length].tolist() if cut else r.tolist()) for r in rows)
        assert got == want
    if isinstance(layout, Bucket):  # each batch from one bucket: its rows fit, and need it
        for b in batches:
            longest = int((b["segment_ids"] > 0).sum(axis=1).max())
            assert longest <= b["input_ids"].shape[1]
            smaller = [n for n in layout.lengths if n < b["input_ids"].shape[1]]
            assert not smaller or longest > smaller[-1]


def _kw(layout) -> dict:
    name = {Pad: "pad", Bucket: "bucket", Pack: "pack"}[type(layout)]
    return {name: layout}


@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_same_global_batches_on_any_process_count_and_resumed(layout):
    rows = _rows(400)
    one = loaders.make("numpy", dataset={"input_ids": rows}, batch_size=8, seed=5, **_kw(layout))
    whole = list(one.iter_epoch(1))
    parts = [
        list(
            loaders.make(
                "numpy",
                dataset={"input_ids": rows},
                batch_size=4,
                seed=5,
                process_index=p,
                process_count=2,
                **_kw(layout),
            ).iter_epoch(1, start=3)
        )
        for p in range(2)
    ]
    for k, (a, b) in enumerate(zip(*parts, strict=True)):
        for key in whole[k + 3]:
            np.testing.assert_array_equal(np.concatenate([a[key], b[key]]), whole[k + 3][key])


def test_pack_is_tight_and_bucket_and_pack_beat_pad():
    rows = _rows(2000, seed=1)
    lengths = np.array([len(r) for r in rows])
    order = np.random.default_rng(0).permutation(len(rows))
    plans = {
        str(layout): plan_epoch(layout, order, lengths, 16, True)
        for layout in (Pad(64), Bucket((16, 32, 64)), Pack(128), Pack(128, method="first_fit"))
    }
    real = {k: p.real_values() / (p.batch_length.sum() * 16) for k, p in plans.items()}
    assert real["Pack(length=128, window=4096, method='best_fit', split=False)"] > 0.97
    assert real["Pack(length=128, window=4096, method='first_fit', split=False)"] > 0.97
    assert (
        real["Bucket(lengths=(16, 32, 64), truncate=False)"]
        > real["Pad(length=64, truncate=False)"]
    )


def test_plans_differ_by_epoch_and_repeat_by_seed():
    rows = _rows(300)
    make = lambda seed: loaders.make(  # noqa: E731
        "numpy", dataset={"input_ids": rows}, batch_size=4, seed=seed, pack=64
    )
    a, b = make(1), make(1)
    first = next(a.iter_epoch(0))["input_ids"]
    np.testing.assert_array_equal(first, next(b.iter_epoch(0))["input_ids"])
    assert not np.array_equal(first, next(a.iter_epoch(1))["input_ids"])
    assert not np.array_equal(first, next(make(2).iter_epoch(0))["input_ids"])


def test_per_row_fields_follow_their_rows_in_pad_and_bucket():
    rows = _rows(200)
    labels = np.arange(200, dtype=np.int32) * 7
    for kw in ({"pad": 64}, {"bucket": True}):
        source = loaders.make(
            "numpy", dataset={"input_ids": rows, "label": labels}, batch_size=8, **kw
        )
        for batch in source.iter_epoch(0):
            first = batch["input_ids"][:, 0] // 1000  # the row each slot holds
            np.testing.assert_array_equal(batch["label"][batch["mask"]], first[batch["mask"]] * 7)
            assert not batch["label"][~batch["mask"]].any()


def test_frames_and_several_fields_of_equal_lengths():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 9, 50)
    frames = RaggedField.from_lengths(rng.random((lengths.sum(), 3)).astype(np.float32), lengths)
    ids = RaggedField.from_lengths(np.arange(lengths.sum(), dtype=np.int32), lengths)
    source = loaders.make(
        "numpy", dataset={"audio": frames, "ids": ids}, batch_size=4, pack=Pack(16)
    )
    batch = next(source.iter_epoch(0))
    assert batch["audio"].shape == (4, 16, 3) and batch["ids"].shape == (4, 16)
    real = batch["segment_ids"] > 0
    np.testing.assert_array_equal(batch["audio"][real], frames.values[batch["ids"][real]])


def test_a_transform_that_tokenizes_runs_once_before_planning():
    texts = [b"the cat sat", b"a b", b"on the mat today again", b"x"] * 10
    vocab: dict[bytes, int] = {}

    def tokenize(record, rng):
        words = record["text"].split()
        return {"input_ids": np.array([vocab.setdefault(w, len(vocab) + 1) for w in words])}

    source = loaders.make(
        "numpy", dataset={"text": texts}, batch_size=4, pack=8, transform=tokenize
    )
    got = _segments(list(source.iter_epoch(0)))
    assert sorted(len(s) for s in got) == sorted([3, 2, 5, 1] * 10)


@pytest.mark.parametrize(
    ("kwargs", "data", "match"),
    [
        ({"pad": 8}, None, r"row \d+ has \d+ values, more than the longest length 8 of Pad"),
        ({"pack": 8}, None, r"raise the length, or pass split=True"),
        ({"bucket": (4, 8)}, None, r"pass truncate=True to cut it"),
        ({"pad": 8, "pack": 8}, None, r"^pass one of pad=, bucket= or pack=, not pad and pack$"),
        (
            {"pack": 64},
            "label",
            r"pack= puts several rows in one, so per-row field\(s\) \['label'\]",
        ),
        ({"pad": 64}, "empty", r"row 1 \(and 0 more\) is empty"),
        (
            {"pad": 64},
            "unequal",
            r"ragged fields 'input_ids' and 'mask_ids' differ in length at row 0",
        ),
        ({"pad": 64}, "fixed", r"has no field of rows of different lengths"),
        ({"pad": "64"}, None, r"pad= takes an int length or jaxfeed.Pad"),
        ({"pad": 64, "host_fields": ("label",)}, "label", r"drop host_fields= and order="),
    ],
)
def test_what_cannot_be_planned_is_refused_by_name(kwargs, data, match):
    rows = _rows(40)
    dataset = {"input_ids": rows}
    if data == "label":
        dataset["label"] = np.arange(40)
    elif data == "empty":
        dataset["input_ids"] = [np.arange(3), np.zeros(0, np.int64), *rows[2:]]
    elif data == "unequal":
        dataset["mask_ids"] = [r[:-1] if len(r) > 1 else np.arange(2) for r in rows]
    elif data == "fixed":
        dataset = {"x": np.zeros((40, 3))}
    error = TypeError if kwargs.get("pad") == "64" else ValueError
    with pytest.raises(error, match=match):
        loaders.make("numpy", dataset=dataset, batch_size=4, **kwargs)


def test_short_forms():
    assert as_layout(pad=8) == Pad(8)
    assert as_layout(bucket=(8, 16)) == Bucket((8, 16))
    assert as_layout(bucket=True) == Bucket()
    assert as_layout(pack=32) == Pack(32)
    assert as_layout() is None
    with pytest.raises(ValueError, match=r"bucket lengths must increase"):
        Bucket((16, 8))
