"""``jaxfeed backends``: every loader backend and whether it can be used here."""

from __future__ import annotations

import argparse

from jaxfeed.cli.args import subcommand


def add_backends(commands: argparse._SubParsersAction) -> None:
    subcommand(commands, "backends", help="list loader backends and whether each can be used")


def run_backends() -> int:
    from jaxfeed import loaders

    for name, status in loaders.available().items():
        print(f"{name:8s} {status}")
    return 0
