"""Variable-length rows: jaxfeed's ``pack=`` and ``bucket=`` beside Grain's
packers and tf.data's ``bucket_by_sequence_length``, on the same rows in the
same order.

The rows: CPython's own documentation (``pydoc_data.topics``) split into
paragraphs, each a row of its whitespace words as uint16 ids (median 16
words, mean 25, a long tail; a paragraph longer than ``--length`` is cut to
it, as Grain's packers refuse longer rows), drawn with replacement to
``--rows`` rows. The order is the shuffled order of jaxfeed's sampler for
``(seed, epoch 0)``; every peer reads the rows in it. The parts (``--parts``):

- ``pack``: packing efficiency (real tokens / all tokens of the emitted rows
  of ``L``) of ``Pack(L, window=W, method=...)`` against Grain's
  ``FirstFitPackIterDataset`` / ``BestFitPackIterDataset`` with
  ``num_packing_bins=K``, ``W`` chosen so a window opens about ``K`` slots
  (``W = K * L / mean length``), and Grain's ``ConcatThenSplitIterDataset``
  (which cuts rows at the slot's end) for reference.
- ``speed``: real tokens/s of ``make(backend, pack=L)`` (best-fit, the default
  window) on each backend, at 0 workers and 2 (grain, torch), against Grain's
  ``BestFitPackIterDataset`` + ``batch`` in one process and under
  ``mp_prefetch`` with 2 workers; the CPU seconds (this process and its
  workers) per million tokens. Medians of interleaved repeats, each at most
  ``--seconds`` of an epoch after its first batch.
- ``bucket``: real tokens/s of ``make(backend, bucket=...)`` (numpy, tf)
  against ``tf.data.Dataset.bucket_by_sequence_length`` with the same bounds
  and batch size, and the distinct batch shapes each gives a step (what it
  compiles: tf.data's last partial batches are shapes of their own).
- ``resume``: the seconds to the first batch of ``iter_epoch(e, start=k)``,
  k = 10 and k = 100,000, in an epoch of more than 100,000 packed batches (a
  resume plans its epoch again: it should not grow with k), beside
  ``make``'s own time and the pack planner's rows/s.

The token values are a memory-mapped ``.npy`` in a temporary directory (a
corpus as one is stored; the tf backend reads it in place, rather than
making a TFDS copy of every token), in the page cache throughout.

Run: ``python3 benchmarks/sequences.py`` (writes results/sequences-cpu.json
and .txt); ``--quick`` for a small run (under a minute), ``--out DIR`` to
write elsewhere.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
from common import RESULTS, git_state  # also puts the repo on sys.path
from jaxfeed.loaders.sequence_plan import Pack, plan_epoch

import jaxfeed
from jaxfeed.compare.processes import cpu_seconds

BUCKETS = (64, 128, 256, 512)


def paragraphs() -> list[np.ndarray]:
    """CPython's documentation topics as paragraphs of uint16 word ids."""
    from pydoc_data.topics import topics

    vocab: dict[str, int] = {}
    rows = []
    for text in topics.values():
        for paragraph in text.split("\n\n"):
            words = paragraph.split()
            if words:
                rows.append([vocab.setdefault(w, len(vocab) + 1) for w in words])
    assert len(vocab) < 1 << 16
    return [np.asarray(r, np.uint16) for r in rows]


def corpus(rows: int, length: int, root: Path, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``rows`` paragraphs drawn with replacement, each cut to ``length``:
    the values (memory-mapped from ``root``) and the lengths."""
    source = [p[:length] for p in paragraphs()]
    pick = np.random.default_rng(seed).choice(len(source), rows)
    lengths = np.fromiter((len(source[i]) for i in pick), np.int64, rows)
    path = root / f"values-{rows}-{length}.npy"
    np.save(path, np.concatenate([source[i] for i in pick]))
    return np.load(path, mmap_mode="r"), lengths


class Rows:
    """Grain's random-access source: row ``i`` of ``order`` as Grain's packers take it."""

    def __init__(self, values: np.ndarray, lengths: np.ndarray, order: np.ndarray):
        self.values, self.order = values, order
        self.offsets = np.concatenate([[0], np.cumsum(lengths)])

    def __len__(self) -> int:
        return len(self.order)

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        row = self.order[i]
        return {"input_ids": np.asarray(self.values[self.offsets[row] : self.offsets[row + 1]])}


def grain_packed(rows: Rows, length: int, method: str, bins: int, seed: int = 0):
    """Grain's packer over ``rows`` in order (bins emitted in the order they filled)."""
    import grain

    packer = {
        "first_fit": grain.experimental.FirstFitPackIterDataset,
        "best_fit": grain.experimental.BestFitPackIterDataset,
    }
    # No read threads: Grain's default prefetch measures its depth over 500
    # futures per element (grain 0.2.18), 5x slower here than this.
    options = grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)
    ds = grain.MapDataset.source(rows).to_iter_dataset(options)
    if method == "concat_then_split":
        return grain.experimental.ConcatThenSplitIterDataset(
            ds, length_struct={"input_ids": length}
        )
    return packer[method](
        ds,
        length_struct={"input_ids": length},
        num_packing_bins=bins,
        seed=seed,
        shuffle_bins=False,
    )


def sampler_order(values: np.ndarray, lengths: np.ndarray, length: int, batch: int) -> np.ndarray:
    field = jaxfeed.RaggedField.from_lengths(values, lengths)
    with jaxfeed.make("numpy", dataset={"input_ids": field}, batch_size=batch, pack=length) as s:
        return s.sampler.permutation(0)


def part_pack(values, lengths, order, args) -> list[dict]:
    mean = float(lengths.mean())
    results = []
    for bins in args.bins:
        window = max(1, round(bins * args.length / mean))
        for method in ("first_fit", "best_fit"):
            plan = plan_epoch(Pack(args.length, window, method), order, lengths, 1, False)
            ours = plan.real_values() / (plan.num_batches * args.length)
            real = slots = 0
            for row in grain_packed(Rows(values, lengths, order), args.length, method, bins):
                real += int(np.count_nonzero(row["input_ids_segment_ids"]))
                slots += 1
            theirs = real / (slots * args.length)
            assert real == lengths.sum(), (real, lengths.sum())
            results.append(
                {
                    "method": method,
                    "grain_bins": bins,
                    "jaxfeed_window": window,
                    "jaxfeed_slots_per_window": plan.num_batches / -(-len(order) // window),
                    "jaxfeed": ours,
                    "grain": theirs,
                    "jaxfeed_minus_grain": ours - theirs,
                }
            )
            print(f"  {method} K={bins} W={window}: jaxfeed {ours:.4f}, grain {theirs:.4f}")
    for method, window in itertools.product(("first_fit", "best_fit"), (1024, 4096, 16384)):
        plan = plan_epoch(Pack(args.length, window, method), order, lengths, 1, False)
        results.append(
            {
                "method": method,
                "jaxfeed_window": window,
                "jaxfeed": plan.real_values() / (plan.num_batches * args.length),
            }
        )
    real = slots = 0
    for row in grain_packed(Rows(values, lengths, order), args.length, "concat_then_split", 0):
        real += int(np.count_nonzero(row["input_ids_segment_ids"]))
        slots += 1
    results.append({"method": "concat_then_split", "grain": real / (slots * args.length)})
    return results


def timed(batches: Iterable, seconds: float, tokens: Callable[[dict], int]) -> dict[str, float]:
    """Real tokens/s from the first batch on, for at most ``seconds``, and CPU s per M tokens."""
    cpu, started = cpu_seconds(), time.perf_counter()
    count, first_at, first = 0, None, 0
    for batch in batches:
        count += tokens(batch)
        now = time.perf_counter()
        if first_at is None:
            first_at, first = now, count
        elif now - first_at > seconds:
            break
    ended = time.perf_counter()
    return {
        "tokens_per_s": (count - first) / (ended - first_at),
        "first_batch_s": first_at - started,
        "cpu_s_per_mtok": (cpu_seconds() - cpu) * 1e6 / count,
    }


def real_tokens(batch: dict) -> int:
    return int(np.count_nonzero(batch["segment_ids"]))


def part_speed(values, lengths, order, args) -> list[dict]:
    import grain

    field = jaxfeed.RaggedField.from_lengths(values, lengths)
    b, length = args.batch, args.length
    pipelines: dict[str, Callable[[], Iterable]] = {}
    sources = {}
    for backend in args.backends:
        for workers in (0, 2) if backend in ("grain", "torch") else (0,):
            if workers and args.quick:
                continue
            extra = {"num_workers": workers} if workers else {}
            name = f"jaxfeed {backend}" + (f" {workers}w" if workers else "")
            sources[name] = jaxfeed.make(
                backend, dataset={"input_ids": field}, batch_size=b, pack=length, **extra
            )
            pipelines[name] = lambda s=sources[name]: s.iter_epoch(0)
    rows = Rows(values, lengths, order)

    def grain_batches(workers: int) -> Iterable:
        ds = grain_packed(rows, length, "best_fit", args.grain_bins).batch(b)
        if workers:
            ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers))
        return ({"segment_ids": x["input_ids_segment_ids"]} for x in ds)

    pipelines["grain BestFitPack"] = lambda: grain_batches(0)
    if not args.quick:
        pipelines["grain BestFitPack 2w mp_prefetch"] = lambda: grain_batches(2)
    runs: dict[str, list[dict]] = {name: [] for name in pipelines}
    for _ in range(args.repeats):
        for name, batches in pipelines.items():
            runs[name].append(timed(batches(), args.seconds, real_tokens))
    for source in sources.values():
        source.close()
    return [summary(name, r) for name, r in runs.items()]


def summary(name: str, runs: list[dict]) -> dict:
    out = {"pipeline": name, "runs": runs}
    for key in runs[0]:
        out[key] = statistics.median(r[key] for r in runs)
    print(f"  {name}: {out['tokens_per_s']:,.0f} tokens/s, {out['cpu_s_per_mtok']:.2f} CPU s/Mtok")
    return out


def part_bucket(values, lengths, order, args) -> list[dict]:
    import tensorflow as tf

    field = jaxfeed.RaggedField.from_lengths(values, lengths)
    b = args.batch
    pipelines: dict[str, Callable[[], Iterable]] = {}
    sources = {}
    for backend in [x for x in args.backends if x in ("numpy", "tf")]:
        sources[backend] = jaxfeed.make(
            backend, dataset={"input_ids": field}, batch_size=b, bucket=BUCKETS
        )
        pipelines[f"jaxfeed {backend}"] = lambda s=sources[backend]: s.iter_epoch(0)
    # tf.data over the same rows in the same order: each row a slice of the values.
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    tokens = tf.constant(np.asarray(values))
    rows = tf.data.Dataset.from_tensor_slices((offsets[order], lengths[order]))
    bounds = [n + 1 for n in BUCKETS]  # tf: a row < bound; jaxfeed: a row <= length

    def tf_batches() -> Iterable:
        ds = rows.map(lambda start, n: tokens[start : start + n])
        ds = ds.bucket_by_sequence_length(
            lambda x: tf.shape(x)[0],
            bucket_boundaries=bounds,
            bucket_batch_sizes=[b] * (len(bounds) + 1),
            pad_to_bucket_boundary=True,
        )
        for x in ds.prefetch(tf.data.AUTOTUNE).as_numpy_iterator():
            yield {"segment_ids": x, "shape": x.shape}

    pipelines["tf.data bucket_by_sequence_length"] = tf_batches
    runs: dict[str, list[dict]] = {name: [] for name in pipelines}
    for _ in range(args.repeats):
        for name, batches in pipelines.items():
            runs[name].append(timed(batches(), args.seconds, real_tokens))
    results = [summary(name, r) for name, r in runs.items()]
    shapes = {name: sorted(set(s.shapes)) for name, s in sources.items()}
    tf_shapes, places = set(), 0
    for x in tf_batches():  # a whole epoch
        tf_shapes.add(tuple(x["shape"]))
        places += x["segment_ids"].size
    jax_pad = next(iter(sources.values())).padding_fraction(0)
    for r in results:
        if r["pipeline"].startswith("jaxfeed"):
            r["shapes"] = [[b, n] for n in shapes[r["pipeline"].split()[1]]]
            r["padding_fraction"] = jax_pad
        else:
            r["shapes"] = sorted(list(s) for s in tf_shapes)
            r["padding_fraction"] = 1 - lengths.sum() / places
        print(f"  {r['pipeline']}: {len(r['shapes'])} shapes, padding {r['padding_fraction']:.3f}")
    for source in sources.values():
        source.close()
    return results


def part_resume(args, root: Path) -> dict:
    b, length = args.resume_batch, args.length
    values, lengths = corpus(args.resume_rows, length, root, seed=1)
    field = jaxfeed.RaggedField.from_lengths(values, lengths)
    order = np.random.default_rng(0).permutation(len(lengths))
    planner = {}
    for method in ("best_fit", "first_fit"):
        started = time.perf_counter()
        plan_epoch(Pack(length, method=method), order, lengths, b, False)
        planner[method] = len(lengths) / (time.perf_counter() - started)
        print(f"  planner {method}: {planner[method]:,.0f} rows/s")
    started = time.perf_counter()
    source = jaxfeed.make("numpy", dataset={"input_ids": field}, batch_size=b, pack=length)
    make_s = time.perf_counter() - started
    first, counts = {}, []
    far = args.resume_far
    for epoch, k in ((1, 10), (2, far), (3, far), (4, 10)):  # each epoch planned afresh
        started = time.perf_counter()
        batches = source.iter_epoch(epoch, start=k)
        next(batches)
        first.setdefault(k, []).append(time.perf_counter() - started)
        batches.close()
        counts.append(source.batches_in(epoch))  # the plan just made
    source.close()
    print(f"  make {make_s:.1f} s; first batch at k=10 {first[10]}, k={far} {first[far]}")
    return {
        "rows": len(lengths),
        "tokens": int(lengths.sum()),
        "batch_size": b,
        "batches_per_epoch": counts,
        "planner_rows_per_s": planner,
        "make_s": make_s,
        "first_batch_s": {str(k): v for k, v in first.items()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default="pack,speed,bucket,resume")
    parser.add_argument("--backends", default="numpy,torch,tf,grain")
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--bins", default="16,64,256", help="Grain's num_packing_bins to compare")
    parser.add_argument("--grain-bins", type=int, default=64, help="Grain's bins in --parts speed")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--resume-rows", type=int, default=8_600_000)
    parser.add_argument("--resume-batch", type=int, default=4)
    parser.add_argument("--resume-far", type=int, default=100_000)
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument("--tag", default="cpu")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.bins, args.repeats, args.seconds = 3000, "16", 1, 0.5
        args.resume_rows, args.resume_far, args.grain_bins = 20_000, 200, 16
    args.parts, args.backends = args.parts.split(","), args.backends.split(",")
    args.bins = [int(n) for n in args.bins.split(",")]
    load = os.getloadavg()
    record: dict = {
        "command": "python3 benchmarks/sequences.py "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "git": git_state(),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "load_start": load,
    }
    lines = []
    with tempfile.TemporaryDirectory(prefix="jaxfeed-seq-") as tmp:
        root = Path(tmp)
        values, lengths = corpus(args.rows, args.length, root)
        order = sampler_order(values, lengths, args.length, args.batch)
        record["rows"] = {
            "rows": len(lengths),
            "tokens": int(lengths.sum()),
            "median": float(np.median(lengths)),
            "mean": float(lengths.mean()),
            "max": int(lengths.max()),
            "cut_to_length": int(np.sum(lengths == args.length)),
        }
        print(f"rows: {record['rows']}")
        parts = {
            "pack": lambda: part_pack(values, lengths, order, args),
            "speed": lambda: part_speed(values, lengths, order, args),
            "bucket": lambda: part_bucket(values, lengths, order, args),
            "resume": lambda: part_resume(args, root),
        }
        for part in args.parts:
            print(f"{part}:")
            record[part] = parts[part]()
    record["load_end"] = os.getloadavg()
    lines = table(record, args)
    print("\n".join(lines))
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"sequences-{args.tag}"
    Path(f"{stem}.json").write_text(json.dumps(record, indent=2, default=float) + "\n")
    Path(f"{stem}.txt").write_text("\n".join(lines) + "\n")
    print(f"wrote {stem}.json and .txt")
    return 0


def table(record: dict, args) -> list[str]:
    """The results as markdown tables."""
    r = record["rows"]
    lines = [
        f"# {record['command']}",
        f"machine: {record['machine']}; load {record['load_start']} -> {record['load_end']}",
        f"rows: {r['rows']:,} ({r['tokens']:,} tokens, median {r['median']:.0f}, mean "
        f"{r['mean']:.1f}, max {r['max']}; {r['cut_to_length']} cut to {args.length}), "
        f"L = {args.length}, B = {args.batch}",
    ]
    if "pack" in record:
        lines += [
            "",
            "| method | Grain bins K | jaxfeed window W | jaxfeed | Grain | jaxfeed - Grain |",
        ]
        lines += ["|---|---|---|---|---|---|"]
        for x in record["pack"]:
            cells = [
                f"{x[k]:.4f}" if k in x else "-"
                for k in ("jaxfeed", "grain", "jaxfeed_minus_grain")
            ]
            lines.append(
                f"| {x['method']} | {x.get('grain_bins', '-')} | {x.get('jaxfeed_window', '-')} | "
                f"{' | '.join(cells)} |"
            )
    for part in ("speed", "bucket"):
        if part not in record:
            continue
        extra = " | shapes | padding" if part == "bucket" else ""
        lines += [
            "",
            f"| {part}: pipeline | real tokens/s | CPU s / M tokens | first batch s{extra} |",
        ]
        lines += ["|---|---|---|---|" + ("---|---|" if extra else "")]
        for x in record[part]:
            more = f" | {len(x['shapes'])} | {x['padding_fraction']:.3f}" if extra else ""
            lines.append(
                f"| {x['pipeline']} | {x['tokens_per_s']:,.0f} | {x['cpu_s_per_mtok']:.2f} | "
                f"{x['first_batch_s']:.2f}{more} |"
            )
    if "resume" in record:
        x = record["resume"]
        lines += [
            "",
            f"resume: {x['rows']:,} rows, {x['tokens']:,} tokens, B = {x['batch_size']}, "
            f"{x['batches_per_epoch']} batches per epoch",
            "planner rows/s: "
            + ", ".join(f"{k} {v:,.0f}" for k, v in x["planner_rows_per_s"].items()),
            f"make: {x['make_s']:.2f} s; first batch of iter_epoch(e, start=k): "
            + ", ".join(
                f"k={k}: {', '.join(f'{s:.2f}' for s in v)} s"
                for k, v in x["first_batch_s"].items()
            ),
        ]
    return lines


if __name__ == "__main__":
    sys.exit(main())
