"""The cache is untrusted storage: an entry is used only when it still matches
its source, and it may name only regular files inside itself."""

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from jaxfeed.loaders.data import cache

from jaxfeed import loaders


def _save(directory, rows: int = 5000, seed: int = 0):
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    np.save(directory / "x.npy", rng.normal(size=(rows, 4)).astype(np.float32))
    np.save(directory / "label.npy", rng.integers(0, 10, rows).astype(np.int32))
    return directory


def _labels(backend, directory):
    source = loaders.make(backend, dataset=directory, batch_size=1000, shuffle=False)
    return np.concatenate([b["label"] for b in source.iter_epoch(0)])


def test_an_edit_that_restores_the_mtime_is_seen_by_the_hf_copy(tmp_path):
    directory = _save(tmp_path / "data")
    np.testing.assert_array_equal(_labels("hf", directory), _labels("numpy", directory))
    path = directory / "label.npy"
    before = path.stat()
    labels = np.load(path, mmap_mode="r+")
    labels[2501] += 1  # one value, not among the 256 sampled rows
    labels.flush()
    del labels
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))  # as cp -p or touch -d would
    assert path.stat().st_mtime_ns == before.st_mtime_ns and path.stat().st_size == before.st_size
    want = _labels("numpy", directory)
    assert want[2501] == np.load(path)[2501]
    np.testing.assert_array_equal(_labels("hf", directory), want)  # not the old copy


@pytest.mark.parametrize(
    ("name", "make"),
    [
        ("../outside.bin", lambda entry: (entry.parent / "outside.bin").write_bytes(b"x")),
        ("/dev/zero", lambda entry: None),
        ("fifo", lambda entry: os.mkfifo(entry / "fifo")),
        ("link", lambda entry: (entry / "link").symlink_to("/dev/zero")),
    ],
    ids=["outside", "absolute", "fifo", "symlink"],
)
def test_a_manifest_naming_anything_but_a_regular_file_inside_is_refused(tmp_path, name, make):
    entry = tmp_path / "entry"
    entry.mkdir()
    make(entry)
    manifest = {"format": 2, "files": {name: {"size": 0, "crc32": "00000000"}}}
    (entry / cache.MANIFEST).write_text(json.dumps(manifest))
    errors = []

    def check():
        try:
            cache.check_entry(entry)
        except RuntimeError as error:
            errors.append(error)

    # In a thread with a deadline: a FIFO or /dev/zero hung it for good before.
    reader = threading.Thread(target=check, daemon=True)
    reader.start()
    reader.join(timeout=60)
    assert not reader.is_alive(), f"check_entry still reads {name} after 60 s"
    assert len(errors) == 1
    assert f"is damaged: {name} is not a regular file inside the entry" in str(errors[0])


def test_an_entry_planted_in_a_cache_others_can_write_is_never_read(tmp_path, monkeypatch):
    mine, theirs = _save(tmp_path / "mine"), _save(tmp_path / "theirs", seed=1)
    want = _labels("numpy", mine)
    shared = tmp_path / "scratch"
    shared.mkdir(mode=0o755)
    monkeypatch.setenv(cache.CACHE_ENV, str(shared))
    _labels("hf", mine)  # my entry, where a cache of one user keeps it
    (entry,) = (shared / "hf").iterdir()
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "elsewhere"))
    _labels("hf", theirs)
    (planted,) = (tmp_path / "elsewhere" / "hf").iterdir()
    shutil.rmtree(entry)
    shutil.copytree(planted, entry)  # a neighbour's rows under my entry's name, manifest and all
    shared.chmod(0o777)  # a team's scratch: anyone may write it
    monkeypatch.setenv(cache.CACHE_ENV, str(shared))
    np.testing.assert_array_equal(_labels("hf", mine), want)  # not the planted rows
    own = shared / f"user-{os.getuid()}"
    assert cache.cache_root() == own
    assert any((own / "hf").iterdir()) and own.stat().st_mode & 0o022 == 0


def test_a_users_directory_in_a_shared_cache_that_others_may_write_is_refused(
    tmp_path, monkeypatch
):
    shared = tmp_path / "scratch"
    shared.mkdir()
    shared.chmod(0o777)
    own = shared / f"user-{os.getuid()}"
    own.mkdir()
    own.chmod(0o777)  # made ready for me by a neighbour
    monkeypatch.setenv(cache.CACHE_ENV, str(shared))
    with pytest.raises(ValueError, match=rf"keeps yours in {own}, but that is not a directory"):
        cache.cache_root()
    own.chmod(0o755)
    if os.geteuid() == 0:  # (only root can give a directory to another user)
        os.chown(own, 65534, 65534)
        with pytest.raises(ValueError, match="someone else may have made it"):
            cache.cache_root()


# A build whose process id, seen from here, belongs to no process: as a build
# running in another container (another PID namespace) on this host looks.
_BUILD_ELSEWHERE = r"""
import os, sys
from pathlib import Path
from jaxfeed.loaders.data import cache

root, started = Path(sys.argv[1]), Path(sys.argv[2])

def build(scratch):
    (scratch / "rows.bin").write_bytes(b"theirs")
    started.touch()
    sys.stdin.read()  # until the test closes it

os.getpid = lambda: 4_194_000  # no such process in the test's namespace
cache.build_once(root / "entry", build)
"""


def test_a_live_build_in_another_pid_namespace_is_never_taken_for_dead(tmp_path):
    started = tmp_path / "started"
    child = subprocess.Popen(
        [sys.executable, "-c", _BUILD_ELSEWHERE, str(tmp_path), str(started)],
        stdin=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 120
        while not started.exists():  # the child's build is under way
            assert child.poll() is None and time.monotonic() < deadline, "never started"
            time.sleep(0.02)
        # This job builds the same entry meanwhile (it lands first).
        cache.build_once(tmp_path / "entry", lambda s: (s / "rows.bin").write_bytes(b"mine"))
        child.stdin.close()
        assert child.wait(timeout=120) == 0  # its scratch was left alone: it finished
    finally:
        child.kill()
        child.wait()
    assert (tmp_path / "entry" / "rows.bin").read_bytes() == b"mine"
    assert [p.name for p in tmp_path.iterdir() if ".build-" in p.name] == []  # nothing left


def _parquet_labels(directory):
    source = loaders.make("numpy", dataset=directory, batch_size=4, shuffle=False)
    return np.concatenate([b["label"] for b in source.iter_epoch(0)])


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a directory to another user")
def test_a_cache_that_another_user_owns_is_refused(tmp_path, monkeypatch):
    import pyarrow as pa
    from pyarrow import parquet

    data = tmp_path / "data"
    data.mkdir()
    labels = np.arange(12) % 3
    parquet.write_table(pa.table({"x": np.arange(12.0), "label": labels}), data / "train.parquet")
    root = tmp_path / "cache"
    monkeypatch.setenv(cache.CACHE_ENV, str(root))
    np.testing.assert_array_equal(_parquet_labels(data), labels)
    (entry,) = (root / "formats").iterdir()
    fields = json.loads((entry / "fields.json").read_text())["fields"]
    shifted = np.roll(np.fromfile(entry / fields["label"]["file"], "<i8"), 1)
    shifted.tofile(entry / fields["label"]["file"])  # a neighbour's edit, manifest and all
    (entry / cache.MANIFEST).unlink()
    cache._write_manifest(entry)
    cache._checked.clear()
    assert list(_parquet_labels(data)) == list(np.roll(labels, 1))  # (the poison works)
    root.chmod(0o755)
    for path in (root, root / "formats", entry, entry / fields["label"]["file"]):
        os.chown(path, 12345, 12345)  # the neighbour's, though no one else may write it
        refusal = rf"cache path {re.escape(str(path))} belongs to uid 12345, not to you .*; set "
        with pytest.raises(ValueError, match=refusal + rf"{cache.CACHE_ENV} to a directory of"):
            _parquet_labels(data)
        os.chown(path, 0, 0)  # root's, writable by root alone: trusted
    assert list(_parquet_labels(data)) == list(np.roll(labels, 1))
