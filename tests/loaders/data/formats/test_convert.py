"""``jaxfeed convert``: the user's files rewritten as Parquet shards or .npy
fields hold the same records; a rerun after a kill skips complete files."""

import numpy as np
import pytest
from format_files import CLASSES, records

from jaxfeed import loaders
from jaxfeed.cli import main


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """An image folder (no TensorFlow to import), train and test."""
    root = tmp_path_factory.mktemp("convert-source")
    for split, (png, labels) in records().items():
        for i, (image, label) in enumerate(zip(png, labels, strict=True)):
            (root / split / CLASSES[label]).mkdir(parents=True, exist_ok=True)
            (root / split / CLASSES[label] / f"{i:03d}.png").write_bytes(image)
    return root


def test_parquet_holds_the_same_records_and_a_rerun_skips_complete_shards(shards, tmp_path):
    out = tmp_path / "out"
    args = ["convert", str(shards), str(out), "--to", "parquet", "--rows-per-shard", "10"]
    assert main(args) == 0
    for split in ("train", "test"):
        want, got = loaders.load_dataset(shards, split), loaders.load_dataset(out, split)
        assert list(got) == list(want)
        for name in want:
            np.testing.assert_array_equal(
                got[name][np.arange(len(got))], want[name][np.arange(len(want))]
            )
    first, second = sorted((out / "train").glob("*.parquet"))[:2]
    stamp = first.stat().st_mtime_ns
    second.unlink()  # a kill before this shard was renamed into place
    (out / "train" / f".{second.name}.partial").write_bytes(b"half")
    assert main(args) == 0
    assert first.stat().st_mtime_ns == stamp and second.is_file()
    again, want = loaders.load_dataset(out)["image"], loaders.load_dataset(shards)["image"]
    rows = np.arange(len(want))
    assert list(again[rows]) == list(want[rows])


def test_npy_takes_numbers_and_refuses_bytes(shards, tmp_path, capsys):
    source = tmp_path / "numbers.parquet"
    import pyarrow as pa
    from pyarrow import parquet

    parquet.write_table(pa.table({"x": np.arange(12.0), "label": np.arange(12) % 3}), source)
    assert main(["convert", str(source), str(tmp_path / "npy"), "--to", "npy"]) == 0
    np.testing.assert_array_equal(
        np.load(tmp_path / "npy" / "train" / "x.npy"), np.arange(12.0, dtype=np.float32)
    )
    assert main(["convert", str(shards), str(tmp_path / "no"), "--to", "npy"]) == 2
    assert "hold encoded bytes, which .npy files cannot" in capsys.readouterr().err
