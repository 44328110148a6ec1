"""benchmarks/sequences.py runs end to end at tiny sizes (its --quick mode),
so a change to make(pack=/bucket=) or to Grain's packers' API that breaks it
shows here rather than at the next measurement."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_sequences_benchmark_quick(tmp_path: Path) -> None:
    command = [sys.executable, "benchmarks/sequences.py", "--quick", "--backends", "numpy"]
    command += ["--parts", "pack,speed,resume", "--out", str(tmp_path)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    record = json.loads((tmp_path / "sequences-cpu.json").read_text())
    for row in record["pack"]:
        assert 0.5 < row.get("jaxfeed", row.get("grain")) <= 1.0, row
    assert {r["pipeline"] for r in record["speed"]} == {"jaxfeed numpy", "grain BestFitPack"}
    assert record["resume"]["batches_per_epoch"][0] > 200
    assert (tmp_path / "sequences-cpu.txt").read_text().count("|") > 20
