"""The sharding-and-prefetch core on 8 simulated CPU devices."""

import gc
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from jaxfeed.loaders.protocol import ArraySpec
from jaxfeed.sharding import DeviceFeed, batch_sharding, data_mesh, place_batch
from jaxfeed.sharding.placement import check_global_batch_divides_mesh

from jaxfeed import loaders


def _source(batch_size=16, **kwargs):
    return loaders.make("numpy", dataset="mnist-sample", batch_size=batch_size, **kwargs)


def _feed_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("jaxfeed-read")]


def test_eight_cpu_devices_are_visible():
    assert jax.device_count() == 8


def test_placed_batches_are_sharded_over_the_data_axis_in_order():
    source = _source(batch_size=16, split="test", shuffle=False)
    mesh = data_mesh()
    host = next(source.iter_epoch(0))
    with DeviceFeed(source, mesh) as feed:
        batch = next(feed)
    assert set(batch) == {"image", "label", "mask"}
    image = batch["image"]
    assert image.shape == (16, 28, 28, 1) and image.dtype == jnp.uint8
    assert image.sharding == NamedSharding(mesh, PartitionSpec("data"))
    shards = sorted(image.addressable_shards, key=lambda s: s.index[0].start)
    assert len(shards) == 8
    for i, shard in enumerate(shards):
        assert shard.data.shape == (2, 28, 28, 1)
        np.testing.assert_array_equal(np.asarray(shard.data), host["image"][2 * i : 2 * i + 2])
    np.testing.assert_array_equal(np.asarray(batch["label"]), host["label"])


def test_two_dimensional_mesh_replicates_over_model_axis():
    mesh = data_mesh(model=2)
    assert mesh.axis_names == ("data", "model") and mesh.shape["data"] == 4
    sharding = batch_sharding(mesh)
    placed = place_batch({"x": np.arange(8, dtype=np.int32)}, sharding)
    assert placed["x"].sharding.spec == PartitionSpec("data")
    # 8 devices hold 4 distinct 2-row shards, each twice (replicated over 'model').
    rows = sorted(tuple(np.asarray(s.data)) for s in placed["x"].addressable_shards)
    assert rows == sorted([(0, 1), (2, 3), (4, 5), (6, 7)] * 2)


def test_user_sharding_is_used_as_is():
    mesh = Mesh(np.array(jax.devices()[:4]), ("batch",))
    sharding = NamedSharding(mesh, PartitionSpec("batch"))
    with DeviceFeed(_source(batch_size=8), sharding) as feed:
        assert next(feed)["image"].sharding == sharding


def test_batch_that_does_not_divide_raises_before_any_data_moves():
    calls = []

    class Spy:
        batch_size, num_batches = 100, 1
        element_spec = {"x": ArraySpec((100,), np.dtype(np.int32))}

        def iter_epoch(self, epoch=0, *, start=0):
            calls.append(epoch)
            yield {"x": np.zeros(100, np.int32)}

    expected = (
        r"global batch 100 .* does not divide over 8 devices on mesh axis 'data'. "
        r"Pick a batch_size that is a multiple of 8 \(e.g. 96 or 104\)"
    )
    with pytest.raises(ValueError, match=expected):
        DeviceFeed(Spy(), data_mesh())
    assert calls == []


def test_unknown_mesh_axis():
    expected = r"mesh axis 'data' not found; the mesh has axes \('batch',\)"
    with pytest.raises(ValueError, match=expected):
        batch_sharding(Mesh(np.array(jax.devices()), ("batch",)))


def test_a_mesh_without_a_data_axis_gets_a_fix_that_works():
    # The jax-ai-stack tutorial's mesh: its one axis is not called 'data'.
    mesh = Mesh(np.array(jax.devices()), ("device",))
    expected = (
        r"the mesh has axes \('device',\). Pass the batch sharding instead of the mesh "
        r"\(DeviceFeed\(source, sharding\), fit\(..., mesh=sharding\)\) with sharding = "
        r"NamedSharding\(mesh, PartitionSpec\('device'\)\), or build the mesh with a 'data' "
        r"axis: Mesh\(devices, \('data',\)\) or jaxfeed.data_mesh\(\)"
    )
    with pytest.raises(ValueError, match=expected):
        DeviceFeed(_source(), mesh)
    # What the message says to do, done: both ways read the same batches.
    sharding = NamedSharding(mesh, PartitionSpec("device"))
    assert batch_sharding(mesh, data_axis="device") == sharding
    data = Mesh(np.array(jax.devices()), ("data",))
    for fixed, axis in ((sharding, "device"), (data, "data")):
        with DeviceFeed(_source(), fixed) as feed:
            batch = next(feed)
        assert batch["image"].sharding == NamedSharding(
            batch["image"].sharding.mesh, PartitionSpec(axis)
        )
        assert len(batch["image"].addressable_shards) == 8


def test_model_axis_must_divide_devices():
    with pytest.raises(ValueError, match="model axis size 3 does not divide the 8 devices"):
        data_mesh(model=3)


def test_check_global_batch_divides_mesh_accepts_multiples():
    check_global_batch_divides_mesh(24, batch_sharding(data_mesh()))


class _Broken:
    """Three good batches, then the disk catches fire."""

    batch_size, num_batches = 8, 5
    element_spec = {"x": ArraySpec((8,), np.dtype(np.int32))}

    def iter_epoch(self, epoch=0, *, start=0):
        for i in range(3):
            yield {"x": np.full(8, i, np.int32)}
        raise OSError("disk on fire")


@pytest.mark.parametrize("options", [{}, {"device_buffer": 4}, {"host_buffer": 2}])
def test_loader_errors_are_reraised_after_every_batch_read_before_them(options):
    feed = DeviceFeed(_Broken(), data_mesh(), **options)
    assert [int(next(feed)["x"][0]) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(OSError, match="disk on fire"):
        next(feed)
    assert next(feed, None) is None  # closed, not stuck
    assert not _feed_threads()


@pytest.mark.parametrize("options", [{}, {"device_buffer": 3}, {"host_buffer": 3}])
def test_every_feed_mode_gives_the_batches_of_a_plain_loop(options):
    source = _source(batch_size=96)
    with DeviceFeed(source, data_mesh(), epoch=2, start=1, **options) as feed:
        got = [{k: np.asarray(v) for k, v in b.items()} for b in feed]
    expected = list(source.iter_epoch(2, start=1))
    assert len(got) == len(expected) == source.num_batches - 1
    for a, b in zip(got, expected, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])


@pytest.mark.parametrize("devices", [1, 8])
def test_on_cpu_a_feed_places_numpy_batches_without_device_puts_python(monkeypatch, devices):
    # jax.device_put's Python costs several times a jitted identity's dispatch
    # a batch, which Keras also avoids on CPU (sharding.placement.place_local).
    source = _source(batch_size=16, split="test", shuffle=False)
    sharding = batch_sharding(data_mesh(jax.devices()[:devices]))
    expected = [jax.device_put(b, sharding) for b in source.iter_epoch(0)]

    def refused(*args, **kwargs):
        raise AssertionError("jax.device_put was called")

    monkeypatch.setattr(jax, "device_put", refused)
    with DeviceFeed(source, sharding) as feed:
        got = list(feed)
    assert len(got) == len(expected) == source.num_batches
    for a, b in zip(got, expected, strict=True):
        assert list(a) == list(b)
        for key in a:
            assert a[key].sharding == b[key].sharding and a[key].dtype == b[key].dtype
            np.testing.assert_array_equal(np.asarray(a[key]), np.asarray(b[key]))


def test_on_cpu_large_transfers_go_to_device_put_not_the_copying_identity(monkeypatch):
    # The identity copies its input: for 8 stacked batches of 1,024 digits
    # (6.5 MB) that took 1.1 ms a transfer against device_put's 47 µs.
    source = _source(batch_size=1024, shuffle=False)  # 5,000 rows: 4 full batches, k=2
    sharding = batch_sharding(data_mesh())
    calls = []
    device_put = jax.device_put

    def counted(value, *args, **kwargs):
        calls.append(len(value))
        return device_put(value, *args, **kwargs)

    monkeypatch.setattr(jax, "device_put", counted)
    with DeviceFeed(source, sharding, steps_per_transfer=2) as feed:
        got = list(feed)
    monkeypatch.undo()
    assert calls and sum(calls) == 2  # the two transfers of 2 x 1,024 digits
    expected = list(source.iter_epoch(0))
    assert len(got) == 2
    for k, transfer in enumerate(got):
        for key, value in transfer.items():
            np.testing.assert_array_equal(
                np.asarray(value), np.stack([b[key] for b in expected[2 * k : 2 * k + 2]])
            )


@pytest.mark.parametrize("host_buffer", [0, 2])
def test_k_steps_per_transfer_stack_k_batches_sharded_on_the_batch_axis(host_buffer):
    source = _source(batch_size=96)  # 4,000 rows: 42 batches, 42 = 4 * 10 + 2
    mesh = data_mesh()
    with DeviceFeed(source, mesh, steps_per_transfer=4, host_buffer=host_buffer) as feed:
        stacks = list(feed)
    assert [s["image"].shape[0] for s in stacks] == [4] * 10 + [2]
    first = stacks[0]["image"]
    assert first.shape == (4, 96, 28, 28, 1)
    assert first.sharding.spec == PartitionSpec(None, "data")
    assert {s.data.shape for s in first.addressable_shards} == {(4, 12, 28, 28, 1)}
    expected = list(source.iter_epoch(0))
    unstacked = [
        {k: np.asarray(v[i]) for k, v in s.items()} for s in stacks for i in range(len(s["mask"]))
    ]
    assert len(unstacked) == len(expected) == 42
    for a, b in zip(unstacked, expected, strict=True):
        for key in b:
            np.testing.assert_array_equal(a[key], b[key])


class _DtypeDrift:
    """float32 batches, then a float64 one: stacking must not cast it silently."""

    batch_size, num_batches = 8, 4
    element_spec = {"x": ArraySpec((), np.dtype(np.float32))}

    def iter_epoch(self, epoch=0, *, start=0):
        for i in range(4):
            yield {"x": np.full(8, 0.1, np.float64 if i == 1 else np.float32)}


def test_a_dtype_change_within_a_transfer_raises_instead_of_casting():
    message = r"batches of one transfer differ: batch 1 is float64 \(8,\), batch 0 float32 \(8,\)"
    with pytest.raises(ValueError, match=message):
        list(DeviceFeed(_DtypeDrift(), data_mesh(), steps_per_transfer=2))


def test_close_stops_a_reading_thread_blocked_on_a_full_queue():
    class Endless:
        batch_size, num_batches = 8, None
        element_spec = {"x": ArraySpec((8,), np.dtype(np.int32))}

        def iter_epoch(self, epoch=0, *, start=0):
            while True:
                yield {"x": np.zeros(8, np.int32)}

    with DeviceFeed(Endless(), data_mesh(), host_buffer=2) as feed:
        assert _feed_threads()
        next(feed)
        time.sleep(0.3)  # let the producer fill the queue and block
    assert not _feed_threads()


def test_closing_a_feed_closes_the_loaders_epoch():
    closed = []

    class Tracked:
        batch_size, num_batches = 8, 100
        element_spec = {"x": ArraySpec((8,), np.dtype(np.int32))}

        def iter_epoch(self, epoch=0, *, start=0):
            try:
                while True:
                    yield {"x": np.zeros(8, np.int32)}
            finally:
                closed.append(epoch)

    with DeviceFeed(Tracked(), data_mesh(), epoch=3) as feed:
        next(feed)
    assert closed == [3]


def test_abandoned_feed_is_collected_and_its_thread_ends():
    feed = DeviceFeed(_source(batch_size=8), data_mesh(), host_buffer=2)
    next(feed)
    del feed
    gc.collect()
    deadline = time.time() + 5
    while _feed_threads() and time.time() < deadline:
        time.sleep(0.05)
    assert not _feed_threads()


def test_feed_yields_the_whole_epoch_then_stops():
    source = _source(batch_size=200, split="test", shuffle=False)
    with DeviceFeed(source, data_mesh()) as feed:
        batches = list(feed)
    assert len(batches) == source.num_batches == 5
    assert sum(int(b["mask"].sum()) for b in batches) == 1000


def test_jitted_step_consumes_placed_batches():
    @jax.jit
    def total(batch):
        return jnp.sum(batch["label"] * batch["mask"])

    source = _source(batch_size=64, split="test", shuffle=False)
    expected = int(loaders.load_dataset("mnist-sample", "test")["label"].sum())
    with DeviceFeed(source, data_mesh()) as feed:
        assert sum(int(total(b)) for b in feed) == expected


@pytest.mark.parametrize(
    "option, value, message",
    [
        ("device_buffer", 0, "device_buffer must be an integer >= 1, got 0"),
        ("host_buffer", -1, "host_buffer must be an integer >= 0, got -1"),
        ("steps_per_transfer", 2.0, "steps_per_transfer must be an integer >= 1, got 2.0"),
        ("steps_per_transfer", True, "steps_per_transfer must be an integer >= 1, got True"),
    ],
)
def test_bad_feed_options_are_refused_by_name(option, value, message):
    with pytest.raises(ValueError, match=message):
        DeviceFeed(_source(), data_mesh(), **{option: value})


def test_source_made_for_another_process_layout_is_refused():
    source = loaders.make(
        "numpy", dataset="mnist-sample", batch_size=8, process_count=2, process_index=1
    )
    with pytest.raises(ValueError, match=r"made for process 1 of 2, but this is process 0 of 1"):
        DeviceFeed(source, data_mesh())


@pytest.mark.parametrize("backend", ["numpy", "torch", "tf", "grain", "hf"])
def test_every_backend_feeds_a_jitted_step_on_eight_devices(backend):
    source = loaders.make(
        backend, dataset="mnist-sample", split="test", batch_size=96, shuffle=False
    )
    mesh = data_mesh()
    expected = loaders.load_dataset("mnist-sample", "test")["label"]
    count = jax.jit(lambda b: jnp.sum(b["mask"]))
    label_sum = jax.jit(lambda b: jnp.sum(b["label"] * b["mask"]))
    seen = total = 0
    with DeviceFeed(source, mesh) as feed:
        for batch in feed:
            assert batch["image"].shape == (96, 28, 28, 1)
            assert batch["image"].sharding.spec == PartitionSpec("data")
            assert {s.data.shape[0] for s in batch["image"].addressable_shards} == {12}
            seen += int(count(batch))
            total += int(label_sum(batch))
    assert seen == len(expected) and total == int(expected.sum())


def test_a_coordinator_port_in_use_is_refused_by_process_0():
    # A second job's coordinator on a running job's port would share it (JAX binds
    # with SO_REUSEPORT) and take over the first job's connections.
    import socket

    from jaxfeed.sharding import initialize

    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        with pytest.raises(ValueError, match=rf"127\.0\.0\.1:{port} is in use .*free port"):
            initialize(f"127.0.0.1:{port}", num_processes=2, process_id=0)


def test_a_roll_call_port_in_use_is_refused_by_process_0():
    import socket

    from jaxfeed.sharding.job.roll_call import RollCall

    with socket.create_server(("", 0)) as busy:
        port = busy.getsockname()[1]
        with pytest.raises(ValueError, match=rf"port {port} \(the coordinator's port \+ 1"):
            RollCall(port, num_processes=2)


def test_the_roll_call_grants_each_id_once_while_its_holder_lives():
    from backend_helpers import free_port
    from jaxfeed.sharding.job.roll_call import RollCall, claim_id

    port = free_port()
    RollCall(port, num_processes=3)
    deadline = time.monotonic() + 10
    first = claim_id("127.0.0.1", port, 1, 3, deadline)
    with pytest.raises(ValueError, match=r"process 1 of the job .* is already running \(pid"):
        claim_id("127.0.0.1", port, 1, 3, deadline)
    with pytest.raises(
        ValueError, match=r"has 3 processes, this process was started with num_processes=4: "
    ):
        claim_id("127.0.0.1", port, 2, 4, deadline)
    first.close()  # its holder exits: the id is free again (once process 0 sees the EOF)
    while True:
        try:
            claim_id("127.0.0.1", port, 1, 3, deadline).close()
            break
        except ValueError:
            assert time.monotonic() < deadline, "the id was not freed"
            time.sleep(0.05)
