"""The cache helpers every native-format backend builds its copy with."""

import os
from pathlib import Path

import numpy as np
import pytest

from loaders.cache import build_once, cache_entry


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
        _write("winner")(scratch)
        # Another process renames its complete copy into place first.
        entry.mkdir()
        (entry / "data.txt").write_text("winner")
        (scratch / "data.txt").write_text("loser")

    assert build_once(entry, beaten) == entry
    assert (entry / "data.txt").read_text() == "winner"
    assert os.listdir(tmp_path) == ["entry"]


def test_a_broken_entry_in_the_way_names_the_fix(tmp_path):
    entry = tmp_path / "entry"
    entry.mkdir()
    (entry / "junk").write_text("x")

    def ready(path: Path) -> bool:
        return (path / "data.txt").is_file()

    with pytest.raises(RuntimeError, match=rf"{entry} exists but is incomplete; delete it"):
        build_once(entry, _write("x"), ready)


def test_cache_entry_is_keyed_by_content_and_version(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXFEED_CACHE_DIR", str(tmp_path))
    a, b = np.arange(10), np.arange(11)
    entry = cache_entry("hf", "My Data/train", "v1", a)
    assert entry.parent == tmp_path / "hf" and entry.name.startswith("my-data-train-v1-")
    assert entry == cache_entry("hf", "My Data/train", "v1", a.copy())
    assert entry != cache_entry("hf", "My Data/train", "v1", b)
    assert entry != cache_entry("hf", "My Data/train", "v2", a)
