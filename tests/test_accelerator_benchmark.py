"""benchmarks/accelerator.sh runs end to end on the CPU at tiny sizes (its
--quick mode) and writes every figure it is meant to, so the script a GPU
machine runs once is known to work before that machine is booked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_accelerator_script_quick_writes_every_figure(tmp_path: Path) -> None:
    command = ["bash", "benchmarks/accelerator.sh", "--quick", "--out-dir", str(tmp_path)]
    env = dict(os.environ, PYTHON=sys.executable)
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (written,) = tmp_path.glob("accelerator-*.json")
    assert written.name == "accelerator-cpu.json"  # the device's name
    record = json.loads(written.read_text())
    assert {"command", "git", "device", "platform", "load_average"} <= set(record)
    (results,) = record["results"]
    (step,) = results["train_step"]
    assert step["step_ms"] > 0 and step["feed_step_over_step"] > 0
    for k in ("k=1", "k=8"):
        assert 0 <= step["mlp"][k]["data_wait_fraction"] <= 1
    (rates,) = results["bandwidth"]
    for key in ("feed_bytes_per_s", "bare_device_put_bytes_per_s", "copy_bytes_per_s"):
        assert rates[key] > 0
    assert rates["feed_over_bare"] > 0 and rates["feed_over_copy"] > 0
    (backend,) = results["backends"]
    assert backend["backend"] == "numpy" and backend["feed_epoch_s"] > 0
    assert backend["train"]["epoch_seconds"] > 0
