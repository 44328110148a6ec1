"""Helpers of the Ray tests (not tests themselves): transforms Ray workers run
(at module level, so a worker imports them by name), and the processes of a
Ray instance."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np
import psutil


def shifted(record: dict, rng: np.random.Generator) -> dict:
    """A random shift of every pixel and a random number per row: each row's
    draw shows in the batch."""
    image = record["image"] + rng.integers(0, 8, dtype=np.uint8)
    return {"image": image, "label": record["label"], "draw": rng.standard_normal(2)}


def shifted_or_stalled(directory: str, row: int, record: dict, rng: np.random.Generator) -> dict:
    """`shifted`, but ``row`` (its label) in epoch 1 first says which process
    runs it (the file ``stalled``) and waits until the file ``go`` exists: the
    test kills that process meanwhile. Ray runs the task again; by then ``go``
    exists."""
    root = Path(directory)
    if int(record["label"]) == row and (root / "epoch1").exists() and not (root / "go").exists():
        (root / "stalled.tmp").write_text(str(os.getpid()))
        (root / "stalled.tmp").rename(root / "stalled")
        while not (root / "go").exists():
            time.sleep(0.01)  # killed here
    return shifted(record, rng)


def dies_on_row_20(record: dict, rng: np.random.Generator) -> dict:
    """Kills its own worker on row 20 (every try): Ray gives up on that task."""
    if int(record["label"]) == 20:
        os._exit(1)
    return shifted(record, rng)


def ray_processes(pid: int) -> list[psutil.Process]:
    """Every process under ``pid`` (a Ray instance's GCS, raylet and workers)."""
    return psutil.Process(pid).children(recursive=True)


def worker_env() -> dict:
    """A runtime_env whose workers import what the tests import (this module,
    transform_helpers), as a user's cluster would get its code."""
    return {"env_vars": {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}}
