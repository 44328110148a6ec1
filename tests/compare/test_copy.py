"""`jaxfeed compare`: one tiny in-process run, checked field by field.

No timing assertions: the figures are only checked to be present and sane
(positive, finite, fractions in [0, 1]).
"""

import concurrent.futures
import contextlib
import copy
import io
import json
import math
import re

import numpy as np
import pytest
from jaxfeed.loaders._doors.tf import import_tensorflow
from jaxfeed.loaders.backends import registry

from jaxfeed import loaders
from jaxfeed.cli import main
from jaxfeed.compare.workloads.copy.report import format_report

# Subprocesses, kills and whole training runs: the full suite (CI) runs it, the
# quick tier (-m "not slow") does not.
pytestmark = pytest.mark.slow

BACKENDS = sorted(registry.everyday())  # compare's default rows (ray runs when named)
TUTORIALS = {
    "torch": ["torch-dataloader"],
    "tf": ["tf-data"],
    "grain": ["grain-dataloader", "grain-mapdataset"],
    "hf": ["hf-iter"],
}
WRAPPED = {  # each wrap row's bare loop: the tutorial row that iterates the same object
    "torch": "torch-dataloader",
    "tf": "tf-data",
    "grain": "grain-mapdataset",
    "hf": "hf-iter",
}
BATCH, BATCHES = 64, 3
FRESH = dict(
    dataset="mnist-sample", data_dir=None, batch_size=BATCH, seed=0, epochs=1, max_batches=1
)


def _strict_json(text: str) -> dict:
    def reject(constant: str) -> None:
        raise ValueError(f"JSON holds {constant}, which is not valid JSON")

    return json.loads(text, parse_constant=reject)


def _measured_two_at_a_time():
    """`fresh.measure` for the 12 fresh processes the run below asks for (4 frameworks x
    3 sides), all run first, two at a time, instead of one after another: each is a real
    child, but the parent sits idle while it imports and trains, and 12 in a row took
    ~4 minutes on 2 cores. Their figures are only checked for presence and sanity."""
    from jaxfeed.compare.workloads.copy import fresh

    settings = dict(FRESH, batch_size=BATCH, max_batches=BATCHES)
    specs = [fresh.spec(side, f, **settings) for f in WRAPPED for side in fresh.SIDES]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        done = dict(zip(map(json.dumps, specs), pool.map(fresh.measure, specs), strict=True))

    def measure(what: dict, timeout: float = fresh.TIMEOUT_S) -> dict:
        assert json.dumps(what) in done, f"compare asked for a run not started above: {what}"
        return done[json.dumps(what)]

    return measure


@pytest.fixture(scope="module")
def compare(tmp_path_factory):
    out = tmp_path_factory.mktemp("compare")
    args = [
        "compare",
        "--batch-size",
        str(BATCH),
        "--max-batches",
        str(BATCHES),
        "--repeats",
        "1",
        "--warmup",
        "1",
        "--train-epochs",
        "1",
        "--devices",
        "2",
        "--json",
        str(out / "result.json"),
        "--plot",
        str(out / "result.png"),
    ]
    printed = io.StringIO()
    with pytest.MonkeyPatch.context() as env, contextlib.redirect_stdout(printed):
        # Keras imported here on TensorFlow (unless this process already has
        # it), as `import tensorflow` does: what once made the Keras rows skip.
        env.setenv("KERAS_BACKEND", "tensorflow")
        import_tensorflow()
        import keras

        parent_keras = keras.backend.backend()
        # The fresh processes compile the same steps: a shared cache saves ~1 s each.
        env.setenv("JAX_COMPILATION_CACHE_DIR", str(out / "jax-cache"))
        env.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
        env.setattr("jaxfeed.compare.workloads.copy.fresh.measure", _measured_two_at_a_time())
        assert main(args) == 0
    result = _strict_json((out / "result.json").read_text())
    assert result["command"] == ["jaxfeed", *args]
    result["parent_keras_backend"] = parent_keras
    return result, out / "result.png", printed.getvalue()


def _positive(value) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


def test_every_backend_and_baseline_is_present(compare):
    result, _, _ = compare
    assert sorted(result["backends"]) == BACKENDS
    expected = ["in-memory", *(t for b in BACKENDS for t in TUTORIALS.get(b, []))]
    assert sorted(result["baselines"]) == sorted(expected)
    for name, row in {**result["backends"], **result["baselines"]}.items():
        assert row["kind"] == ("backend" if name in BACKENDS else "baseline")
        assert isinstance(row["description"], str) and row["description"]


def test_throughput_figures_are_sane(compare):
    result, _, _ = compare
    for name, row in {**result["backends"], **result["baselines"]}.items():
        assert len(row["runs"]) == 1, name
        run = row["runs"][0]
        for stage in ("loader", "feed"):
            # 3 full batches of 64 from a 4,000-example split: no padding.
            assert run[f"{stage}_samples"] == BATCH * BATCHES, (name, stage)
            for key in ("seconds", "samples_per_s", "mb_per_s"):
                assert _positive(run[f"{stage}_{key}"]), (name, stage, key)
                assert row["median"][f"{stage}_{key}"] == run[f"{stage}_{key}"]


def test_training_figures_are_sane_and_identical_across_backends(compare):
    result, _, _ = compare
    trained = {**result["backends"], "in-memory": result["baselines"]["in-memory"]}
    for name, row in trained.items():
        median = row["median"]
        assert _positive(median["epoch_s"]), name
        assert 0 <= median["data_wait_fraction"] <= 1, name
        assert 0 <= median["test_accuracy"] <= 1, name
        assert [m["epoch"] for m in row["runs"][0]["history"]] == [1]
    # Same seed and batch size: byte-identical batches, so identical training.
    accuracies = {row["median"]["test_accuracy"] for row in trained.values()}
    assert len(accuracies) == 1, accuracies
    for name, row in result["baselines"].items():
        if name != "in-memory":
            assert "epoch_s" not in row["median"], name


def test_wrap_and_keras_rows(compare):
    result, _, _ = compare
    frameworks = [f for f in BACKENDS if f in WRAPPED]
    assert sorted(frameworks) == sorted(WRAPPED)  # every framework is installed for the tests
    wrapped = result["wrapped"]
    names = list(wrapped)
    assert sorted(names[::3]) == sorted(f"wrap-{f}" for f in frameworks)
    # Each wrap row's two Keras rows right after it, so their runs interleave.
    assert names[1::3] == [n.replace("wrap-", "keras-fit-") for n in names[::3]]
    assert names[2::3] == [n.replace("wrap-", "keras-fit-jaxfeed-") for n in names[::3]]
    for framework in frameworks:
        row = wrapped[f"wrap-{framework}"]
        assert row["kind"] == "wrap" and row["bare"] == WRAPPED[framework]
        run = row["runs"][0]
        for stage in ("loader", "feed"):
            assert run[f"{stage}_samples"] == BATCH * BATCHES, (framework, stage)
            assert _positive(run[f"{stage}_samples_per_s"]), (framework, stage)
        # Trained in a fresh process, on the wrapped loader, for the one epoch asked.
        assert [h["epoch"] for h in run["history"]] == [1], framework
        assert run["how"] == "jaxfeed.mnist.train(loaders.wrap(obj)), steps_per_transfer=1"
        for key in ("epoch_s", "epoch_cpu_s", "process_peak_rss_mb"):
            assert _positive(row["median"][key]), (framework, key)
        assert 0 <= row["median"]["data_wait_fraction"] <= 1
        assert 0 <= row["median"]["test_accuracy"] <= 1
        figures = result["ratios"]["wrap"][f"wrap-{framework}"]
        assert figures["bare"] == WRAPPED[framework]
        assert math.isfinite(figures["wrap_overhead"]) and figures["wrap_overhead"] > -1
        fit = wrapped[f"keras-fit-{framework}"]
        assert fit["kind"] == "keras" and fit["bare"] == WRAPPED[framework]
        assert fit["runs"][0]["how"].startswith("Keras 3.")
        assert [h["epoch"] for h in fit["runs"][0]["history"]] == [1]
        for key in ("epoch_s", "epoch_cpu_s", "process_peak_rss_mb"):
            assert _positive(fit["median"][key]), (framework, key)
        assert 0 <= fit["median"]["test_accuracy"] <= 1
        assert "loader_samples_per_s" not in fit["median"]  # fit only: no loader timing
        assert figures["jaxfeed_epoch_s"] == row["median"]["epoch_s"]
        assert figures["keras_epoch_s"] == fit["median"]["epoch_s"]
        assert figures["jaxfeed_vs_keras_epoch"] == pytest.approx(
            row["median"]["epoch_s"] / fit["median"]["epoch_s"]
        )
        assert figures["jaxfeed_vs_keras_cpu"] == pytest.approx(
            row["median"]["epoch_cpu_s"] / fit["median"]["epoch_cpu_s"]
        )
        bridge = wrapped[f"keras-fit-jaxfeed-{framework}"]
        assert bridge["kind"] == "keras" and bridge["bare"] == WRAPPED[framework]
        assert "jaxfeed.keras_data(wrap(the same object)" in bridge["runs"][0]["how"]
        assert [h["epoch"] for h in bridge["runs"][0]["history"]] == [1]
        assert (
            _positive(bridge["median"]["epoch_s"]) and 0 <= bridge["median"]["test_accuracy"] <= 1
        )
        assert figures["keras_data_vs_keras_epoch"] == pytest.approx(
            bridge["median"]["epoch_s"] / fit["median"]["epoch_s"]
        )
    targets = {(t["row"], t["target"]) for t in result["targets"]}
    for framework in frameworks:
        assert (f"wrap-{framework}", "wrap adds <= 5% over the bare loop") in targets
        on_keras = (f"wrap-{framework}", "jaxfeed epoch on a wrapped loader <= Keras fit epoch")
        assert on_keras in targets
        bridged = (
            f"keras-fit-jaxfeed-{framework}",
            "Keras fit on keras_data(wrap(obj)) <= Keras fit(obj)",
        )
        assert bridged in targets


def test_keras_runs_on_jax_with_jaxfeeds_mlp(compare):
    """Keras was imported here on TensorFlow first; each fit still ran on JAX,
    with the MLP and optimiser of jaxfeed.mnist.train."""
    result, _, _ = compare
    assert result["parent_keras_backend"] in ("tensorflow", "jax")  # "jax": imported earlier
    shapes = [[784, 512], [512], [512, 512], [512], [512, 10], [10]]
    for name, row in result["wrapped"].items():
        if row["kind"] != "keras":
            continue
        model = row["runs"][0]["model"]
        assert model["backend"] == "jax", name
        assert model["weight_shapes"] == shapes and model["input_dtype"] == "uint8", name
        assert model["optimizer"]["name"] == "sgd", name
        assert model["optimizer"]["learning_rate"] == pytest.approx(0.05), name
        assert model["optimizer"]["momentum"] == pytest.approx(0.9), name


@pytest.mark.parametrize(("flag", "rows"), [("--no-keras", ["wrap-torch"]), ("--no-wrap", [])])
def test_no_wrap_and_no_keras_skip_their_rows(flag, rows, tmp_path):
    args = ["compare", "--loaders", "torch", flag, "--max-batches", "1", "--repeats", "1"]
    args += ["--warmup", "0", "--train-epochs", "1", "--json", str(tmp_path / "r.json")]
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(args) == 0
    result = _strict_json((tmp_path / "r.json").read_text())
    assert list(result["wrapped"]) == rows
    assert sorted(result["baselines"]) == ["in-memory", "torch-dataloader"]


@pytest.mark.parametrize(
    ("side", "framework", "match"),
    [
        ("pytorch", "torch", r"side must be one of \('jaxfeed', 'keras', 'keras-jaxfeed'\), got"),
        ("keras", "numpy", r"no user loader for framework 'numpy'; choose one of"),
    ],
)
def test_a_bad_fresh_spec_is_refused_before_any_process(side, framework, match):
    from jaxfeed.compare.workloads.copy import fresh

    with pytest.raises(ValueError, match=match):
        fresh.spec(side, framework, **FRESH)


def test_a_failed_fresh_process_names_itself_and_its_error():
    from jaxfeed.compare.workloads.copy import fresh

    what = fresh.spec("jaxfeed", "torch", **(FRESH | {"dataset": "no-such-dataset"}))
    with pytest.raises(RuntimeError) as caught:
        fresh.measure(what, timeout=120)
    message = str(caught.value)
    assert "the jaxfeed training measurement on the torch loader failed" in message
    assert "no-such-dataset" in message  # the child's own error, from its stderr


def test_a_stuck_fresh_process_is_stopped():
    from jaxfeed.compare.workloads.copy import fresh

    with pytest.raises(RuntimeError, match=r"on the tf loader did not finish in 0.5 s"):
        fresh.measure(fresh.spec("keras", "tf", **FRESH), timeout=0.5)


def test_first_batch_and_memory(compare):
    result, _, _ = compare
    for name, row in result["backends"].items():
        for key in ("first_batch_cold_s", "first_batch_warm_s"):
            assert _positive(row["median"][key]), (name, key)
    assert result["memory_per_row"] is True  # the tests run on Linux
    wrapped = {n: r for n, r in result["wrapped"].items() if r["kind"] == "wrap"}
    for name, row in {**result["backends"], **result["baselines"], **wrapped}.items():
        assert _positive(row["memory"]["peak_rss_mb"]), name
        assert 0 <= row["memory"]["peak_increase_mb"] <= row["memory"]["peak_rss_mb"], name
    assert _positive(result["process_peak_rss_mb"])
    assert "VmHWM" in result["memory_note"] and "ru_maxrss" in result["memory_note"]


def test_ratios_and_targets(compare):
    result, _, _ = compare
    ratios = result["ratios"]
    assert sorted(ratios["slowdown_vs_fastest"]) == BACKENDS
    assert min(ratios["slowdown_vs_fastest"].values()) == 1.0
    assert all(v >= 1 for v in ratios["slowdown_vs_fastest"].values())
    for table in ("epoch_time_vs_in_memory", "feed_vs_in_memory"):
        assert sorted(ratios[table]) == BACKENDS
        assert all(_positive(v) for v in ratios[table].values())
    assert sorted(ratios["adapter_vs_tutorial"]) == sorted(b for b in BACKENDS if b in TUTORIALS)
    for backend, tutorials in ratios["adapter_vs_tutorial"].items():
        assert sorted(tutorials) == sorted(TUTORIALS[backend])
        for r in tutorials.values():
            assert _positive(r["loader"]) and _positive(r["feed"])
    assert result["targets"]
    for target in result["targets"]:
        assert target["row"] in BACKENDS or target["row"] in result["wrapped"]
        assert isinstance(target["met"], bool)
        assert math.isfinite(target["value"]) and target["limit"] > 0


def test_run_description(compare):
    result, _, _ = compare
    assert result["config"]["repeats"] == 1 and result["config"]["max_batches"] == BATCHES
    assert sorted(result["config"]["backends"]) == BACKENDS
    assert result["dataset"] == {
        "name": "mnist-sample",
        "train_examples": 4000,
        "test_examples": 1000,
        "image_shape": [28, 28, 1],
    }
    assert result["versions"]["loaders"] == loaders.available()
    assert isinstance(result["versions"]["jax"], str)
    machine = result["machine"]
    assert machine["cpu_count"] >= 1 and _positive(machine["memory_total_bytes"])
    assert len(machine["mesh_devices"]) == 2 and len(machine["jax_devices"]) >= 2
    for when in ("start", "end"):
        assert len(machine["load_average"][when]) == 3
    assert _positive(result["total_seconds"])


def test_table_names_every_row_and_target(compare):
    result, _, printed = compare
    for name in [*result["backends"], *result["baselines"], *result["wrapped"]]:
        assert f"\n{name} " in printed, name
    for heading in (
        "Throughput",
        "tutorial loop",
        "Training",
        "Time to first batch",
        "Wrapped loaders: your own loader object (each tutorial row's), iterated bare vs "
        "through wrap() (the same reads, so wrap() can only add time; but a HF Dataset",
        "vs Keras 3 model.fit(obj)",
        "not wrap()",
        "Performance targets (jaxfeed's design goals)",
    ):
        assert heading in printed
    assert ".md" not in printed  # cites no file a user may not have
    assert not re.search(r"^epoch \d+/\d+ ", printed, re.MULTILINE)  # no training's progress lines
    verdicts = re.findall(r"^  (met   |MISSED) ([\w-]+) ", printed, re.MULTILINE)
    assert verdicts == [("met   " if t["met"] else "MISSED", t["row"]) for t in result["targets"]]


def test_a_missed_target_says_what_it_means(compare):
    result, _, _ = compare
    for target in result["targets"]:
        assert isinstance(target["meaning"], str) and target["meaning"], target
    missed = copy.deepcopy(result)
    for target in missed["targets"]:
        target["met"] = False
    lines = format_report(missed).splitlines()
    for target in missed["targets"]:
        at = lines.index(
            f"  MISSED {target['row']:6s} {target['target']}: "
            f"{target['value']:.3g} (limit {target['limit']:g})"
        )
        assert lines[at + 1] == f"         meaning: {target['meaning']}"
    # --max-batches and one repeat: the report warns that a miss may be noise.
    assert "may be noise" in lines[-1]
    # Met targets need no explaining.
    missed_here = sum(not t["met"] for t in result["targets"])
    assert format_report(result).count("\n         meaning: ") == missed_here


def test_plot_is_a_readable_png(compare):
    from matplotlib import image

    _, png, _ = compare
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    pixels = image.imread(png)
    assert pixels.ndim == 3 and pixels.shape[0] > 100 and pixels.shape[1] > 100
    assert np.ptp(pixels) > 0  # not a blank canvas


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        (["--loaders", "numpy,nope"], ValueError, r"unknown backend 'nope'; choose one of"),
        (["--warmup", "-1"], ValueError, r"--warmup must be >= 0, got -1"),
    ],
)
def test_bad_input_is_a_clear_error(args, error, match, capsys):
    assert main(["compare", "--max-batches", "1", "--repeats", "1", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("jaxfeed: error: ") and err.count("\n") == 1
    assert re.search(match, err), err
    with pytest.raises(error, match=match):
        main(["--debug", "compare", "--max-batches", "1", "--repeats", "1", *args])


@pytest.mark.parametrize("args", [["--loaders", ","], ["--repeats", "0"]])
def test_argument_errors_exit_with_usage(args, capsys):
    with pytest.raises(SystemExit):
        main(["compare", *args])
    assert "error" in capsys.readouterr().err
