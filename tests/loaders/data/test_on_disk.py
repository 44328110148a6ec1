"""Datasets on disk: read in place by every backend, byte-identical with the same
data held in memory, never copied whole into memory, and a conversion killed
midway never served."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from backend_helpers import assert_same_batches
from jaxfeed.loaders._io.mapped_files import file_rows

from jaxfeed import loaders

BACKENDS = ["numpy", "torch", "tf", "grain", "hf"]
REPO = Path(__file__).resolve().parents[3]


def _fields(rows: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "image": rng.integers(0, 256, (rows, 6, 5, 1), dtype=np.uint8),
        "label": rng.integers(0, 10, rows).astype(np.int32),
        "score": rng.normal(size=(rows, 3)).astype(np.float32),
        "flag": rng.random(rows) < 0.5,
    }


def _save(directory: Path, fields: dict[str, np.ndarray]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, array in fields.items():
        np.save(directory / f"{name}.npy", array)
    return directory


@pytest.fixture(scope="module")
def on_disk(tmp_path_factory):
    """A directory with train/ and test/ subdirectories of .npy files, and the arrays."""
    root = tmp_path_factory.mktemp("npy")
    fields = {"train": _fields(1000), "test": _fields(300, seed=1)}
    for split, arrays in fields.items():
        _save(root / split, arrays)
    return root, fields


def test_a_directory_of_npy_files_is_memory_mapped_per_split(on_disk):
    root, fields = on_disk
    for split in ("train", "test"):
        data = loaders.load_dataset(root, split)
        assert data.name == f"{split}/{split}" and len(data) == len(fields[split]["label"])
        for name, array in fields[split].items():
            np.testing.assert_array_equal(data[name], array)
            assert file_rows(data[name]).path == str(root / split / f"{name}.npy")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shuffle", [True, "blocks"], ids=["full", "blocks"])
def test_on_disk_data_reads_byte_identical_to_the_same_data_in_memory(on_disk, backend, shuffle):
    root, fields = on_disk
    order = dict(shuffle=shuffle, **({"block_rows": 64} if shuffle == "blocks" else {}))
    disk = loaders.make(backend, dataset=root, batch_size=96, seed=3, **order)
    memory = loaders.make("numpy", dataset=fields["train"], batch_size=96, seed=3, **order)
    for epoch in (0, 1):
        assert_same_batches(list(disk.iter_epoch(epoch)), list(memory.iter_epoch(epoch)))
    assert_same_batches(list(disk.iter_epoch(1, start=4)), list(memory.iter_epoch(1, start=4)))


def test_an_on_disk_dataset_changed_in_place_gets_a_new_cache_key(tmp_path):
    from jaxfeed.loaders.data.cache import fingerprint

    directory = _save(tmp_path / "d", _fields(500))
    before = fingerprint(*loaders.load_dataset(directory).content())
    labels = np.load(directory / "label.npy", mmap_mode="r+")
    labels[251] += 1  # one value, in the middle: not among the sampled rows
    labels.flush()
    del labels
    os.utime(directory / "label.npy", ns=(time.time_ns(), time.time_ns() + 10**9))
    assert fingerprint(*loaders.load_dataset(directory).content()) != before


# Reads an epoch of an on-disk dataset and prints the peak growth of anonymous
# memory (not the page cache, which the kernel reclaims) over what the backend's
# framework itself takes (measured first, on a tiny dataset).
_MEMORY_CHILD = r"""
import json, sys, threading, time
import numpy as np
from jaxfeed import loaders

backend, directory, tiny = sys.argv[1], sys.argv[2], sys.argv[3]
options = json.loads(sys.argv[4])

def rss_anon():
    with open("/proc/self/status") as status:
        return next(int(l.split()[1]) * 1024 for l in status if l.startswith("RssAnon:"))

for batch in loaders.make(backend, dataset=tiny, batch_size=64, **options):
    pass  # imports and starts the framework
peak, base = [0], rss_anon()
def watch():
    while True:
        peak[0] = max(peak[0], rss_anon())
        time.sleep(0.01)
threading.Thread(target=watch, daemon=True).start()
rows = 0
for batch in loaders.make(backend, dataset=directory, batch_size=1024, **options).iter_epoch(0):
    rows += int(batch["mask"].sum())
time.sleep(0.05)
print(json.dumps({"rows": rows, "growth": max(peak[0], rss_anon()) - base}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_no_backend_copies_an_on_disk_dataset_into_memory(tmp_path, backend):
    # 400 MB of rows against a budget of 120 MB: a copy of the split (hf's and
    # tf's conversions held 1.1x and 4.5x of it) would overrun it several times.
    rows, width = 100_000, 4000
    directory = tmp_path / "big"
    directory.mkdir()
    images = np.lib.format.open_memmap(directory / "image.npy", "w+", np.uint8, (rows, width))
    for start in range(0, rows, 10_000):
        images[start : start + 10_000] = start // 10_000
    images.flush()
    del images
    np.save(directory / "label.npy", np.arange(rows, dtype=np.int32))
    tiny = _save(tmp_path / "tiny", {"image": np.zeros((128, width), np.uint8),
                                     "label": np.zeros(128, np.int32)})  # fmt: skip
    options = {"num_workers": 2} if backend in ("torch", "grain") else {}
    env = {**os.environ, "JAXFEED_CACHE_DIR": str(tmp_path / "cache")}
    child = subprocess.run(
        [sys.executable, "-c", _MEMORY_CHILD, backend, str(directory), str(tiny),
         json.dumps(options)],
        capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert child.returncode == 0, child.stderr
    report = json.loads(child.stdout.strip().splitlines()[-1])
    assert report["rows"] == rows
    assert report["growth"] < 120 << 20, f"{report['growth'] / 2**20:.0f} MiB more anonymous memory"


_KILLED_CONVERSION_CHILD = r"""
import sys
from pathlib import Path
from jaxfeed import loaders
from jaxfeed.loaders.backends import hf

marker = Path(sys.argv[2])
write = hf._Sliced.write

def write_then_stall(self, data):
    written = write(self, data)
    marker.touch()  # part of the copy is on disk: now it is killed
    import time
    time.sleep(600)
    return written

hf._WRITE_SLICE = 1 << 16
hf._Sliced.write = write_then_stall
loaders.make("hf", dataset=sys.argv[1], batch_size=64)
"""


@pytest.mark.slow
def test_a_conversion_killed_midway_is_rebuilt_never_served(on_disk, tmp_path):
    root, fields = on_disk
    marker, cache = tmp_path / "writing", tmp_path / "cache"
    env = {**os.environ, "JAXFEED_CACHE_DIR": str(cache)}
    child = subprocess.Popen(
        [sys.executable, "-c", _KILLED_CONVERSION_CHILD, str(root), str(marker)], env=env
    )
    try:
        deadline = time.monotonic() + 300
        while not marker.exists():
            assert child.poll() is None and time.monotonic() < deadline, "never started writing"
            time.sleep(0.05)
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
    left = sorted(p.name for p in (cache / "hf").iterdir())  # the killed build's scratch
    assert len(left) == 2 and all(".build-" in name for name in left), left  # (and its lock)

    result = subprocess.run(
        [sys.executable, "-c", "import sys; from jaxfeed import loaders; "
         "s = loaders.make('hf', dataset=sys.argv[1], batch_size=64, shuffle=False); "
         "import numpy as np; np.save(sys.argv[2], np.concatenate("
         "[b['label'][b['mask']] for b in s]))", str(root), str(tmp_path / "labels.npy")],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "labels.npy"), fields["train"]["label"])
    assert [p.name for p in (cache / "hf").iterdir() if ".build-" in p.name] == []  # cleaned up
