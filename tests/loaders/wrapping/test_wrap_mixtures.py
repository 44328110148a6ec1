"""A mixture the user built with their own framework, served by `wrap` (issue 44).

The kinds live in tests/stream_resume_worker.py's ``MIXTURES``: Grain's
``MapDataset.mix`` / ``IterDataset.mix``, HF's ``interleave_datasets``,
tf.data's ``sample_from_datasets`` / ``choose_from_datasets``, and torch's
``WeightedRandomSampler`` or shuffled ``ConcatDataset``. Each serves the mix its
framework makes and resumes exactly in a fresh process; a tf.data mixture that
draws without a seed would mix every later epoch differently after a resume,
so it is refused by name, pointing at jaxfeed's own mixture (``jaxfeed.Mixture``).
"""

import json

import numpy as np
import pytest
from stream_resume_worker import MIXTURES, WEIGHTS
from test_stream_resume import _assert_same, _batches, _rows, _save_and_resume

from jaxfeed import loaders

CODE = 1000  # the "code" source's labels start here; the "web" source's below
RANDOM_ACCESS = {"grain-mix-map", "hf-interleave-table", "torch-concat"}  # wrap reorders them


def _fresh(kind: str) -> dict:
    import torch

    torch.manual_seed(0)  # torch-weighted-global draws from torch's global generator
    return MIXTURES[kind][0]()


def _own_rows(obj) -> np.ndarray:
    """The labels its framework serves, iterating it without jaxfeed."""
    return np.concatenate([np.atleast_1d(np.asarray(item["label"])) for item in obj])


@pytest.mark.parametrize("kind", MIXTURES)
def test_wrap_serves_the_mix_its_framework_makes(kind):
    options = _fresh(kind)
    got = _rows(list(loaders.wrap(options.pop("obj"), **options).iter_epoch(0)))
    if kind != "hf-interleave-unseeded":  # (a fresh one draws anew)
        want = _own_rows(_fresh(kind)["obj"])
        if kind in RANDOM_ACCESS:  # the same rows, read in the shared sampler's order
            got, want = np.sort(got), np.sort(want)
        assert np.array_equal(got, want)
    assert abs(np.mean(got >= CODE) - WEIGHTS[1]) < 0.08  # the weights hold (HF, torch: drawn)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``(saved, resumed)``: every mixture read without a break, and read
    again in a fresh process from its data state."""
    saved, resumed, _ = _save_and_resume(tmp_path_factory.mktemp("mixtures"), MIXTURES)
    return saved, resumed


@pytest.mark.slow  # subprocesses
@pytest.mark.parametrize("kind", MIXTURES)
def test_a_fresh_process_resumes_each_mixture_exactly(kind, runs):
    saved, resumed = runs
    _, epoch, k = MIXTURES[kind]
    _assert_same(_batches(resumed, kind, epoch), _batches(saved, kind, epoch)[k:])
    _assert_same(_batches(resumed, kind, epoch + 1), _batches(saved, kind, epoch + 1))
    rows = _rows(_batches(saved, kind, epoch))
    assert abs(np.mean(rows >= CODE) - WEIGHTS[1]) < 0.08


def _tf_mixture(how: str, seed: int | None):
    import tensorflow as tf

    rows = tf.data.Dataset.from_tensor_slices({"label": np.arange(40)})
    parts = [rows.shuffle(40, seed=1), rows.map(lambda row: {"label": row["label"] + CODE})]
    if how == "sample":
        return tf.data.Dataset.sample_from_datasets(parts, list(WEIGHTS), seed=seed).batch(8)
    choice = tf.data.Dataset.random(seed=seed).map(lambda x: tf.cast(x % 10 >= 7, tf.int64))
    return tf.data.Dataset.choose_from_datasets(parts, choice).batch(8)


_UNSEEDED = (
    r"cannot restart at batch 2 of epoch 1: its sample_from_datasets\(\) / "
    r"choose_from_datasets\(\) choice of source draws without a seed, so after a resume .* "
    r"mix the sources in another order .* pass seed= to sample_from_datasets\(\) .* "
    r"jaxfeed\.make\(backend, dataset=jaxfeed\.Mixture\(\{\.\.\.\}, weights=\{\.\.\.\}\)"
)


@pytest.mark.parametrize("how", ["sample", "choose"])
def test_an_unseeded_tf_mixture_is_refused_by_name_for_a_resume_and_several_processes(how):
    # Its own epoch would resume exactly (tf.data's checkpoint holds the draws), but
    # every later one would be mixed anew in the fresh process, silently.
    source = loaders.wrap(_tf_mixture(how, None))
    list(source.iter_epoch(0))  # trains as it is
    with pytest.raises(ValueError, match=_UNSEEDED):
        source.data_state(1, 2)
    with pytest.raises(ValueError, match=r"mixes its sources without a seed .*jaxfeed\.Mixture\("):
        loaders.wrap(_tf_mixture(how, None), process_index=0, process_count=2)
    seeded = loaders.wrap(_tf_mixture(how, 3))
    list(seeded.iter_epoch(0))
    batches = seeded.iter_epoch(1)
    want = [next(batches)["label"] for _ in range(2)] + [b["label"] for b in batches]
    state = json.loads(json.dumps(seeded.data_state(1, 2)))
    resumed = loaders.wrap(_tf_mixture(how, 3))
    resumed.restore_data_state(state)
    got = [b["label"] for b in resumed.iter_epoch(1, start=2)]
    assert [b.tolist() for b in got] == [b.tolist() for b in want[2:]]


def test_a_weighted_sampler_on_several_processes_names_jaxfeeds_mixture():
    loader = MIXTURES["torch-weighted"][0]()["obj"]
    with pytest.raises(
        ValueError,
        match=r"own sampler \(WeightedRandomSampler\).*\(a WeightedRandomSampler over a "
        r"ConcatDataset\), jaxfeed's own mixture gives each process its share: "
        r"jaxfeed\.make\(backend, dataset=jaxfeed\.Mixture\(",
    ):
        loaders.wrap(loader, process_index=0, process_count=2)
