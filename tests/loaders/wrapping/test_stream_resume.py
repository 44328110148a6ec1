"""Wrapped streams resume exactly in a fresh process, or refuse (issue 11).

The subprocess runs live in tests/stream_resume_worker.py: one process saves
every stream kind's ``data_state`` mid-epoch (behind a `DeviceFeed` that read
ahead) and reads on; a fresh one restores and must read the same bytes. Then
`jaxfeed.fit` is killed with SIGKILL mid-epoch and resumed: the final
parameters must be bit-identical to an uninterrupted run's.
"""

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from stream_resume_worker import KINDS, N

from jaxfeed import loaders

ROOT = Path(__file__).resolve().parents[3]
WORKER = ROOT / "tests" / "stream_resume_worker.py"
ENV = {
    **os.environ,
    "PYTHONPATH": str(ROOT),
    "JAX_PLATFORMS": "cpu",
    "XLA_FLAGS": "--xla_force_host_platform_device_count=1",
    "TF_CPP_MIN_LOG_LEVEL": "2",
}


def _worker(*args: str, killed: bool = False) -> None:
    done = subprocess.run(
        [sys.executable, str(WORKER), *args],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    expected = -9 if killed else 0
    assert done.returncode == expected, done.stderr[-3000:]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``(saved, resumed, states)``: every kind read without a break, and
    read again in a fresh process from its state."""
    return _save_and_resume(tmp_path_factory.mktemp("streams"), KINDS)


def _save_and_resume(directory, kinds) -> tuple:
    """``kinds`` read whole in one fresh process, then in another from the
    states the first saved: ``(saved, resumed, states)``."""
    states = directory / "states.json"
    _worker("save", str(directory / "saved.npz"), str(states), *kinds)
    _worker("resume", str(directory / "resumed.npz"), str(states), *kinds)
    saved, resumed = np.load(directory / "saved.npz"), np.load(directory / "resumed.npz")
    return saved, resumed, json.loads(states.read_text())


def _batches(arrays, kind: str, epoch: int) -> list[dict[str, np.ndarray]]:
    out: dict[int, dict[str, np.ndarray]] = {}
    for name in arrays.files:
        k, e, i, key = name.split("|")
        if (k, int(e)) == (kind, epoch):
            out.setdefault(int(i), {})[key] = arrays[name]
    return [out[i] for i in sorted(out)]


def _assert_same(got: list[dict], want: list[dict]) -> None:
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        assert a.keys() == b.keys(), i
        for key in a:
            assert a[key].dtype == b[key].dtype and a[key].tobytes() == b[key].tobytes(), (i, key)


def _rows(batches: list[dict]) -> np.ndarray:
    return np.concatenate([b["label"][b["mask"]] if "mask" in b else b["label"] for b in batches])


@pytest.mark.slow  # subprocesses
@pytest.mark.parametrize("kind", KINDS)
def test_a_fresh_process_resumes_each_stream_kind_exactly(kind, runs):
    saved, resumed, states = runs
    _, epoch, k = KINDS[kind]
    # The state came through a JSON file, and it is the position resumed from.
    assert (states[kind]["epoch"], states[kind]["next_batch"]) == (epoch, k)
    _assert_same(_batches(resumed, kind, epoch), _batches(saved, kind, epoch)[k:])
    _assert_same(_batches(resumed, kind, epoch + 1), _batches(saved, kind, epoch + 1))
    # The epochs differ (reshuffled), so resuming at the wrong one would show; Grain
    # iterates an IterDataset the same way every time (its repeat reshuffles).
    first, second = _rows(_batches(saved, kind, epoch)), _rows(_batches(saved, kind, epoch + 1))
    assert np.array_equal(first, second) == (kind == "grain")


def test_the_issues_hf_case_resumes_all_100_rows(runs):
    # to_iterable_dataset(num_shards=4).shuffle(seed=1, buffer_size=10), batch 16, epoch 3, start=3
    saved, resumed, _ = runs
    head = _batches(saved, "hf", 3)[:3]
    rows = _rows(head + _batches(resumed, "hf", 3))
    assert sorted(rows.tolist()) == list(range(N))


def test_tf_states_hold_tf_datas_own_checkpoint_and_others_theirs(runs):
    _, _, states = runs
    # tf.data's checkpoint of the epoch's iterator as it was made, then K batches read again.
    assert states["tf"]["stream"]["state"]["files"].keys() >= {"iterator.index"}
    tf_state = states["tf"]["stream"]
    assert tf_state["state"]["at"] == 0 and tf_state["note"] == [1, 0, 1, 0]
    assert tf_state["target"] == [1, 3]
    # After batch K - 1 = 2: 3 batches of 16, not the 7 the feed had read ahead.
    assert states["grain"]["stream"]["state"] == {"next_index": 48}
    assert states["hf"]["stream"]["state"] is None  # a shuffle buffer: read again
    assert states["hf-sharded"]["stream"]["state"]["epoch"] == 1  # HF's own state_dict
    torch_state = states["torch"]["stream"]["state"]
    assert torch_state["loader"]["_num_yielded"] == 3  # torchdata's StatefulDataLoader's
    assert len(torch_state["generators"]) == 1  # torch's global one, at the epoch's start
    assert len(states["torch-sampler"]["stream"]["state"]["generators"]) == 2  # + the sampler's


# --- refusals -------------------------------------------------------------------------


def _list_batches(count: int = 4) -> list[dict[str, np.ndarray]]:
    return [{"label": np.arange(4 * i, 4 * i + 4, dtype=np.int32)} for i in range(count)]


class Batches:
    """A custom re-iterable: wrap cannot know it repeats."""

    def __iter__(self):
        return iter(_list_batches())


_CALL = (
    r"the wrapped callable returning batches cannot restart at batch 2 of epoch 1: wrap "
    r"cannot know that calling the function again gives the same batches\. Pass a list of "
    r"the batches, or a random-access dataset .* pass resume='replay' to wrap\(\)"
)
_ITER = (
    r"the wrapped re-iterable of batches cannot restart at batch 2 of epoch 1: wrap cannot "
    r"know that iterating the Batches again gives the same batches\. Pass a list"
)


@pytest.mark.parametrize(
    "make, message", [(lambda: lambda: iter(_list_batches()), _CALL), (Batches, _ITER)]
)
def test_callables_and_custom_iterables_refuse_a_mid_epoch_position(make, message):
    source = loaders.wrap(make())
    with pytest.raises(ValueError, match=message):
        source.iter_epoch(1, start=2)
    list(source.iter_epoch(1))
    with pytest.raises(ValueError, match=message):
        source.data_state(1, 2)
    # An epoch's start is a fresh call / iteration: that is what an epoch of it is.
    state = json.loads(json.dumps(source.data_state(2, 0)))
    again = loaders.wrap(make())
    again.restore_data_state(state)
    assert [b["label"][0] for b in again.iter_epoch(2)] == [0, 4, 8, 12]
    # resume="replay" vouches that it repeats: read again up to the position.
    replay = loaders.wrap(make(), resume="replay")
    list(replay.iter_epoch(0))
    state = json.loads(json.dumps(replay.data_state(0, 3)))
    fresh = loaders.wrap(make(), resume="replay")
    fresh.restore_data_state(state)
    assert [int(b["label"][0]) for b in fresh.iter_epoch(0, start=3)] == [12]


def test_resume_replay_is_only_for_callables_and_custom_iterables():
    import tensorflow as tf

    dataset = tf.data.Dataset.from_tensor_slices({"label": np.arange(8)}).batch(4)
    with pytest.raises(ValueError, match=r"resume='replay': only resume='replay' exists, for"):
        loaders.wrap(dataset, resume="replay")
    with pytest.raises(ValueError, match=r"resume='again': only resume='replay' exists"):
        loaders.wrap(_list_batches(), resume="again")


def test_a_list_resumes_by_position_counting_dropped_short_batches():
    # The short batch 2 is dropped: batch 3 of the epoch is the list's item 4.
    batches = _list_batches(5)
    batches[2] = {"label": np.arange(2, dtype=np.int32)}
    source = loaders.wrap(batches, drop_remainder=True)
    read = [int(b["label"][0]) for b in source.iter_epoch(0)]
    assert read == [0, 4, 12, 16]
    state = json.loads(json.dumps(source.data_state(0, 3)))
    fresh = loaders.wrap(batches, drop_remainder=True)
    fresh.restore_data_state(state)
    assert [int(b["label"][0]) for b in fresh.iter_epoch(0, start=3)] == [16]


def test_a_tf_pipeline_tf_cannot_checkpoint_refuses_to_resume():
    import tensorflow as tf

    def double(x):
        return tf.py_function(lambda v: v * 2, [x], tf.int64)

    dataset = tf.data.Dataset.range(12).map(double).batch(4)
    source = loaders.wrap(dataset, keys=("label",))
    assert [int(b["label"][0]) for b in source.iter_epoch(0)] == [0, 8, 16]
    with pytest.raises(
        ValueError,
        match=r"tf.data.Dataset cannot restart at batch 1 of epoch 0: tf.data cannot "
        r"checkpoint this pipeline \(.*EagerPyFunc is stateful.*\); stateful ops such as",
    ):
        source.data_state(0, 1)
    assert [int(b["label"][0]) for b in source.iter_epoch(1)] == [0, 8, 16]  # reads on


def test_an_endless_tf_pipeline_whose_checkpoint_would_lose_the_shuffle_state_refuses():
    import tensorflow as tf

    rows = tf.data.Dataset.from_tensor_slices({"label": np.arange(10)}).shuffle(10, seed=1)
    source = loaders.wrap(rows.batch(4).repeat(), steps_per_epoch=2)
    list(source.iter_epoch(0))
    with pytest.raises(
        ValueError,
        match=r"cannot restart at batch 1 of epoch 0: its \.repeat\(\) is above a reshuffling "
        r"\.shuffle\(\) with BatchDataset between them, .* put \.repeat\(\) right after",
    ):
        source.data_state(0, 1)
    # .repeat() right after .shuffle(): checkpointed where asked.
    source = loaders.wrap(rows.repeat().batch(4), steps_per_epoch=2)
    list(source.iter_epoch(0))
    assert source.data_state(1, 0)["stream"]["state"]["at"] == 2


def test_an_epoch_left_part_read_does_not_change_the_next_one():
    import tensorflow as tf

    def dataset():  # one each: a dataset's iterators share its shuffle's random state
        rows = tf.data.Dataset.from_tensor_slices({"label": np.arange(40)})
        return rows.shuffle(40, seed=5).batch(8)

    straight = loaders.wrap(dataset())
    list(straight.iter_epoch(0))
    want = [b["label"].tolist() for b in straight.iter_epoch(1)]
    source = loaders.wrap(dataset())
    first = source.iter_epoch(0)
    next(first), next(first)
    first.close()  # e.g. a benchmark's max_batches: the rest of the epoch is not read
    assert [b["label"].tolist() for b in source.iter_epoch(1)] == want


def _count_tf_checkpoints(monkeypatch) -> list:
    """A list that grows by one for each tf.data checkpoint a wrap takes."""
    from jaxfeed.loaders.wrapping.tf import TfCursor

    taken, checkpoint = [], TfCursor._checkpoint

    def counted(self):
        files = checkpoint(self)
        if files is not None:
            taken.append(1)
        return files

    monkeypatch.setattr(TfCursor, "_checkpoint", counted)
    return taken


def test_a_tf_pipeline_read_without_data_state_keeps_no_checkpoints(monkeypatch):
    import tensorflow as tf

    def dataset():
        rows = tf.data.Dataset.from_tensor_slices({"label": np.arange(40)})
        return rows.shuffle(40, seed=6).batch(8)

    taken = _count_tf_checkpoints(monkeypatch)
    kept = loaders.wrap(dataset())
    want = [[b["label"].tolist() for b in kept.iter_epoch(e)] for e in range(3)]
    assert len(taken) == 3  # one per epoch start
    source = loaders.wrap(dataset())  # epoch 0's start: checkpointed by wrap()
    assert isinstance(source, loaders.SkipsDataState)
    view = source.without_data_state()
    assert isinstance(view, loaders.BatchSource) and not isinstance(view, loaders.Resumable)
    got = [[b["label"].tolist() for b in view.iter_epoch(e)] for e in range(3)]
    assert got == want and len(taken) == 4  # the same order, no checkpoint after wrap()
    with pytest.raises(ValueError, match=r"cannot restart at batch 1 of epoch 2: .*without_data_s"):
        source.data_state(2, 1)
    list(source.iter_epoch(3))
    assert source.data_state(3, 1)["stream"]["state"] is not None


def test_fit_keeps_tf_checkpoints_only_when_it_checkpoints(tmp_path, monkeypatch):
    import jax
    import jax.numpy as jnp
    import tensorflow as tf

    from jaxfeed import Logging, fit

    taken = _count_tf_checkpoints(monkeypatch)
    rows = tf.data.Dataset.from_tensor_slices({"label": np.arange(40, dtype=np.int32)})
    source = loaders.wrap(rows.shuffle(40, seed=7).batch(8))

    def step(state, batch):
        return state, {"count": jnp.sum(batch["mask"].astype(jnp.float32))}

    options = dict(epochs=3, mesh=jax.devices()[:1], log=Logging(progress=False))
    fit(step, {"w": jnp.zeros(())}, source, **options)
    assert len(taken) == 1  # wrap()'s only
    fit(step, {"w": jnp.zeros(())}, source, checkpoint=tmp_path, **options)
    assert len(taken) > 1


def test_positions_older_than_those_kept_are_refused_by_name():
    import tensorflow as tf

    rows = tf.data.Dataset.from_tensor_slices({"label": np.arange(20)})
    source = loaders.wrap(rows.shuffle(20, seed=4).batch(5))
    epochs = [list(source.iter_epoch(e)) for e in range(6)]
    with pytest.raises(
        ValueError, match=r"cannot come back to batch 1 of epoch 1: it is a stream, read forward"
    ):
        source.data_state(1, 1)
    # A recent epoch is kept, and reading it again is exact.
    again = list(source.iter_epoch(4, start=1))
    assert [b["label"].tolist() for b in again] == [b["label"].tolist() for b in epochs[4][1:]]


def test_reading_an_old_epoch_again_says_the_stream_moved_on_and_what_reads_it():
    import tensorflow as tf

    rows = tf.data.Dataset.from_tensor_slices({"label": np.arange(20)})
    source = loaders.wrap(rows.shuffle(20, seed=4).batch(5))
    for epoch in range(4):
        list(source.iter_epoch(epoch))
    with pytest.raises(ValueError) as refused:
        source.iter_epoch(0)
    expected = (
        r"the wrapped tf.data.Dataset cannot come back to batch 0 of epoch 0: it is a stream, "
        r"read forward, and it has moved on past that position \(it stands in epoch 3\); it "
        r"can come back only to the starts of epochs 1, 2, 3 \(its last 3\). An old epoch of "
        r"a stream cannot be read again. .*wrap a random-access dataset instead \(a TFDS "
        r"data_source, .*jaxfeed.make\(dataset=\{...\}\); or wrap the stream anew"
    )
    refused.match(expected)
    assert "resume" not in str(refused.value)  # nothing was being resumed
    # A new wrap of it starts at its epoch 0, as the message says.
    assert len(list(loaders.wrap(rows.batch(5)).iter_epoch(0))) == 4


def test_restore_refuses_another_kinds_state():
    source = loaders.wrap(_list_batches())
    with pytest.raises(
        ValueError, match=r"taken from a wrapped 'tf.data.Dataset', but this source wraps 'a re-it"
    ):
        source.restore_data_state({"kind": "tf.data.Dataset", "epoch": 0, "next_batch": 0})


def test_restore_refuses_a_malformed_state_before_changing_the_stream():
    import tensorflow as tf

    rows = tf.data.Dataset.from_tensor_slices({"label": np.arange(12)})
    source = loaders.wrap(rows.shuffle(12, seed=2).batch(4))
    want = [b["label"].tolist() for b in source.iter_epoch(0)]
    state = source.data_state(0, 1)
    del state["dropped"]
    with pytest.raises(ValueError, match=r"not a data state of a wrapped stream \(KeyError\('dro"):
        source.restore_data_state(state)
    assert [b["label"].tolist() for b in source.iter_epoch(0, start=1)] == want[1:]


# --- end to end: jaxfeed.fit killed mid-epoch -------------------------------------------


@pytest.mark.slow  # subprocesses
def test_fit_killed_mid_epoch_resumes_bit_identical(tmp_path):
    # 7 batches per epoch, 3 epochs: kill during a step of epoch 2 (steps 9..13, 1-based).
    pick = random.Random(11)
    kinds = {"tf": pick.randint(9, 13), "hf": pick.randint(9, 13)}
    _worker("fit", str(tmp_path / "straight.npz"), str(tmp_path / "straight"), "0", *kinds)
    for kind, step in kinds.items():
        _worker("fit", str(tmp_path / "killed.npz"), str(tmp_path / "run"), str(step), kind,
                killed=True)  # fmt: skip
        complete = [int(p.name) for p in (tmp_path / "run" / kind).iterdir() if p.name.isdigit()]
        assert max(complete) < step and max(complete) % 7, (kind, step, complete)  # mid-epoch
    _worker("fit", str(tmp_path / "resumed.npz"), str(tmp_path / "run"), "0", *kinds)
    straight, resumed = np.load(tmp_path / "straight.npz"), np.load(tmp_path / "resumed.npz")
    assert sorted(resumed.files) == sorted(straight.files) == ["hf|b", "hf|w", "tf|b", "tf|w"]
    for name in straight.files:
        assert straight[name].tobytes() == resumed[name].tobytes(), name


def test_a_torch_dataset_that_is_its_own_iterator_resumes_at_batch_0():
    # torchdata's Iterable2 case: __iter__ returns self, so wrap()'s first read
    # advances the very iterator a resume at batch 0 must start from.
    import torch

    class OwnIterator(torch.utils.data.IterableDataset):
        def __init__(self):
            self.i = 0

        def __iter__(self):
            return self

        def __next__(self):
            if self.i >= 60:
                raise StopIteration
            self.i += 1
            return torch.tensor([self.i - 1])

        def state_dict(self):
            return {"i": self.i}

        def load_state_dict(self, state):
            self.i = state["i"]

    def wrapped():
        return loaders.wrap(torch.utils.data.DataLoader(OwnIterator(), batch_size=4))

    state = json.loads(json.dumps(wrapped().data_state(0, 0)))  # as a checkpoint stores it
    resumed = wrapped()  # a fresh process: wrap() reads batch 0 again
    resumed.restore_data_state(state)
    got = [b["image"][:, 0].tolist() for b in resumed.iter_epoch(0, start=0)]
    assert got == [list(range(i, i + 4)) for i in range(0, 60, 4)]  # all 15, batch 0 first


class _RandomRows:
    """A map-style dataset whose rows draw from torch's global RNG (an augmentation)."""

    def __len__(self):
        return 22

    def __getitem__(self, i):
        import torch

        return {"x": torch.tensor([i, int(torch.randint(0, 1000, ()))])}


def test_a_torch_dataset_drawing_random_numbers_resumes_with_the_same_draws():
    # torchdata's map-style test_state_dict case: the position alone used to
    # resume into other draws, silently.
    import torch

    def wrapped():
        loader = torch.utils.data.DataLoader(_RandomRows(), batch_size=4, shuffle=True)
        return loaders.wrap(loader, seed=5)

    torch.manual_seed(0)
    first = wrapped()
    want = [b["x"].tolist() for b in first.iter_epoch(1)]
    state = json.loads(json.dumps(first.data_state(1, 2)))
    assert [b["x"].tolist() for b in wrapped().iter_epoch(1)] == want  # the draws are the batch's
    torch.manual_seed(1)  # a fresh process, another global seed
    resumed = wrapped()
    resumed.restore_data_state(state)
    assert [b["x"].tolist() for b in resumed.iter_epoch(1, start=2)] == want[2:]
    assert [b["x"].tolist() for b in resumed.iter_epoch(2)] != want  # a new draw each epoch


def _shuffled_rows(seed):
    """A torch IterableDataset that shuffles its rows with numpy: from the
    clock without ``seed`` (as WebDataset's ``.shuffle(1000)`` does)."""
    import torch

    class Shuffled(torch.utils.data.IterableDataset):
        def __iter__(self):
            for i in np.random.default_rng(seed).permutation(200):
                yield {"label": torch.tensor(i)}

    return torch.utils.data.DataLoader(Shuffled(), batch_size=10)


_NO_REPLAY = (
    r"the wrapped torch DataLoader cannot restart at batch 7 of epoch 0: read again up to "
    r"there, its batch 6 is another \(digest \w+\) than the run the data state was taken "
    r"from read \(digest \w+\): the stream does not replay the same order.* Seed it"
)


@pytest.mark.parametrize("seed", [None, 3])
def test_a_torch_stream_that_does_not_replay_its_order_is_refused_on_resume(seed):
    # issue 42: 0 of 13 batches after the position matched, silently.
    first = loaders.wrap(_shuffled_rows(seed))
    want = [b["label"].tolist() for b in first.iter_epoch(0)]
    state = json.loads(json.dumps(first.data_state(0, 7)))
    resumed = loaders.wrap(_shuffled_rows(seed))
    resumed.restore_data_state(state)
    if seed is None:
        with pytest.raises(ValueError, match=_NO_REPLAY):
            next(iter(resumed.iter_epoch(0, start=7)))
        return
    assert [b["label"].tolist() for b in resumed.iter_epoch(0, start=7)] == want[7:]
    del state["stream"]["digest"]  # a state taken before digests: restored unchecked
    old = loaders.wrap(_shuffled_rows(seed))
    old.restore_data_state(state)
    assert [b["label"].tolist() for b in old.iter_epoch(0, start=7)] == want[7:]


def test_a_replayed_callable_that_does_not_repeat_is_refused_on_resume():
    # The same check for every stream reached by reading again (resume="replay").
    def fresh():  # (a batch of 64: two runs' batch 2 coincide with odds 1/64!, not 1/4!)
        return iter([{"label": np.random.default_rng().permutation(64)} for _ in range(5)])

    first = loaders.wrap(fresh, resume="replay")
    list(first.iter_epoch(0))
    state = json.loads(json.dumps(first.data_state(0, 3)))
    resumed = loaders.wrap(fresh, resume="replay")
    resumed.restore_data_state(state)
    with pytest.raises(ValueError, match=r"callable returning batches cannot restart at batch 3"):
        next(iter(resumed.iter_epoch(0, start=3)))
