"""`jaxfeed compare --workload sequences`: every row reads every token, jaxfeed's
batches agree across backends, and a tiny CLI run renders its table.

No timing assertions: figures are only checked to be present and sane.
"""

import json

import numpy as np
import pytest

from jaxfeed import loaders
from jaxfeed.cli import main
from jaxfeed.compare.workloads.sequences import corpus, idioms
from jaxfeed.compare.workloads.sequences.report import format_report
from jaxfeed.compare.workloads.sequences.workload import (
    TIMED_EPOCHS,
    SequencesConfig,
    measure,
    pipelines,
    same_batches,
)

BATCH = 16
ROWS = 160  # a slice of the corpus: whole epochs stay fast


@pytest.fixture(scope="module")
def rows_and_plan():
    rows = corpus.token_rows()[:ROWS]
    buckets = loaders.Bucket().resolved(np.array([len(r) for r in rows])).lengths
    return rows, idioms.Plan(BATCH, 0, corpus.MAX_TOKENS, buckets)


def test_the_corpus_is_real_text_of_many_lengths():
    rows = corpus.token_rows()
    lengths = np.array([len(r) for r in rows])
    assert len(rows) > 2000 and lengths.min() >= corpus.MIN_TOKENS
    assert lengths.max() == corpus.MAX_TOKENS and np.median(lengths) < corpus.MAX_TOKENS / 2
    assert all(r.dtype == np.int32 and r.min() >= 1 and r.max() <= 256 for r in rows)
    assert (rows[0] - 1).astype(np.uint8).tobytes() == corpus.paragraphs()[0].encode()


def test_every_row_reads_every_token_and_jaxfeed_agrees_across_backends(rows_and_plan):
    rows, plan = rows_and_plan
    config = SequencesConfig(backends=("numpy", "grain", "torch", "hf"), batch_size=BATCH)
    measured = pipelines(config, rows, plan)
    for row in measured:
        row.runs = [measure(row, None, warm_up=False)]
    found = {(r.backend, r.name, r.layout.split()[0]): r.runs[0] for r in measured}
    tokens = sum(len(r) for r in rows) * (1 + TIMED_EPOCHS)
    assert {key[1] for key in found} == {
        "jaxfeed", "grain-first-fit", "grain-best-fit", "torch-pad-sequence", "hf-dynamic-padding"
    }  # fmt: skip
    for key, figures in found.items():
        assert figures["tokens"] == tokens, key  # none lost, none read twice
        assert 0 <= figures["padding_fraction"] < 1 and figures["tokens_per_s"] > 0, key
    # jaxfeed: static shapes, one per bucket; dynamic padding: a shape per longest row.
    for backend in ("numpy", "grain", "torch", "hf"):
        assert found[(backend, "jaxfeed", "pad")]["shapes"] == 1
        assert found[(backend, "jaxfeed", "pack")]["shapes"] == 1
        assert 1 < found[(backend, "jaxfeed", "bucket")]["shapes"] <= len(plan.buckets)
    assert found[("torch", "torch-pad-sequence", "pad")]["shapes"] > 3
    assert found[("hf", "hf-dynamic-padding", "pad")]["shapes"] > 3
    with loaders.make("numpy", dataset={"input_ids": rows}, batch_size=BATCH, pad=512) as source:
        expected = source.padding_fraction(0)
    assert found[("numpy", "jaxfeed", "pad")]["padding_fraction"] == pytest.approx(expected)
    entries = [{"pipeline": r.name, "layout": r.layout, "runs": r.runs} for r in measured]
    assert same_batches(entries) == {"pad": True, "bucket": True, "pack": True}
    digests = {found[(b, "jaxfeed", "pack")]["digest"] for b in ("numpy", "grain")}
    assert len(digests) == 1 and digests != {found[("numpy", "jaxfeed", "pad")]["digest"]}


def test_a_tiny_cli_run_writes_its_table_and_json(tmp_path, capsys):
    out = tmp_path / "sequences.json"
    tiny = ["--batch-size", "8", "--max-batches", "2", "--repeats", "1", "--warmup", "0"]
    argv = ["compare", "--workload", "sequences", "--loaders", "numpy,grain", *tiny]
    argv += ["--json", str(out)]
    assert main(argv) == 0
    result = json.loads(out.read_text())
    assert capsys.readouterr().out.strip() == format_report(result)  # the JSON re-renders
    names = [(r["backend"], r["pipeline"]) for r in result["rows"]]
    assert names == [("numpy", "jaxfeed")] * 3 + [("grain", "jaxfeed")] * 3 + [
        ("grain", "grain-first-fit"), ("grain", "grain-best-fit")
    ]  # fmt: skip
    assert result["same_batches"] == {"pad": True, "bucket": True, "pack": True}
    for row in result["rows"]:
        (run,) = row["runs"]
        assert run["batches"] == 2 * (1 + TIMED_EPOCHS) and run["first_batch_s"] > 0


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--workers", "0,1"], "drop --workers and --train-epochs"),
        (["--train-epochs", "3"], "drop --workers and --train-epochs"),
        (["--dataset", "mnist"], "drop --dataset, --data-dir and --plot"),
        (["--plot", "x.png"], "drop --dataset, --data-dir and --plot"),
    ],
)
def test_flags_of_other_workloads_are_refused(flags, message, capsys):
    assert main(["compare", "--workload", "sequences", "--loaders", "numpy", *flags]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.slow  # imports TensorFlow
def test_tf_idioms_read_every_token_and_bucket_to_jaxfeeds_lengths(rows_and_plan):
    rows, plan = rows_and_plan
    padded = list(idioms.tf_padded_batch(rows, plan)(0))
    bucketed = list(idioms.tf_bucket_by_sequence_length(rows, plan)(0))
    for batches in (padded, bucketed):
        assert sum(np.count_nonzero(b["input_ids"]) for b in batches) == sum(map(len, rows))
    assert {b["input_ids"].shape[1] for b in bucketed} <= set(plan.buckets)
    assert len({b["input_ids"].shape for b in padded}) > 3
