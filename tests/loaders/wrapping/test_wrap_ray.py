"""`wrap` of Ray Data: a user's pipeline through the wrap contract, on one
local Ray instance for the module (each start costs seconds; slow tier only).

A pipeline whose order is fixed (``preserve_order``, seeded random steps)
resumes exactly inside an epoch; any other is refused for resume by name.
"""

import json

import numpy as np
import pytest
from backend_helpers import assert_same_batches
from jaxfeed.loaders._doors import ray as ray_door
from ray_helpers import worker_env

from jaxfeed import loaders

pytestmark = pytest.mark.slow

N, B = 100, 16


@pytest.fixture(scope="module")
def ray():
    import ray

    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False,
             runtime_env=worker_env())  # fmt: skip
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    try:
        yield ray
    finally:
        ray.shutdown()


def _pipeline(ray, preserve_order=True, **shuffle):
    """Rows 0..N-1 in 4 blocks through map_batches (and random_shuffle(**shuffle))."""
    context = ray.data.DataContext.get_current()
    before = context.execution_options.preserve_order
    context.execution_options.preserve_order = preserve_order
    try:  # (a Dataset keeps a copy of the context it was made under)
        ds = ray.data.from_numpy(np.arange(N, dtype=np.int64)).repartition(4)
        ds = ds.map_batches(lambda b: {"label": b["data"], "double": 2 * b["data"]})
        return ds.random_shuffle(**shuffle) if shuffle else ds
    finally:
        context.execution_options.preserve_order = before


def _labels(batches):
    return np.concatenate([b["label"][b["mask"]] for b in batches])


def test_a_pipeline_reads_in_its_order_with_a_padded_masked_last_batch(ray):
    source = loaders.wrap(_pipeline(ray), batch_size=B)
    batches = list(source.iter_epoch(0))
    assert len(batches) == 7 and source.element_spec["label"].dtype == np.int32
    np.testing.assert_array_equal(_labels(batches), np.arange(N))
    np.testing.assert_array_equal(batches[-1]["mask"], np.arange(B) < N % B)
    np.testing.assert_array_equal(batches[-1]["double"][N % B :], 0)
    assert_same_batches(list(source.iter_epoch(1)), batches)


def test_a_fixed_order_resumes_mid_epoch_exactly_in_a_fresh_source(ray):
    seeded = _pipeline(ray, seed=7)
    source = loaders.wrap(seeded, batch_size=B)
    epoch = list(source.iter_epoch(1))
    assert sorted(_labels(epoch)) == list(range(N))
    state = json.loads(json.dumps(source.data_state(1, 3)))
    fresh = loaders.wrap(_pipeline(ray, seed=7), batch_size=B)
    fresh.restore_data_state(state)
    assert_same_batches(list(fresh.iter_epoch(1, start=3)), epoch[3:])


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(seed=None), r"its random_shuffle\(\) has no seed, so every pass draws a new order"),
        (dict(preserve_order=False), r"its context.s execution_options.preserve_order is False"),
    ],
)
def test_an_order_that_changes_is_refused_for_resume_by_name(ray, options, message):
    shuffle = {"seed": options["seed"]} if "seed" in options else {}
    preserve = options.get("preserve_order", True)
    source = loaders.wrap(_pipeline(ray, preserve, **shuffle), batch_size=B)
    full = r"the wrapped ray.data.Dataset cannot restart at batch 2 of epoch 1: " + message
    with pytest.raises(ValueError, match=full):
        source.iter_epoch(1, start=2)
    epochs = [_labels(source.iter_epoch(e)) for e in (0, 1)]
    assert all(sorted(rows) == list(range(N)) for rows in epochs)  # every row, every epoch
    if "seed" in options:
        assert not np.array_equal(*epochs)  # a seedless shuffle reshuffles every epoch


def test_a_data_iterator_reads_its_share_and_refuses_a_mid_epoch_start(ray):
    # One share: the shares of streaming_split(n) start each epoch together, so
    # in one process (wrap reads the first batch) n > 1 would wait for the others.
    (share,) = _pipeline(ray).streaming_split(1)
    with pytest.raises(ValueError, match=r"it is already one share of a dataset"):
        loaders.wrap(share, batch_size=10, process_index=1, process_count=2)
    source = loaders.wrap(share, batch_size=10)
    assert sorted(_labels(source.iter_epoch(0))) == list(range(N))
    with pytest.raises(ValueError, match=r"a DataIterator's blocks go to its consumers"):
        source.iter_epoch(1, start=1)


def test_two_processes_each_read_their_split(ray):
    shares = [
        loaders.wrap(_pipeline(ray), batch_size=10, process_index=i, process_count=2)
        for i in range(2)
    ]
    rows = [_labels(share.iter_epoch(0)) for share in shares]
    assert len(rows[0]) == len(rows[1]) == N // 2
    np.testing.assert_array_equal(np.sort(np.concatenate(rows)), np.arange(N))
    with pytest.raises(ValueError, match=r"Dataset.split\(n, equal=True\), which needs the same"):
        loaders.wrap(_pipeline(ray, seed=None), batch_size=10, process_index=0, process_count=2)


def test_the_door_reads_a_pipelines_random_steps(ray):
    steps = ray_door.random_steps(_pipeline(ray, seed=7).randomize_block_order())
    version = f"ray {ray.__version__}: see loaders/_doors/ray.py"
    assert steps == [
        ray_door.RandomStep("RandomShuffle", 7, False),
        ray_door.RandomStep("RandomizeBlockOrder", None, False),
    ], version
