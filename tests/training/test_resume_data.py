"""What a resume checks about the data (issue 29, item 4): a checkpoint records
the content fingerprint of each split, so ``--resume`` after the dataset's files
were rewritten in place is refused by name, and accepted with
``--resume-changed-data``; the same data given by a relative path, or moved,
resumes."""

import os
import re
import shutil
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import sample_digits
from resume_worker import train_in_process

from jaxfeed import Checkpointing, Logging, fit, loaders
from jaxfeed.training.checkpoint import latest
from jaxfeed.training.verify import ChangedDataWarning

ROWS = 512


def _save(directory):
    images, digits = sample_digits()
    for split, rows in (("train", slice(0, ROWS)), ("test", slice(ROWS, ROWS + 256))):
        (directory / split).mkdir(parents=True)
        np.save(directory / split / "image.npy", images[rows, :, :, None])
        np.save(directory / split / "label.npy", digits[rows].astype(np.int32))
    return directory


def _train(*argv):
    return train_in_process("--devices", "1", "--batch-size", "128", *argv)


@pytest.fixture(scope="module")
def one_epoch(tmp_path_factory):
    """A dataset directory and the checkpoints of one epoch trained on it."""
    root = tmp_path_factory.mktemp("resume-data")
    data, checkpoints = _save(root / "data"), root / "checkpoints"
    argv = ["--epochs", "1", "--dataset", str(data), "--checkpoint-dir", str(checkpoints)]
    status, _, err = _train(*argv)
    assert status == 0, err
    return data, checkpoints


def _copies(one_epoch, tmp_path):
    data, checkpoints = one_epoch
    return (
        shutil.copytree(data, tmp_path / "data", copy_function=shutil.copy2),
        shutil.copytree(checkpoints, tmp_path / "checkpoints"),
    )


def test_the_same_data_by_a_relative_path_or_moved_resumes(one_epoch, tmp_path, monkeypatch):
    moved, checkpoints = _copies(one_epoch, tmp_path)  # another path, inode and ctime
    monkeypatch.chdir(tmp_path)
    argv = ["--dataset", "data", "--checkpoint-dir", str(checkpoints), "--resume"]
    status, out, err = _train(*argv, "--epochs", "2")
    assert status == 0, err
    assert f"resuming from step 4 (epoch 2, batch 0) in {checkpoints}" in out
    assert "epoch 2/2" in out and err == ""
    assert latest(checkpoints)["data"]["train"]["read_from"] == str(moved)


def test_resume_on_data_rewritten_in_place_is_refused_by_name_unless_asked(one_epoch, tmp_path):
    data, checkpoints = _copies(one_epoch, tmp_path)
    labels = data / "train" / "label.npy"
    kept = os.stat(labels)
    np.save(labels, (np.load(labels) + 1) % 10)  # in place, the same size
    os.utime(labels, ns=(kept.st_atime_ns, kept.st_mtime_ns))  # and its time put back
    argv = ["--dataset", str(data), "--checkpoint-dir", str(checkpoints), "--resume"]

    status, out, err = _train(*argv, "--epochs", "2")
    assert status == 2 and "epoch 2/2" not in out
    assert re.match(
        rf"jaxfeed: error: checkpoint {checkpoints}/4 was written by a run that read other "
        rf"data: train data: fingerprint \w{{16}} then, \w{{16}} now \(fields changed: "
        rf"label\), read from {one_epoch[0]} then, {data} now\. Resume on the data it was "
        r"written with; or continue on this data on purpose with --resume-changed-data",
        err,
    ), err
    assert "test data" not in err  # the test split did not change

    with warnings.catch_warnings():  # shown as the command shows it, not raised
        warnings.simplefilter("default", ChangedDataWarning)
        status, out, err = _train(*argv, "--epochs", "2", "--resume-changed-data")
    assert status == 0, err
    assert "resuming from step 4 (epoch 2, batch 0)" in out and "epoch 2/2" in out
    assert re.match(
        rf"jaxfeed: warning: resuming checkpoint {checkpoints}/4 on changed data, as asked: "
        r"train data: fingerprint \w+ then, \w+ now \(fields changed: label\)",
        err,
    ), err
    # The new checkpoints vouch for the data now read: a plain resume goes on.
    status, out, err = _train(*argv, "--epochs", "3")
    assert status == 0 and "epoch 3/3" in out, err


def _step(state, batch):
    return state, {"count": jnp.sum(batch["mask"].astype(jnp.float32))}


def test_fit_refuses_a_checkpoint_of_other_data_unless_asked(tmp_path):
    train = loaders.make("numpy", dataset={"x": np.zeros((64, 2), np.float32)}, batch_size=32)
    state = {"w": jnp.zeros(2)}

    def run(epochs, data, **given):
        checkpoint = Checkpointing(tmp_path, data=data, **given)
        common = dict(mesh=jax.devices()[:1], log=Logging(progress=False))
        return fit(_step, state, train, epochs=epochs, checkpoint=checkpoint, resume=True, **common)

    run(1, {"train": "aaaa"})
    with pytest.raises(
        ValueError,
        match=r"read other data: train data: fingerprint aaaa then, bbbb.*on purpose with "
        r"Checkpointing\(accept_changed_data=True\); or use another checkpoint directory",
    ):
        run(2, {"train": "bbbb"})
    with pytest.warns(ChangedDataWarning, match="on changed data, as asked: train data"):
        assert len(run(2, {"train": "bbbb"}, accept_changed_data=True).history) == 2
    assert latest(tmp_path)["data"] == {"train": "bbbb"}
