"""Arrow IPC files are read in place: the file format, the stream format and
a ``save_to_disk`` directory give every backend the same batches as the same
records in Parquet, with only a small index in the cache (no columnar copy);
a changed file is indexed again; record batches are ``shuffle="blocks"``'s
units; a compressed file falls back to the copy."""

import os
import pickle
import subprocess
import sys

import numpy as np
import pytest
from backend_helpers import assert_same_batches
from format_files import TRAIN_ROWS, augmented_epochs, records, table, write_all
from jaxfeed.loaders._io.mapped_files import memmap_of
from jaxfeed.loaders.bytes_field import BytesField
from transform_helpers import augment_image

from jaxfeed import loaders

BACKENDS = ("numpy", "torch", "tf", "grain", "hf")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """An empty cache of this module's own, to see what reading puts there."""
    with pytest.MonkeyPatch.context() as patch:
        root = tmp_path_factory.mktemp("arrow-cache")
        patch.setenv("JAXFEED_CACHE_DIR", str(root))
        yield root


@pytest.fixture(scope="module")
def written(tmp_path_factory, cache):
    import pyarrow as pa

    root = tmp_path_factory.mktemp("arrow-in-place")
    paths = write_all(root)
    png, labels = records()["train"]
    whole = table(png, labels)
    for name, options in (("stream", None), ("zstd", pa.ipc.IpcWriteOptions(compression="zstd"))):
        (root / name).mkdir()
        new = pa.ipc.new_stream if name == "stream" else pa.ipc.new_file
        with new(root / name / "train.arrow", whole.schema, options=options) as writer:
            writer.write_table(whole, max_chunksize=5)
        paths[name] = root / name
    (root / "two").mkdir()  # two stream files, one split
    half = TRAIN_ROWS // 2
    for part, rows in enumerate((whole.slice(0, half), whole.slice(half))):
        with pa.ipc.new_stream(root / "two" / f"train-{part}.arrow", whole.schema) as writer:
            writer.write_table(rows, max_chunksize=4)
    paths["two"] = root / "two"
    return paths


def cached(cache) -> dict[str, int]:
    """The bytes of each kind of file in the cache (by suffix)."""
    sizes: dict[str, int] = {}
    for folder, _, names in os.walk(cache):
        for name in names:
            suffix = name.rsplit(".", 1)[-1]
            sizes[suffix] = sizes.get(suffix, 0) + os.path.getsize(os.path.join(folder, name))
    return sizes


@pytest.mark.parametrize("name", ["arrow", "stream", "hf", "two"])
def test_arrow_files_are_read_in_place_with_no_copy(written, tmp_path, monkeypatch, name):
    monkeypatch.setenv("JAXFEED_CACHE_DIR", str(tmp_path))
    dataset = loaders.load_dataset(written[name], split="train")
    image = dataset["image"]
    assert isinstance(image, BytesField) and image.places is not None
    files = {memmap_of(buffer).filename for buffer in image.data}
    every = written[name].rglob("*.arrow")
    train = {str(p) for p in every if "test" not in str(p.relative_to(written[name]))}
    assert files == train
    png, labels = records()["train"]
    assert list(image[np.arange(len(dataset))]) == png
    np.testing.assert_array_equal(dataset["label"], labels)
    # Only an index in the cache: no image bytes, 16 bytes a row for them.
    entries = list((tmp_path / "formats").iterdir())
    assert all("arrow-index" in entry.name for entry in entries), entries
    assert "bytes" not in cached(tmp_path)
    assert cached(tmp_path)["places"] == 16 * len(dataset)


@pytest.mark.parametrize("name", ["arrow", "stream", "hf", "two"])
def test_hf_reads_the_files_through_datasets_with_no_arrow_copy(
    written, tmp_path, monkeypatch, name
):
    monkeypatch.setenv("JAXFEED_CACHE_DIR", str(tmp_path))
    dataset = loaders.load_dataset(written[name], split="train")
    source = loaders.make("hf", dataset=dataset, batch_size=7, seed=5, transform=augment_image)
    assert source.path is None and source.files == dataset.in_place.arrow
    assert sorted(os.listdir(tmp_path)) == ["formats"]  # no hf/ Arrow copy
    for epoch in (0, 1):
        want = list(
            loaders.make(
                "numpy", dataset=dataset, batch_size=7, seed=5, transform=augment_image
            ).iter_epoch(epoch)
        )
        assert_same_batches(list(source.iter_epoch(epoch)), want)


@pytest.mark.parametrize("name", ["arrow", "stream", "hf", "two"])
def test_five_backends_give_the_batches_of_the_same_records_in_parquet(written, name):
    want = augmented_epochs("numpy", written["parquet"])
    for backend in BACKENDS:
        got = augmented_epochs(backend, written[name])
        for epoch in (0, 1):
            assert_same_batches(got[epoch], want[epoch])


def test_record_batches_are_the_blocks(written):
    assert loaders.load_dataset(written["arrow"]).units == (7, 7, 7, 3)
    assert loaders.load_dataset(written["stream"]).units == (5,) * (TRAIN_ROWS // 5) + (
        (TRAIN_ROWS % 5,) if TRAIN_ROWS % 5 else ()
    )
    want = augmented_epochs("numpy", written["parquet"], shuffle="blocks", block_rows=4)
    got = augmented_epochs("numpy", written["arrow"], shuffle="blocks", block_rows=4)
    assert got[0][0]["image"].shape == want[0][0]["image"].shape
    for backend in BACKENDS[1:]:
        other = augmented_epochs(backend, written["arrow"], shuffle="blocks", block_rows=4)
        for epoch in (0, 1):
            assert_same_batches(other[epoch], got[epoch])


def test_a_changed_file_is_indexed_again(written, tmp_path):
    import pyarrow as pa

    target = tmp_path / "one.arrow"
    target.write_bytes((written["stream"] / "train.arrow").read_bytes())
    before = loaders.load_dataset(target)
    assert list(before["image"][[0, 1]]) == records()["train"][0][:2]
    png, labels = records()["test"]
    with pa.ipc.new_file(target, table(png, labels).schema) as writer:
        writer.write_table(table(png, labels), max_chunksize=3)
    after = loaders.load_dataset(target)
    assert list(after["image"][np.arange(len(after))]) == png
    np.testing.assert_array_equal(after["label"], labels)


def test_a_compressed_file_is_copied(written, tmp_path, monkeypatch):
    monkeypatch.setenv("JAXFEED_CACHE_DIR", str(tmp_path))
    dataset = loaders.load_dataset(written["zstd"])
    assert dataset["image"].places is None  # the columnar copy's field
    assert "bytes" in cached(tmp_path)
    assert dataset.units == loaders.load_dataset(written["stream"]).units
    assert_same_batches(
        augmented_epochs("numpy", written["zstd"])[0],
        augmented_epochs("numpy", written["arrow"])[0],
    )


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["torch", "hf"])  # BytesField pickled; ArrowRows
def test_workers_map_the_arrow_files_by_path(written, backend):
    dataset = loaders.load_dataset(written["two"])
    # Into a worker goes where the rows lie (the files' paths), not their bytes.
    assert len(pickle.dumps(dataset["image"])) < 2_000
    want = augmented_epochs("numpy", written["two"])
    got = augmented_epochs(backend, written["two"], num_workers=2)
    for epoch in (0, 1):
        assert_same_batches(got[epoch], want[epoch])


# In a process of its own: were the check gone, SIGBUS would end it, not pytest.
_CUT_SHORT = r"""
import os, sys
from pathlib import Path
from jaxfeed import loaders

def first_byte(record, rng):
    return {"x": record["image"][0], "label": record["label"]}

path = Path(sys.argv[1])
source = loaders.make("numpy", dataset=path, batch_size=4, transform=first_byte)
next(iter(source.iter_epoch(0)))
os.truncate(path, path.stat().st_size // 2)  # another job rewriting it, say
try:
    for batch in source.iter_epoch(1):
        pass
except ValueError as error:
    print(error)
"""


def test_an_arrow_file_cut_short_under_a_live_source_is_named(written, tmp_path):
    target = tmp_path / "cut.arrow"
    target.write_bytes((written["stream"] / "train.arrow").read_bytes())
    run = subprocess.run(
        [sys.executable, "-c", _CUT_SHORT, str(target)], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, f"status {run.returncode}: {run.stderr[-2000:]}"
    assert "field 'image': " in run.stdout and "cut.arrow holds" in run.stdout, run.stdout
    assert "cut short after it was opened" in run.stdout
