"""Read-ahead asks the kernel for the coming batches' rows of on-disk fields."""

import ctypes
import errno
import itertools
import mmap
import os
import threading
import time

import numpy as np
import pytest
from jaxfeed.loaders._io import disk_read_ahead, on_disk_fields
from jaxfeed.loaders._io.disk_read_ahead import DiskReadAhead, mapped_rows
from jaxfeed.loaders._io.mapped_files import MADV_POPULATE_READ, memmap_of
from jaxfeed.loaders._io.read_depth import ReadDepth
from jaxfeed.loaders.sampler import Sampler

from jaxfeed import loaders


def _record_asks(monkeypatch, window: int) -> list[tuple[int, int]]:
    """The (address, length) of every ask to the kernel, none made for real, as
    if nothing were cached, on a device whose read-ahead window is ``window``."""
    asked = []
    monkeypatch.setattr(disk_read_ahead, "_MADVISE", lambda *a: asked.append(a[:2]))
    monkeypatch.setattr(disk_read_ahead, "_MINCORE", None)
    monkeypatch.setattr(disk_read_ahead, "read_window", lambda address: window)
    return asked


def _read_ahead_all(x: np.ndarray, plan, asked: list[tuple[int, int]]) -> None:
    """Runs a read-ahead over ``plan`` until it has asked for ``x``'s bytes (or 10 s)."""
    ahead = DiskReadAhead(mapped_rows([x]), plan)
    deadline = time.monotonic() + 120  # bounds a hung reader; ends when done
    while sum(n for _, n in asked) < x.nbytes and time.monotonic() < deadline:
        time.sleep(0.01)
    ahead.close()


def test_read_ahead_asks_for_the_coming_blocks_as_long_ranges(tmp_path, monkeypatch):
    asked = _record_asks(monkeypatch, 8 << 20)
    directory = tmp_path / "d"
    directory.mkdir()
    np.save(directory / "x.npy", np.zeros((4000, 1024), np.uint8))
    (x,) = loaders.load_dataset(directory).arrays.values()
    for shuffle, kwargs in (("blocks", {"block_rows": 100, "window_blocks": 2}), (True, {})):
        asked.clear()
        plan = [i for i, _ in Sampler(4000, 200, shuffle=shuffle, **kwargs).epoch_plan(0)]
        ahead = DiskReadAhead(mapped_rows([x]), plan)  # no reader yet: all 20 are ahead
        deadline = time.monotonic() + 120  # bounds a hung reader; ends when done
        while len(asked) < 20 and time.monotonic() < deadline:
            time.sleep(0.01)
        ahead.close()
        assert all(start % 4096 == 0 for start, _ in asked)  # madvise wants pages
        if shuffle == "blocks":  # a batch is one window: 2 blocks, 1 or 2 ranges of 100 rows,
            # rounded out to whole 64 KiB cells (one a neighbour asked for is not asked again)
            assert 20 <= len(asked) <= 40, asked
            assert all(64 << 10 <= length <= (200 + 128) << 10 for _, length in asked), asked
        else:  # 200 random rows of 4,000: gaps under 64 KiB merge them into long ranges
            assert len(asked) >= 20


def test_long_ranges_are_asked_for_in_pieces_the_kernel_reads_whole(tmp_path, monkeypatch):
    # MADV_WILLNEED reads at most the device's read-ahead window per call.
    asked = _record_asks(monkeypatch, 64 << 10)
    np.save(tmp_path / "x.npy", np.zeros((4000, 1024), np.uint8))
    x = np.load(tmp_path / "x.npy", mmap_mode="r")
    plan = [np.arange(1000 * i, 1000 * (i + 1)) for i in range(4)]  # 4 batches of 1000 KiB
    _read_ahead_all(x, plan, asked)
    assert all(length <= 64 << 10 for _, length in asked), asked
    pieces = sorted(asked)  # they cover every row, with no gap
    assert pieces[0][0] <= x.ctypes.data and sum(pieces[-1]) >= x.ctypes.data + x.nbytes
    assert all(start <= sum(before) for before, (start, _) in itertools.pairwise(pieces))


def test_a_window_of_blocks_is_asked_for_once_not_once_per_batch(tmp_path, monkeypatch):
    asked = _record_asks(monkeypatch, 8 << 20)
    np.save(tmp_path / "x.npy", np.zeros((4000, 1024), np.uint8))
    x = np.load(tmp_path / "x.npy", mmap_mode="r")
    # Windows of 4 blocks of 100 rows, batches of 100: each batch spans its window's 4 blocks.
    sampler = Sampler(4000, 100, shuffle="blocks", block_rows=100, window_blocks=4)
    plan = [i for i, _ in sampler.epoch_plan(0)]
    _read_ahead_all(x, plan, asked)
    # Once, plus the 64 KiB cells at the ends of ranges, which neighbours share: not 4 times.
    assert x.nbytes <= sum(n for _, n in asked) < 1.5 * x.nbytes


@pytest.fixture(scope="module")
def on_disk(tmp_path_factory):
    """A small dataset on disk, written and synced so its pages can be evicted."""
    directory = tmp_path_factory.mktemp("on-disk")
    rng = np.random.default_rng(0)
    np.save(directory / "image.npy", rng.integers(0, 256, (20_000, 28, 28, 1), dtype=np.uint8))
    np.save(directory / "label.npy", rng.integers(0, 10, 20_000).astype(np.int32))
    os.sync()
    return directory


def _evict(directory):
    for path in directory.glob("*.npy"):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


class _NoReadAhead:
    def __init__(self, fields, plan, populate):
        pass

    def reached(self, step):
        pass

    def close(self):
        pass


@pytest.mark.parametrize("shuffle", [True, "blocks"])
def test_batches_are_byte_identical_with_read_ahead_on_and_off(on_disk, monkeypatch, shuffle):
    reads = []
    real_done = ReadDepth.done
    monkeypatch.setattr(
        ReadDepth, "done", lambda self, n, backlog: reads.append(n) or real_done(self, n, backlog)
    )
    kwargs = {"block_rows": 500} if shuffle == "blocks" else {}
    source = loaders.make("numpy", dataset=on_disk, batch_size=256, shuffle=shuffle, **kwargs)
    _evict(on_disk)
    with_read_ahead = list(source.iter_epoch(1))
    assert reads  # the readers faulted rows in
    monkeypatch.setattr(on_disk_fields, "DiskReadAhead", _NoReadAhead)
    _evict(on_disk)
    without = list(source.iter_epoch(1))
    assert len(with_read_ahead) == len(without) == source.num_batches
    for a, b in zip(with_read_ahead, without, strict=True):
        assert a.keys() == b.keys()
        assert all(a[key].tobytes() == b[key].tobytes() for key in a)


@pytest.mark.parametrize("kernel", ["populates", "refuses"])
def test_pages_read_ahead_are_mapped_or_left_to_fault_with_the_same_bytes(
    on_disk, monkeypatch, kernel
):
    # With POPULATE the gather finds the pages mapped, not faulting them in; a kernel
    # before 5.14 refuses the advice (EINVAL) and the gather faults them in as without.
    real = disk_read_ahead._MADVISE
    if kernel == "populates" and not _kernel_populates():
        pytest.skip("this kernel has no MADV_POPULATE_READ (Linux 5.14+)")
    asked = {"willneed": 0, "populated": 0}
    results = []  # of each MADV_POPULATE_READ

    def madvise(start, length, advice):
        if advice != MADV_POPULATE_READ:
            asked["willneed"] += length
            return real(start, length, advice)
        if kernel == "refuses":
            ctypes.set_errno(errno.EINVAL)
            results.append(-1)
            return -1
        results.append(real(start, length, advice))
        asked["populated"] += length
        return results[-1]

    monkeypatch.setattr(disk_read_ahead, "_MADVISE", madvise)
    monkeypatch.setattr(disk_read_ahead, "_MINCORE", None)  # as if nothing were cached
    monkeypatch.setattr(disk_read_ahead, "POPULATE", True)
    image = np.load(on_disk / "image.npy", mmap_mode="r")
    plan = [i for i, _ in Sampler(len(image), 256, shuffle="blocks", block_rows=500).epoch_plan(1)]
    _evict(on_disk)
    ahead = DiskReadAhead(mapped_rows([image]), plan)  # no reader comes: every read is made
    done = "populated" if kernel == "populates" else "willneed"
    deadline = time.monotonic() + 120  # bounds a hung reader; ends when done
    while asked[done] < image.nbytes and time.monotonic() < deadline:
        time.sleep(0.01)
    ahead.close()
    assert results and set(results) == ({0} if kernel == "populates" else {-1}), results
    if kernel == "refuses":
        assert len(results) <= disk_read_ahead.MAX_READERS  # each reader tried once at most
        assert asked["willneed"] >= image.nbytes  # and the reads went on
    rows = np.concatenate(plan)
    assert image[rows].tobytes() == np.load(on_disk / "image.npy")[rows].tobytes()


def _kernel_populates():
    page = mmap.mmap(-1, mmap.PAGESIZE)
    address = ctypes.addressof(ctypes.c_char.from_buffer(page))
    try:
        return disk_read_ahead._MADVISE(address, mmap.PAGESIZE, MADV_POPULATE_READ) == 0
    finally:
        del address
        page.close()


def _read_ahead_threads():
    return [t for t in threading.enumerate() if t.name.startswith("jaxfeed-read-ahead")]


def test_read_ahead_threads_stop_on_close(on_disk):
    source = loaders.make("numpy", dataset=on_disk, batch_size=64, shuffle=True)
    _evict(on_disk)
    epoch = source.iter_epoch(0)
    next(epoch)
    assert _read_ahead_threads()  # planner (and readers) running mid-epoch
    epoch.close()  # a loop left early
    assert not _read_ahead_threads()
    (x,) = mapped_rows([loaders.load_dataset(on_disk).arrays["image"]])
    plan = [i for i, _ in Sampler(20_000, 64, shuffle=True).epoch_plan(0)]
    _evict(on_disk)
    ahead = DiskReadAhead([x], plan)  # the reader never comes: it reads up to AHEAD_BYTES
    threads = ahead.threads
    ahead.close()
    assert threads and not any(t.is_alive() for t in threads)
    assert not _read_ahead_threads()


def test_without_mapped_fields_it_starts_nothing():
    plan = [i for i, _ in Sampler(1000, 100).epoch_plan(0)]
    ahead = DiskReadAhead(mapped_rows([np.zeros((1000, 4))]), plan)  # in memory
    for step in range(len(plan)):
        ahead.reached(step)
    ahead.close()
    assert not ahead.threads


@pytest.mark.parametrize("shuffle, random", [(True, True), ("blocks", True), (False, False)])
def test_past_memory_shuffled_orders_read_pages_not_read_around(
    on_disk, monkeypatch, shuffle, random
):
    # Block order read around a fault too: 1.34-1.48 bytes read per byte used, cold.
    monkeypatch.setattr(on_disk_fields, "_bigger_than_half_of_memory", lambda nbytes: True)
    kwargs = {"block_rows": 500} if shuffle == "blocks" else {}
    source = loaders.make("numpy", dataset=on_disk, batch_size=256, shuffle=shuffle, **kwargs)
    next(iter(source.iter_epoch(0)))
    for array in source.dataset.arrays.values():
        assert memmap_of(array)._jaxfeed_random_reads is random


@pytest.mark.parametrize("backend", ["torch", "grain"])
def test_pages_are_mapped_only_where_this_process_gathers(backend):
    # Worker processes gather from mappings of their own: mapping pages here is waste.
    data = {"x": np.zeros((100, 4), np.float32)}
    assert loaders.make(backend, dataset=data, batch_size=10)._gathers_here()
    assert not loaders.make(backend, dataset=data, batch_size=10, num_workers=2)._gathers_here()
