"""The ``jaxfeed`` command line: ``jaxfeed train``, ``jaxfeed compare``, ``jaxfeed backends``.

Arguments are parsed before jax is imported, because ``--devices`` on a CPU
only takes effect through XLA_FLAGS set before that import.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any


def _option(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return key, value  # a bare string such as order=native


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jaxfeed", description="Feed any Python data loader to JAX, sharded and prefetched."
    )
    commands = parser.add_subparsers(dest="command", required=True)

    train = commands.add_parser("train", help="train the MNIST MLP through one loader backend")
    train.add_argument("--loader", default="numpy", help="backend name (see `jaxfeed backends`)")
    train.add_argument(
        "--dataset",
        default="mnist-sample",
        help="mnist, mnist-sample (offline default), mnist-10k, or an IDX directory",
    )
    train.add_argument("--data-dir", default=None, help="directory with the MNIST IDX files")
    train.add_argument("--epochs", type=_positive, default=5)
    train.add_argument("--batch-size", type=_positive, default=128, help="per-process batch size")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--learning-rate", type=float, default=None)
    train.add_argument("--momentum", type=float, default=None)
    train.add_argument("--no-shuffle", action="store_true")
    train.add_argument("--drop-remainder", action="store_true")
    train.add_argument(
        "--loader-option",
        type=_option,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="backend option, e.g. num_workers=2 (repeatable)",
    )
    train.add_argument(
        "--devices",
        type=_positive,
        default=None,
        help="use N local devices (N simulated CPU devices without an accelerator)",
    )
    train.add_argument(
        "--coordinator",
        default=None,
        metavar="HOST:PORT",
        help="multi-process: process 0's address (or JAXFEED_COORDINATOR)",
    )
    train.add_argument("--num-processes", type=_positive, default=None)
    train.add_argument("--process-id", type=int, default=None)
    train.add_argument("--json", type=Path, default=None, help="write per-epoch metrics here")
    train.add_argument("--quiet", action="store_true", help="no progress bar")

    commands.add_parser("backends", help="list loader backends and whether each can be used")
    _add_compare(commands)
    return parser


def _loader_list(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if not names:
        raise argparse.ArgumentTypeError(f"expected comma-separated backend names, got {text!r}")
    return names


def _add_compare(commands: argparse._SubParsersAction) -> None:
    compare = commands.add_parser(
        "compare",
        help="run every backend on the same work, interleaved, and compare them",
        description="Loader-only and end-to-end throughput, training epoch time and data "
        "wait, time to first batch and peak memory for every backend, beside the in-memory "
        "ceiling and each framework's tutorial loop, in one process.",
    )
    compare.add_argument(
        "--loaders",
        type=_loader_list,
        default=None,
        metavar="A,B,...",
        help="backends to compare (default: every available one)",
    )
    compare.add_argument(
        "--dataset",
        default="mnist-sample",
        help="mnist, mnist-sample (offline default), mnist-10k, or an IDX directory",
    )
    compare.add_argument("--data-dir", default=None, help="directory with the MNIST IDX files")
    compare.add_argument("--batch-size", type=_positive, default=128, help="per-process batch")
    compare.add_argument("--seed", type=int, default=0)
    compare.add_argument("--repeats", type=_positive, default=3, help="timed repeats (medians)")
    compare.add_argument(
        "--warmup", type=int, default=1, help="untimed warm-up passes (<= 16 batches each)"
    )
    compare.add_argument("--train-epochs", type=_positive, default=2, help="epochs per repeat")
    compare.add_argument(
        "--max-batches",
        type=_positive,
        default=None,
        help="read at most N batches per measurement (tiny CI runs); default: whole epochs",
    )
    compare.add_argument(
        "--no-baselines",
        action="store_true",
        help="skip the in-memory ceiling and the tutorial loops",
    )
    compare.add_argument("--json", type=Path, default=None, help="write every figure here")
    compare.add_argument("--plot", type=Path, default=None, help="write a PNG bar chart here")
    compare.add_argument(
        "--devices",
        type=_positive,
        default=None,
        help="use N local devices (N simulated CPU devices without an accelerator)",
    )


def _set_devices(count: int | None) -> None:
    if count is None:
        return
    flag = f"--xla_force_host_platform_device_count={count}"
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if "device_count" not in f]
    os.environ["XLA_FLAGS"] = " ".join([*flags, flag])


def _pick_devices(devices: list, per_process: int | None) -> list:
    """The first ``per_process`` devices of every process (all if None)."""
    if per_process is None:
        return devices
    by_process: dict[int, list] = {}
    for device in devices:
        by_process.setdefault(device.process_index, []).append(device)
    fewest = min(len(d) for d in by_process.values())
    if per_process > fewest:
        raise ValueError(f"--devices {per_process}: only {fewest} device(s) per process here")
    return [d for group in by_process.values() for d in group[:per_process]]


def _run_train(args: argparse.Namespace) -> int:
    _set_devices(args.devices)
    import jax

    import loaders
    from sharding import initialize, make_mesh
    from trainer.train import TrainConfig, train

    initialize(args.coordinator, args.num_processes, args.process_id)
    mesh = make_mesh(_pick_devices(jax.devices(), args.devices))
    devices = mesh.devices.ravel()
    common = dict(
        dataset=args.dataset,
        data_dir=args.data_dir,
        batch_size=args.batch_size,
        seed=args.seed,
        process_index=jax.process_index(),
        process_count=jax.process_count(),
        **dict(args.loader_option),
    )
    train_source = loaders.make(
        args.loader,
        split="train",
        shuffle=not args.no_shuffle,
        drop_remainder=args.drop_remainder,
        **common,
    )
    test_source = loaders.make(args.loader, split="test", shuffle=False, **common)
    defaults = TrainConfig()
    config = TrainConfig(
        epochs=args.epochs,
        learning_rate=(
            defaults.learning_rate if args.learning_rate is None else args.learning_rate
        ),
        momentum=args.momentum if args.momentum is not None else defaults.momentum,
        seed=args.seed,
    )
    print(
        f"jaxfeed train: loader={args.loader} dataset={args.dataset} "
        f"train={train_source.num_batches} batches x {args.batch_size} "
        f"devices={mesh.devices.size} ({devices[0].platform}) processes={jax.process_count()}"
    )

    prefix = f"[process {jax.process_index()}] " if jax.process_count() > 1 else ""

    def report(m: dict) -> None:
        print(
            f"{prefix}epoch {m['epoch']}/{config.epochs}  loss {m['loss']:.4f}  "
            f"train_acc {m['train_accuracy']:.4f}  test_acc {m['test_accuracy']:.4f}  "
            f"{m['samples_per_second']:,.0f} samples/s  "
            f"data-wait {100 * m['data_wait_fraction']:.1f}%  {m['seconds']:.2f}s",
            flush=True,
        )

    _, history = train(
        train_source,
        test_source,
        config,
        sharding=mesh,
        on_epoch=report,
        progress=False if args.quiet else None,
    )
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        record = {
            "command": sys.argv,
            "config": dataclasses.asdict(config),
            "loader": args.loader,
            "dataset": args.dataset,
            "epochs": history,
        }
        args.json.write_text(json.dumps(record, indent=2, default=str))
    return 0


def _run_compare(args: argparse.Namespace, command: list[str]) -> int:
    if args.warmup < 0:
        raise ValueError(f"--warmup must be >= 0, got {args.warmup}")
    _set_devices(args.devices)
    import jax

    import loaders
    from sharding import make_mesh
    from trainer.compare import CompareConfig, run
    from trainer.compare_report import format_report, write_plot

    usable = [name for name, status in loaders.available().items() if "unavailable" not in status]
    names = args.loaders if args.loaders is not None else tuple(usable)
    for name in names:
        loaders.registry.get(name)  # unknown or not installed: a clear error, before any work
    config = CompareConfig(
        backends=tuple(dict.fromkeys(names)),
        dataset=args.dataset,
        data_dir=args.data_dir,
        batch_size=args.batch_size,
        seed=args.seed,
        repeats=args.repeats,
        warmup=args.warmup,
        train_epochs=args.train_epochs,
        max_batches=args.max_batches,
        baselines=not args.no_baselines,
    )
    mesh = make_mesh(_pick_devices(jax.devices(), args.devices))
    result = run(config, mesh, command)
    print(format_report(result))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2, default=str) + "\n")
    if args.plot is not None:
        write_plot(result, args.plot)
    return 0


def _run_backends() -> int:
    import loaders

    for name, status in loaders.available().items():
        print(f"{name:8s} {status}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "train":
        return _run_train(args)
    if args.command == "compare":
        return _run_compare(args, ["jaxfeed", *(sys.argv[1:] if argv is None else argv)])
    return _run_backends()


if __name__ == "__main__":
    sys.exit(main())
