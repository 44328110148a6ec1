"""The ``jaxfeed`` command line: ``jaxfeed train``, ``jaxfeed compare``, ``jaxfeed backends``.

Arguments are parsed, and library logging quieted, before any loader backend is
imported: TensorFlow reads ``TF_CPP_MIN_LOG_LEVEL`` once, at import. ``--devices``
sets XLA_FLAGS, which jax reads when its backends start (the first ``jax.devices()``).

A user error (bad input, a missing package or file) is one line on stderr and
exit status 2; ``--debug`` shows its traceback and the libraries' own logs instead.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from jaxfeed.cli_args import (
    DATA_DIR_HELP,
    DATASET_HELP,
    DEVICES_HELP,
    HELP_FORMAT,
    check_writable,
    loader_list,
    one_line,
    pick_devices,
    positive,
    seed,
    set_devices,
    subcommand,
    worker_counts,
)
from jaxfeed.cli_train import add_train, run_train
from jaxfeed.interrupts import PREEMPTED_STATUS, Preempted


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jaxfeed",
        description="Feed any Python data loader to JAX, sharded and prefetched.",
        formatter_class=HELP_FORMAT,
    )
    parser.add_argument(
        "--debug",
        action="store_true",
        help="on an error, show the full traceback; show the libraries' own warnings and logs",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    add_train(commands)
    subcommand(commands, "backends", help="list loader backends and whether each can be used")
    _add_compare(commands)
    return parser


def _add_compare(commands: argparse._SubParsersAction) -> None:
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
        "pipeline (docs/compare.md).",
    )
    compare.add_argument(
        "--workload",
        choices=("copy", "decode"),
        default="copy",
        help="copy: decoded digits (what the flags above describe); decode: digits-png, "
        "decoded and augmented per record in each backend's workers",
    )
    compare.add_argument(
        "--workers",
        type=worker_counts,
        default=None,
        metavar="K,K,...",
        help="--workload decode: the worker counts to measure (default 0,1,2)",
    )
    compare.add_argument(
        "--loaders",
        type=loader_list,
        default=None,
        metavar="A,B,...",
        help="backends to compare; None: every available one",
    )
    compare.add_argument("--dataset", default="mnist-sample", help=DATASET_HELP)
    compare.add_argument("--data-dir", default=None, help=DATA_DIR_HELP)
    compare.add_argument("--batch-size", type=positive, default=128, help="per-process batch")
    compare.add_argument("--seed", type=seed, default=0, help="shuffle and init seed")
    compare.add_argument("--repeats", type=positive, default=3, help="timed repeats (medians)")
    compare.add_argument(
        "--warmup", type=int, default=1, help="untimed warm-up passes (<= 16 batches each)"
    )
    compare.add_argument("--train-epochs", type=positive, default=2, help="epochs per repeat")
    compare.add_argument(
        "--max-batches",
        type=positive,
        default=None,
        metavar="N",
        help="read at most N batches per measurement (tiny CI runs); None: whole epochs",
    )
    compare.add_argument(
        "--no-baselines",
        action="store_true",
        help="skip the in-memory ceiling and the tutorial loops (and so the wrap and Keras rows); "
        "decode: skip each framework's own pipeline",
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


def _run_compare(args: argparse.Namespace, command: list[str]) -> int:
    if args.warmup < 0:
        raise ValueError(f"--warmup must be >= 0, got {args.warmup}")
    check_writable(args.json, "--json")
    check_writable(args.plot, "--plot")
    set_devices(args.devices)
    import jax

    from jaxfeed import loaders
    from jaxfeed.compare.runner import run
    from jaxfeed.loaders.backends import registry
    from jaxfeed.sharding import data_mesh

    usable = [name for name, status in loaders.available().items() if "unavailable" not in status]
    names = args.loaders if args.loaders is not None else tuple(usable)
    for name in names:
        registry.get(name)  # unknown or not installed: a clear error, before any work
    chosen = {"copy": _copy_workload, "decode": _decode_workload}[args.workload]
    workload, config, report = chosen(args, tuple(dict.fromkeys(names)))
    mesh = data_mesh(pick_devices(jax.devices(), args.devices))
    result = run(workload(config, mesh), command)
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
    config = CopyConfig(
        backends=names,
        dataset=args.dataset,
        data_dir=args.data_dir,
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

    if args.plot is not None or args.dataset != "mnist-sample":
        raise ValueError(
            f"--workload decode reads {DATASET!r} and prints a table; drop "
            "--dataset and --plot (use --data-dir for the real digits, --json for every figure)"
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
    )
    return Decode, config, report


def _run_backends() -> int:
    from jaxfeed import loaders

    for name, status in loaders.available().items():
        print(f"{name:8s} {status}")
    return 0


def _quiet_libraries() -> None:
    """Keeps TensorFlow's C++ logs, and library log records below ERROR, off stderr.

    Must run before TensorFlow is imported: it reads TF_CPP_MIN_LOG_LEVEL at
    import, and adds its own log handler only when the root logger has none.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    # A no-op where logging is already set up (an embedding program, pytest).
    logging.basicConfig(level=logging.ERROR, format="%(name)s: %(levelname)s: %(message)s")
    # A failed checkpoint write is named in one line (``--debug`` shows the rest):
    # Orbax logs its save thread's traceback, and TensorStore's late callbacks into
    # Orbax's closed event loop print more, unraisable, or unretrieved.
    logging.getLogger("absl").addFilter(_not_an_orbax_thread_traceback)
    logging.getLogger("asyncio").addFilter(_not_an_unretrieved_future)
    sys.unraisablehook = _without_closed_loop_callbacks(sys.unraisablehook)


def _not_an_orbax_thread_traceback(record: logging.LogRecord) -> bool:
    return not (record.exc_info and f"{os.sep}orbax{os.sep}" in record.pathname)


def _not_an_unretrieved_future(record: logging.LogRecord) -> bool:
    return "exception was never retrieved" not in str(record.msg)  # a Future's or a Task's


def _without_closed_loop_callbacks(hook: Callable[[Any], None]) -> Callable[[Any], None]:
    def unless_closed_loop(unraisable: Any) -> None:
        error = unraisable.exc_value
        if not (isinstance(error, RuntimeError) and str(error) == "Event loop is closed"):
            hook(unraisable)

    return unless_closed_loop


@contextlib.contextmanager
def _one_line_warnings() -> Iterator[None]:
    """Shows each warning once per place that raises it, as one ``jaxfeed: warning:`` line.

    The mnist offline fallback warns once per split; one line says it all.
    """
    seen: set[tuple] = set()

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        if (category, filename, lineno) not in seen:
            seen.add((category, filename, lineno))
            print(f"jaxfeed: warning: {one_line(str(message))}", file=sys.stderr)

    with warnings.catch_warnings():
        warnings.showwarning = show
        yield


def _is_user_error(err: Exception) -> bool:
    """Bad input, or a missing package or file: worth one line, not a traceback."""
    if isinstance(err, ImportError):
        # A failed import between jaxfeed's own modules is a bug, not a missing package.
        return (err.name or "").partition(".")[0] != "jaxfeed"
    return isinstance(err, ValueError | TypeError | OSError)


def _run(args: argparse.Namespace, argv: list[str] | None) -> int:
    if args.command == "train":
        return run_train(args)
    if args.command == "compare":
        return _run_compare(args, ["jaxfeed", *(sys.argv[1:] if argv is None else argv)])
    return _run_backends()


def main(argv: list[str] | None = None) -> int:
    """Runs one ``jaxfeed`` command and returns its exit status.

    Example:
      >>> main(["train", "--loader", "torch", "--epochs", "1", "--quiet"])  # doctest: +SKIP
      0
    """
    args = build_parser().parse_args(argv)  # argparse's own errors exit 2 with usage
    if args.debug:
        return _run(args, argv)
    _quiet_libraries()
    try:
        with _one_line_warnings():
            return _run(args, argv)
    except KeyboardInterrupt as err:
        # fit says where it stopped and which checkpoint it saved.
        detail = f": {one_line(str(err))}" if str(err) else ""
        if isinstance(err, Preempted):
            print(f"jaxfeed: preempted (SIGTERM){detail}", file=sys.stderr)
            return PREEMPTED_STATUS
        print(f"jaxfeed: interrupted{detail}", file=sys.stderr)
        return 130
    except Exception as err:
        if not _is_user_error(err):
            raise
        said = " ".join([str(err), *getattr(err, "__notes__", ())])  # notes: where it arose
        print(f"jaxfeed: error: {one_line(said) or type(err).__name__}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
