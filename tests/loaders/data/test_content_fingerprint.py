"""A dataset's fingerprint follows its content (issue 29, items 3, 4 and 11):
byte-identical copies at two paths share one (so hosts reading local copies
agree), any one-byte edit gives another, also when the file's modification
time is put back, and a file is read whole once, then its digest is memoised."""

import argparse
import json
import os
import shutil

import numpy as np
import pytest
from jaxfeed.loaders.data import on_disk
from jaxfeed.loaders.data.cache import CONTENT_MEMO, cache_root, fingerprint
from jaxfeed.sharding.job.agreement import disagreements

from jaxfeed import loaders
from jaxfeed.cli.train import _agreed_settings


def _save(directory, rows=600, seed=0):
    rng = np.random.default_rng(seed)
    for split, n in (("train", rows), ("test", rows // 3)):
        (directory / split).mkdir(parents=True)
        np.save(directory / split / "image.npy", rng.integers(0, 256, (n, 4, 4, 1), np.uint8))
        np.save(directory / split / "label.npy", rng.integers(0, 10, n).astype(np.int32))
    return directory


def _fingerprint(directory, split="train"):
    return fingerprint(*loaders.load_dataset(directory, split).content())


@pytest.fixture
def memo(tmp_path, monkeypatch):
    """An empty cache of this test's own, and its folder of memoised digests."""
    monkeypatch.setenv("JAXFEED_CACHE_DIR", str(tmp_path / "cache"))
    return cache_root() / CONTENT_MEMO


def _edit_one_byte_keeping_the_mtime(file):
    """Changes one byte in the middle of ``file`` (a row the old identity did
    not sample) and puts its access and modification times back, as ``cp -p``
    or ``touch -d`` would."""
    before = os.stat(file)
    with open(file, "r+b") as f:
        f.seek(before.st_size // 2 + 1)
        old = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([old[0] ^ 1]))
    os.utime(file, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert os.stat(file).st_mtime_ns == before.st_mtime_ns


def test_byte_identical_copies_at_two_paths_share_one_fingerprint(tmp_path, memo):
    first = _save(tmp_path / "host-a" / "mnist")
    second = shutil.copytree(first, tmp_path / "host-b" / "local-copy")  # other inodes, times
    for split in ("train", "test"):
        here = _fingerprint(first, split)
        assert _fingerprint(second, split) == here
        in_memory = [np.array(a) for a in loaders.load_dataset(first, split).content()]
        assert fingerprint(*in_memory) == here  # the same data held in memory, too
    assert _fingerprint(first, "train") != _fingerprint(first, "test")


@pytest.mark.parametrize("field", ["image", "label"])
def test_any_one_byte_edit_changes_it_even_with_the_mtime_put_back(tmp_path, memo, field):
    directory = _save(tmp_path / "d")
    before = _fingerprint(directory)  # (memoised now)
    _edit_one_byte_keeping_the_mtime(directory / "train" / f"{field}.npy")
    assert _fingerprint(directory) != before


def test_a_file_is_read_once_then_its_digest_is_memoised(tmp_path, memo, monkeypatch):
    directory = _save(tmp_path / "d")
    hashed = []
    real = on_disk._hash_file
    monkeypatch.setattr(on_disk, "_hash_file", lambda *a: hashed.append(a[0]) or real(*a))
    first = _fingerprint(directory)
    assert sorted(hashed) == [str(directory / "train" / f"{f}.npy") for f in ("image", "label")]
    hashed.clear()
    assert _fingerprint(directory) == first and hashed == []  # a stat each, no read
    (directory / "train" / "label.npy").touch()  # a new version of one file
    assert _fingerprint(directory) == first and hashed == [str(directory / "train" / "label.npy")]


def test_a_memo_is_used_only_for_the_file_state_it_names(tmp_path, memo):
    directory = _save(tmp_path / "d")
    expected = _fingerprint(directory)
    image, label = sorted(memo.glob("*.json"), key=lambda f: "label.npy" in f.read_text())
    # Under the right names: a digest for another file state, and no JSON at all.
    record = json.loads(image.read_text())
    record["key"][4] += 1  # another modification time
    image.write_text(json.dumps({"key": record["key"], "digest": "00" * 32}))
    label.write_text("{")
    assert _fingerprint(directory) == expected
    for planted in memo.glob("*.json"):
        planted.unlink()
        os.mkfifo(planted)  # a FIFO is never read (opening it would hang)
    assert _fingerprint(directory) == expected


def test_a_long_hash_says_so_on_stderr(tmp_path, memo, monkeypatch, capsys):
    directory = _save(tmp_path / "d")
    monkeypatch.setattr(on_disk, "PROGRESS_AFTER_S", 0.0)
    _fingerprint(directory)
    said = capsys.readouterr().err
    assert f"jaxfeed: fingerprinting {directory / 'train' / 'label.npy'}: " in said
    assert "once: later runs reuse the digest until the file changes" in said


def _settings(directory, **given):
    args = argparse.Namespace(
        loader="numpy",
        dataset=str(directory),
        batch_size=64,
        seed=0,
        drop_remainder=False,
        devices=None,
        no_shuffle=False,
        block_shuffle=None,
        loader_option=[],
        epochs=1,
        learning_rate=None,
        momentum=0.9,
        checkpoint_every=None,
        resume=False,
        **given,
    )
    make = dict(dataset=directory, batch_size=64, seed=0, process_index=0, process_count=2)
    sources = {split: loaders.make("numpy", split=split, **make) for split in ("train", "test")}
    settings = _agreed_settings(args, sources)
    return {name: json.dumps(value, sort_keys=True) for name, value in settings.items()}


def test_two_processes_agree_on_local_copies_and_refuse_other_content(tmp_path, memo):
    first = _save(tmp_path / "host-a" / "mnist")
    copy = shutil.copytree(first, tmp_path / "host-b" / "data")
    assert disagreements({0: _settings(first), 1: _settings(copy)}) == []
    _edit_one_byte_keeping_the_mtime(copy / "test" / "label.npy")
    (found,) = disagreements({0: _settings(first), 1: _settings(copy)})
    assert found.startswith("test_fingerprint: process 0 has ")
