"""``jaxfeed convert SRC DST --to parquet|arrayrecord|npy``: the user's files rewritten for
random access (see `jaxfeed.loaders.data.formats.convert`)."""

from __future__ import annotations

import argparse
import sys

from jaxfeed.cli.args import add_storage_option, positive, storage_options, subcommand


def add_convert(commands: argparse._SubParsersAction) -> None:
    convert = subcommand(
        commands,
        "convert",
        help="rewrite a dataset's files as Parquet or ArrayRecord shards or .npy fields",
    )
    convert.add_argument("source", help="a directory, glob, file or URL jaxfeed reads (see train)")
    convert.add_argument("destination", help="written as DESTINATION/<split>/...")
    convert.add_argument(
        "--to", required=True, choices=("parquet", "arrayrecord", "npy"), help="the format"
    )
    convert.add_argument("--format", default=None, help="what SOURCE holds; None: detected")
    convert.add_argument(
        "--rows-per-shard",
        type=positive,
        default=10_000,
        help="rows per Parquet or ArrayRecord shard",
    )
    convert.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the earlier conversion DESTINATION holds (only the files it wrote); "
        "a destination holding other files is refused even so",
    )
    add_storage_option(convert, "SOURCE")


def run_convert(args: argparse.Namespace) -> int:
    from jaxfeed.loaders.data.formats.convert import convert

    files = convert(
        args.source,
        args.destination,
        args.to,
        format=args.format,
        rows_per_shard=args.rows_per_shard,
        overwrite=args.overwrite,
        storage_options=storage_options(args),
        progress=lambda line: print(f"jaxfeed convert: {line}", file=sys.stderr, flush=True),
    )
    print(f"jaxfeed convert: {len(files)} files in {args.destination}")
    return 0
