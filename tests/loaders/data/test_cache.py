"""The cache helpers every native-format backend builds its copy with."""

import json
import os
import zlib
from pathlib import Path

import numpy as np
import pytest
from jaxfeed.loaders.data import cache
from jaxfeed.loaders.data.cache import MANIFEST, build_once, cache_entry, check_entry


def _write(text: str):
    def build(scratch: Path) -> None:
        (scratch / "data.txt").write_text(text)

    return build


def test_builds_once_then_reuses(tmp_path):
    entry = tmp_path / "kind" / "entry"
    assert build_once(entry, _write("first")) == entry
    assert build_once(entry, _write("second")) == entry
    assert (entry / "data.txt").read_text() == "first"
    assert os.listdir(entry.parent) == ["entry"]  # no scratch left behind
    assert sorted(os.listdir(entry)) == ["data.txt", MANIFEST]
    manifest = json.loads((entry / MANIFEST).read_text())
    assert manifest["files"] == {"data.txt": {"size": 5, "crc32": f"{zlib.crc32(b'first'):08x}"}}


def test_failed_build_leaves_nothing_behind(tmp_path):
    def crash(scratch: Path) -> None:
        (scratch / "half-written").write_text("x")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        build_once(tmp_path / "entry", crash)
    assert os.listdir(tmp_path) == []


def test_losing_the_build_race_keeps_the_winners_copy(tmp_path):
    entry = tmp_path / "entry"

    def beaten(scratch: Path) -> None:
        _write("loser")(scratch)
        # Another process renames its complete copy into place first.
        build_once(entry, _write("winner"))

    assert build_once(entry, beaten) == entry
    assert (entry / "data.txt").read_text() == "winner"
    assert os.listdir(tmp_path) == ["entry"]


def test_an_entry_without_manifest_names_the_directory_to_delete(tmp_path):
    entry = tmp_path / "entry"
    entry.mkdir()
    (entry / "junk").write_text("x")
    with pytest.raises(
        RuntimeError,
        match=rf"cache entry {entry} is damaged: it has no {MANIFEST} .*Delete that directory",
    ):
        build_once(entry, _write("x"))
    assert os.listdir(tmp_path) == ["entry"]  # refused before building anything


def _built(tmp_path: Path, text: str = "0123456789" * 100) -> Path:
    entry = build_once(tmp_path / "entry", _write(text))
    cache._checked.clear()  # as a new process would
    return entry


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (
            lambda f: f.write_bytes(f.read_bytes()[:-7]),
            "data.txt has 993 bytes, its manifest says 1000",
        ),
        (lambda f: f.unlink(), "data.txt is missing"),
        (lambda f: f.write_text("0123456789" * 99 + "01234x6789"), "data.txt fails its checksum"),
    ],
    ids=["truncated", "missing", "flipped"],
)
def test_a_damaged_entry_names_the_directory_to_delete(tmp_path, damage, problem):
    entry = _built(tmp_path)
    damage(entry / "data.txt")
    with pytest.raises(RuntimeError, match=rf"cache entry {entry} is damaged: {problem}") as info:
        build_once(entry, _write("never built"))
    assert f"rm -r '{entry}'" in str(info.value)


def test_an_unreadable_manifest_is_damage(tmp_path):
    entry = _built(tmp_path)
    (entry / MANIFEST).write_text("{not json")
    with pytest.raises(RuntimeError, match=rf"{entry} is damaged: its {MANIFEST} is unreadable"):
        check_entry(entry)


def test_checksums_are_read_once_per_process_unless_a_file_changes(tmp_path, monkeypatch):
    entry = _built(tmp_path)
    reads = []
    crc32 = cache._crc32
    monkeypatch.setattr(cache, "_crc32", lambda f, **kw: reads.append(f.name) or crc32(f, **kw))
    check_entry(entry)
    check_entry(entry)
    assert reads == ["data.txt"]  # sizes on every open, content on the first
    data = entry / "data.txt"
    data.write_text(data.read_text()[::-1])  # same size, new content
    os.utime(data, ns=(1, 1))  # a new mtime, even on a coarse clock
    with pytest.raises(RuntimeError, match=r"data\.txt fails its checksum"):
        check_entry(entry)


def test_a_read_only_cache_is_opened_without_writing(tmp_path, monkeypatch):
    entry = _built(tmp_path)

    def refuse(*args, **kwargs):  # chmod cannot stop root; refusing here can
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr("jaxfeed.loaders.data.cache.tempfile.mkstemp", refuse)
    monkeypatch.setattr("jaxfeed.loaders.data.cache.tempfile.mkdtemp", refuse)
    assert build_once(entry, _write("never built")) == entry
    with pytest.raises(ValueError, match=rf"cache directory {tmp_path} is not writable"):
        build_once(tmp_path / "other", _write("x"))


def test_cache_entry_is_keyed_by_content_and_version(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXFEED_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cache, "writer_version", {"datasets": "3.0.0", "other": "1.0"}.get)
    a, b = np.arange(10), np.arange(11)
    entry = cache_entry("hf", "My Data/train", "v1", a, writer="datasets")
    assert entry.parent == tmp_path / "hf"
    assert entry.name.startswith("my-data-train-v1-datasets-3.0.0-")
    assert entry == cache_entry("hf", "My Data/train", "v1", a.copy(), writer="datasets")
    assert entry != cache_entry("hf", "My Data/train", "v1", b, writer="datasets")
    assert entry != cache_entry("hf", "My Data/train", "v2", a, writer="datasets")
    assert entry != cache_entry("hf", "My Data/train", "v1", a, writer="other")


def test_cache_entry_is_keyed_by_the_writers_version(tmp_path, monkeypatch):
    # An entry written by datasets 5.2 failed to open in datasets 3.0.
    monkeypatch.setenv("JAXFEED_CACHE_DIR", str(tmp_path))
    a = np.arange(10)
    monkeypatch.setattr(cache, "writer_version", lambda distribution: "5.2.0")
    newer = cache_entry("hf", "data", "v1", a, writer="datasets")
    monkeypatch.setattr(cache, "writer_version", lambda distribution: "3.0.0")
    older = cache_entry("hf", "data", "v1", a, writer="datasets")
    assert newer != older and "datasets-5.2.0" in newer.name and "datasets-3.0.0" in older.name


def test_writer_version_is_the_installed_version():
    assert cache.writer_version("numpy") == np.__version__


def test_a_large_file_is_checksummed_over_a_sample_that_still_sees_damage(tmp_path, monkeypatch):
    # A dataset bigger than memory must open in milliseconds, not a read of every byte.
    monkeypatch.setattr(cache, "_WHOLE_CRC_BYTES", 1 << 20)
    big = tmp_path / "big.bin"
    big.write_bytes(np.random.default_rng(0).integers(0, 256, 8 << 20, np.uint8).tobytes())
    sampled = cache._crc32(big)
    assert sampled != cache._crc32(big, whole=True)
    with open(big, "r+b") as f:  # damage the last chunk, always among the sampled ones
        f.seek(-10, 2)
        f.write(b"x" * 10)
    assert cache._crc32(big) != sampled
