"""Checkpoints of a `jaxfeed.fit` run, with Orbax: state, step, data position, stream state.

One checkpoint is one Orbax step directory with up to three items:

* ``state``: the train state and the epoch's running metric sums (arrays);
* ``meta``: ``meta.json`` with the step, the data position ``(epoch,
  next_batch)``, the run's settings and the finished epochs' history;
* ``data``: one ``process_{i}-of-{n}.json`` per process, the source's own
  ``data_state(epoch, next_batch)``, only for sources that have that method.

Orbax writes a checkpoint into a temporary directory and renames it when every
item (and every process) is done, so a crash mid-save leaves no checkpoint
that looks complete; the next run deletes the leftover. Saves are
asynchronous: the arrays are copied to host memory, then written while
training goes on.

A checkpoint verifies itself: ``meta.json`` holds the shape, dtype and CRC-32
of every array, checked after the restore, and a SHA-256 of its own values,
checked before anything in it is used (an edited ``next_batch`` would resume
elsewhere). A damaged, edited or unreadable newest checkpoint is reported by
step and file, and the newest one that verifies is used instead; when none
does, `CheckpointError`. Given the data's fingerprints, a checkpoint records
them, and a resume on changed data is refused by split (`check_data`).

One run at a time writes a directory: the first process holds a lock on
``jaxfeed.lock`` in it (released by the system when the process dies, so a
killed run leaves no stale lock).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import re
import socket
import time
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import jax

from jaxfeed.loaders.checks import check_bool
from jaxfeed.training.verify import (
    as_json,
    check_data,
    check_settings,
    check_structure,
    fingerprints,
    meta_checksum,
)

FORMAT = 3  # of meta.json; bumped when its fields change meaning (2: array checksums,
# 3: its own checksum and the data's fingerprints)
LOCK_FILE = "jaxfeed.lock"


class CheckpointError(ValueError):
    """No checkpoint in the directory can be trusted (each is damaged or
    unreadable), or one could not be written (disk full, read-only)."""


class _Damaged(Exception):
    """One checkpoint failed to read or to verify; the message names the file."""


class CheckpointFallbackWarning(UserWarning):
    """The newest checkpoint was damaged, and an older one that verifies was used."""


class TopologyChangedWarning(UserWarning):
    """A checkpoint written on other process or device counts was resumed."""


@dataclasses.dataclass(frozen=True)
class Checkpointing:
    """Where and how often `jaxfeed.fit` saves checkpoints.

    Args:
      directory: one directory per run; every checkpoint of the run goes in it.
      every: also save every this many training steps; None: only at the end
        of each epoch (always saved).
      keep: how many of the newest checkpoints to keep.
      data: the data the run reads, recorded in every checkpoint: split ->
        its content fingerprint (`jaxfeed.loaders.data.cache.fingerprint`
        of ``dataset.content()``), or a mapping with a ``"fingerprint"`` and
        optionally ``"fields"`` and ``"read_from"`` that a refusal names.
        None: not recorded, and not checked on resume.
      accept_changed_data: resume on data whose fingerprint differs from the
        checkpoint's (with a `ChangedDataWarning`) instead of refusing it.

    Raises:
      ValueError: ``every`` or ``keep`` is not a positive integer.
      TypeError: ``accept_changed_data`` is not a bool.
    """

    directory: str | os.PathLike
    every: int | None = None
    keep: int = 3
    data: Mapping[str, Any] | None = None
    accept_changed_data: bool = False

    def __post_init__(self) -> None:
        for name, value in (("every", self.every), ("keep", self.keep)):
            if value is None and name == "every":  # every=None: at epoch ends only
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Checkpointing.{name} must be an integer >= 1, got {value!r}")
        check_bool("Checkpointing.accept_changed_data", self.accept_changed_data)


class Restored(NamedTuple):
    """What a checkpoint gives back to `jaxfeed.fit`."""

    state: Any
    totals: dict[str, jax.Array]
    step: int
    epoch: int
    next_batch: int
    history: list[dict]
    data_state: dict | None


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:300]}" if text else type(error).__name__


def _write_failure(error: BaseException) -> str:
    """The system's reason a write failed ("No space left on device"), also from
    TensorStore, whose errors carry it as ``os_error_code='28'``."""
    code = getattr(error, "errno", None)
    if code is None and (found := re.search(r"os_error_code='(\d+)'", str(error))):
        code = int(found[1])
    return f"{os.strerror(code)} (errno {code})" if code else _first_line(error)


def _lock(directory: Path) -> Any:
    """An exclusive lock on ``directory`` for this process's lifetime (or
    until closed); refuses, by owner, a directory another run holds."""
    directory.mkdir(parents=True, exist_ok=True)
    handle = open(directory / LOCK_FILE, "a+")  # noqa: SIM115 (held for the run)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        owner = handle.read().strip() or "an unknown process"
        handle.close()
        raise ValueError(
            f"checkpoint directory {directory} is in use by another run ({owner}); wait for "
            f"it to end, or give this run its own Checkpointing(directory=...)"
        ) from None
    handle.seek(0)
    handle.truncate()
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    handle.write(f"host {socket.gethostname()}, pid {os.getpid()}, since {started}\n")
    handle.flush()
    return handle


def _abstract_leaf(x: jax.Array) -> jax.ShapeDtypeStruct:
    """An array's shape, dtype and sharding: what Orbax restores into."""
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)


def _manager(directory: Path, keep: int | None, *, create: bool = True) -> Any:
    import orbax.checkpoint as ocp  # lazily: only runs that checkpoint pay for the import

    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep,
        create=create,
        # A save killed mid-way leaves a temporary directory; the next run removes it.
        cleanup_tmp_directories=create,
        enable_async_checkpointing=True,
    )
    # Each process writes its own stream state (primary_host=None: every process writes).
    data_file = f"process_{jax.process_index()}-of-{jax.process_count()}.json"
    every_process = ocp.options.MultiprocessingOptions(primary_host=None)
    handlers = {
        "state": ocp.StandardCheckpointHandler(),
        "meta": ocp.JsonCheckpointHandler("meta.json"),
        "data": ocp.JsonCheckpointHandler(data_file, multiprocessing_options=every_process),
    }
    return ocp.CheckpointManager(directory, options=options, item_handlers=handlers)


def _check_directory(directory: Path) -> None:
    if directory.exists() and not directory.is_dir():
        raise ValueError(f"checkpoint directory {directory} is a file; pick a directory")


def latest(directory: str | os.PathLike) -> dict | None:
    """The ``meta.json`` of the newest complete checkpoint in ``directory`` whose
    ``meta.json`` reads and matches its checksum (its arrays are checked when
    restored), or None when there is none (also when the directory does not
    exist).

    Example:
      >>> latest("runs/a")["step"]  # doctest: +SKIP
      120
    """
    directory = Path(directory).absolute()
    _check_directory(directory)
    if not directory.is_dir():
        return None
    manager = _manager(directory, None, create=False)  # only reads
    try:
        for step in sorted(manager.all_steps(), reverse=True):
            try:
                meta = _read_meta(manager, step, f"checkpoint {directory / str(step)}")
            except _Damaged:
                continue  # the restore names it when it falls back
            return meta
        return None
    finally:
        manager.close()


def _read_meta(manager: Any, step: int, where: str) -> dict:
    """Checkpoint ``step``'s ``meta.json``, checked against its own checksum.

    Raises:
      _Damaged: it cannot be read, or does not match its checksum.
      ValueError: another jaxfeed's format.
    """
    import orbax.checkpoint as ocp

    try:
        meta = manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
    except Exception as error:
        raise _Damaged(f"step {step}: {where}/meta/meta.json is unreadable "
                       f"({_first_line(error)})") from None  # fmt: skip
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise ValueError(f"{where} has format {found!r}; this jaxfeed reads format {FORMAT}")
    if meta.get("checksum") != meta_checksum(meta):
        raise _Damaged(
            f"step {step}: {where}/meta/meta.json does not match its checksum (edited or "
            f"damaged after it was written)"
        )
    return meta


class Checkpointer:
    """The checkpoints of one run: saves (asynchronous, keeping the newest
    ``keep``) and the restore of the newest one.

    Args:
      config: directory, frequency and how many to keep.
      settings: what a resumed run must have in common with this one (JSON
        values); stored in every checkpoint.
      topology: ``{"processes": P, "devices": D}``, stored too; a resume on
        another one says what changed, and refuses a stream's per-process state.

    Raises:
      ValueError: the directory is a file.
    """

    def __init__(
        self,
        config: Checkpointing,
        settings: Mapping[str, Any],
        topology: Mapping[str, int],
    ):
        self.config = config
        self.topology = dict(topology)
        self.directory = Path(config.directory).absolute()
        _check_directory(self.directory)
        self.settings = as_json(dict(settings))
        self.data = None if config.data is None else as_json(dict(config.data))
        self._lock = _lock(self.directory) if jax.process_index() == 0 else None
        try:
            self._manager = _manager(self.directory, config.keep)
        except BaseException:
            self._unlock()
            raise
        self.last_step: int | None = self._manager.latest_step()
        self._written: int | None = self.last_step  # the newest checkpoint complete on disk

    @contextlib.contextmanager
    def _writing(self, step: int | None) -> Iterator[None]:
        """Turns a failed write of ``step`` (a full disk, a read-only or
        vanished directory) into one `CheckpointError` line that says so."""
        try:
            yield
        except Exception as error:
            kept = (
                f"the newest complete checkpoint is step {self._written}"
                if self._written is not None
                else "no checkpoint was completed"
            )
            raise CheckpointError(
                f"could not write the checkpoint of step {step} in {self.directory}: "
                f"{_write_failure(error)}. Free space there or pick a writable "
                f"Checkpointing(directory=...); {kept}"
            ) from error

    def save(
        self,
        step: int,
        state: Any,
        totals: Mapping[str, jax.Array],
        *,
        epoch: int,
        next_batch: int,
        history: list[dict],
        data_state: dict | None,
    ) -> bool:
        """Starts saving a checkpoint of ``step``; returns False if it exists already.

        Returns once the arrays are copied off the devices; a previous save
        still being written is waited for first.
        """
        import orbax.checkpoint as ocp

        if step == self.last_step:  # e.g. stopped before the first step after a resume
            return False
        meta = {
            "format": FORMAT,
            "step": step,
            "epoch": epoch,
            "next_batch": next_batch,
            "settings": self.settings,
            "history": history,
            "data_state": data_state is not None,
            "arrays": fingerprints({"state": state, "totals": dict(totals)}),
            "topology": self.topology,
            "data": self.data,
        }
        meta["checksum"] = meta_checksum(meta)
        items = {
            "state": ocp.args.StandardSave({"state": state, "totals": dict(totals)}),
            "meta": ocp.args.JsonSave(as_json(meta)),
        }
        if data_state is not None:
            items["data"] = ocp.args.JsonSave(data_state)
        self.wait()  # the previous save: its failure is named by its own step
        with self._writing(step):
            self._manager.save(step, args=ocp.args.Composite(**items))
        self.last_step = step
        return True

    def restore(self, state: Any, totals: Mapping[str, jax.Array]) -> Restored | None:
        """The newest checkpoint that verifies, restored onto the shardings of
        ``state`` and ``totals`` (same structure, shapes and dtypes), or None if
        there is none. Damaged newer ones are named in one warning.

        Raises:
          ValueError: the checkpoint was written with other settings, or holds
            a state of another structure.
          CheckpointError: there are checkpoints, but none verifies.
        """
        damaged = []
        for step in sorted(self._manager.all_steps(), reverse=True):
            try:
                restored = self._restore(step, state, totals)
            except _Damaged as damage:
                damaged.append(str(damage))
                continue
            if damaged:
                warnings.warn(
                    f"{'; '.join(damaged)}; resuming from step {step} instead, the newest "
                    f"checkpoint in {self.directory} that verifies",
                    CheckpointFallbackWarning,
                    stacklevel=3,
                )
            return restored
        if damaged:
            raise CheckpointError(
                f"no checkpoint in {self.directory} verifies: {'; '.join(damaged)}. Delete "
                f"the damaged ones to start fresh, or restore them from a copy"
            )
        return None

    def _restore(self, step: int, state: Any, totals: Mapping[str, jax.Array]) -> Restored:
        """Checkpoint ``step``, read and verified.

        Raises:
          _Damaged: a file of it cannot be read, or it does not match its
            checksums (the message names the step and the file).
          ValueError: it is another run's (settings, data, format or
            structure).
        """
        import orbax.checkpoint as ocp

        where = f"checkpoint {self.directory / str(step)}"
        meta = _read_meta(self._manager, step, where)
        check_settings(meta["settings"], self.settings, where)
        check_data(meta["data"], self.data, where, self.config.accept_changed_data)
        self._check_topology(meta, where)
        target = {"state": state, "totals": dict(totals)}
        check_structure(meta["arrays"], target, where)
        items = {"state": ocp.args.StandardRestore(jax.tree.map(_abstract_leaf, target))}
        if meta["data_state"]:
            items["data"] = ocp.args.JsonRestore()
        try:
            restored = self._manager.restore(step, args=ocp.args.Composite(**items))
        except Exception as error:
            raise _Damaged(f"step {step}: {where}/state is unreadable "
                           f"({_first_line(error)})") from None  # fmt: skip
        for path, found in fingerprints(restored["state"]).items():
            if found["crc32"] != meta["arrays"][path]["crc32"]:
                raise _Damaged(
                    f"step {step}: array {path} in {where}/state does not match its checksum"
                )
        return Restored(
            state=restored["state"]["state"],
            totals=restored["state"]["totals"],
            step=int(meta["step"]),
            epoch=int(meta["epoch"]),
            next_batch=int(meta["next_batch"]),
            history=list(meta["history"]),
            data_state=restored["data"] if meta["data_state"] else None,
        )

    def _check_topology(self, meta: Mapping[str, Any], where: str) -> None:
        """Says what changed when resuming on other processes or devices; refuses
        a stream's state taken on another process count (it is per process)."""
        saved, now = meta["topology"], self.topology
        if saved == now:
            return

        def layout(t: Mapping[str, int]) -> str:
            return f"{t['processes']} process(es), {t['devices']} device(s)"

        if meta["data_state"] and saved["processes"] != now["processes"]:
            raise ValueError(
                f"{where} holds the stream states of {layout(saved)}, one per process, and a "
                f"stream cannot be split anew over {now['processes']}; resume it on "
                f"{saved['processes']} process(es)"
            )
        warnings.warn(
            f"resuming on {layout(now)} from {where}, written on {layout(saved)}: the global "
            f"batch is the same, so the same global batches continue; the results equal an "
            f"uninterrupted run's up to float rounding (sums over another layout are added "
            f"in another order)",
            TopologyChangedWarning,
            stacklevel=4,
        )

    def wait(self) -> None:
        """Blocks until the save in progress is written.

        Raises:
          CheckpointError: it could not be written.
        """
        with self._writing(self.last_step):
            self._manager.wait_until_finished()
        self._written = self.last_step  # on disk now

    def close(self) -> None:
        """Waits for the save in progress to be written, then releases Orbax's
        threads and the directory's lock."""
        try:
            self.wait()
            self._manager.close()
        finally:
            self._unlock()

    def _unlock(self) -> None:
        if self._lock is not None:
            self._lock.close()  # closing the file releases the lock
            self._lock = None
