"""`jaxfeed compare --workload decode`: a tiny run in a fresh process, checked
row by row, and the CPU and memory accounting of worker processes it relies on.

No timing assertions: figures are only checked to be present and sane.
"""

import json
import math
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from jaxfeed.cli import main
from jaxfeed.compare import processes
from jaxfeed.compare.workloads.decode.idioms import Records, tf_numpy_function
from jaxfeed.compare.workloads.decode.report import format_report, ratios_and_targets
from jaxfeed.compare.workloads.decode.workload import DecodeConfig, pipelines

BATCH, BATCHES = 32, 3
# A child that burns CPU for a while, then holds 200 MB until it is killed.
BUSY_CHILD = (
    "import time\n"
    "end = time.process_time() + 0.5\n"
    "while time.process_time() < end: pass\n"
    "block = bytearray(200 << 20)\n"
    "block[::4096] = b'x' * len(block[::4096])\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)


def _positive(value) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


@pytest.fixture(scope="module")
def decode_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("decode") / "result.json"
    command = [
        sys.executable,
        "-m",
        "jaxfeed",
        "compare",
        "--workload",
        "decode",
        "--loaders",
        "numpy,torch",
        "--workers",
        "0,1",
        "--batch-size",
        str(BATCH),
        "--max-batches",
        str(BATCHES),
        "--repeats",
        "1",
        "--warmup",
        "0",
        "--train-epochs",
        "1",
        "--devices",
        "1",
        "--json",
        str(out),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=os.environ)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text()), done.stdout


@pytest.mark.slow  # a subprocess that spawns workers and trains
def test_a_row_per_backend_and_worker_count_and_per_idiom(decode_run):
    result, printed = decode_run
    rows = {(r["backend"], r["pipeline"], r["workers"]) for r in result["rows"]}
    assert rows == {
        ("numpy", "jaxfeed", 0),
        ("numpy", "jaxfeed", 1),
        ("numpy", "python-loop", 0),  # one process only: the ceiling of that work
        ("torch", "jaxfeed", 0),
        ("torch", "jaxfeed", 1),
        ("torch", "torch-dataloader", 0),
        ("torch", "torch-dataloader", 1),
    }
    assert result["workload"] == "decode" and result["timed_batches"] == BATCHES
    for row in result["rows"]:
        (run,) = row["runs"]
        where = (row["backend"], row["pipeline"], row["workers"])
        assert run["samples"] == BATCH * BATCHES, where
        for key in ("samples_per_s", "cores_busy", "first_batch_s", "peak_mb", "epoch_s"):
            assert _positive(run[key]), (where, key)
            assert row["median"][key] == run[key], (where, key)
        assert 0 <= run["data_wait_fraction"] <= 1, where
        # Workers are processes of their own, and counted as such.
        assert (run["worker_processes"] > 0) == (row["workers"] > 0), where
        assert (run["peak_workers_mb"] > 0) == (row["workers"] > 0), where
    assert set(result["ratios"]["vs_idiom"]) == {"numpy", "torch"}
    assert set(result["ratios"]["vs_idiom"]["torch"]) == {"0", "1"}
    assert printed.strip() == format_report(result)  # the JSON re-renders the table


def test_workers_belong_to_the_decode_workload(capsys):
    assert main(["compare", "--loaders", "numpy", "--workers", "0,1"]) == 2
    assert "--workers is for --workload decode" in capsys.readouterr().err
    assert main(["compare", "--workload", "decode", "--loaders", "numpy", "--plot", "x.png"]) == 2
    assert "drop --dataset and --plot" in capsys.readouterr().err


@pytest.mark.parametrize("text", ["", "a", "1,-1"])
def test_worker_counts_are_checked(text, capsys):
    with pytest.raises(SystemExit):
        main(["compare", "--workload", "decode", "--workers", text])
    assert "worker counts >= 0" in capsys.readouterr().err


def test_cpu_and_memory_of_live_workers_are_counted():
    before = processes.cpu_seconds()
    with (
        processes.PeakMemory() as memory,
        subprocess.Popen([sys.executable, "-c", BUSY_CHILD], stdout=subprocess.PIPE) as child,
    ):
        try:
            assert child.stdout.readline().strip() == b"ready"
            time.sleep(2 * processes.SAMPLE_S)
            assert child.pid in processes.descendants()
            # Still running, so getrusage(RUSAGE_CHILDREN) does not see it yet.
            assert processes.cpu_seconds() - before >= 0.4
            memory.sample()
        finally:
            child.kill()
            child.wait()
    assert memory.workers == 1
    assert memory.children_mb >= 200
    assert memory.total_mb == pytest.approx(memory.self_mb + memory.children_mb)
    assert np.isfinite(memory.added_mb)


def test_tf_gets_a_row_of_the_same_transform_beside_its_native_idiom():
    records = Records([b""] * 4, np.zeros(4, np.int32))
    config = DecodeConfig(backends=("tf",), workers=(0, 2))
    rows = [(r.backend, r.name, r.workers) for r in pipelines(config, records)]
    assert rows == [
        ("tf", "jaxfeed", 0),
        ("tf", "tf-data", 0),
        ("tf", "tf-numpy-function", 0),
        ("tf", "jaxfeed", 2),
        ("tf", "tf-data", 2),
        ("tf", "tf-numpy-function", 2),
        ("tf", "tf-data", "auto"),
    ]


def test_vs_idiom_is_against_the_native_idiom_and_tf_workers_must_scale():
    speeds = {("jaxfeed", 1): 50.0, ("jaxfeed", 2): 95.0, ("tf-data", 1): 100.0,
              ("tf-data", 2): 100.0, ("tf-numpy-function", 1): 50.0,
              ("tf-numpy-function", 2): 50.0}  # fmt: skip
    rows = [{"backend": "tf", "pipeline": p, "workers": w, "median": {"samples_per_s": s}}
            for (p, w), s in speeds.items()]  # fmt: skip
    ratios, targets = ratios_and_targets(rows)
    assert ratios["vs_idiom"]["tf"] == {"1": 0.5, "2": 0.95}
    assert ratios["speedup_2_vs_1"]["tf"] == {"jaxfeed": 1.9, "tf-data": 1.0,
                                              "tf-numpy-function": 1.0}  # fmt: skip
    scaling = [t for t in targets if t["row"] == "tf jaxfeed"]
    assert len(scaling) == 1 and scaling[0]["met"]


def test_on_files_every_backend_is_against_the_formats_own_reader():
    rows = [{"backend": b, "pipeline": p, "workers": w, "median": {"samples_per_s": s}}
            for b, p, w, s in [("hf", "jaxfeed", 0, 90.0), ("grain", "jaxfeed", 0, 120.0),
                               ("tf", "jaxfeed", 2, 50.0), ("tf", "TFRecordDataset", 0, 100.0),
                               ("tf", "TFRecordDataset", 2, 100.0)]]  # fmt: skip
    ratios, targets = ratios_and_targets(rows, ("tf", "TFRecordDataset"))
    assert ratios["vs_idiom"] == {"hf": {"0": 0.9}, "grain": {"0": 1.2}, "tf": {"2": 0.5}}
    assert [t["met"] for t in targets] == [False, True, False]
    assert all("own reader" in t["target"] for t in targets)


def test_the_tf_numpy_function_row_runs_the_python_augment():
    from transform_helpers import encoded_digits

    records = Records.of(encoded_digits(8))
    stream = tf_numpy_function(records, 4, 0, 2)
    batch = next(stream)
    stream.close()
    assert batch["image"].shape == (4, 56, 56, 3) and batch["image"].dtype == np.float32
    assert batch["label"].dtype == np.int32
