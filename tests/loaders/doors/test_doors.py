"""Each door's accessors on a real, small object of their framework.

A failure names the framework, its installed version and the door to update:
an upgrade moved or changed something jaxfeed reads there.
"""

from __future__ import annotations

import concurrent.futures
import importlib.metadata
import multiprocessing
import os
import platform
import subprocess
import sys
import threading

import numpy as np
import pytest
from jaxfeed.loaders._doors import grain as grain_door
from jaxfeed.loaders._doors import hf as hf_door
from jaxfeed.loaders._doors import jax as jax_door
from jaxfeed.loaders._doors import keras as keras_door
from jaxfeed.loaders._doors import multiprocessing as multiprocessing_door
from jaxfeed.loaders._doors import tf as tf_door
from jaxfeed.loaders._doors import torch as torch_door


def _version(package: str) -> str:
    if package == "python":
        return platform.python_version()
    return importlib.metadata.version(package)


def _where(door: str, package: str) -> str:
    return f"{package} {_version(package)}: see loaders/_doors/{door}.py"


def read(door: str, package: str, accessor, *args):
    """``accessor(*args)``; a failure names the framework, its version and the door."""
    try:
        return accessor(*args)
    except Exception as error:
        pytest.fail(f"{door}.{accessor.__name__} failed ({error!r}); {_where(door, package)}")


def expect(ok: bool, door: str, package: str, what: str) -> None:
    """Asserts ``ok``; the message names the framework, its version and the door."""
    assert ok, f"{what}; {_where(door, package)}"


# --- grain ---------------------------------------------------------------------------------


def test_grain_loader_reads_what_it_was_built_with():
    import grain

    source = [{"x": np.int32(i)} for i in range(4)]
    sampler = grain.samplers.IndexSampler(num_records=4, shuffle=True, seed=3, num_epochs=1)
    operations = [grain.transforms.Batch(batch_size=2)]
    loader = grain.DataLoader(data_source=source, sampler=sampler, operations=operations)
    expect(
        read("grain", "grain", grain_door.loader_sampler, loader) is sampler,
        "grain",
        "grain",
        "loader._sampler is not the sampler it was built with",
    )
    expect(
        read("grain", "grain", grain_door.loader_data_source, loader) is source,
        "grain",
        "grain",
        "loader._data_source is not the source it was built with",
    )
    got = list(read("grain", "grain", grain_door.loader_operations, loader))
    expect(
        len(got) == 1 and got[0] is operations[0],
        "grain",
        "grain",
        f"loader._operations is {got!r}, not the operations given",
    )


def test_grain_sampler_seed_and_shuffle():
    import grain

    shuffled = grain.samplers.IndexSampler(num_records=4, shuffle=True, seed=3, num_epochs=1)
    plain = grain.samplers.IndexSampler(num_records=4, shuffle=False, num_epochs=1)
    seed = read("grain", "grain", grain_door.sampler_seed, shuffled)
    expect(seed == 3, "grain", "grain", f"sampler._seed is {seed!r}, not the seed 3")
    unseeded = read("grain", "grain", grain_door.sampler_seed, plain)
    expect(unseeded is None, "grain", "grain", f"an unseeded sampler's _seed is {unseeded!r}")
    expect(
        read("grain", "grain", grain_door.sampler_shuffles, shuffled) is True
        and read("grain", "grain", grain_door.sampler_shuffles, plain) is False,
        "grain",
        "grain",
        "sampler._shuffle does not say whether it shuffles",
    )


def test_grain_batch_settings():
    import grain

    def batch_fn(rows):
        return rows

    rows = grain.MapDataset.source(list(range(5)))
    dataset = rows.batch(2, drop_remainder=True, batch_fn=batch_fn)
    expect(
        type(dataset).__name__ == "BatchMapDataset",
        "grain",
        "grain",
        f".batch() makes a {type(dataset).__name__}, not a BatchMapDataset",
    )
    got = read("grain", "grain", grain_door.batch_settings, dataset)
    expect(
        got == (2, True, batch_fn),
        "grain",
        "grain",
        f"BatchMapDataset's _batch_size, _drop_remainder, _batch_fn: {got!r}",
    )


def test_grain_iter_dataset_batch_size():
    import grain

    dataset = grain.MapDataset.source(list(range(5))).to_iter_dataset().batch(3)
    expect(
        type(dataset).__name__ == "BatchIterDataset",
        "grain",
        "grain",
        f".batch() makes a {type(dataset).__name__}, not a BatchIterDataset",
    )
    size = read("grain", "grain", grain_door.batch_size, dataset)
    expect(size == 3, "grain", "grain", f"BatchIterDataset._batch_size is {size!r}, not 3")


def test_grain_absl_flags_marked_parsed():
    from absl import flags

    read("grain", "grain", grain_door.mark_absl_flags_parsed)
    expect(flags.FLAGS.is_parsed(), "grain", "absl-py", "absl flags are still unparsed")


def test_grain_shared_memory_is_copied_out_and_unlinked_now():
    from grain.python import SharedMemoryArray

    array = SharedMemoryArray((4,), np.float32)
    array[:] = np.arange(4)
    array.unlink_on_del()  # as Grain's iterator marks a batch it received
    segment = f"/dev/shm/{array.shm.name.lstrip('/')}"
    expect(os.path.exists(segment), "grain", "grain", f"no segment {segment}")
    copy = read("grain", "grain", grain_door.out_of_shared_memory, array)
    expect(
        type(copy) is np.ndarray and list(copy) == [0, 1, 2, 3],
        "grain",
        "grain",
        f"out_of_shared_memory gave {copy!r}",
    )
    expect(not os.path.exists(segment), "grain", "grain", f"{segment} is still linked")
    expect(
        array._unlink_on_del is False,
        "grain",
        "grain",
        "SharedMemoryArray._unlink_on_del is not what marks the array to unlink its segment",
    )
    del array  # its __del__ only closes the mapping now
    plain = np.arange(3)
    expect(grain_door.out_of_shared_memory(plain) is plain, "grain", "grain", "copied a plain leaf")


# --- tf.data and TFDS ----------------------------------------------------------------------


def test_tf_imports_quietly():
    tf = read("tf", "tensorflow", tf_door.import_tensorflow)
    expect(hasattr(tf, "data"), "tf", "tensorflow", "import_tensorflow gave no tf.data")
    tfds = read("tf", "tensorflow-datasets", tf_door.import_tfds)
    expect(
        hasattr(tfds, "features") and hasattr(tfds, "builder_from_directory"),
        "tf",
        "tensorflow-datasets",
        "import_tfds gave no tfds.features / builder_from_directory",
    )


def test_tf_autograph_files_go_to_an_owned_directory():
    read("tf", "tensorflow", tf_door.import_tensorflow)
    from tensorflow.python.autograph.pyct import loader

    _, path = read("tf", "tensorflow", loader.load_source, "x = 1\n", True)
    expect(
        os.path.basename(os.path.dirname(path)).startswith(tf_door.AUTOGRAPH_PREFIX),
        "tf",
        "tensorflow",
        f"autograph wrote {path}, not in a {tf_door.AUTOGRAPH_PREFIX}* directory",
    )


def test_tfds_gcs_lookups_switched_off_inside_the_block(monkeypatch):
    tfds = read("tf", "tensorflow-datasets", tf_door.import_tfds)
    gcs_utils = tfds.core.utils.gcs_utils
    expect(
        hasattr(gcs_utils, "_is_gcs_disabled"),
        "tf",
        "tensorflow-datasets",
        "tfds.core.utils.gcs_utils has no _is_gcs_disabled",
    )
    monkeypatch.setattr(gcs_utils, "_is_gcs_disabled", False)
    with tf_door.no_gcs_lookups(tfds):
        inside = gcs_utils._is_gcs_disabled
    expect(
        inside is True and gcs_utils._is_gcs_disabled is False,
        "tf",
        "tensorflow-datasets",
        f"_is_gcs_disabled was {inside!r} inside the block, {gcs_utils._is_gcs_disabled!r} after",
    )


def test_quiet_stderr_replays_only_on_failure(capfd):
    with tf_door.quiet_stderr():
        os.write(2, b"start-up noise\n")
    assert "start-up noise" not in capfd.readouterr().err
    with pytest.raises(RuntimeError, match="boom"), tf_door.quiet_stderr():
        os.write(2, b"why it failed\n")
        raise RuntimeError("boom")
    assert "why it failed" in capfd.readouterr().err


def test_tf_pipeline_inputs():
    tf = tf_door.import_tensorflow()
    source = tf.data.Dataset.range(8)
    mapped = source.shuffle(4, seed=1).map(lambda x: x)
    (shuffle,) = read("tf", "tensorflow", tf_door.pipeline_inputs, mapped)
    (below,) = read("tf", "tensorflow", tf_door.pipeline_inputs, shuffle)
    expect(
        type(shuffle).__name__ == "_ShuffleDataset" and type(below).__name__ == "_RangeDataset",
        "tf",
        "tensorflow",
        f"a pipeline's _inputs() lead to {shuffle!r}, {below!r}",
    )
    got = read("tf", "tensorflow", tf_door.pipeline_inputs, below)
    expect(got == [], "tf", "tensorflow", f"a source's _inputs() are {got!r}, not []")


def test_tf_shuffle_seeds():
    tf = tf_door.import_tensorflow()
    source = tf.data.Dataset.range(8)
    seeded = read("tf", "tensorflow", tf_door.shuffle_seeds, source.shuffle(4, seed=5))
    expect(
        all(s is not None for s in seeded) and any(int(s) != 0 for s in seeded),
        "tf",
        "tensorflow",
        f"a seeded shuffle's (_seed, _seed2) are {seeded!r}",
    )
    if _no_global_seed():
        unseeded = read("tf", "tensorflow", tf_door.shuffle_seeds, source.shuffle(4))
        expect(
            all(s is not None and int(s) == 0 for s in unseeded),
            "tf",
            "tensorflow",
            f"an unseeded shuffle's (_seed, _seed2) are {unseeded!r}, not 0s",
        )
    got = read("tf", "tensorflow", tf_door.shuffle_seeds, source)
    expect(got == (None, None), "tf", "tensorflow", f"a range's seeds are {got!r}")


def _no_global_seed() -> bool:
    # A global seed (tf.random.set_seed) gives every op a seed.
    from tensorflow.python.framework import random_seed

    return random_seed.get_seed(None) == (None, None)


def test_tf_reshuffles_each_iteration():
    tf = tf_door.import_tensorflow()
    source = tf.data.Dataset.range(8)
    again = source.shuffle(4, seed=1, reshuffle_each_iteration=True)
    once = source.shuffle(4, seed=1, reshuffle_each_iteration=False)
    expect(
        read("tf", "tensorflow", tf_door.reshuffles_each_iteration, again) is True,
        "tf",
        "tensorflow",
        f"a reshuffling {type(again).__name__} does not say so",
    )
    expect(
        read("tf", "tensorflow", tf_door.reshuffles_each_iteration, once) is False
        and read("tf", "tensorflow", tf_door.reshuffles_each_iteration, source) is False,
        "tf",
        "tensorflow",
        "a shuffle without reshuffling, or no shuffle, says it reshuffles",
    )


def _same(x):
    return x


def test_tf_step_class_names():
    tf = tf_door.import_tensorflow()
    rows = tf.data.Dataset.range(8)
    missing = tf.data.TFRecordDataset(["never-read"])  # built, not read
    steps = {
        tf_door.BATCHING: [
            rows.batch(2),
            rows.padded_batch(2),
            rows.batch(2, num_parallel_calls=2),
            rows.batch(4).rebatch(2),
            rows.bucket_by_sequence_length(lambda x: tf.cast(x, tf.int32), [3], [2, 2]),
        ],
        tf_door.ROWS: [
            tf.data.Dataset.from_tensor_slices([1, 2]),
            rows,
            missing,
            tf.data.TextLineDataset(["never-read"]),
            tf.data.FixedLengthRecordDataset(["never-read"], 4),
            rows.batch(2).unbatch(),
        ],
        tf_door.NESTED: [
            rows.flat_map(lambda x: rows),
            rows.interleave(lambda x: rows),
            rows.interleave(lambda x: rows, num_parallel_calls=2),
        ],
        tf_door.PASS_THROUGH: [
            rows.map(_same),
            rows.filter(lambda x: True),
            rows.with_options(tf.data.Options()),
            rows.shard(2, 0),
            rows.take(2),
            rows.skip(2),
        ],
        frozenset({tf_door.REPEAT}): [rows.repeat()],
        frozenset({tf_door.RANDOM}): [tf.data.Dataset.random(seed=1)],
        frozenset({tf_door.MIX}): [
            tf.data.Dataset.sample_from_datasets([rows, rows], seed=1),
            tf.data.Dataset.choose_from_datasets([rows, rows], rows.map(lambda x: x % 2)),
        ],
    }
    for names, datasets in steps.items():
        for dataset in datasets:
            name = type(dataset).__name__
            expect(
                name in names,
                "tf",
                "tensorflow",
                f"tf.data step class {name} is not among those the door expects: {sorted(names)}",
            )


def test_tf_unseeded_in_graph():
    tf = tf_door.import_tensorflow()
    rows = tf.data.Dataset.range(8)

    def choice(seed):  # choose_from_datasets hides its choice behind an opaque dataset
        picks = tf.data.Dataset.random(seed=seed).map(lambda x: x % 2)
        mixed = tf.data.Dataset.choose_from_datasets([rows, rows], picks)
        hidden = tf_door.pipeline_inputs(mixed)[0]
        name = type(hidden).__name__
        expect(name == tf_door.OPAQUE, "tf", "tensorflow", f"the choice's step is {name}")
        return hidden

    got = read("tf", "tensorflow", tf_door.unseeded_in_graph, choice(3))
    expect(got is False, "tf", "tensorflow", "a seeded Dataset.random() reads as unseeded")
    got = read("tf", "tensorflow", tf_door.unseeded_in_graph, rows.shuffle(4, seed=2))
    expect(got is False, "tf", "tensorflow", "a seeded .shuffle() reads as unseeded")
    if _no_global_seed():
        got = read("tf", "tensorflow", tf_door.unseeded_in_graph, choice(None))
        expect(got is True, "tf", "tensorflow", "an unseeded Dataset.random() reads as seeded")
        got = read("tf", "tensorflow", tf_door.unseeded_in_graph, rows.shuffle(4))
        expect(got is True, "tf", "tensorflow", "an unseeded .shuffle() reads as seeded")


# --- Hugging Face datasets -----------------------------------------------------------------


def test_hf_indices_mapping():
    import datasets

    table = datasets.Dataset.from_dict({"x": list(range(6))})
    got = read("hf", "datasets", hf_door.indices_mapping, table)
    expect(got is None, "hf", "datasets", f"a table in storage order has _indices {got!r}")
    shuffled = read("hf", "datasets", hf_door.indices_mapping, table.shuffle(seed=0))
    order = None if shuffled is None else sorted(shuffled.column(0).to_pylist())
    expect(
        order == list(range(6)),
        "hf",
        "datasets",
        f"a shuffled table's _indices are {shuffled!r}, not its row order",
    )


def test_hf_examples_iterable():
    import datasets

    stream = datasets.Dataset.from_dict({"x": list(range(6))}).to_iterable_dataset()
    first = read("hf", "datasets", hf_door.examples_iterable, stream)
    expect(first is not None, "hf", "datasets", "an IterableDataset has no _ex_iterable")
    buffered = stream.shuffle(seed=0, buffer_size=2)
    shuffled = read("hf", "datasets", hf_door.examples_iterable, buffered)
    expect(
        type(shuffled).__name__ == "BufferShuffledExamplesIterable",
        "hf",
        "datasets",
        f"a buffer-shuffled stream's _ex_iterable is a {type(shuffled).__name__}",
    )
    expect(hf_door.examples_iterable(object()) is None, "hf", "datasets", "no chain is not None")


def test_hf_row_reader_reads_what_getitem_reads():
    import datasets

    images = np.arange(12 * 4, dtype=np.uint8).reshape(12, 2, 2)
    table = datasets.Dataset.from_dict(
        {"image": images, "label": np.arange(12), "name": list("abcdefghijkl")}
    )
    as_numpy = table.with_format("numpy", dtype=None)
    cases = {
        "storage order": as_numpy,
        "shuffled": as_numpy.shuffle(seed=0),
        "a contiguous select": as_numpy.select(range(3, 11)),
        "a gathering select": as_numpy.select([5, 1, 7, 2, 9, 0]),
        "two columns": table.with_format("numpy", columns=["label", "image"], dtype=None),
        "two columns, all output": table.with_format(
            "numpy", columns=["label"], output_all_columns=True
        ),
        "python": table,
        "a transform": table.with_transform(lambda b: {"twice": [2 * x for x in b["label"]]}),
    }
    for what, dataset in cases.items():
        reader = read("hf", "datasets", hf_door.row_reader, dataset)
        for rows in (slice(0, 4), slice(2, 6), [4, 0, 3], [1]):
            got, want = reader(rows), dataset[rows]
            same = got.keys() == want.keys() and all(
                np.array_equal(np.asarray(got[k]), np.asarray(want[k]))
                and np.asarray(got[k]).dtype == np.asarray(want[k]).dtype
                for k in want
            )
            expect(same, "hf", "datasets", f"{what}: row_reader(rows={rows}) != dataset[rows]")


# --- torch ---------------------------------------------------------------------------------


def test_torch_default_collate_registry():
    from torch.utils.data._utils import collate

    expect(
        read("torch", "torch", torch_door.default_collate_is_torchs),
        "torch",
        "torch",
        "default_collate_fn_map is not the registry torch ships",
    )
    added = dict(collate.default_collate_fn_map)
    collate.default_collate_fn_map[complex] = collate.collate_float_fn
    try:
        expect(not torch_door.default_collate_is_torchs(), "torch", "torch", "an extension unseen")
    finally:
        collate.default_collate_fn_map.clear()
        collate.default_collate_fn_map.update(added)


@pytest.mark.slow
def test_torch_loader_workers():
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    dataset = TensorDataset(torch.arange(8))
    alone = iter(DataLoader(dataset, batch_size=4))
    got = read("torch", "torch", torch_door.loader_workers, alone)
    expect(got == [], "torch", "torch", f"a loader without workers has workers {got!r}")
    loader = DataLoader(dataset, batch_size=4, num_workers=1, multiprocessing_context="spawn")
    batches = iter(loader)
    try:
        workers = read("torch", "torch", torch_door.loader_workers, batches)
        expect(
            len(workers) == 1 and isinstance(workers[0], multiprocessing.process.BaseProcess),
            "torch",
            "torch",
            f"a one-worker iterator's _workers are {workers!r}",
        )
    finally:
        for _ in batches:  # read to the end: the loader stops its worker
            pass


# --- the standard library's process pools -----------------------------------------------


@pytest.mark.slow
def test_process_pool_processes():
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
        pid = pool.submit(os.getpid).result()
        workers = read("multiprocessing", "python", multiprocessing_door.pool_processes, pool)
        expect(
            [worker.pid for worker in workers] == [pid],
            "multiprocessing",
            "python",
            f"a pool's _processes are {workers!r}, not its worker",
        )


def test_a_process_target():
    process = multiprocessing.get_context("spawn").Process(target=os.getpid)
    got = read("multiprocessing", "python", multiprocessing_door.process_target, process)
    expect(got is os.getpid, "multiprocessing", "python", f"a process's _target is {got!r}")


def test_spawn_launches_through_the_hook(monkeypatch):
    from multiprocessing import popen_spawn_posix

    monkeypatch.setattr(popen_spawn_posix.Popen, "_launch", popen_spawn_posix.Popen._launch)
    launched = []

    def around(process, launch):
        launched.append(process)
        launch()

    read("multiprocessing", "python", multiprocessing_door.around_spawn_launch, around)
    process = multiprocessing.get_context("spawn").Process(target=os.getpid)
    process.start()
    process.join(timeout=120)
    expect(
        launched == [process] and process.exitcode == 0,
        "multiprocessing",
        "python",
        f"spawn's Popen._launch saw {launched!r}; the child's exit code {process.exitcode}",
    )


def test_a_spawn_without_its_launch_is_named(monkeypatch):
    from multiprocessing import popen_spawn_posix

    monkeypatch.delattr(popen_spawn_posix.Popen, "_launch")
    with pytest.raises(RuntimeError, match=r"spawn has no Popen\._launch.*_doors/multipro"):
        multiprocessing_door.around_spawn_launch(lambda process, launch: launch())


def test_spawn_forks_through_the_hook(monkeypatch):
    from multiprocessing import util

    monkeypatch.setattr(util, "spawnv_passfds", util.spawnv_passfds)
    forked = []

    def around(fork):
        pid = fork()
        forked.append((threading.current_thread(), pid))
        return pid

    read("multiprocessing", "python", multiprocessing_door.around_spawn_fork, around)
    process = multiprocessing.get_context("spawn").Process(target=os.getpid)
    process.start()
    process.join(timeout=120)
    # (The launch may also start the resource tracker, through the same fork.)
    expect(
        (threading.current_thread(), process.pid) in forked and process.exitcode == 0,
        "multiprocessing",
        "python",
        f"spawn's util.spawnv_passfds forked {forked!r}, not pid {process.pid} in this thread; "
        f"the child's exit code {process.exitcode}",
    )


def test_spawn_leaves_out_the_main_module_when_asked(monkeypatch):
    from multiprocessing import spawn

    monkeypatch.setattr(spawn, "get_preparation_data", spawn.get_preparation_data)
    whole = spawn.get_preparation_data("child")
    main = {"init_main_from_name", "init_main_from_path"}
    expect(
        len(main & whole.keys()) == 1,
        "multiprocessing",
        "python",
        f"spawn's preparation data names the main module in none of {sorted(main)}: "
        f"{sorted(whole)}",
    )
    asked = []

    def skip():
        asked.append(threading.current_thread())
        return len(asked) > 1  # the first call keeps it

    read("multiprocessing", "python", multiprocessing_door.spawn_without_main_when, skip)
    kept, left_out = spawn.get_preparation_data("child"), spawn.get_preparation_data("child")
    expect(
        kept == whole and left_out == {k: v for k, v in whole.items() if k not in main},
        "multiprocessing",
        "python",
        f"the preparation data's keys, with the main module kept: {sorted(kept)}; "
        f"left out: {sorted(left_out)}",
    )
    process = multiprocessing.get_context("spawn").Process(target=os.getpid)
    process.start()
    process.join(timeout=120)
    expect(
        asked[2:] == [threading.current_thread()] and process.exitcode == 0,
        "multiprocessing",
        "python",
        f"spawn's launch asked {asked[2:]!r} through get_preparation_data; "
        f"the child's exit code {process.exitcode}",
    )


def _note(path: str, line: str) -> None:
    with open(path, "a") as note:
        note.write(line + "\n")


class _Noted(multiprocessing_door.AroundBootstrap, multiprocessing.context.SpawnProcess):
    note = ""  # the path to note in

    def around_bootstrap(self, bootstrap):  # in the child
        _note(self.note, "before")
        _note(self.note, f"after {bootstrap()}")
        return 7


def test_a_child_runs_inside_around_bootstrap(tmp_path):
    path = tmp_path / "note"
    process = _Noted(target=_note, args=(str(path), "run"))
    process.note = str(path)  # (sent with the process)
    process.start()
    process.join(timeout=120)
    noted = path.read_text() if path.exists() else ""
    expect(
        noted == "before\nrun\nafter 0\n" and process.exitcode == 7,
        "multiprocessing",
        "python",
        f"a child of an AroundBootstrap class noted {noted!r} and exited with "
        f"{process.exitcode}, not 7: BaseProcess._bootstrap is no longer where it runs",
    )


def test_shared_memory_names(monkeypatch):
    from multiprocessing import shared_memory

    monkeypatch.setattr(shared_memory, "_make_filename", shared_memory._make_filename)
    read("multiprocessing", "python", multiprocessing_door.name_shared_memory, "psm_jaxfeed-test-")
    segment = shared_memory.SharedMemory(create=True, size=8)
    try:
        expect(
            segment.name.startswith("psm_jaxfeed-test-"),
            "multiprocessing",
            "python",
            f"a new segment is named {segment.name!r}",
        )
    finally:
        segment.close()
        segment.unlink()


def test_exit_hooks_run_before_an_immediate_exit():
    script = (
        "import atexit, os\n"
        "atexit.register(print, 'hook ran', flush=True)\n"
        "from jaxfeed.loaders._doors.multiprocessing import run_exit_hooks\n"
        "run_exit_hooks()\n"
        "os._exit(0)\n"
    )
    command = [sys.executable, "-c", script]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    expect(
        done.returncode == 0 and done.stdout == "hook ran\n",
        "multiprocessing",
        "python",
        f"run_exit_hooks then os._exit gave {done.returncode}, {done.stdout!r}, {done.stderr!r}",
    )


# --- JAX -----------------------------------------------------------------------------------


def test_jax_distributed_state():
    state = read("jax", "jax", jax_door.distributed_state)
    expect(
        all(hasattr(state, name) for name in ("client", "process_id", "num_processes")),
        "jax",
        "jax",
        f"jax._src.distributed.global_state is {state!r}, without those fields",
    )
    expect(state.client is None, "jax", "jax", "a process that joined no job has a client")


# --- Keras ---------------------------------------------------------------------------------


def test_keras_compiled_metrics():
    import keras  # any backend: what compile keeps is the same

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(loss="mse", metrics=["accuracy"], weighted_metrics=["mae"])
    metrics = read("keras", "keras", keras_door.compiled_metrics, model)
    expect(
        metrics == (["accuracy"], ["mae"]),
        "keras",
        "keras",
        f"a compiled model's _compile_config.config gives {metrics!r}",
    )
