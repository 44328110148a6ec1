"""Quirks of the torch backend (the shared contract suite covers the rest)."""

import faulthandler
import os
import re

import numpy as np
import pytest
from jaxfeed.loaders._workers import shared_batches
from jaxfeed.loaders.backends import torch as torch_backend

from jaxfeed import loaders

BATCH = 512  # 8 batches of mnist-sample/train, the last one padded


def _epochs(source, epochs=2):
    return [list(source.iter_epoch(epoch)) for epoch in range(epochs)]


def _assert_identical(got, want):
    assert len(got) == len(want)
    for got_epoch, want_epoch in zip(got, want, strict=True):
        assert len(got_epoch) == len(want_epoch)
        for g, w in zip(got_epoch, want_epoch, strict=True):
            assert g.keys() == w.keys()
            for key in w:
                assert type(g[key]) is np.ndarray, (key, type(g[key]))
                assert g[key].dtype == w[key].dtype and g[key].shape == w[key].shape
                np.testing.assert_array_equal(g[key], w[key])


@pytest.fixture
def deadlock_guard():
    """Fails loudly (traceback + exit) instead of hanging CI if workers deadlock."""
    faulthandler.dump_traceback_later(240, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"num_workers": 2},
        {"num_workers": 2, "persistent_workers": True, "prefetch_factor": 4},
    ],
    ids=["in-process", "workers", "persistent-workers"],
)
def test_matches_numpy_backend_after_jax_started(options, deadlock_guard):
    import jax

    # XLA's threads are running now: forked workers could deadlock, spawned ones must not.
    jax.numpy.ones(3).block_until_ready()
    want = _epochs(loaders.make("numpy", dataset="mnist-sample", batch_size=BATCH, seed=3))
    source = loaders.make("torch", dataset="mnist-sample", batch_size=BATCH, seed=3, **options)
    _assert_identical(_epochs(source), want)


def test_getitems_gathers_each_batch_once(monkeypatch):
    calls = []
    gather = torch_backend.ArrayTorchDataset.__getitems__

    def counting(self, indices):
        calls.append(np.asarray(indices))
        return gather(self, indices)

    def per_sample(self, index):
        raise AssertionError("__getitem__ called: the loader fell back to per-sample reads")

    monkeypatch.setattr(torch_backend.ArrayTorchDataset, "__getitems__", counting)
    monkeypatch.setattr(torch_backend.ArrayTorchDataset, "__getitem__", per_sample)
    source = loaders.make("torch", dataset="mnist-sample", batch_size=BATCH, seed=1)
    batches = list(source.iter_epoch(0))
    assert len(calls) == len(batches) == source.num_batches == 8
    expected = loaders.Sampler(4000, BATCH, seed=1).epoch_plan(0)
    for got, (want, _) in zip(calls, expected, strict=True):
        np.testing.assert_array_equal(got, want)


def test_options_are_checked():
    make = loaders.make
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['pin_memory'\]"):
        make("torch", dataset="mnist-sample", pin_memory=True)
    with pytest.raises(ValueError, match="prefetch_factor needs worker processes"):
        make("torch", dataset="mnist-sample", prefetch_factor=2)
    with pytest.raises(ValueError, match="persistent_workers needs worker processes"):
        make("torch", dataset="mnist-sample", persistent_workers=True)
    with pytest.raises(ValueError, match="order must be one of"):
        make("torch", dataset="mnist-sample", order="random")


@pytest.mark.parametrize(
    "option, value, message",
    [
        # What `--loader-option num_workers=junk` passes: a string.
        ("num_workers", "junk", "num_workers must be an int >= 0, got 'junk'"),
        ("num_workers", -1, "num_workers must be an int >= 0, got -1"),
        ("num_workers", True, "num_workers must be an int >= 0, got True"),
        ("num_workers", 2.0, "num_workers must be an int >= 0, got 2.0"),
        ("num_workers", None, "num_workers must be an int >= 0, got None"),
        ("prefetch_factor", 0, "prefetch_factor must be an int >= 1, got 0"),
        ("persistent_workers", "yes", "persistent_workers must be a bool, got 'yes'"),
    ],
)
def test_worker_options_of_the_wrong_type_are_refused(option, value, message):
    options = {"num_workers": 2, option: value}
    with pytest.raises(ValueError, match=re.escape(f"the torch option {message}")):
        loaders.make("torch", dataset="mnist-sample", **options)


def test_in_process_epochs_can_interleave():
    source = loaders.make("torch", dataset="mnist-sample", batch_size=BATCH)
    a, b = source.iter_epoch(0), source.iter_epoch(0)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x["image"], y["image"])


def test_workers_persist_by_default_and_a_second_epoch_at_once_gets_its_own(deadlock_guard):
    source = loaders.make("torch", dataset="mnist-sample", batch_size=BATCH, num_workers=1)
    reference = loaders.make("numpy", dataset="mnist-sample", batch_size=BATCH)
    first = source.iter_epoch(0)
    next(first)
    workers = source._read._shared._iterator._workers  # the persistent loader's processes
    # Epoch 1 while epoch 0 still reads the shared workers: a loader of its own.
    _assert_identical([list(source.iter_epoch(1))], [list(reference.iter_epoch(1))])
    first.close()  # an abandoned epoch frees the loader; torch drops its stale batches
    _assert_identical([list(source.iter_epoch(2))], [list(reference.iter_epoch(2))])
    assert source._read._shared._iterator._workers == workers, "the workers were restarted"
    assert all(w.is_alive() for w in workers)


def test_a_handoff_directory_gets_every_batch_as_a_file(tmp_path):
    # Pickled through torch's pipe, a batch of rows cost 2 workers 3.6 CPU s per GB.
    arrays = {"x": np.arange(60, dtype=np.uint8).reshape(20, 3), "y": np.arange(20.0)}
    dataset = torch_backend.ArrayTorchDataset(arrays, handoff=str(tmp_path))
    handed = dataset.__getitems__([4, 0, 19])
    assert isinstance(handed, shared_batches.Handed)
    got = shared_batches.collect(*handed)
    for key, array in arrays.items():
        np.testing.assert_array_equal(got[key], array[[4, 0, 19]])
    assert not list(tmp_path.iterdir()), "collect deletes the file"


def test_workers_hand_back_files_in_both_orders(deadlock_guard):
    options = {"dataset": "mnist-sample", "batch_size": BATCH, "seed": 5}
    source = loaders.make("torch", num_workers=1, **options)
    assert source.torch_dataset.handoff is not None
    for order in ("sampler", "native"):
        want = loaders.make("torch", order=order, **options)
        source.order = order  # the same persistent workers read both orders
        _assert_identical(_epochs(source, 1), _epochs(want, 1))
    left = [name for name in os.listdir(source.torch_dataset.handoff) if name != ".owner.lock"]
    assert not left, "a batch file was left behind"


def test_rows_gather_straight_into_a_ring_slot_and_come_back_identical(tmp_path):
    from jaxfeed.loaders._workers import batch_ring

    arrays = {"x": np.arange(60, dtype=np.uint8).reshape(20, 3), "y": np.arange(20.0)}
    dataset = torch_backend.ArrayTorchDataset(arrays, handoff=str(tmp_path))
    ring = batch_ring.BatchRing(str(tmp_path), 3 * (3 + 8), slots=2)
    tasks = iter(torch_backend._Tasks([[4, 0, 19], [1, 2], [3]], None, ring))
    handed = [dataset.__getitems__(next(tasks)), dataset.__getitems__(next(tasks))]
    assert all(isinstance(h, batch_ring.Ringed) for h in handed)
    # Both slots taken: the third batch goes as a file, as it did before the ring.
    third = dataset.__getitems__(next(tasks))
    assert isinstance(third, shared_batches.Handed)
    for got, rows in zip([ring.collect(h) for h in handed], [[4, 0, 19], [1, 2]], strict=True):
        for key, array in arrays.items():
            assert got[key].dtype == array.dtype
            np.testing.assert_array_equal(got[key], array[rows])
    assert ring.lease() is not None, "a collected batch frees its slot"
    shared_batches.collect(*third)
    ring.close()
    assert not list(tmp_path.iterdir()), "the ring's file goes with close"
    # A ring gone (its epoch abandoned) before a worker got to it: a file again.
    slot = batch_ring.Slot(str(tmp_path / "gone"), 0, 4096)
    late = dataset.__getitems__(torch_backend._Task(slot, None, [5]))
    assert isinstance(late, shared_batches.Handed)


def test_workers_hand_batches_back_through_the_ring_and_leave_nothing(monkeypatch, deadlock_guard):
    from jaxfeed.loaders._workers import batch_ring

    collected = []
    collect = batch_ring.BatchRing.collect
    monkeypatch.setattr(
        batch_ring.BatchRing, "collect", lambda ring, h: collected.append(h) or collect(ring, h)
    )
    options = {"dataset": "mnist-sample", "batch_size": BATCH, "seed": 7, "shuffle": "blocks"}
    source = loaders.make("torch", num_workers=2, **options)
    want = loaders.make("numpy", **options)
    _assert_identical(_epochs(source), _epochs(want))
    assert len(collected) == 2 * source.num_batches, "every batch came through the ring"
    # Resumed mid-epoch, and an epoch abandoned after two batches.
    _assert_identical([list(source.iter_epoch(1, start=3))], [list(want.iter_epoch(1, start=3))])
    abandoned = source.iter_epoch(2)
    next(abandoned), next(abandoned)
    abandoned.close()
    left = [name for name in os.listdir(source.torch_dataset.handoff) if name != ".owner.lock"]
    assert not left, "a ring or batch file was left behind"
    source.close()
