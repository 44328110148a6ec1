"""Argument types, help texts and helpers shared by the ``jaxfeed`` subcommands."""

from __future__ import annotations

import argparse
import ast
import json
import math
import os
from pathlib import Path
from typing import Any

from jaxfeed.loaders.checks import MAX_SEED

HELP_FORMAT = argparse.ArgumentDefaultsHelpFormatter

DATASET_HELP = (
    "mnist, mnist-sample (offline), mnist-10k, digits-png (encoded and augmented: see "
    "docs/data.md), a directory of .npy files, a directory of IDX files, or your files: "
    "TFRecord, ArrayRecord, Parquet or Arrow shards, an image folder, a TFDS or HF directory"
)

DATA_DIR_HELP = "directory with the MNIST IDX files; None: $JAXFEED_DATA_DIR, then the cache"

DEVICES_HELP = (
    "use the first N local devices of each process (N simulated CPU devices without an "
    "accelerator); None: all"
)


def option(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return key, value  # a bare string such as order=native


def storage_option(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` for a dataset URL's store: VALUE as JSON (``true``, ``1``,
    ``{"retries": ...}``), else the string (``endpoint_url=http://...``)."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(
            f"expected KEY=VALUE (e.g. anon=true or endpoint_url=http://127.0.0.1:9000), got "
            f"{key or text!r}"
        )
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value


def add_storage_option(parser: argparse.ArgumentParser, dataset: str = "--dataset") -> None:
    parser.add_argument(
        "--storage-option",
        type=storage_option,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"for a {dataset} URL (s3://, gs://, hf://, https://): an option of its store, as "
        "fsspec takes it (anon=true, endpoint_url=http://127.0.0.1:9000; a JSON VALUE is read "
        "as JSON); repeatable (docs/storage.md)",
    )


def storage_options(args: argparse.Namespace) -> dict[str, Any] | None:
    """``--storage-option``'s dict, None when not given (the store's own chain)."""
    return dict(args.storage_option) or None


def public_command(argv: list[str]) -> list[str]:
    """``argv`` as a record may hold it: each ``--storage-option`` that holds a
    key looking like a secret has its value blanked (as the library blanks
    ``storage_options``)."""
    out = list(argv)
    for i, arg in enumerate(out):
        flag, sep, given = arg.partition("=")
        if flag == "--storage-option" and sep:  # --storage-option=KEY=VALUE
            out[i] = f"{flag}={_public_option(given)}"
        elif arg == "--storage-option" and i + 1 < len(out):
            out[i + 1] = _public_option(out[i + 1])
    return out


def _public_option(text: str) -> str:
    from jaxfeed.loaders.data.remote import without_secrets

    try:
        key, value = storage_option(text)
    except argparse.ArgumentTypeError:
        return text
    given = {key: value}
    return text if without_secrets(given) == given else f"{key}=***"


def positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


class Datasets(argparse.Action):
    """``--dataset``, repeatable (a mixture's, with ``--weights``): the first
    given replaces the default."""

    def __call__(self, parser: Any, namespace: Any, value: Any, option: Any = None) -> None:
        given = getattr(namespace, self.dest)
        setattr(namespace, self.dest, [*(given if isinstance(given, list) else []), value])


def weights(text: str) -> list[float]:
    """``0.7,0.3``: a mixture's weights, each a number >= 0."""
    try:
        values = [float(w) for w in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected weights as numbers separated by commas (0.7,0.3), got {text!r}"
        ) from None
    if not all(0 <= v < float("inf") for v in values) or not sum(values) > 0:
        raise argparse.ArgumentTypeError(f"weights are numbers >= 0, not all 0; got {text!r}")
    return values


def non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {value}")
    return value


def number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def learning_rate(text: str) -> float:
    value = number(text)
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(
            f"must be a finite number > 0, got {text!r}; SGD diverges to nan otherwise"
        )
    return value


def momentum(text: str) -> float:
    value = number(text)
    if not 0 <= value < 1:  # also refuses nan
        raise argparse.ArgumentTypeError(
            f"must be in [0, 1), got {text!r}; 0 is plain SGD, 0.9 is usual"
        )
    return value


def seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if not 0 <= value <= MAX_SEED:
        raise argparse.ArgumentTypeError(
            f"must be in [0, {MAX_SEED}] (32 bits, what every backend takes), got {value}"
        )
    return value


def seconds(text: str) -> float:
    value = number(text)
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text!r}")
    return value


def loader_list(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if not names:
        raise argparse.ArgumentTypeError(f"expected comma-separated backend names, got {text!r}")
    return names


def worker_counts(text: str) -> tuple[int, ...]:
    """``0,1,2``: distinct worker counts >= 0, in the order given."""
    try:
        counts = tuple(int(n) for n in text.split(",") if n.strip())
    except ValueError:
        counts = ()
    if not counts or min(counts) < 0:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated worker counts >= 0 (e.g. 0,1,2), got {text!r}"
        )
    return tuple(dict.fromkeys(counts))


def subcommand(commands: argparse._SubParsersAction, name: str, **kwargs: Any):
    """A subcommand that shows its defaults and also takes ``--debug`` after its name."""
    debug = argparse.ArgumentParser(add_help=False)
    # SUPPRESS: when absent here, the top-level parser's value stands.
    debug.add_argument(
        "--debug", action="store_true", default=argparse.SUPPRESS, help="as jaxfeed --debug"
    )
    kwargs.setdefault("description", kwargs.get("help"))
    return commands.add_parser(name, formatter_class=HELP_FORMAT, parents=[debug], **kwargs)


def set_devices(count: int | None) -> None:
    if count is None:
        return
    flag = f"--xla_force_host_platform_device_count={count}"
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if "device_count" not in f]
    os.environ["XLA_FLAGS"] = " ".join([*flags, flag])


def pick_devices(devices: list, per_process: int | None) -> list:
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


def check_writable(path: Path | None, flag: str) -> None:
    """Refuses an output file that cannot be written, before any work is done."""
    if path is None:
        return
    existed = path.exists()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a"):  # what writing it later needs, without truncating it now
            pass
        if not existed:
            # missing_ok: every process of a job checks the same path at once.
            path.unlink(missing_ok=True)
    except OSError as err:
        raise ValueError(
            f"{flag} {path} cannot be written ({type(err).__name__}: {err.strerror or err}); "
            f"pick a writable path"
        ) from err


def check_directory(path: Path | None, flag: str) -> None:
    """Refuses an output directory that cannot be made or written, before any
    work is done, without making it (a run that fails leaves nothing behind)."""
    if path is None:
        return
    existing = next(p for p in (path, *path.parents) if p.exists())  # "." or "/" at last
    if not existing.is_dir():
        where = "is a file" if existing == path else f"lies under the file {existing}"
        raise ValueError(f"{flag} {path} {where}; pick a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {path} cannot be written ({existing}: permission denied)")


# A library error names the argument its caller passed; a user of the command
# passed a flag. Each library spelling here is written only where it names that
# argument (tests/cli/test_error_words.py checks each is still in use).
FLAGS = {
    "coordinator=": "--coordinator ",
    "num_processes=": "--num-processes ",
    "process_id=": "--process-id ",
    "initialize(timeout_s=...)": "--peer-timeout",
    "data_dir=": "--data-dir ",
    "nan_policy='continue'": "--nan-policy continue",
    "Checkpointing(directory=...)": "--checkpoint-dir",
    "Checkpointing(accept_changed_data=True)": "--resume-changed-data",
    "to='parquet'": "--to parquet",
    "overwrite=True": "--overwrite",
    "storage_options=": "--storage-option",
}


def in_flags(message: str) -> str:
    """A library's message in the command's words: each argument it names as its flag."""
    for argument, flag in FLAGS.items():
        message = message.replace(argument, flag)
    return message


def one_line(text: str) -> str:
    return " ".join(line.strip() for line in text.splitlines() if line.strip())
