"""``make(..., host_fields=("text",))`` on the user's files: a text field (a
Parquet string column, an Example bytes feature) rides along with each batch
as host numpy on every backend, in the shared order, outside
``element_spec``; the batches' device fields are those without it."""

import pytest
from backend_helpers import assert_same_batches
from format_files import example, records, write_tfrecord
from transform_helpers import augment_image

from jaxfeed import loaders

BACKENDS = ("numpy", "torch", "tf", "grain", "hf")


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    """The records with a ``text`` per row, as Parquet and as TFRecord Examples."""
    import pyarrow as pa
    from pyarrow import parquet

    root = tmp_path_factory.mktemp("host-fields")
    png, labels = records()["train"]
    text = [f"digit {i}: ünïcode" for i in range(len(png))]
    table = pa.table(
        {"image": pa.array(png, pa.binary()), "label": labels, "text": pa.array(text, pa.string())}
    )
    (root / "parquet").mkdir()
    parquet.write_table(table, root / "parquet" / "train.parquet", row_group_size=5)
    (root / "tfrecord").mkdir()
    serialized = [
        _with_text(example(p, lab), t) for p, lab, t in zip(png, labels, text, strict=True)
    ]
    write_tfrecord(root / "tfrecord" / "train.tfrecord", serialized)
    return root, [t.encode() for t in text]


def _with_text(serialized: bytes, text: str) -> bytes:
    import tensorflow as tf

    record = tf.train.Example.FromString(serialized)
    record.features.feature["text"].bytes_list.value.append(text.encode())
    return record.SerializeToString()


def epoch(backend: str, dataset, **options) -> list[dict]:
    source = loaders.make(
        backend, dataset=dataset, batch_size=7, seed=5, transform=augment_image, **options
    )
    try:
        return list(source.iter_epoch(1))
    finally:
        source.close()


@pytest.mark.parametrize("name", ["parquet", "tfrecord"])
def test_text_stays_on_the_host_on_every_backend(texts, name):
    root, text = texts
    source = loaders.make(
        "numpy", dataset=root / name, batch_size=7, seed=5, transform=augment_image,
        host_fields=("text",),
    )  # fmt: skip
    assert source.host_fields == ("text",) and "text" not in source.element_spec
    want = epoch("numpy", root / name, host_fields=("text",))
    # The device fields are the batches without host_fields (the transform ignores text).
    assert_same_batches([_device(b) for b in want], epoch("numpy", root / name))
    for batch in want:
        assert batch["text"].dtype == object and len(batch["text"]) == 7
        assert list(batch["text"][~batch["mask"]]) == [b""] * int((~batch["mask"]).sum())
    # Each row's text is its own record's (it names the row it was written with).
    rows = [int(t.split(b":")[0].split()[1]) for b in want for t in b["text"][b["mask"]]]
    assert sorted(rows) == list(range(len(text)))
    for backend in BACKENDS[1:]:
        got = epoch(backend, root / name, host_fields=("text",))
        assert_same_batches([_device(b) for b in got], [_device(b) for b in want])
        assert [list(b["text"]) for b in got] == [list(b["text"]) for b in want]


def _device(batch: dict) -> dict:
    return {k: v for k, v in batch.items() if k != "text"}


def test_a_host_field_that_is_not_there_is_refused_by_name(texts):
    root, _ = texts
    with pytest.raises(ValueError, match=r"host_fields \['txt'\] are not fields"):
        loaders.make(
            "numpy",
            dataset=root / "parquet",
            transform=augment_image,
            batch_size=4,
            host_fields=["txt"],
        )
    with pytest.raises(ValueError, match="sequence of field names"):
        loaders.make(
            "numpy",
            dataset=root / "parquet",
            transform=augment_image,
            batch_size=4,
            host_fields="text",
        )
