"""A `.npy` file cut short under a live source is named when an epoch starts,
instead of killing the process with SIGBUS and no word at the first read."""

import subprocess
import sys

import numpy as np
import pytest

BACKENDS = ["numpy", "torch", "tf", "grain", "hf"]

# In a process of its own: were the check gone, SIGBUS would end it, not pytest.
_CUT_SHORT = r"""
import os, sys
from pathlib import Path
from jaxfeed import loaders

directory = Path(sys.argv[2])
source = loaders.make(sys.argv[1], dataset=directory, batch_size=64)
next(iter(source.iter_epoch(0)))
path = directory / "x.npy"
os.truncate(path, path.stat().st_size // 2)  # another job rewriting it, say
try:
    for batch in source.iter_epoch(1):
        pass
except ValueError as error:
    print(error)
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_file_cut_short_under_a_live_source_is_named(tmp_path, backend):
    directory = tmp_path / "data"
    directory.mkdir()
    np.save(directory / "x.npy", np.arange(4096 * 64, dtype=np.float32).reshape(4096, 64))
    np.save(directory / "label.npy", np.zeros(4096, np.int32))
    run = subprocess.run(
        [sys.executable, "-c", _CUT_SHORT, backend, str(directory)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, f"status {run.returncode}: {run.stderr[-2000:]}"
    assert "field 'x': " in run.stdout and "x.npy holds" in run.stdout, run.stdout
    assert "cut short after it was opened" in run.stdout
