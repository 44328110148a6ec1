"""`jaxfeed compare --workload mixtures`: every row's realized shares counted
from its batches, jaxfeed's batches identical across backends, each
framework's own mixture beside them, and a tiny CLI run's table.

No timing assertions: rates are only checked to be present and positive.
"""

import json

import numpy as np
import pytest

from jaxfeed.cli import main
from jaxfeed.compare.workloads.mixtures.report import format_report
from jaxfeed.compare.workloads.mixtures.workload import (
    TIMED_EPOCHS,
    Mixtures,
    MixturesConfig,
)


@pytest.mark.slow  # four frameworks started, tf alone ~10 s
def test_every_row_realizes_the_weights_and_jaxfeed_agrees_across_backends():
    config = MixturesConfig(backends=("numpy", "grain", "tf", "hf"), batch_size=64, repeats=1)
    workload = Mixtures(config)
    rows = workload.rows()
    for row in rows:
        row.runs = [workload.measure(row, "pipeline", 0, warm_up=False)]
    result = workload.result(rows, ["compare"], 1.0)
    found = {(r["backend"], r["pipeline"]): r["runs"][0] for r in result["rows"]}
    assert set(found) == {
        ("numpy", "jaxfeed"), ("grain", "jaxfeed"), ("tf", "jaxfeed"), ("hf", "jaxfeed"),
        ("grain", "grain-mix"), ("tf", "tf-sample"), ("hf", "hf-interleave"),
    }  # fmt: skip
    assert result["same_batches"] is True
    low, high = (f"share digits {d}" for d in ("0-4", "5-9"))
    first = result["components"]["digits 0-4"]["rows"]
    for key, figures in found.items():
        assert figures[low] + figures[high] == pytest.approx(1.0), key
        assert figures["rows_per_s"] > 0 and figures["batches"] > 0, key
        # Within 4 sd of 0.7 over the rows read (a seeded draw, or jaxfeed's plan).
        sd = np.sqrt(0.7 * 0.3 / figures["rows"])
        assert abs(figures[low] - 0.7) < 4 * sd, (key, figures[low])
    # jaxfeed's epoch ends when the first component has been read once: its
    # rows in the timed epochs are exactly that many, each epoch.
    jaxfeed = found[("numpy", "jaxfeed")]
    assert round(jaxfeed[low] * jaxfeed["rows"]) == TIMED_EPOCHS * first
    text = format_report(result)
    assert "grain-mix" in text and "jaxfeed's batches across backends: identical" in text


def test_the_cli_runs_a_mixture_of_two_datasets_and_refuses_what_does_not_fit(tmp_path, capsys):
    out = tmp_path / "mix.json"
    args = ["compare", "--workload", "mixtures", "--loaders", "numpy", "--repeats", "1"]
    args += ["--warmup", "1", "--max-batches", "3", "--batch-size", "32", "--json", str(out)]
    assert main([*args, "--dataset", "mnist-sample", "--dataset", "mnist-sample"]) == 0
    result = json.loads(out.read_text())
    assert list(result["components"]) == ["mnist-sample", "mnist-sample 2"]
    assert result["config"]["weights"] == [0.7, 0.3]
    assert "mixtures workload" in capsys.readouterr().out
    assert main([*args, "--dataset", "mnist-sample"]) != 0  # one dataset is no mixture
    assert "give --dataset twice or more" in capsys.readouterr().err
    assert main([*args, "--weights", "1,2,3"]) != 0
    assert "2 datasets and 3 --weights" in capsys.readouterr().err
    assert main(["compare", "--dataset", "a", "--dataset", "b", "--workload", "copy"]) != 0
    assert "are for --workload mixtures" in capsys.readouterr().err
