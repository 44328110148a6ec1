"""Checkpoints of `jaxfeed.fit` and `jaxfeed train`: what they hold, what they refuse,
and a stream source's own state (the optional data_state / restore_data_state)."""

import json
import os
import re
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jaxfeed.loaders.protocol import ArraySpec
from resume_worker import train_in_process

from jaxfeed import Checkpointing, Logging, batch_mask, fit, loaders
from jaxfeed.training.checkpoint import (
    Checkpointer,
    CheckpointError,
    CheckpointFallbackWarning,
    TopologyChangedWarning,
    latest,
)
from jaxfeed.training.verify import check_settings, meta_checksum

BATCH, BATCHES, FEATURES, CLASSES = 8, 6, 4, 3


class Stream:
    """A stream whose batches come from one RNG that runs on across epochs
    (as a tf.data iterator's shuffle buffer does): its position alone cannot
    restart it, its RNG state can. It reports that state, but cannot take it
    back (see `ResumableStream`)."""

    batch_size, num_batches = BATCH, BATCHES
    element_spec = {
        "x": ArraySpec((BATCH, FEATURES), np.dtype(np.float32)),
        "label": ArraySpec((BATCH,), np.dtype(np.int32)),
    }

    def __init__(self, fail_at: tuple[int, int] | None = None):
        self._rng = np.random.default_rng(0)
        self._after: dict[tuple[int, int], dict] = {}  # (epoch, next batch) -> RNG state
        self.fail_at = fail_at

    def iter_epoch(self, epoch=0, *, start=0):
        if epoch > 0 and start == 0:
            self._after[(epoch, 0)] = self._rng.bit_generator.state
        for b in range(start, BATCHES):
            if (epoch, b) == self.fail_at:
                raise RuntimeError("the loader crashed")
            x = self._rng.normal(size=(BATCH, FEATURES)).astype(np.float32)
            label = self._rng.integers(0, CLASSES, BATCH).astype(np.int32)
            self._after[(epoch, b + 1)] = self._rng.bit_generator.state
            yield {"x": x, "label": label}

    def data_state(self, epoch, next_batch):
        # The feed reads ahead: the state asked for is an earlier one, kept here.
        if (epoch, next_batch) not in self._after:  # the next epoch, never opened
            return {"rng": self._rng.bit_generator.state}
        return {"rng": self._after[(epoch, next_batch)]}


class ResumableStream(Stream):
    def __init__(self, fail_at=None, *, restores: bool = True):
        super().__init__(fail_at)
        self.restored: list[dict] = []
        self.restores = restores

    def restore_data_state(self, state):
        self.restored.append(state)
        if self.restores:
            self._rng.bit_generator.state = state["rng"]


def _step(state, batch):
    def loss(w):
        logits = batch["x"] @ w
        nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), batch["label"][:, None], 1)[:, 0]
        return jnp.sum(nll * batch_mask(batch)) / BATCH

    value, grad = jax.value_and_grad(loss)(state["w"])
    return {"w": state["w"] - 0.1 * grad}, {"loss": value * BATCH, "count": jnp.float32(BATCH)}


def _fit(source, directory, epochs=3, **kwargs):
    state = {"w": jnp.zeros((FEATURES, CLASSES), jnp.float32)}
    checkpoint = Checkpointing(directory, every=2, keep=2)
    return fit(
        _step, state, source, epochs=epochs, mesh=jax.devices()[:1], checkpoint=checkpoint, **kwargs
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """An uninterrupted run, and the checkpoints of one whose loader crashed
    at batch 5 of epoch 1 (each test resumes from its own copy of them)."""
    root = tmp_path_factory.mktemp("checkpoints")
    expected = _fit(ResumableStream(), root / "whole", log=Logging(progress=False))
    with pytest.raises(RuntimeError, match="the loader crashed"):
        _fit(ResumableStream(fail_at=(1, 5)), root / "crashed", log=Logging(progress=False))
    return expected, root


def _crashed(runs, tmp_path):
    return shutil.copytree(runs[1] / "crashed", tmp_path / "crashed")


def test_a_stream_resumes_from_its_own_state_after_a_crash(runs, tmp_path):
    expected, root = runs
    crashed = _crashed(runs, tmp_path)
    # Saved every 2 steps (6 per epoch); the feed had read up to batch 4 of epoch 1.
    saved = latest(crashed)
    assert (saved["step"], saved["epoch"], saved["next_batch"]) == (10, 1, 4)
    assert saved["data_state"] is True
    (data_file,) = (crashed / "10" / "data").glob("*.json")
    assert data_file.name == "process_0-of-1.json"
    data_state = json.loads(data_file.read_text())

    fresh = ResumableStream()
    resumed = _fit(fresh, crashed, resume=True, log=Logging(progress=False))
    assert fresh.restored == [data_state]
    np.testing.assert_array_equal(np.asarray(resumed.state["w"]), np.asarray(expected.state["w"]))
    assert [m["loss"] for m in resumed.history] == [m["loss"] for m in expected.history]
    # keep=2: only the two newest checkpoints are left.
    assert sorted(int(p.name) for p in (root / "whole").iterdir() if p.name.isdigit()) == [16, 18]


def test_a_stream_state_that_cannot_be_restored_is_refused(runs, tmp_path):
    expected, _ = runs
    crashed = _crashed(runs, tmp_path)
    with pytest.raises(ValueError, match=r"\(Stream\) has no restore_data_state\(\); resume with"):
        _fit(Stream(), crashed, resume=True, log=Logging(progress=False))
    # What the error prevents: by position alone the stream would give other batches.
    ignores = ResumableStream(restores=False)
    resumed = _fit(ignores, crashed, resume=True, log=Logging(progress=False))
    assert len(ignores.restored) == 1
    assert not np.array_equal(np.asarray(resumed.state["w"]), np.asarray(expected.state["w"]))


def test_a_checkpoint_of_another_model_is_refused(tmp_path):
    _fit(ResumableStream(), tmp_path, epochs=1, log=Logging(progress=False))
    other = {"w": jnp.zeros((FEATURES, CLASSES)), "b": jnp.zeros((CLASSES,))}
    with pytest.raises(ValueError, match=r"/6 holds a train state that does not fit this run's"):
        fit(
            # The sums _step returns, so only the model (an extra "b") differs.
            lambda state, batch: (state, {"loss": jnp.float32(0), "count": jnp.float32(BATCH)}),
            other,
            ResumableStream(),
            epochs=2,
            mesh=jax.devices()[:1],
            checkpoint=tmp_path,
            resume=True,
            log=Logging(progress=False),
        )


def test_a_state_holding_prng_keys_resumes_exactly(tmp_path):
    # Typed keys (jax.random.key; Flax NNX's Rngs hold them): numpy cannot hold one, so
    # its checksum is of its key data. Orbax saves and restores the keys themselves.
    def step(state, batch):
        key, noise = jax.random.split(state["key"])
        trained, sums = _step({"w": state["w"]}, batch)
        w = trained["w"] + 1e-3 * jax.random.normal(noise, trained["w"].shape)
        return {"w": w, "key": key}, sums

    def run(directory, epochs, **kwargs):
        state = {"w": jnp.zeros((FEATURES, CLASSES), jnp.float32), "key": jax.random.key(0)}
        return fit(step, state, ResumableStream(), epochs=epochs, mesh=jax.devices()[:1],
                   checkpoint=directory, log=Logging(progress=False), **kwargs)  # fmt: skip

    whole = run(tmp_path / "whole", 2)
    run(tmp_path / "parts", 1)
    resumed = run(tmp_path / "parts", 2, resume=True)
    assert jax.random.key_data(resumed.state["key"]).tolist() == (
        jax.random.key_data(whole.state["key"]).tolist()
    )
    np.testing.assert_array_equal(np.asarray(resumed.state["w"]), np.asarray(whole.state["w"]))
    assert latest(tmp_path / "parts")["arrays"]["['state']['key']"]["dtype"] == "<u4"


@pytest.mark.parametrize(("name", "value"), [("every", 0), ("keep", 0), ("every", 1.5)])
def test_checkpointing_takes_positive_integers(name, value):
    with pytest.raises(ValueError, match=f"Checkpointing.{name} must be an integer >= 1"):
        Checkpointing("d", **{name: value})


def test_settings_that_differ_are_named_with_both_values():
    saved = {"batch_size": 64, "dataset": "mnist-sample", "process_count": 2}
    current = {"batch_size": 128, "dataset": "mnist-sample", "process_count": 1}
    with pytest.raises(ValueError) as err:
        check_settings(saved, current, "checkpoint d/10")
    assert str(err.value) == (
        "checkpoint d/10 was written by a run with other settings: batch_size 64, this run "
        "has 128; process_count 2, this run has 1. Resume with the checkpoint's settings, or "
        "use another checkpoint directory to start fresh"
    )
    check_settings(saved, dict(saved), "same")  # equal settings pass


def _main(*argv: str) -> tuple[int, str, str]:
    return train_in_process("--devices", "1", *argv)


@pytest.fixture(scope="module")
def one_epoch(tmp_path_factory):
    """A checkpoint directory after one epoch of numpy, batch 256."""
    directory = tmp_path_factory.mktemp("one-epoch")
    status, _, err = _main(
        "--epochs", "1", "--batch-size", "256", "--checkpoint-dir", str(directory)
    )
    assert status == 0, err
    return directory


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--batch-size", "128"], "global_batch 256, this run has 128"),
        (["--loader", "torch"], "loader 'numpy', this run has 'torch'"),
        (["--dataset", "mnist-10k", "--data-dir", "MNIST"], "dataset 'mnist-sample', this run has"),
        (["--no-shuffle"], "shuffle True, this run has False"),
        (["--seed", "3"], "seed 0, this run has 3"),
    ],
)
def test_a_mismatching_checkpoint_is_refused(one_epoch, mnist_dir, args, named):
    args = [str(mnist_dir) if a == "MNIST" else a for a in args]
    base = ["--epochs", "2", "--batch-size", "256", "--checkpoint-dir", str(one_epoch)]
    status, out, err = _main(*base, "--resume", *args)
    assert status == 2, err
    assert err.startswith(f"jaxfeed: error: checkpoint {one_epoch}/16 was written by a run with ")
    assert named in err, err
    assert "epoch 2/2" not in out  # refused before training


def test_resume_continues_a_finished_run_with_more_epochs(one_epoch, tmp_path):
    directory = tmp_path / "run"
    shutil.copytree(one_epoch, directory)
    record = tmp_path / "metrics.json"
    base = ["--batch-size", "256", "--checkpoint-dir", str(directory), "--resume"]
    status, out, err = _main(*base, "--epochs", "2", "--json", str(record))
    assert status == 0, err
    assert f"resuming from step 16 (epoch 2, batch 0) in {directory}" in out
    assert "epoch 1/2" not in out and "epoch 2/2" in out
    epochs = json.loads(record.read_text())["epochs"]
    assert [(m["epoch"], m["step"]) for m in epochs] == [(1, 16), (2, 32)]
    assert latest(directory)["step"] == 32


def test_resume_with_no_checkpoint_starts_fresh(tmp_path):
    empty = tmp_path / "none-yet"
    args = ["--epochs", "1", "--batch-size", "500", "--checkpoint-dir", str(empty), "--resume"]
    status, out, err = _main(*args)
    assert status == 0, err
    assert err == f"jaxfeed: --resume: no checkpoint in {empty}; starting fresh\n"
    assert "epoch 1/1" in out
    assert latest(empty)["step"] == 8


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--resume"], "--resume needs --checkpoint-dir DIR"),
        (["--checkpoint-every", "5"], "--checkpoint-every needs --checkpoint-dir DIR"),
        (["--checkpoint-dir", "FILE"], r"--checkpoint-dir \S+ is a file; pick a directory"),
    ],
)
def test_checkpoint_flags_are_checked_before_any_work(tmp_path, args, message):
    (tmp_path / "file").write_text("")
    args = [str(tmp_path / "file") if a == "FILE" else a for a in args]
    status, out, err = _main(*args)
    assert status == 2 and out == ""
    assert re.match(f"jaxfeed: error: {message}", err), err


def _truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _edit_meta(checkpoint, edit, *, reseal):
    """Edits a checkpoint's meta.json; ``reseal``: and its own checksum to match."""
    meta = checkpoint / "meta" / "meta.json"
    saved = json.loads(meta.read_text())
    edit(saved)
    if reseal:
        saved["checksum"] = meta_checksum(saved)
    meta.write_text(json.dumps(saved))


def _wrong_checksum(checkpoint):
    # An array's recorded CRC-32 off by one, meta.json consistent: the array check tells.
    def flip(saved):
        saved["arrays"]["['state']['w']"]["crc32"] ^= 1

    _edit_meta(checkpoint, flip, reseal=True)


def _moved_on_by_two(checkpoint):
    def move(saved):
        saved["next_batch"] += 2  # would resume 2 batches later

    _edit_meta(checkpoint, move, reseal=False)


DAMAGE = {
    "truncated meta.json": (
        lambda c: _truncate(c / "meta" / "meta.json"),
        r"10/meta/meta\.json is",
    ),
    # Values that read back but are not the ones saved: only the checksum tells.
    # (Damaged array files: tests/training/test_resume.py, in a subprocess, since
    # Orbax's failed reads leave async callbacks that fire after the test.)
    "values not as saved": (_wrong_checksum, r"\['w'\] in .*10/state does not match its checksum"),
    # Edited by hand: meta.json's own checksum tells, before its position is used.
    "next_batch edited": (_moved_on_by_two, r"10/meta/meta\.json does not match its checksum"),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one(runs, tmp_path, damage):
    expected, _ = runs
    crashed = _crashed(runs, tmp_path)  # checkpoints of steps 8 and 10
    harm, named = DAMAGE[damage]
    harm(crashed / "10")
    fresh = ResumableStream()
    with pytest.warns(
        CheckpointFallbackWarning, match=rf"step 10: .*{named}.*resuming from step 8"
    ):
        resumed = _fit(fresh, crashed, resume=True, log=Logging(progress=False))
    # Step 8's state and stream state, then the same steps: the uninterrupted run's result.
    np.testing.assert_array_equal(np.asarray(resumed.state["w"]), np.asarray(expected.state["w"]))
    assert [m["loss"] for m in resumed.history] == [m["loss"] for m in expected.history]


def test_no_checkpoint_that_verifies_stops_the_run(runs, tmp_path):
    crashed = _crashed(runs, tmp_path)
    for step in ("8", "10"):
        _wrong_checksum(crashed / step)
    with pytest.raises(
        CheckpointError, match=r"no checkpoint in .*crashed verifies: step 10: .*; step 8"
    ):
        _fit(ResumableStream(), crashed, resume=True, log=Logging(progress=False))


def test_two_runs_cannot_write_one_directory(tmp_path):
    first = Checkpointer(Checkpointing(tmp_path / "run"), {}, {"processes": 1, "devices": 1})
    try:
        with pytest.raises(
            ValueError,
            match=rf"{tmp_path}/run is in use by another run \(host .*, pid {os.getpid()}, since",
        ):
            _fit(ResumableStream(), tmp_path / "run", log=Logging(progress=False))
    finally:
        first.close()
    _fit(
        ResumableStream(), tmp_path / "run", epochs=1, log=Logging(progress=False)
    )  # free again once closed


def test_a_one_device_checkpoint_resumes_on_eight_devices(tmp_path):
    rng = np.random.default_rng(1)
    data = {
        "x": rng.normal(size=(96, FEATURES)).astype(np.float32),
        "label": rng.integers(0, CLASSES, 96).astype(np.int32),
    }
    state = {"w": jnp.zeros((FEATURES, CLASSES), jnp.float32)}

    def run(epochs, devices, **kwargs):
        source = loaders.make("numpy", dataset=data, batch_size=BATCH, seed=3)
        return fit(
            _step, state, source, epochs=epochs, mesh=devices, log=Logging(progress=False), **kwargs
        )

    whole = run(3, jax.devices()[:1])
    run(1, jax.devices()[:1], checkpoint=tmp_path)
    changed = r"resuming on 1 process\(es\), 8 device\(s\) .* written on 1 process\(es\), 1 device"
    with pytest.warns(TopologyChangedWarning, match=changed):
        resumed = run(3, jax.devices(), checkpoint=tmp_path, resume=True)
    # The same global batches (the order depends on the global batch only);
    # 8 devices add each gradient's sum in another order: equal up to rounding.
    want, got = np.asarray(whole.state["w"]), np.asarray(resumed.state["w"])
    assert np.max(np.abs(got - want)) <= 1e-5 * np.max(np.abs(want))
    for a, b in zip(whole.history, resumed.history, strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5)


def test_a_failed_write_names_its_step_and_the_newest_complete_checkpoint(tmp_path):
    # The subprocess test fills a "disk" for real (test_resume.py); this one checks
    # which checkpoint the message says is still there.
    import errno

    checkpointer = Checkpointer(Checkpointing(tmp_path / "run"), {}, {"processes": 1, "devices": 1})
    state, totals = {"w": jnp.ones((4, 3))}, {"loss": jnp.zeros(())}
    kwargs = dict(epoch=0, history=[], data_state=None)
    try:
        assert checkpointer.save(3, state, totals, next_batch=3, **kwargs)
        checkpointer.wait()

        def full_disk(*args, **kwargs):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        checkpointer._manager.save = full_disk
        with pytest.raises(
            CheckpointError,
            match=r"could not write the checkpoint of step 6 in .*/run: No space left on device "
            r"\(errno 28\)\. Free space there .*; the newest complete checkpoint is step 3$",
        ):
            checkpointer.save(6, state, totals, next_batch=6, **kwargs)
    finally:
        checkpointer.close()
    assert latest(tmp_path / "run")["step"] == 3
