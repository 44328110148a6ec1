"""What a user moving a tutorial pipeline onto `wrap` meets (issue 30, items 8, 9, 12).

A Grain chain as Keras's ``image_dataset_from_directory(format="grain")``
builds it knows its length; the options and batches `wrap` cannot take name
the route that works: a ``collate_fn`` for an HF dataset, encoded bytes, a
source of serialized records.
"""

import re

import numpy as np
import pytest

from jaxfeed import loaders

N, B = 10, 4


def _images(index: int) -> tuple[np.ndarray, np.int32]:
    return np.full((2, 2, 3), index, np.uint8), np.int32(index % 3)


def _keras_grain_chain(**batch):
    """What ``keras.utils.image_dataset_from_directory(..., format="grain")``
    returns: a MapDataset of (image, label), shuffled and mapped, then
    ``.to_iter_dataset().batch(B)``."""
    import grain

    files = grain.MapDataset.source(list(range(N))).shuffle(seed=0).map(_images)
    return files.to_iter_dataset().batch(B, **batch)


@pytest.mark.parametrize(("drop", "batches"), [(False, 3), (True, 2)])
def test_a_grain_chain_from_a_map_dataset_knows_its_length(drop, batches):
    source = loaders.wrap(_keras_grain_chain(drop_remainder=drop))
    assert source.num_batches == batches  # keras_data needs no steps_per_epoch
    for epoch in (0, 1):
        read = list(source.iter_epoch(epoch))
        assert len(read) == batches
        rows = np.concatenate([b["image"][b.get("mask", slice(None)), 0, 0, 0] for b in read])
        assert len(set(rows.tolist())) == len(rows) == (B * batches if drop else N)


def test_a_grain_chain_with_a_filter_keeps_an_unknown_length():
    import grain

    stream = grain.MapDataset.source(list(range(N))).map(_images).to_iter_dataset()
    source = loaders.wrap(stream.filter(lambda row: row[1] > 0).batch(B))
    assert source.num_batches is None  # only reading it would tell


def test_a_collate_fn_for_an_hf_dataset_names_the_route_that_works():
    import datasets

    table = datasets.Dataset.from_dict({"x": list(range(N)), "label": list(range(N))})
    for obj in (table, table.to_iterable_dataset()):
        with pytest.raises(
            TypeError,
            match=re.escape("takes options ['columns'], got ['collate_fn']; to batch with your ")
            + r"collate_fn, wrap a torch DataLoader over the dataset: "
            + re.escape("wrap(DataLoader(hf_dataset, batch_size=B, collate_fn=fn))")
            + r".*set_transform\(fn\)",
        ):
            loaders.wrap(obj, batch_size=B, collate_fn=lambda rows: rows)


@pytest.mark.parametrize(
    "encoded",
    [
        [b"\x89PNG\r\n" + bytes([i]) for i in range(B)],  # files read whole, tf.data strings
        [{"bytes": b"\xff\xd8" + bytes([i]), "path": None} for i in range(B)],  # datasets' Image
    ],
)
def test_encoded_bytes_are_named_with_the_decoding_route(encoded):
    batch = {"image": np.array(encoded, dtype=object), "label": np.arange(B)}
    expected = (
        "field 'image' is object (encoded bytes, e.g. image files); JAX arrays hold numbers "
        "only: decode them with transform="
    )
    with pytest.raises(ValueError, match=re.escape(expected)):
        loaders.wrap([batch])


def test_a_source_of_serialized_records_names_the_parse_step(tmp_path):
    import grain
    from array_record.python import array_record_module

    path = str(tmp_path / "records.array_record")
    writer = array_record_module.ArrayRecordWriter(path, "group_size:1")
    for i in range(N):
        writer.write(b"record %d" % i)
    writer.close()
    records = grain.sources.ArrayRecordDataSource([path])
    expected = (
        "a batch must be a dict, a tuple/list or an array, got bytes: each item is one "
        "serialized record, not a batch; parse and batch the records first, e.g. "
        "grain.MapDataset.source(records).map(parse).batch(32) with parse = "
        "tf.train.Example.FromString"
    )
    with pytest.raises(TypeError, match=re.escape(expected)):
        loaders.wrap(records, batch_size=32)
