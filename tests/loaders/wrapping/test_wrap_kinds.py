"""`wrap` of random-access objects: the shared sampler's order, per kind.

One table of kinds drives the contract (byte-identical to `make` and to a
reference built from `Sampler.epoch_plan`, a new order each epoch, an exact
``start`` that reads nothing skipped, a padded and masked last batch); the
tests after it cover what ``shuffle=None`` means per kind, the user's own
collate and augmentations, torch workers, and endless streams.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from backend_helpers import assert_same_batches
from jaxfeed.loaders._doors.tf import import_tensorflow
from jaxfeed.loaders.sampler import Sampler
from wrap_worker import ArraysDataset, B, N, Records, make_arrays

from jaxfeed import loaders

SEED = 3
TESTS = Path(__file__).resolve().parents[2]  # tests/


@pytest.fixture(scope="module")
def arrays():
    return make_arrays()


def reference(arrays, epoch, start=0, *, shuffle=True, drop=False, seed=SEED, index=0, count=1):
    """The batches `make` gives: rows of the sampler's plan, padding rows
    zeroed and masked, int64 as JAX's int32."""
    sampler = Sampler(N, B, seed, shuffle, drop, index, count)
    out = []
    for indices, valid in sampler.epoch_plan(epoch, start):
        batch = {}
        for key, array in arrays.items():
            rows = array[indices].astype(np.int32 if array.dtype == np.int64 else array.dtype)
            rows[valid:] = 0
            batch[key] = rows
        if not drop:
            batch["mask"] = np.arange(B) < valid
        out.append(batch)
    return out


def plan_rows(epoch, start, shuffle=True):
    """The rows of the epoch's batches from ``start`` on: each once, no padding row."""
    sampler = Sampler(N, B, SEED, shuffle)
    plan = sampler.epoch_plan(epoch, start)
    return sorted(np.concatenate([i[:valid] for i, valid in plan]).tolist())


def labels(source, epoch, **kwargs):
    return np.concatenate([b["label"][b["mask"]] for b in source.iter_epoch(epoch, **kwargs)])


# Each factory returns (object, wrap options, the list its reads are recorded in).
def _torch_dataset(arrays):
    dataset = ArraysDataset(arrays)
    return dataset, {"batch_size": B}, dataset.reads


def _torch_loader(arrays):
    from torch.utils.data import DataLoader

    dataset = ArraysDataset(arrays)
    return DataLoader(dataset, batch_size=B, shuffle=True), {}, dataset.reads


def _grain_rows(arrays):
    import grain

    source = Records(arrays)
    return grain.MapDataset.source(source), source.reads


def _grain_map(arrays):
    rows, reads = _grain_rows(arrays)
    return rows, {"batch_size": B}, reads


def _grain_map_batched(arrays):
    rows, reads = _grain_rows(arrays)
    return rows.batch(B), {}, reads


def _grain_loader(arrays):
    import grain

    source = Records(arrays)
    sampler = grain.samplers.IndexSampler(
        N, shard_options=grain.sharding.NoSharding(), shuffle=False, num_epochs=1, seed=1
    )
    batch = [grain.transforms.Batch(B)]
    return grain.DataLoader(data_source=source, sampler=sampler, operations=batch), {}, source.reads


def _hf_dataset(arrays, monkeypatch):
    import datasets

    reads = []
    format_table = datasets.formatting.format_table  # (what wrap formats each batch with)

    def recording(table, key, **kwargs):
        reads.extend(range(key.start, key.stop) if isinstance(key, slice) else map(int, key))
        return format_table(table, key, **kwargs)

    monkeypatch.setattr(datasets.formatting, "format_table", recording)
    return datasets.Dataset.from_dict(arrays), {"batch_size": B}, reads


@pytest.fixture(scope="module")
def tfds_source_dir(tmp_path_factory, arrays):
    """The arrays stored as a TFDS dataset in array_record format."""
    from jaxfeed.loaders._doors.tf import import_tfds
    from jaxfeed.loaders.backends.tfds_store import quiet_build

    tfds = import_tfds()
    features = tfds.features.FeaturesDict(
        {
            "x": tfds.features.Tensor(shape=(3, 8, 8), dtype=np.float32),
            "label": tfds.features.Scalar(dtype=np.int64),
            "meta": tfds.features.Tensor(shape=(4,), dtype=np.float32),
        }
    )
    root = tmp_path_factory.mktemp("tfds")
    examples = ((i, {k: v[i] for k, v in arrays.items()}) for i in range(N))
    with quiet_build():
        tfds.dataset_builders.store_as_tfds_dataset(
            name="wrap_arrays",
            version="1.0.0",
            features=features,
            split_datasets={"train": examples},
            data_dir=root,
            file_format="array_record",
            disable_shuffling=True,
        )
    return root / "wrap_arrays" / "1.0.0"


def _tfds_source(tfds_source_dir, monkeypatch):
    from jaxfeed.loaders._doors.tf import import_tfds

    source = import_tfds().builder_from_directory(tfds_source_dir).as_data_source("train")
    reads = []
    getitems = type(source).__getitems__

    def recording(self, keys):
        reads.extend(keys)
        return getitems(self, keys)

    monkeypatch.setattr(type(source), "__getitems__", recording)
    return source, {"batch_size": B}, reads


KINDS = {
    "torch-dataset": _torch_dataset,
    "torch-loader": _torch_loader,
    "grain-map": _grain_map,
    "grain-map-batched": _grain_map_batched,
    "grain-loader": _grain_loader,
    "hf-dataset": _hf_dataset,
    "tfds-source": _tfds_source,
}


@pytest.fixture
def make_kind(arrays, monkeypatch, request):
    def make(kind):
        if kind == "hf-dataset":
            return _hf_dataset(arrays, monkeypatch)
        if kind == "tfds-source":
            return _tfds_source(request.getfixturevalue("tfds_source_dir"), monkeypatch)
        return KINDS[kind](arrays)

    return make


@pytest.mark.parametrize("kind", KINDS)
def test_random_access_kinds_read_in_the_shared_order(kind, make_kind, arrays):
    obj, options, reads = make_kind(kind)
    source = loaders.wrap(obj, seed=SEED, shuffle=True, **options)
    assert source.num_batches == 7 and source.batch_size == B
    epochs = [list(source.iter_epoch(epoch)) for epoch in (0, 1)]
    for epoch, batches in enumerate(epochs):
        assert_same_batches(batches, reference(arrays, epoch))
    # A new order each epoch, every row once.
    orders = [np.concatenate([b["label"][b["mask"]] for b in batches]) for batches in epochs]
    assert sorted(orders[0]) == sorted(orders[1]) == list(range(N))
    assert not np.array_equal(orders[0], orders[1])
    # The last batch is padded: 4 real rows, 12 zeroed and masked.
    assert epochs[0][-1]["mask"].sum() == N - 6 * B
    # Byte-identical to make() over the same arrays.
    made = loaders.make("numpy", dataset=arrays, batch_size=B, seed=SEED, shuffle=True)
    assert_same_batches(epochs[1], list(made.iter_epoch(1)))
    # An exact start reads only the rows of the batches it yields.
    reads.clear()
    resumed = list(source.iter_epoch(1, start=5))
    assert_same_batches(resumed, epochs[1][5:])
    assert sorted(reads) == plan_rows(1, 5)


def test_an_hf_dataset_gives_every_row_of_batches_whose_last_index_breaks_the_run():
    import datasets

    # Batches of 2: a shuffled pair [3, 7] is a run of one then one other row;
    # an unshuffled last batch [8, 9, pad...] is a run then padding. Each must
    # be read as its own rows (a run-then-tail shortcut once repeated row 3).
    rows = {"x": np.arange(10, dtype=np.int32)}
    for shuffle, batch_size in ((True, 2), (False, 4)):
        source = loaders.wrap(
            datasets.Dataset.from_dict(rows), batch_size=batch_size, seed=SEED, shuffle=shuffle
        )
        made = loaders.make(
            "numpy", dataset=rows, batch_size=batch_size, seed=SEED, shuffle=shuffle
        )
        for epoch in (0, 1):
            assert_same_batches(list(source.iter_epoch(epoch)), list(made.iter_epoch(epoch)))


@pytest.mark.parametrize("kind", KINDS)
def test_random_access_kinds_drop_remainder(kind, make_kind, arrays):
    obj, options, _ = make_kind(kind)
    source = loaders.wrap(obj, seed=SEED, shuffle=True, drop_remainder=True, **options)
    assert source.num_batches == 6
    assert_same_batches(list(source.iter_epoch(2)), reference(arrays, 2, drop=True))


def test_what_shuffle_none_means_per_kind(arrays, make_kind):
    import grain
    import torch.utils.data as torch_data

    in_order = list(range(N))

    def order(obj, epoch=0, **options):
        return labels(loaders.wrap(obj, seed=SEED, **options), epoch).tolist()

    # No order of their own: dataset order (shuffle=True shuffles them).
    for kind in ("torch-dataset", "grain-map", "grain-map-batched", "hf-dataset", "tfds-source"):
        obj, options, _ = make_kind(kind)
        assert order(obj, **options) == in_order, kind
        assert order(obj, shuffle=True, **options) == labels_of(reference(arrays, 0)), kind
    # A DataLoader keeps its own meaning, now seeded per epoch; shuffle= overrides it.
    dataset = ArraysDataset(arrays)
    shuffled = torch_data.DataLoader(dataset, batch_size=B, shuffle=True)
    assert order(shuffled) == labels_of(reference(arrays, 0))
    assert order(shuffled, 1) == labels_of(reference(arrays, 1))
    assert order(shuffled, shuffle=False) == in_order
    assert order(torch_data.DataLoader(dataset, batch_size=B)) == in_order
    # Grain and HF objects shuffled by their own tool are shuffled anew each epoch.
    rows, _ = _grain_rows(arrays)
    hf, _, _ = make_kind("hf-dataset")
    for obj, options in (
        (rows.shuffle(seed=0).batch(B), {}),
        (hf.shuffle(seed=0), {"batch_size": B}),
    ):
        first, second = order(obj, 0, **options), order(obj, 1, **options)
        assert sorted(first) == sorted(second) == in_order
        assert first != second and first != in_order
        assert order(obj, 0, **options) == first  # reproducible
    sampler = grain.samplers.IndexSampler(
        N, shard_options=grain.sharding.NoSharding(), shuffle=True, num_epochs=1, seed=1
    )
    loader = grain.DataLoader(
        data_source=Records(arrays), sampler=sampler, operations=[grain.transforms.Batch(B)]
    )
    assert order(loader) == labels_of(reference(arrays, 0))


def labels_of(batches):
    return np.concatenate([b["label"][b["mask"]] for b in batches]).tolist()


def test_the_users_collate_fn_still_runs(arrays):
    from torch.utils.data import DataLoader, default_collate

    def collate(rows):
        batch = default_collate(rows)
        batch["rows"] = np.full(len(rows), len(rows), np.int32)
        return batch

    for obj, options in (
        (DataLoader(ArraysDataset(arrays), batch_size=B, collate_fn=collate), {}),
        (ArraysDataset(arrays), {"batch_size": B, "collate_fn": collate}),
    ):
        batches = list(loaders.wrap(obj, **options).iter_epoch(0))
        assert set(batches[0]) == {"x", "label", "meta", "rows", "mask"}
        # The short last batch is collated from its own 4 rows, then padded and masked.
        assert batches[-2]["rows"].tolist() == [B] * B
        assert batches[-1]["rows"].tolist() == [4] * 4 + [0] * (B - 4)


def test_grain_random_map_draws_anew_each_epoch_and_the_same_on_a_rerun(arrays):
    rows, _ = _grain_rows(arrays)

    def dataset():
        return rows.random_map(lambda row, rng: {**row, "noise": rng.random(2)}, seed=7).batch(B)

    def noise(source, epoch):
        batches = list(source.iter_epoch(epoch))
        by_row = {}
        for batch in batches:
            for label, value in zip(batch["label"][batch["mask"]], batch["noise"], strict=False):
                by_row[int(label)] = value.tolist()
        return by_row

    source = loaders.wrap(dataset(), seed=SEED, shuffle=True)
    first, second = noise(source, 0), noise(source, 1)
    assert sorted(first) == sorted(second) == list(range(N))
    assert all(first[r] != second[r] for r in range(N))  # each row drawn anew
    assert noise(source, 0) == first
    assert noise(loaders.wrap(dataset(), seed=SEED, shuffle=True), 0) == first
    # The draws belong to the row, not to where the order puts it.
    assert noise(loaders.wrap(dataset(), seed=SEED + 1, shuffle=True), 0) == first


def test_unbatched_grain_map_dataset_batches_with_batch_size(arrays):
    rows, _ = _grain_rows(arrays)
    source = loaders.wrap(rows, batch_size=B)
    assert source.num_batches == 7
    assert_same_batches(list(source.iter_epoch(0)), reference(arrays, 0, shuffle=False))
    with pytest.raises(ValueError, match=r"grain.MapDataset yields single rows; pass batch_size="):
        loaders.wrap(rows)
    with pytest.raises(ValueError, match=r"grain.MapDataset yields batches of 16 but batch_size=8"):
        loaders.wrap(rows.batch(B), batch_size=8)


def test_torch_loader_with_two_workers_is_spawned_and_keeps_the_order(arrays):
    from torch.utils.data import DataLoader

    loader = DataLoader(
        ArraysDataset(arrays), batch_size=B, shuffle=True, num_workers=2, persistent_workers=True
    )
    source = loaders.wrap(loader, seed=SEED)
    for epoch in (0, 1):
        assert_same_batches(list(source.iter_epoch(epoch)), reference(arrays, epoch))
    assert_same_batches(list(source.iter_epoch(1, start=4)), reference(arrays, 1, 4))


def test_a_spawned_loaders_workers_start_once_without_the_scripts_imports(tmp_path, arrays):
    # In a script of its own: pytest's __main__ is not a training script's.
    done = subprocess.run(
        [sys.executable, str(TESTS / "wrap_worker.py"), "spawn", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "PYTHONPATH": str(TESTS.parent)},
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    notes = [json.loads(p.read_text()) for p in tmp_path.glob("worker-*.json")]
    # Two workers, each started (and initialised) once, alive through 3 epochs.
    assert len(notes) == 2, notes
    assert report["pids"] == [sorted(note["pid"] for note in notes)] * 3
    assert done.stderr.count("jaxfeed: starting 2 torch workers (spawn): ") == 1, done.stderr
    # The script imported JAX; its workers did not run it again.
    assert "jax" in report["imported"] and [note["imported"] for note in notes] == [[], []]
    numpy = loaders.make("numpy", dataset=arrays, batch_size=B, seed=SEED)
    for epoch in range(3):
        with np.load(tmp_path / f"epoch-{epoch}.npz") as saved:
            batches = [{} for _ in range(1 + max(int(n.split("-")[0]) for n in saved.files))]
            for name in saved.files:
                index, key = name.split("-", 1)
                batches[int(index)][key] = saved[name]
        assert_same_batches(batches, reference(arrays, epoch))
        assert_same_batches(batches, list(numpy.iter_epoch(epoch)))


def test_a_spawned_loader_with_its_own_sampler_resumes_exactly(arrays):
    import torch
    from torch.utils.data import DataLoader, WeightedRandomSampler

    def wrapped():  # a stream: its own sampler's order, read through torchdata
        generator = torch.Generator().manual_seed(0)
        sampler = WeightedRandomSampler(torch.ones(N), N, generator=generator)
        return loaders.wrap(
            DataLoader(
                ArraysDataset(arrays),
                batch_size=B,
                sampler=sampler,
                num_workers=2,
                multiprocessing_context="spawn",
            )
        )

    source = wrapped()
    list(source.iter_epoch(0))
    batches = source.iter_epoch(1)
    head = [next(batches)["label"] for _ in range(3)]
    state = source.data_state(1, 3)
    rest = [b["label"] for b in batches]
    assert len(head) + len(rest) == 7
    resumed = wrapped()
    resumed.restore_data_state(state)
    np.testing.assert_array_equal([b["label"] for b in resumed.iter_epoch(1, start=3)], rest)


def _fork_report(*args):
    done = subprocess.run(
        [sys.executable, str(TESTS / "wrap_worker.py"), "fork", *args],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "PYTHONPATH": str(TESTS.parent)},
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), done.stderr


def test_forked_torch_workers_are_switched_to_spawn_without_jax_fork_warning():
    bare, _ = _fork_report("bare")
    assert any("os.fork() was called" in w for w in bare["warnings"])  # the test can fail
    wrapped, stderr = _fork_report()
    assert wrapped["labels"] == list(range(N))
    assert wrapped["warnings"] == [] and "os.fork()" not in stderr


def test_workers_that_cannot_be_spawned_get_one_warning_with_the_fix(arrays):
    from torch.utils.data import DataLoader

    class Local(ArraysDataset):  # a local class does not pickle
        pass

    def wrap_without_reading(loader):
        # The warning comes first; batch_size=8 then stops wrap before it reads
        # a batch, so no worker is forked in this JAX process.
        with pytest.raises(ValueError, match="yields batches of 16 but batch_size=8"):
            loaders.wrap(loader, batch_size=8)

    loader = DataLoader(Local(arrays), batch_size=B, num_workers=2)
    match = r"wrapped DataLoader starts its 2 workers with fork.* its dataset does not pickle"
    with pytest.warns(RuntimeWarning, match=match) as caught:
        wrap_without_reading(loader)
    assert len(caught) == 1
    assert "multiprocessing_context='spawn' and a picklable dataset" in str(caught[0].message)
    explicit = DataLoader(ArraysDataset(arrays), batch_size=B, num_workers=2)
    explicit.multiprocessing_context = "fork"
    with pytest.warns(RuntimeWarning, match=r"it was built with multiprocessing_context='fork'"):
        wrap_without_reading(explicit)


def test_loader_with_its_own_sampler_keeps_its_order_on_one_process_only(arrays):
    import torch
    from torch.utils.data import DataLoader, WeightedRandomSampler

    sampler = WeightedRandomSampler(torch.ones(N), N, generator=torch.Generator().manual_seed(0))
    loader = DataLoader(ArraysDataset(arrays), batch_size=B, sampler=sampler)
    assert loaders.wrap(loader).num_batches == 7
    with pytest.raises(ValueError, match=r"own sampler \(WeightedRandomSampler\).* 2 processes"):
        loaders.wrap(loader, process_index=0, process_count=2)
    with pytest.raises(ValueError, match=r"shuffle=True orders random-access datasets"):
        loaders.wrap(loader, shuffle=True)


def test_steps_per_epoch_is_refused_for_random_access_kinds(arrays):
    with pytest.raises(ValueError, match=r"steps_per_epoch=3 is for streams, but a torch Dataset"):
        loaders.wrap(ArraysDataset(arrays), batch_size=B, steps_per_epoch=3)


def _endless_tf(arrays):
    tf = import_tensorflow()
    return tf.data.Dataset.from_tensor_slices(arrays).repeat()


def test_endless_tf_stream_needs_steps_per_epoch_and_reads_one_live_stream(arrays):
    stream = _endless_tf(arrays)
    with pytest.raises(ValueError, match=r"tf.data.Dataset never ends .* pass steps_per_epoch="):
        loaders.wrap(stream, batch_size=B)
    source = loaders.wrap(stream, batch_size=B, steps_per_epoch=4)
    assert source.num_batches == 4
    read = [labels(source, epoch) for epoch in range(3)]
    # Epoch e is batches [4e, 4e + 4) of one pass after another through the rows.
    np.testing.assert_array_equal(np.concatenate(read), np.arange(3 * 4 * B) % N)
    np.testing.assert_array_equal(labels(source, 1, start=2), read[1][2 * B :])
    np.testing.assert_array_equal(labels(source, 0), read[0])  # an earlier epoch: read again
    # One live stream: the epoch iterator that started reading last owns it.
    first, second = source.iter_epoch(0), source.iter_epoch(1)
    next(first), next(second)
    with pytest.raises(RuntimeError, match=r"one epoch at a time, and a later iter_epoch"):
        next(first)
    with pytest.raises(ValueError, match=r"shuffle=False orders random-access datasets, but"):
        loaders.wrap(stream, batch_size=B, steps_per_epoch=4, shuffle=False)


def test_endless_grain_map_dataset_needs_steps_per_epoch(arrays):
    rows, _ = _grain_rows(arrays)
    with pytest.raises(ValueError, match=r"grain.MapDataset never ends .* steps_per_epoch="):
        loaders.wrap(rows.repeat(), batch_size=B)
    source = loaders.wrap(rows.repeat(), batch_size=B, steps_per_epoch=10)
    np.testing.assert_array_equal(labels(source, 1), np.arange(10 * B, 20 * B) % N)


def test_grain_loader_workers_make_the_batches_in_order(arrays):
    import grain

    sampler = grain.samplers.IndexSampler(
        N, shard_options=grain.sharding.NoSharding(), shuffle=True, num_epochs=1, seed=1
    )
    loader = grain.DataLoader(
        data_source=Records(arrays),
        sampler=sampler,
        operations=[grain.transforms.Batch(B)],
        worker_count=2,
    )
    # One epoch: each starts its workers (spawned, a few seconds).
    source = loaders.wrap(loader, seed=SEED)
    assert_same_batches(list(source.iter_epoch(0)), reference(arrays, 0))


def test_pad_to_pads_a_short_last_batch_of_variable_rows_after_collation():
    # Keras's test_with_different_shapes: rows of width 4, 5 and 6, padded to 6.
    import datasets
    import torch
    from torch.utils.data import DataLoader

    widths = [4, 4, 5, 5, 6]
    rows = [np.arange(w, dtype=np.int32) + 10 * i for i, w in enumerate(widths)]
    seen = []

    class Ragged(torch.utils.data.Dataset):
        def __len__(self):
            return len(rows)

        def __getitem__(self, i):
            seen.append(i)
            return rows[i]

    def collate(batch):  # pads within the batch, as a user's collate would
        return torch.nn.utils.rnn.pad_sequence([torch.from_numpy(r) for r in batch], True)

    want = np.zeros((6, 6), np.int32)  # batches of 2: the last holds row 4 alone
    for i, r in enumerate(rows):
        want[i, : len(r)] = r
    torch_source = loaders.wrap(
        DataLoader(Ragged(), batch_size=2, collate_fn=collate), pad_to={"image": 6}
    )
    hf_source = loaders.wrap(
        datasets.Dataset.from_dict({"image": rows}), batch_size=2, pad_to={"image": 6}
    )
    for source in (torch_source, hf_source):
        batches = list(source.iter_epoch(0))
        assert np.array_equal(np.concatenate([b["image"] for b in batches]), want)
        assert [b["mask"].tolist() for b in batches][-1] == [True, False]
        if source is torch_source:
            assert seen == [0, 1, 2, 3, 4]  # (batch 0 read by wrap()); no row twice
