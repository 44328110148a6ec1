"""`wrap` on several processes: random-access objects sliced by the shared
sampler (a loopback run of 2 and 3 processes), streams sharded with their
framework's own tool or refused with the way to shard them."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from jaxfeed.loaders._doors.tf import import_tensorflow
from wrap_worker import ArraysDataset, B, N, make_arrays

from jaxfeed import loaders

TESTS = Path(__file__).resolve().parents[2]  # tests/


@pytest.fixture(scope="module")
def arrays():
    return make_arrays()


@pytest.mark.slow
@pytest.mark.parametrize("count", [2, 3])
def test_random_access_kinds_give_every_row_to_exactly_one_process(count, tmp_path):
    """Each process wraps with its own process_index (passed explicitly, no
    jax.distributed needed for the data): per epoch, the valid rows of all
    processes together are the dataset, each row exactly once."""
    env = {**os.environ, "PYTHONPATH": str(TESTS.parent), "JAX_PLATFORMS": "cpu"}
    runs = [
        subprocess.Popen(
            [sys.executable, str(TESTS / "wrap_worker.py"), "rows", str(count), str(i), out],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i, out in enumerate(str(tmp_path / f"process{i}.json") for i in range(count))
    ]
    for run in runs:
        try:
            _, stderr = run.communicate(timeout=240)
        finally:
            run.kill()
        assert run.returncode == 0, stderr
    reports = [json.loads((tmp_path / f"process{i}.json").read_text()) for i in range(count)]
    assert set(reports[0]) == {
        "torch-dataset",
        "torch-loader",
        "grain-map",
        "grain-loader",
        "hf-dataset",
    }
    steps = -(-N // (B * count))
    for kind in reports[0]:
        per_process = [report[kind] for report in reports]
        assert [p["num_batches"] for p in per_process] == [steps] * count, kind
        for epoch in (0, 1):
            read = [label for p in per_process for batch in p["epochs"][epoch] for label in batch]
            assert sorted(read) == list(range(N)), (kind, epoch)
            assert all(len(p["epochs"][epoch]) == steps for p in per_process), kind
        # Shuffled anew each epoch.
        assert per_process[0]["epochs"][0] != per_process[0]["epochs"][1], kind


def _shares(make, count=2, **options):
    """Each process's valid labels per epoch, wrapping ``make()`` once per process."""
    sources = [
        loaders.wrap(make(), process_index=i, process_count=count, **options) for i in range(count)
    ]
    assert len({s.num_batches for s in sources}) == 1

    def valid(batch):
        return batch["label"][batch["mask"]] if "mask" in batch else batch["label"]

    return [np.concatenate([valid(b) for b in s.iter_epoch(0)]) for s in sources], sources


def test_tf_stream_is_sharded_by_rows_or_by_batches(arrays):
    tf = import_tensorflow()

    rows = tf.data.Dataset.from_tensor_slices(arrays)
    # Rows: process p reads rows p, p + 2, ... , batched by wrap.
    (first, second), sources = _shares(lambda: rows, batch_size=B)
    np.testing.assert_array_equal(first, np.arange(0, N, 2))
    np.testing.assert_array_equal(second, np.arange(1, N, 2))
    assert sources[0].num_batches == 4
    # A pipeline that batches itself: process p reads its batches p, p + 2, ...,
    # and every process as many (the one with fewer gets a masked one).
    (first, second), sources = _shares(lambda: rows.batch(B))
    assert sources[0].num_batches == 4
    assert sorted([*first, *second]) == list(range(N))
    np.testing.assert_array_equal(first[:B], np.arange(B))
    np.testing.assert_array_equal(second[:B], np.arange(B, 2 * B))
    last = list(sources[1].iter_epoch(0))[-1]
    assert not last["mask"].any()  # 7 batches over 2 processes: a padding one
    # Three processes, short batches dropped: every process as many full batches.
    (*shares,), sources = _shares(lambda: rows, count=3, batch_size=B, drop_remainder=True)
    assert [len(s) for s in shares] == [2 * B] * 3 and sources[0].num_batches == 2
    assert len(set(np.concatenate(shares).tolist())) == 3 * 2 * B


def test_tf_stream_shuffled_without_seed_is_refused_on_several_processes(arrays):
    tf = import_tensorflow()

    rows = tf.data.Dataset.from_tensor_slices(arrays)
    with pytest.raises(ValueError, match=r"shuffles without a seed.*pass seed= to \.shuffle\(\)"):
        loaders.wrap(rows.shuffle(N), batch_size=B, process_index=0, process_count=2)
    (first, second), _ = _shares(lambda: rows.shuffle(N, seed=1), batch_size=B)
    assert sorted([*first, *second]) == list(range(N))


def test_hf_iterable_dataset_is_split_by_node(arrays):
    import datasets

    stream = datasets.Dataset.from_dict(arrays).to_iterable_dataset(num_shards=4)
    (first, second), _ = _shares(lambda: stream, batch_size=B)
    assert len(first) == len(second) == N // 2
    assert sorted([*first, *second]) == list(range(N))


def test_torch_loader_with_a_matching_distributed_sampler_is_already_sharded(arrays):
    from torch.utils.data import DataLoader, DistributedSampler

    def loader(rank, replicas=2):
        dataset = ArraysDataset(arrays)
        sampler = DistributedSampler(dataset, num_replicas=replicas, rank=rank, seed=0)
        return DataLoader(dataset, batch_size=B, sampler=sampler)

    sources = [loaders.wrap(loader(i), process_index=i, process_count=2) for i in (0, 1)]
    read = [labels for s in sources for b in s.iter_epoch(0) for labels in b["label"][b["mask"]]]
    assert sorted(read) == list(range(N))
    with pytest.raises(ValueError, match=r"own sampler \(DistributedSampler\).* 2 processes"):
        loaders.wrap(loader(0, replicas=1), process_index=0, process_count=2)


def test_streams_without_a_sharding_tool_are_refused_with_the_fix(arrays):
    import grain
    import torch

    two = {"process_index": 1, "process_count": 2}
    batch = {"label": np.arange(4)}

    class Rows(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(ArraysDataset(arrays)[i] for i in range(N))

    cases = [
        (
            grain.MapDataset.range(N).to_iter_dataset(),
            {"batch_size": B},
            r"grain.IterDataset .* 2 processes .*dataset\[process_index::process_count\]",
        ),
        (Rows(), {"batch_size": B}, r"torch IterableDataset .* 2 processes .*Shard it yourself"),
        (lambda: iter([batch]), {}, r"callable returning batches .* 2 processes"),
        (
            grain.MapDataset.range(N).filter(lambda i: i % 2),
            {"batch_size": B},
            r"grain.MapDataset .*FilterMapDataset leaves holes.* 2 processes",
        ),
        ([batch], {}, r"re-iterable of batches .* 2 processes .*process_count=1"),
        (
            torch.utils.data.DataLoader(Rows(), batch_size=B),
            {},
            r"torch DataLoader .*IterableDataset.* 2 processes .*Shard it in the dataset's",
        ),
    ]
    for obj, options, match in cases:
        with pytest.raises(ValueError, match=match):
            loaders.wrap(obj, **options, **two)
