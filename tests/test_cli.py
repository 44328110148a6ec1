"""The `jaxfeed` command line."""

import json
import subprocess
import sys

import pytest

from trainer.cli import main


def test_train_prints_metrics_and_writes_json(tmp_path, capsys):
    out = tmp_path / "metrics.json"
    assert (
        main(["train", "--epochs", "2", "--batch-size", "256", "--quiet", "--json", str(out)]) == 0
    )
    printed = capsys.readouterr().out
    assert "loader=numpy dataset=mnist-sample" in printed
    assert "epoch 2/2" in printed and "data-wait" in printed and "samples/s" in printed
    record = json.loads(out.read_text())
    assert record["loader"] == "numpy" and record["config"]["epochs"] == 2
    assert [m["epoch"] for m in record["epochs"]] == [1, 2]
    for m in record["epochs"]:
        assert 0 <= m["test_accuracy"] <= 1 and 0 <= m["data_wait_fraction"] <= 1


def test_backends_lists_every_backend(capsys):
    assert main(["backends"]) == 0
    printed = capsys.readouterr().out
    for name in ("numpy", "torch", "tf", "grain", "hf"):
        assert name in printed


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--loader", "nope"], r"unknown backend 'nope'; choose one of \['grain', 'hf', 'numpy'"),
        (["--dataset", "fashion"], "fashion"),
        (["--batch-size", "5000"], "larger than the split's 4000 examples"),
    ],
)
def test_bad_input_is_a_clear_error(args, match):
    with pytest.raises(ValueError, match=match):
        main(["train", "--epochs", "1", "--quiet", *args])


@pytest.mark.parametrize(
    "args", [["--batch-size", "0"], ["--epochs", "-1"], ["--loader-option", "x"]]
)
def test_argument_errors_exit_with_usage(args, capsys):
    with pytest.raises(SystemExit):
        main(["train", *args])
    assert "error" in capsys.readouterr().err


def test_python_dash_m_and_devices_flag():
    # A subprocess, because --devices must set XLA_FLAGS before jax is imported.
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer",
            "train",
            "--epochs",
            "1",
            "--batch-size",
            "96",
            "--devices",
            "3",
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "HOME": "/tmp", "JAX_PLATFORMS": "cpu"},
    )
    assert result.returncode == 0, result.stderr
    assert "devices=3 (cpu)" in result.stdout and "epoch 1/1" in result.stdout
