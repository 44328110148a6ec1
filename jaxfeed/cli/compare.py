"""``jaxfeed compare``: its arguments, and the run of a workload (``copy``,
``decode``, ``sequences`` or ``mixtures``) over every backend (docs/compare.md)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from jaxfeed.cli.args import (
    DATA_DIR_HELP,
    DATASET_HELP,
    DEVICES_HELP,
    Datasets,
    add_storage_option,
    check_writable,
    loader_list,
    non_negative,
    pick_devices,
    positive,
    public_command,
    seed,
    set_devices,
    storage_options,
    subcommand,
    weights,
    worker_counts,
)

DEFAULT_DATASET = "mnist-sample"
TRAIN_EPOCHS = 2


def add_compare(commands: argparse._SubParsersAction) -> None:
    compare = subcommand(
        commands,
        "compare",
        help="run every backend on the same work, interleaved, and compare them",
        description="Loader-only and end-to-end throughput, training epoch time and data "
        "wait, time to first batch and peak memory for every backend, beside the in-memory "
        "ceiling and each framework's tutorial loop, in one process; and each tutorial's "
        "loader object through loaders.wrap, trained by jaxfeed and by Keras 3 model.fit "
        "(JAX backend), each training in a fresh process. --workload decode: the same for "
        "PNG decoding and augmentation, per worker count, beside each framework's own "
        "pipeline; --workload sequences: paragraphs of CPython's docs as byte tokens, padded, "
        "bucketed and packed, beside each framework's own padding, bucketing or packing; "
        "--workload mixtures: datasets mixed by weight on every backend, beside each "
        "framework's own mixture, with the shares each realized (docs/compare.md).",
    )
    compare.add_argument(
        "--workload",
        choices=("copy", "decode", "sequences", "mixtures"),
        default=None,
        help="copy: decoded digits (what the flags above describe); decode: digits-png, "
        "or the user's files with --dataset DIR (TFRecord, ArrayRecord, Parquet, image "
        "folder: 'image' bytes and 'label'), decoded and augmented per record in each "
        "backend's workers, beside each framework's own reader of those files; sequences: "
        "rows of different lengths with pad=, bucket= and pack= (loader figures, no "
        "training); mixtures: --dataset given several times with --weights (default: the "
        "digits 0-4 and 5-9 at 0.7,0.3), the shares each pipeline realized. None: mixtures "
        "for several --dataset, decode for --dataset DIR of such files, else copy",
    )
    compare.add_argument(
        "--workers",
        type=worker_counts,
        default=None,
        metavar="K,K,...",
        help="--workload decode: the worker counts to measure; None: 0,1,2",
    )
    compare.add_argument(
        "--loaders",
        type=loader_list,
        default=None,
        metavar="A,B,...",
        help="backends to compare; None: every available one",
    )
    compare.add_argument(
        "--dataset",
        action=Datasets,
        default=DEFAULT_DATASET,
        help=DATASET_HELP + "; given several times (with --weights): --workload mixtures",
    )
    compare.add_argument(
        "--weights",
        type=weights,
        default=None,
        metavar="W1,W2,...",
        help="--workload mixtures: one weight per --dataset; None: 0.7,0.3",
    )
    compare.add_argument("--data-dir", default=None, help=DATA_DIR_HELP)
    add_storage_option(compare)
    compare.add_argument("--batch-size", type=positive, default=128, help="per-process batch")
    compare.add_argument("--seed", type=seed, default=0, help="shuffle and init seed")
    compare.add_argument("--repeats", type=positive, default=3, help="timed repeats (medians)")
    compare.add_argument(
        "--warmup", type=int, default=1, help="untimed warm-up passes (<= 16 batches each)"
    )
    compare.add_argument(
        "--train-epochs",
        type=non_negative,
        default=TRAIN_EPOCHS,
        help="epochs per repeat; 0 (--workload decode): loader figures only, no training",
    )
    compare.add_argument(
        "--max-batches",
        type=positive,
        default=None,
        metavar="N",
        help="read at most N batches per measurement (sequences: per epoch; tiny CI runs); "
        "None: whole epochs",
    )
    compare.add_argument(
        "--no-baselines",
        action="store_true",
        help="skip the in-memory ceiling and the tutorial loops (and so the wrap and Keras rows); "
        "decode, sequences: skip each framework's own pipeline",
    )
    compare.add_argument(
        "--no-wrap",
        action="store_true",
        help="skip the wrap-* rows (each tutorial's object through loaders.wrap) and Keras rows",
    )
    compare.add_argument(
        "--no-keras",
        action="store_true",
        help="skip the keras-fit-* rows (Keras 3 model.fit on each tutorial's object)",
    )
    compare.add_argument("--json", type=Path, default=None, help="write every figure here")
    compare.add_argument("--plot", type=Path, default=None, help="write a PNG bar chart here")
    compare.add_argument("--devices", type=positive, default=None, metavar="N", help=DEVICES_HELP)


def run_compare(args: argparse.Namespace, command: list[str]) -> int:
    if args.warmup < 0:
        raise ValueError(f"--warmup must be >= 0, got {args.warmup}")
    check_writable(args.json, "--json")
    check_writable(args.plot, "--plot")
    set_devices(args.devices)
    import jax

    from jaxfeed.compare.runner import run
    from jaxfeed.loaders.backends import registry
    from jaxfeed.sharding import data_mesh

    # Every backend but those run on request (ray starts or joins a cluster).
    names = args.loaders if args.loaders is not None else tuple(registry.everyday())
    for name in names:
        registry.get(name)  # unknown or not installed: a clear error, before any work
    datasets = args.dataset if isinstance(args.dataset, list) else [args.dataset]
    if args.workload is None:
        several = len(datasets) > 1
        args.workload = "mixtures" if several else "decode" if _holds_files(datasets[0]) else "copy"
    if args.workload != "mixtures":
        if len(datasets) > 1 or args.weights is not None:
            raise ValueError(
                f"several --dataset and --weights are for --workload mixtures, not "
                f"--workload {args.workload}; give one --dataset"
            )
        args.dataset = datasets[0]
    if args.storage_option and args.workload not in ("copy", "mixtures"):
        raise ValueError(
            f"--storage-option is for a --dataset URL of the copy or mixtures workload, not "
            f"--workload {args.workload}; leave it out"
        )
    chosen = {
        "copy": _copy_workload,
        "decode": _decode_workload,
        "sequences": _sequences_workload,
        "mixtures": _mixtures_workload,
    }[args.workload]
    workload, config, report = chosen(args, tuple(dict.fromkeys(names)))
    mesh = data_mesh(pick_devices(jax.devices(), args.devices))
    result = run(workload(config, mesh), public_command(command))
    print(report.format_report(result))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2, default=str) + "\n")
    if args.plot is not None:  # the copy workload's; decode refuses --plot
        report.write_plot(result, args.plot)
    return 0


def _copy_workload(args: argparse.Namespace, names: tuple[str, ...]) -> tuple[type, Any, Any]:
    """The copy workload's class, its config from ``args``, and its report module."""
    from jaxfeed.compare.workloads.copy import report
    from jaxfeed.compare.workloads.copy.workload import Copy, CopyConfig

    if args.workers is not None:
        raise ValueError("--workers is for --workload decode; the copy workload has no workers")
    if args.train_epochs == 0:
        raise ValueError("--train-epochs 0 is for --workload decode; the copy workload trains")
    config = CopyConfig(
        backends=names,
        dataset=args.dataset,
        data_dir=args.data_dir,
        storage_options=storage_options(args),
        batch_size=args.batch_size,
        seed=args.seed,
        repeats=args.repeats,
        warmup=args.warmup,
        train_epochs=args.train_epochs,
        max_batches=args.max_batches,
        baselines=not args.no_baselines,
        wrap=not args.no_wrap,
        keras=not args.no_keras,
    )
    return Copy, config, report


def _decode_workload(args: argparse.Namespace, names: tuple[str, ...]) -> tuple[type, Any, Any]:
    """The decode workload's class, its config from ``args``, and its report module."""
    from jaxfeed.compare.workloads.decode import report
    from jaxfeed.compare.workloads.decode.workload import DATASET, Decode, DecodeConfig

    files = _holds_files(args.dataset)
    if args.plot is not None or (args.dataset != "mnist-sample" and not files):
        raise ValueError(
            f"--workload decode reads {DATASET!r}, or --dataset DIR of your TFRecord, "
            "ArrayRecord, Parquet or image-folder files, and prints a table; otherwise "
            "drop --dataset and --plot (use --data-dir for the real digits, --json for every "
            "figure)"
        )
    config = DecodeConfig(
        backends=names,
        workers=args.workers or (0, 1, 2),
        data_dir=args.data_dir,
        batch_size=args.batch_size,
        seed=args.seed,
        repeats=args.repeats,
        warmup=args.warmup,
        train_epochs=args.train_epochs,
        max_batches=args.max_batches,
        idioms=not args.no_baselines,
        dataset=args.dataset if files else DATASET,
    )
    return Decode, config, report


def _sequences_workload(args: argparse.Namespace, names: tuple[str, ...]) -> tuple[type, Any, Any]:
    """The sequences workload's class, its config from ``args``, and its report module."""
    from jaxfeed.compare.workloads.sequences import report
    from jaxfeed.compare.workloads.sequences.workload import Sequences, SequencesConfig

    if args.workers is not None or args.train_epochs != TRAIN_EPOCHS:
        raise ValueError(
            "--workload sequences reads each backend in this process and trains nothing; "
            "drop --workers and --train-epochs"
        )
    if args.plot is not None or args.dataset != DEFAULT_DATASET or args.data_dir is not None:
        raise ValueError(
            "--workload sequences reads the paragraphs of CPython's docs and prints a table; "
            "drop --dataset, --data-dir and --plot (use --json for every figure)"
        )
    config = SequencesConfig(
        backends=names,
        batch_size=args.batch_size,
        seed=args.seed,
        repeats=args.repeats,
        warmup=args.warmup,
        max_batches=args.max_batches,
        idioms=not args.no_baselines,
    )
    return Sequences, config, report


def _mixtures_workload(args: argparse.Namespace, names: tuple[str, ...]) -> tuple[type, Any, Any]:
    """The mixtures workload's class, its config from ``args``, and its report module."""
    from jaxfeed.compare.workloads.mixtures import report
    from jaxfeed.compare.workloads.mixtures.workload import (
        DEFAULT_WEIGHTS,
        Mixtures,
        MixturesConfig,
    )

    if args.workers is not None or args.train_epochs != TRAIN_EPOCHS or args.plot is not None:
        raise ValueError(
            "--workload mixtures reads each backend in this process, trains nothing and "
            "prints a table; drop --workers, --train-epochs and --plot"
        )
    datasets = args.dataset if isinstance(args.dataset, list) else []
    if len(datasets) == 1:
        raise ValueError(
            "--workload mixtures mixes several --dataset (with --weights), or by default the "
            "digits 0-4 and 5-9; give --dataset twice or more, or none"
        )
    given = args.weights or DEFAULT_WEIGHTS
    if len(given) != (len(datasets) or 2):
        raise ValueError(
            f"{len(datasets) or 2} datasets and {len(given)} --weights: give one weight per "
            "--dataset"
        )
    config = MixturesConfig(
        backends=names,
        datasets=tuple(datasets),
        weights=tuple(given),
        data_dir=args.data_dir,
        storage_options=storage_options(args),
        batch_size=args.batch_size,
        seed=args.seed,
        repeats=args.repeats,
        warmup=args.warmup,
        max_batches=args.max_batches,
        idioms=not args.no_baselines,
    )
    return Mixtures, config, report


def _holds_files(dataset: str) -> bool:
    """Whether ``--dataset`` is the user's files in a format `own_readers` compares."""
    from jaxfeed.compare.workloads.decode.own_readers import READERS
    from jaxfeed.loaders.data.formats import locate

    if dataset == "mnist-sample" or not Path(dataset).exists():
        return False
    found = locate(dataset, "train", ("train", "test"))
    return found is not None and found.format in READERS
