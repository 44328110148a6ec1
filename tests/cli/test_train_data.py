"""``jaxfeed train`` on a user's directory says what it read and refuses, before
the first step, what the example MLP cannot train on."""

import json

import numpy as np
import pytest
from conftest import sample_digits

from jaxfeed.cli import main


def _save(directory, labels=None, fields=("image", "label")):
    images, digits = sample_digits()
    directory.mkdir(parents=True, exist_ok=True)
    arrays = {"image": images[:512, :, :, None], "label": digits[:512].astype(np.int32)}
    if labels is not None:
        arrays["label"] = labels
    for name in fields:
        np.save(directory / f"{name}.npy", arrays[name])


def test_a_directory_without_a_test_split_trains_and_says_it_has_no_test_data(
    tmp_path, capsys, monkeypatch
):
    _save(tmp_path / "flat")
    out = tmp_path / "run.json"
    monkeypatch.chdir(tmp_path)  # given relatively, named by its absolute path
    assert main(["train", "--dataset", "flat", "--epochs", "1", "--quiet", "--json", str(out)]) == 0
    said = capsys.readouterr().out
    assert "no test data, so no test accuracy: flat has no 'test' split" in said
    assert f"dataset={tmp_path / 'flat'} " in said and "fallback" not in said
    assert "test_acc -" in said
    record = json.loads(out.read_text())
    assert record["epochs"][0]["test_accuracy"] is None  # never the training rows' accuracy
    assert record["dataset"] == str(tmp_path / "flat")


def test_labels_outside_the_models_classes_are_refused_before_training(tmp_path, capsys):
    _save(tmp_path / "d" / "train", labels=np.arange(512, dtype=np.int32) % 100)
    _save(tmp_path / "d" / "test")
    assert main(["train", "--dataset", str(tmp_path / "d"), "--epochs", "1", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "the train labels of" in err and "hold 0..99, but jaxfeed train's MLP has 10" in err


@pytest.mark.parametrize("split", ["train", "test"])
def test_a_missing_field_is_named_before_training(tmp_path, capsys, split):
    for name in ("train", "test"):
        _save(tmp_path / "d" / name, fields=("image",) if name == split else ("image", "label"))
    assert main(["train", "--dataset", str(tmp_path / "d"), "--epochs", "1", "--quiet"]) == 2
    said = capsys.readouterr()
    assert f"the {split} split of" in said.err
    assert "has no 'label' field (it has ['image'])" in said.err
    assert "epoch 1/1" not in said.out  # refused before the first epoch
