"""The ``jaxfeed`` command line: ``jaxfeed train``, ``jaxfeed compare``, ``jaxfeed backends``.

Arguments are parsed, and library logging quieted, before any loader backend is
imported: TensorFlow reads ``TF_CPP_MIN_LOG_LEVEL`` once, at import. ``--devices``
sets XLA_FLAGS, which jax reads when its backends start (the first ``jax.devices()``).

A user error (bad input, a missing package or file) is one line on stderr and
exit status 2; ``--debug`` shows its traceback and the libraries' own logs instead.

- `train`: ``jaxfeed train``, with what it reads checked in `train_data`.
- `train_data`: the data a training run reads, checked before it starts.
- `compare`: ``jaxfeed compare``.
- `convert`: ``jaxfeed convert``.
- `backends`: ``jaxfeed backends``.
- `args`: the argument helpers, and library errors put in the command's words.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from jaxfeed.cli.args import HELP_FORMAT, in_flags, one_line
from jaxfeed.cli.backends import add_backends, run_backends
from jaxfeed.cli.compare import add_compare, run_compare
from jaxfeed.cli.convert import add_convert, run_convert
from jaxfeed.cli.train import add_train, run_train
from jaxfeed.training.interrupts import PREEMPTED_STATUS, Preempted

__all__ = ["build_parser", "main"]


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
    add_backends(commands)
    add_compare(commands)
    add_convert(commands)
    return parser


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
            print(f"jaxfeed: warning: {one_line(in_flags(str(message)))}", file=sys.stderr)

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
        return run_compare(args, ["jaxfeed", *(sys.argv[1:] if argv is None else argv)])
    if args.command == "convert":
        return run_convert(args)
    return run_backends()


def main(argv: list[str] | None = None) -> int:
    """Runs one ``jaxfeed`` command and returns its exit status.

    Example:
      >>> main(["train", "--loader", "torch", "--epochs", "1", "--quiet"])  # doctest: +SKIP
      0
    """
    args = build_parser().parse_args(argv)  # argparse's own errors exit 2 with usage
    if args.debug:
        os.environ["JAXFEED_DEBUG"] = "1"  # a Ray instance jaxfeed starts shows its logs too
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
        said = in_flags(said)  # the library's messages name arguments; this user gave flags
        print(f"jaxfeed: error: {one_line(said) or type(err).__name__}", file=sys.stderr)
        return 2
