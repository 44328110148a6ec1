"""The copy workload's report: ratios, targets, plain-text tables and a PNG.

Everything here works on the JSON-able dict `Copy.result` returns, so a saved
``--json`` file can be re-rendered without measuring.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from jaxfeed.compare.report import fig, load_text, table, target, verdict


def ratios_and_targets(
    backends: dict, rows: dict, wrapped: dict | None = None
) -> tuple[dict, list[dict]]:
    """The copy workload's ratios of medians, and its targets checked against them.

    Args:
      backends, rows, wrapped: the ``backends``, ``baselines`` and ``wrapped``
        entries of a result.

    Returns:
      ``(ratios, targets)``: ratios by kind then row; one dict per target
      check (``target``, ``row``, ``value``, ``limit``, ``met``, and
      ``meaning``: what missing it says about the row).
    """
    ratios: dict[str, dict] = {"slowdown_vs_fastest": {}, "adapter_vs_tutorial": {}}
    targets: list[dict] = []

    def check(*args: Any, **kwargs: Any) -> None:
        targets.append(target(*args, **kwargs))

    fastest = max(b["median"]["loader_samples_per_s"] for b in backends.values())
    memory = rows.get("in-memory", {}).get("median", {})
    if memory:
        ratios["epoch_time_vs_in_memory"], ratios["feed_vs_in_memory"] = {}, {}
    for name, b in backends.items():
        med = b["median"]
        slow = fastest / med["loader_samples_per_s"]
        ratios["slowdown_vs_fastest"][name] = slow
        check(
            "loader-only no more than 3x below the fastest backend",
            name,
            slow,
            3.0,
            at_most=True,
            meaning="this loader alone is more than 3x slower than the fastest backend",
        )
        if "data_wait_fraction" in med:
            check(
                "training data wait < 5% of wall time",
                name,
                med["data_wait_fraction"],
                0.05,
                at_most=True,
                meaning="training waited on data for more than 5% of its wall time: "
                "the prefetch did not hide this loader's cost",
            )
        if memory:
            epoch = med["epoch_s"] / memory["epoch_s"]
            ratios["epoch_time_vs_in_memory"][name] = epoch
            ratios["feed_vs_in_memory"][name] = (
                med["feed_samples_per_s"] / memory["feed_samples_per_s"]
            )
            check(
                "epoch time within 1.15x of the in-memory ceiling",
                name,
                epoch,
                1.15,
                at_most=True,
                meaning="an epoch took over 15% longer than one on batches already in memory: "
                "this loader slows training down",
            )
        for tut, row in rows.items():
            if row["framework"] != name:
                continue
            loader = med["loader_samples_per_s"] / row["median"]["loader_samples_per_s"]
            feed = med["feed_samples_per_s"] / row["median"]["feed_samples_per_s"]
            ratios["adapter_vs_tutorial"].setdefault(name, {})[tut] = {
                "loader": loader,
                "feed": feed,
            }
            check(
                f"loader-only >= the {tut} tutorial loop",
                name,
                loader,
                1.0,
                at_most=False,
                meaning=f"the {name} adapter reads slower than the {tut} tutorial loop it replaces",
            )
            if name in ("grain", "hf"):
                check(
                    f"loader-only >= 5x the {tut} tutorial loop",
                    name,
                    loader,
                    5.0,
                    at_most=False,
                    meaning=f"the {name} adapter's batched reads are less than 5x faster than "
                    f"the {tut} tutorial's per-record reads",
                )
    if wrapped:
        ratios["wrap"] = _wrap_ratios(wrapped, rows, check)
    return ratios, targets


def _wrap_ratios(wrapped: dict, rows: dict, check: Callable) -> dict[str, dict]:
    """Per wrap row: its object bare vs through wrap(), and jaxfeed vs Keras fit."""
    out: dict[str, dict] = {}
    for name, row in wrapped.items():
        if row["kind"] != "wrap" or row["bare"] not in rows:
            continue
        med, bare = row["median"], rows[row["bare"]]["median"]
        figures = {
            "bare": row["bare"],
            "bare_loader_samples_per_s": bare["loader_samples_per_s"],
            "wrap_loader_samples_per_s": med["loader_samples_per_s"],
            # Extra time per sample that wrap() adds over iterating the object bare.
            "wrap_overhead": bare["loader_samples_per_s"] / med["loader_samples_per_s"] - 1,
            "jaxfeed_epoch_s": med.get("epoch_s"),
        }
        check(
            "wrap adds <= 5% over the bare loop",
            name,
            figures["wrap_overhead"],
            0.05,
            at_most=True,
            meaning=f"reading the {row['bare']} object through wrap() takes over 5% longer "
            "than iterating it bare",
        )
        keras = wrapped.get(f"keras-fit-{row['framework']}", {}).get("median", {})
        if "epoch_s" in keras and figures["jaxfeed_epoch_s"] is not None:
            figures["keras_epoch_s"] = keras["epoch_s"]
            figures["jaxfeed_vs_keras_epoch"] = figures["jaxfeed_epoch_s"] / keras["epoch_s"]
            if "epoch_cpu_s" in med and "epoch_cpu_s" in keras:
                figures["jaxfeed_vs_keras_cpu"] = med["epoch_cpu_s"] / keras["epoch_cpu_s"]
            check(
                "jaxfeed epoch on a wrapped loader <= Keras fit epoch",
                name,
                figures["jaxfeed_vs_keras_epoch"],
                1.0,
                at_most=True,
                meaning="jaxfeed.mnist.train on wrap(obj) takes longer per epoch than Keras "
                "model.fit(obj) with the same MLP and optimiser: on this loader, moving "
                "from Keras to jaxfeed would slow training down",
            )
        bridge = wrapped.get(f"keras-fit-jaxfeed-{row['framework']}", {}).get("median", {})
        if "epoch_s" in bridge and "epoch_s" in keras:
            figures["keras_data_epoch_s"] = bridge["epoch_s"]
            figures["keras_data_vs_keras_epoch"] = bridge["epoch_s"] / keras["epoch_s"]
            check(
                "Keras fit on keras_data(wrap(obj)) <= Keras fit(obj)",
                f"keras-fit-jaxfeed-{row['framework']}",
                figures["keras_data_vs_keras_epoch"],
                1.0,
                at_most=True,
                meaning="Keras trains slower per epoch on jaxfeed.keras_data(wrap(obj)) than on "
                "the object itself: for a Keras user, the bridge costs time on this loader",
            )
        out[name] = figures
    return out


def _wrap_table(wrap: dict[str, dict], epochs: str) -> str:
    if not wrap:
        return ""

    def fig(key: str, spec: str, scale: float = 1.0) -> Callable:
        return lambda n, r: "-" if r.get(key) is None else format(r[key] * scale, spec)

    return table(
        "Wrapped loaders: your own loader object (each tutorial row's), iterated bare vs "
        "through wrap() (the same reads, so wrap() can only add time; but a HF Dataset, "
        "which wrap() reads in whole-batch slices, not by Dataset.iter, and a torch "
        "DataLoader with default_collate over numpy rows, which wrap() collates in numpy, "
        "not a tensor per row), and trained by "
        "jaxfeed.mnist.train on wrap(obj) vs Keras 3 model.fit(obj) (same MLP and optimiser, one "
        f"device each, each run in a fresh process; epoch: {epochs}). cpu: the ratio of "
        "process CPU seconds per epoch (all threads), which other work on the machine "
        "sways less than wall time. keras_data: Keras 3 model.fit(jaxfeed.keras_data(wrap(obj)))",
        [
            ("wrap row", lambda n, r: n),
            ("bare row", lambda n, r: r["bare"]),
            ("bare samples/s", fig("bare_loader_samples_per_s", ",.0f")),
            ("wrap samples/s", fig("wrap_loader_samples_per_s", ",.0f")),
            ("wrap overhead %", fig("wrap_overhead", "+.1f", 100)),
            ("jaxfeed epoch s", fig("jaxfeed_epoch_s", ".3f")),
            ("keras fit epoch s", fig("keras_epoch_s", ".3f")),
            ("jaxfeed / keras", fig("jaxfeed_vs_keras_epoch", ".2f")),
            ("cpu: jaxfeed / keras", fig("jaxfeed_vs_keras_cpu", ".2f")),
            ("keras_data epoch s", fig("keras_data_epoch_s", ".3f")),
            ("keras_data / keras", fig("keras_data_vs_keras_epoch", ".2f")),
        ],
        wrap,
    )


def format_report(result: dict[str, Any]) -> str:
    """The result as plain-text tables for a terminal."""
    cfg, data, ratios, machine = (result[k] for k in ("config", "dataset", "ratios", "machine"))
    rows = {**result["backends"], **result["baselines"], **result.get("wrapped", {})}
    slow, vs_mem = ratios["slowdown_vs_fastest"], ratios.get("epoch_time_vs_in_memory", {})
    pairs = {
        f"{name} / {tut}": {"median": r}
        for name, tuts in ratios["adapter_vs_tutorial"].items()
        for tut, r in tuts.items()
    }
    limit = f", at most {cfg['max_batches']} batches each" if cfg["max_batches"] else ""
    epochs = (
        "median of epochs 2.., as epoch 1 compiles"
        if cfg["train_epochs"] > 1
        else "epoch 1, compiling included"
    )
    out = [
        f"jaxfeed compare: {data['name']} ({data['train_examples']} train / "
        f"{data['test_examples']} test examples), batch {cfg['batch_size']}, seed "
        f"{cfg['seed']}; medians of {cfg['repeats']} interleaved repeats{limit}",
        f"machine: {machine['processor']}, {machine['cpu_count']} CPUs; mesh of "
        f"{len(machine['mesh_devices'])} {machine['jax_backend']} device(s); load average "
        f"(1/5/15 min) {load_text(machine, 'start')} at the start, "
        f"{load_text(machine, 'end')} at the end",
        "",
        table(
            "Throughput. loader: the loader alone; feed: + DeviceFeed (backends, wrap rows) or "
            "+ jax.device_put per batch (baselines), last batch awaited",
            [
                ("name", lambda n, r: n),
                ("kind", lambda n, r: r["kind"]),
                ("loader samples/s", fig("loader_samples_per_s", ",.0f")),
                ("loader MB/s", fig("loader_mb_per_s", ",.1f")),
                ("feed samples/s", fig("feed_samples_per_s", ",.0f")),
                ("feed MB/s", fig("feed_mb_per_s", ",.1f")),
                ("fastest / this", lambda n, r: f"{slow[n]:.2f}x" if n in slow else "-"),
            ],
            rows,
        ),
        table(
            "Adapter vs its framework's tutorial loop (throughput ratios of jaxfeed's built-in "
            "backend, batched reads, over the per-sample tutorial loop: a different reader of "
            "the same arrays, not wrap(): see the next table)",
            [
                ("backend / tutorial", lambda n, r: n),
                ("loader", fig("loader", ",.1f")),
                ("feed", fig("feed", ",.1f")),
            ],
            pairs,
        ),
        _wrap_table(ratios.get("wrap", {}), epochs),
        table(
            f"Training, {cfg['train_epochs']} epoch(s) per repeat (epoch time, data wait: "
            f"{epochs}; test accuracy after the last epoch)",
            [
                ("name", lambda n, r: n),
                ("epoch s", fig("epoch_s", ".3f")),
                ("vs in-memory", lambda n, r: f"{vs_mem[n]:.3f}x" if n in vs_mem else "-"),
                ("data wait %", lambda n, r: fig("data_wait_fraction", ".2f", 100)(n, r) or "-"),
                ("test acc", fig("test_accuracy", ".4f")),
            ],
            rows,
        ),
        table(
            "Time to first batch (make + first batch; cold: empty JAXFEED_CACHE_DIR) and memory",
            [
                ("name", lambda n, r: n),
                ("cold s", lambda n, r: fig("first_batch_cold_s", ".3f")(n, r) or "-"),
                ("warm s", lambda n, r: fig("first_batch_warm_s", ".3f")(n, r) or "-"),
                ("peak RSS MB", fig("peak_rss_mb", ",.0f", part="memory")),
                ("peak increase MB", fig("peak_increase_mb", ",.1f", part="memory")),
            ],
            rows,
        ),
        f"Memory: {result['memory_note']}"
        if result["memory_per_row"]
        else "Memory: per-row peaks need Linux's /proc/self/clear_refs, not available here.",
        f"Whole run: peak RSS {result['process_peak_rss_mb']:,.0f} MB, "
        f"{result['total_seconds']:.1f} s.",
        "",
        "Performance targets (jaxfeed's design goals), as ratios from this run:",
    ]
    for t in result["targets"]:
        out.append(
            f"  {verdict(t)} {t['row']:6s} {t['target']}: {t['value']:.3g} (limit {t['limit']:g})"
        )
        if not t["met"] and t.get("meaning"):  # results saved before 'meaning' lack it
            out.append(f"         meaning: {t['meaning']}")
    if not all(t["met"] for t in result["targets"]) and (cfg["max_batches"] or cfg["repeats"] < 3):
        out.append(
            "A miss in a short run (--max-batches, or fewer than 3 repeats) may be noise; "
            "rerun with whole epochs and --repeats 3 before acting on it."
        )
    return "\n".join(out)


def write_plot(result: dict[str, Any], path: str | os.PathLike) -> Path:
    """A PNG: throughput per row (loader-only and end-to-end, log scale) and data wait."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = {**result["backends"], **result["baselines"]}
    names = list(rows)
    fig = Figure(figsize=(11, 0.35 * len(names) + 2.2), layout="constrained")
    FigureCanvasAgg(fig)
    speed, wait = fig.subplots(1, 2, width_ratios=(2, 1))
    y = np.arange(len(names))
    for offset, key, label in ((-0.2, "loader", "loader only"), (0.2, "feed", "end to end")):
        values = [rows[n]["median"][f"{key}_samples_per_s"] for n in names]
        speed.barh(y + offset, values, height=0.4, label=label)
    speed.set(yticks=y, yticklabels=names, xscale="log", xlabel="samples/s (median)")
    speed.axhline(len(result["backends"]) - 0.5, color="grey", linewidth=0.8)  # | baselines
    speed.invert_yaxis()
    speed.legend(loc="lower right")
    trained = [n for n in names if "data_wait_fraction" in rows[n]["median"]]
    waits = [100 * rows[n]["median"]["data_wait_fraction"] for n in trained]
    bars = wait.barh(np.arange(len(trained)), waits, color="tab:red")
    # Near-zero bars are invisible: print every value beside its bar.
    wait.bar_label(bars, labels=[f"{w:.2f}%" for w in waits], padding=3)
    wait.axvline(5, color="black", linestyle="--", linewidth=1, label="5% target")
    wait.set(yticks=np.arange(len(trained)), yticklabels=trained, xlabel="training data wait (%)")
    wait.invert_yaxis()
    wait.legend(loc="lower right")
    data, batch = result["dataset"]["name"], result["config"]["batch_size"]
    fig.suptitle(f"jaxfeed compare: {data}, batch {batch}, {len(rows)} rows")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    return path
