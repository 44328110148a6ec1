"""benchmarks/object_storage.py runs end to end at tiny sizes (its --quick
mode, against moto through the capped proxy), so a change to reading
``s3://`` URLs or to the proxy that breaks it shows here rather than at the
next measurement."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_object_storage_benchmark_quick(tmp_path: Path) -> None:
    command = [sys.executable, "benchmarks/object_storage.py", "--quick", "--out", str(tmp_path)]
    command += ["--parts", "blocks,permutation,peers,memory,faults", "--peers", "pyarrow"]
    command += ["--small-batches", "1", "--fault-batches", "1", "--every", "8"]
    command += ["--cache-mb", "1", "--dir", str(tmp_path)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    record = json.loads((tmp_path / "object-storage-cpu.json").read_text())
    rows = record["blocks"] + record["permutation"] + record["faults"]
    assert len(rows) == 5 and all(r["identical"] for r in rows), rows
    assert all(0 < r["of_cap"] < 1.2 for r in record["blocks"]), record["blocks"]
    assert record["peers"][0]["rows"] == record["data"]["rows"]
    memory = record["memory"]
    assert memory["read_in_place"] and memory["peak_cache_dir_bytes"] <= memory["cache_bytes"]
    assert sum(record["faults"][1]["faults"].values()) > 0, record["faults"]
    assert (tmp_path / "object-storage-cpu.md").read_text().count("| yes |") >= 3
