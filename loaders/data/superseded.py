"""Copies in the cache that a newer copy of the same source supersedes:
pruned, unless a live process reads them.

An on-disk dataset regenerated in place gets a new content key, so a backend
that converts it (hf's Arrow copy) builds a new entry, and without pruning
every version would stay, a full copy each. An entry records its source's name
(`record_source`, the dataset's name: an on-disk dataset's absolute path);
building a new one removes the others of that source (`prune`).

A reader holds a shared ``flock`` on the entry's directory for as long as it
reads it (`hold_reading`), and the pruner takes an exclusive one without
waiting: an entry some process reads, on this host or another sharing the
cache, is left for a later build. The kernel drops a reader's lock when it
dies, however it dies. Entries written before sources were recorded are
never pruned (whose they are is unknown).
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import shutil
from pathlib import Path

__all__ = ["SOURCE_FILE", "hold_reading", "prune", "record_source"]

SOURCE_FILE = "jaxfeed-source.json"


def record_source(scratch: Path, source: str) -> None:
    """In a build's scratch: which source the entry is a copy of."""
    (scratch / SOURCE_FILE).write_text(json.dumps({"source": source}))


def hold_reading(entry: Path) -> int | None:
    """Holds a shared lock on ``entry`` for as long as the returned descriptor
    is open; None if the entry was pruned meanwhile (build it again)."""
    try:
        handle = os.open(entry, os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        return None
    fcntl.flock(handle, fcntl.LOCK_SH)
    try:  # the directory locked is still the one at `entry`: not pruned before the lock
        if os.path.samestat(os.fstat(handle), os.stat(entry)):
            return handle
    except FileNotFoundError:
        pass
    os.close(handle)
    return None


def _source(entry: Path) -> str | None:
    try:
        return str(json.loads((entry / SOURCE_FILE).read_text())["source"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def prune(entry: Path, source: str) -> list[Path]:
    """Deletes the entries beside ``entry`` copied from ``source`` that no
    process reads; returns them. A read-only cache is left as it is."""
    pruned = []
    for other in entry.parent.iterdir():
        if other == entry or other.name.startswith(".") or _source(other) != source:
            continue
        try:
            handle = os.open(other, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            continue
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            # Out of sight first (readers then build anew), then deleted.
            doomed = other.parent / f".{other.name}.pruned-{secrets.token_hex(4)}"
            os.rename(other, doomed)
        except OSError:  # read (a shared lock is held), or not ours to delete
            continue
        finally:
            os.close(handle)
        shutil.rmtree(doomed, ignore_errors=True)
        pruned.append(other)
    return pruned
