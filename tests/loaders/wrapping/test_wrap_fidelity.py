"""The user's pipeline, exactly as written, is what `wrap` serves: a formatting
transform of an HF dataset runs, and augmentations drawing from numpy's or
Python's global generators give the same batches on every re-read, after an
exact start and with workers, and new draws every epoch."""

import random

import datasets
import numpy as np
import pytest
from augmenting_datasets import GlobalRandomDataset, RarelyRandomDataset
from backend_helpers import assert_same_batches

import jaxfeed


def _epoch(source, epoch=0, start=0):
    return list(source.iter_epoch(epoch, start=start))


def _assert_reproducible(source):
    first = _epoch(source)
    assert_same_batches(_epoch(source), first)  # the same draws on a re-read
    assert_same_batches(_epoch(source, start=3), first[3:])  # start=3 is batch 3
    later = _epoch(source, epoch=1)
    assert any(not np.array_equal(a["x"], b["x"]) for a, b in zip(first, later, strict=True))
    return first


@pytest.mark.parametrize("workers", [0, 2])
def test_a_torch_dataset_drawing_from_global_generators_is_reproducible(workers):
    from torch.utils.data import DataLoader

    loader = DataLoader(GlobalRandomDataset(), batch_size=8, shuffle=True, num_workers=workers)
    source = jaxfeed.wrap(loader, seed=3)  # (imports JAX, whose import draws from np.random)
    before = np.random.get_state()[1].copy(), random.getstate()
    first = _assert_reproducible(source)
    # The seeding is the batch's only: the program's own global generators go on as before.
    assert np.array_equal(np.random.get_state()[1], before[0]) and random.getstate() == before[1]
    rows = np.concatenate([b["row"] for b in first])
    assert sorted(rows.tolist()) == list(range(64))  # the sampler's order, every row once


def _counting_seeds(monkeypatch):
    """The batches `seeded_globals` seeds, counted."""
    from jaxfeed.loaders.wrapping import seeded

    calls = []
    real = seeded.seeded_globals

    def counted(seed, epoch, rows):
        calls.append((epoch, sorted(rows)))
        return real(seed, epoch, rows)

    monkeypatch.setattr(seeded, "seeded_globals", counted)
    return calls


@pytest.mark.parametrize("generator", ["numpy", "python", "python-gauss", "torch"])
def test_a_dataset_that_draws_only_now_and_then_is_seeded_from_its_first_draw(
    monkeypatch, generator
):
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    calls = _counting_seeds(monkeypatch)
    pure = jaxfeed.wrap(DataLoader(TensorDataset(torch.arange(64.0)), batch_size=8), keys=("x",))
    assert len(_epoch(pure)) == 8 and calls == []  # it never draws: never seeded
    # only row 63 (batch 7) draws; "python-gauss" takes the deviate random.gauss
    # keeps from its last call (the generator's words do not move)
    # (its own generator: a DataLoader's iterator draws its base seed from torch's otherwise)
    own = torch.Generator().manual_seed(0)
    loader = DataLoader(RarelyRandomDataset(generator=generator), batch_size=8, generator=own)
    source = jaxfeed.wrap(loader, seed=3)
    random.gauss(0, 1)
    before = _global_states()
    first = _assert_reproducible(source)  # the draw is seeded: the same on every re-read
    assert calls[0] == (0, list(range(56, 64)))  # batches 0-6 read plainly, batch 7 seeded
    assert _global_states() == before  # the program's generators as they were
    assert first[6]["x"][:, 0].tolist() == list(range(48, 56))


def _global_states():
    import torch

    return (
        np.random.get_state()[1].tobytes(),
        random.getstate(),
        torch.default_generator.get_state().numpy().tobytes(),
    )


def test_the_watch_reads_the_generators_as_words_on_this_python_and_numpy():
    """The watch reads numpy's and CPython's generator structs directly (checked
    against their public getstate once); a layout these versions no longer
    have falls back to slower reads, which this names."""
    import platform
    import sys

    from jaxfeed.loaders.wrapping import seeded

    python = f"{platform.python_implementation()} {sys.version.split()[0]}"
    assert seeded._numpy_words() is not None, f"numpy {np.__version__}'s MT19937 layout moved"
    assert seeded._python_words() is not None, f"{python}'s random.Random layout moved"
    words = seeded._python_words()
    random.random()
    _, key, _ = random.getstate()
    assert words[1:].tolist() == list(key[:624]) and words[0] == key[624]  # a live view


def _augment(batch):
    """An image-classification ``with_transform``: normalise, channels first, a
    random flip from numpy's global generator."""
    pixels = []
    for image in batch["image"]:
        x = np.asarray(image, np.float32).transpose(2, 0, 1) / 255
        pixels.append(x[..., ::-1] if np.random.random() < 0.5 else x)
    return {"pixel_values": pixels, "x": [p.sum() for p in pixels], "label": batch["label"]}


def test_wrap_of_an_hf_dataset_runs_its_formatting_transform():
    images = np.random.default_rng(0).integers(0, 256, (64, 4, 4, 3), dtype=np.uint8)
    table = datasets.Dataset.from_dict({"image": images, "label": np.arange(64)})
    source = jaxfeed.wrap(table.with_transform(_augment), batch_size=8, seed=0)
    first = _assert_reproducible(source)
    assert set(first[0]) == {"pixel_values", "x", "label", "mask"}  # not the raw image
    assert first[0]["pixel_values"].shape == (8, 3, 4, 4)
    assert first[0]["pixel_values"].dtype == np.float32 and first[0]["pixel_values"].max() <= 1
    for batch in first:  # each row's own image, flipped or not
        for pixels, label in zip(batch["pixel_values"], batch["label"], strict=True):
            want = images[label].transpose(2, 0, 1) / np.float32(255)
            assert np.array_equal(pixels, want) or np.array_equal(pixels, want[..., ::-1])
    picked = jaxfeed.wrap(table.with_transform(_augment), batch_size=8, columns=["label"])
    assert set(next(iter(picked.iter_epoch(0)))) == {"label", "mask"}
    with pytest.raises(ValueError, match=r"transform returns \['label', 'pixel_values', 'x'\]"):
        next(iter(jaxfeed.wrap(table.with_transform(_augment), batch_size=8, columns=["image"])))


def test_a_grain_chain_with_a_finite_repeat_is_refused_unless_an_epoch_is_said():
    import grain

    records = grain.MapDataset.source(np.arange(40, dtype=np.float32)).map(lambda x: {"x": x})
    chain = records.shuffle(seed=0).repeat(2).batch(8)  # Grain's tutorial chain
    for obj in (chain, chain.to_iter_dataset()):
        with pytest.raises(ValueError, match=r"finite \.repeat\(\) \(2 passes of its 40 records"):
            jaxfeed.wrap(obj)
    stream = jaxfeed.wrap(chain.to_iter_dataset(), steps_per_epoch=5)  # one pass, said
    assert len(_epoch(stream)) == stream.num_batches == 5
    assert jaxfeed.wrap(records.repeat().batch(8), steps_per_epoch=5).num_batches == 5  # endless


def _rows_pipeline(tf):
    return tf.data.Dataset.from_tensor_slices(
        {"x": np.arange(64, dtype=np.float32), "label": np.arange(64, dtype=np.int32)}
    )


def test_an_unseeded_tf_shuffle_is_refused_for_an_exact_resume_by_name():
    from jaxfeed.loaders._doors.tf import import_tensorflow

    tf = import_tensorflow()
    unseeded = jaxfeed.wrap(_rows_pipeline(tf).shuffle(16).batch(8))  # TF's tutorial pipeline
    _epoch(unseeded)  # trains as it is
    with pytest.raises(ValueError, match=r"\.shuffle\(\) has no seed, so after a resume"):
        unseeded.data_state(0, 2)
    seeded = jaxfeed.wrap(_rows_pipeline(tf).shuffle(16, seed=1).batch(8))
    _epoch(seeded)
    assert seeded.data_state(0, 2)["next_batch"] == 2


class _Steps(jaxfeed.Callback):
    def __init__(self):
        self.seen = 0

    def on_step(self, info):
        self.seen += 1


def test_fit_with_checkpoints_refuses_a_pipeline_it_cannot_checkpoint_at_its_first_batch(
    tmp_path,
):
    import jax.numpy as jnp
    from jaxfeed.loaders._doors.tf import import_tensorflow

    tf = import_tensorflow()
    noise = tf.random.Generator.from_seed(1)  # TF's tutorial's augmentation option
    rows = _rows_pipeline(tf).map(lambda r: {**r, "x": r["x"] + noise.uniform([])})
    source = jaxfeed.wrap(rows.batch(8))

    def step(state, batch):
        mask = jaxfeed.batch_mask(batch)
        return state, {"x": jnp.sum(batch["x"] * mask), "count": jnp.sum(mask)}

    steps = _Steps()
    with pytest.raises(ValueError, match=r"(?s)cannot checkpoint .*asked at the run.s first batch"):
        jaxfeed.fit(
            step, {"w": jnp.zeros(())}, source, epochs=2, checkpoint=tmp_path, callbacks=[steps]
        )
    assert steps.seen == 0  # not after training up to the first checkpoint
    fresh = jaxfeed.wrap(rows.batch(8))
    assert jaxfeed.fit(step, {"w": jnp.zeros(())}, fresh, epochs=1).history  # no checkpoint=
