"""A feed left open must never abort the interpreter at exit (tf.data did)."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# Subprocesses, kills and whole training runs: the full suite (CI) runs it, the
# quick tier (-m "not slow") does not.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]

_SCRIPT = """
from jaxfeed import loaders
from jaxfeed.sharding import DeviceFeed, data_mesh

source = loaders.make({backend!r}, dataset="mnist-sample", batch_size=64)
feed = DeviceFeed(source, data_mesh(), {options})
for i, batch in enumerate(feed):
    if i == 2:
        {ending}
print("left the loop", flush=True)
"""


ENDINGS = [("break", 0), ("raise SystemExit(3)", 3), ("raise ValueError('boom')", 1)]
# Each case is a fresh interpreter. tf, whose feed aborted, gets every ending with
# and without a host buffer; the other backends a covering design: every ending
# on each, and each with and without the buffer.
CASES = [
    *(("tf", options, *ending) for options in ("", "host_buffer=2") for ending in ENDINGS),
    ("numpy", "", *ENDINGS[0]),
    ("numpy", "host_buffer=2", *ENDINGS[1]),
    ("numpy", "", *ENDINGS[2]),
    ("hf", "host_buffer=2", *ENDINGS[0]),
    ("hf", "", *ENDINGS[1]),
    ("hf", "host_buffer=2", *ENDINGS[2]),
]


@pytest.mark.parametrize(("backend", "options", "ending", "status"), CASES)
def test_a_feed_left_open_exits_with_the_scripts_own_status(
    backend, options, ending, status, tmp_path
):
    script = _SCRIPT.format(backend=backend, options=options, ending=ending)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == status, done.stderr[-2000:]
    assert "terminate called" not in done.stderr
