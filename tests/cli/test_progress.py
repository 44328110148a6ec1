"""``jaxfeed train`` off a terminal: progress lines during an epoch, at the
default cadence and at ``--log-every``. None with ``--quiet``: test_cli.py's fresh
``--quiet`` runs check that (their stdout a pipe, not a terminal either)."""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 300


def _cli(tmp_path: Path, *args: str) -> str:
    """``jaxfeed train ARGS > file``: stdout is a file, not a terminal."""
    out = tmp_path / "log.txt"
    env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
    with out.open("w") as file:
        subprocess.run([sys.executable, "-m", "jaxfeed", "train", "--batch-size", "256", *args],
                       stdout=file, stderr=subprocess.STDOUT, env=env, timeout=TIMEOUT,
                       check=True)  # fmt: skip
    return out.read_text()


def test_off_a_terminal_the_cli_prints_progress_during_the_first_epoch(tmp_path):
    lines = _cli(tmp_path, "--epochs", "2").splitlines()
    progress = [i for i, line in enumerate(lines) if line.startswith("epoch 1/2  batch ")]
    end = next(i for i, line in enumerate(lines) if line.startswith("epoch 1/2  loss "))
    # 16 batches: a line about every 10% of the epoch, all before its end.
    assert len(progress) >= 5 and max(progress) < end, lines
    assert "loss " in lines[progress[0]] and "samples/s" in lines[progress[0]]
    every_4 = [line for line in _cli(tmp_path, "--epochs", "1", "--log-every", "4").splitlines()
               if line.startswith("epoch 1/1  batch ")]  # fmt: skip
    assert [line.split()[3] for line in every_4] == ["4/16", "8/16", "12/16"]
