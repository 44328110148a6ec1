"""What a checkpoint is checked against before it is trusted: the settings
of the run that wrote it (`check_settings`), the data it read (`check_data`),
the structure of its arrays (`check_structure`), the shape, dtype and CRC-32
of each array (`fingerprints`), which ``meta.json`` holds, and ``meta.json``
itself (`meta_checksum`)."""

from __future__ import annotations

import hashlib
import json
import warnings
import zlib
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

__all__ = [
    "ChangedDataWarning",
    "as_json",
    "check_data",
    "check_settings",
    "check_structure",
    "fingerprints",
    "meta_checksum",
]


class ChangedDataWarning(UserWarning):
    """A checkpoint was resumed on other data than it was written with, on purpose."""


def as_json(value: Any) -> Any:
    """``value`` as it reads back from JSON (tuples become lists), for comparisons."""
    return json.loads(json.dumps(value, default=str))


def check_settings(saved: Mapping[str, Any], current: Mapping[str, Any], where: str) -> None:
    """Refuses to resume a checkpoint written by a run with other settings.

    Args:
      saved: the settings stored in the checkpoint.
      current: this run's settings.
      where: names the checkpoint in the message.

    Raises:
      ValueError: naming every setting that differs, with both values.
    """
    current = as_json(current)
    missing = "(not set)"
    differ = [
        f"{key} {saved.get(key, missing)!r}, this run has {current.get(key, missing)!r}"
        for key in sorted(set(saved) | set(current))
        if saved.get(key, missing) != current.get(key, missing)
    ]
    if differ:
        raise ValueError(
            f"{where} was written by a run with other settings: {'; '.join(differ)}. "
            f"Resume with the checkpoint's settings, or use another checkpoint directory "
            f"to start fresh"
        )


def meta_checksum(meta: Mapping[str, Any]) -> str:
    """SHA-256 of ``meta.json``'s values but its own ``checksum`` entry: an
    edited ``meta.json`` (a ``next_batch`` moved on by hand) no longer matches."""
    body = {key: value for key, value in meta.items() if key != "checksum"}
    text = json.dumps(as_json(body), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def _fingerprint(record: Any) -> Any:
    """A split's fingerprint from its record: the string itself, or a mapping's
    ``"fingerprint"``."""
    return record.get("fingerprint") if isinstance(record, Mapping) else record


def _what_changed(split: str, old: Any, new: Any) -> str:
    """One split's change: its fingerprints, the fields that changed and where
    it was read from, as far as the records say."""
    said = f"{split} data: fingerprint {_fingerprint(old)} then, {_fingerprint(new)} now"
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        before, after = old.get("fields") or {}, new.get("fields") or {}
        changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
        if changed:
            said += f" (fields changed: {', '.join(changed)})"
        if old.get("read_from") and new.get("read_from"):
            said += f", read from {old['read_from']} then, {new['read_from']} now"
    return said


def check_data(
    saved: Mapping[str, Any] | None,
    current: Mapping[str, Any] | None,
    where: str,
    accept_changed: bool,
) -> None:
    """Refuses to resume a checkpoint on other data than the run that wrote it
    read, by split: a dataset rewritten in place, or other data under the
    same name. Nothing is compared when either run did not record its data.

    Args:
      saved, current: split -> its content fingerprint, or a mapping with a
        ``"fingerprint"`` (and optionally ``"fields"``, field -> fingerprint,
        and ``"read_from"``, which the message names).
      where: names the checkpoint in the message.
      accept_changed: resume anyway, with a `ChangedDataWarning`.

    Raises:
      ValueError: naming each split that changed, its old and new
        fingerprints and, where known, the fields that changed.
    """
    if not saved or not current:
        return
    current = as_json(current)
    changed = [
        _what_changed(split, saved.get(split), current.get(split))
        for split in sorted(set(saved) | set(current))
        if _fingerprint(saved.get(split)) != _fingerprint(current.get(split))
    ]
    if not changed:
        return
    if accept_changed:
        warnings.warn(
            f"resuming {where} on changed data, as asked: {'; '.join(changed)}",
            ChangedDataWarning,
            stacklevel=4,
        )
        return
    raise ValueError(
        f"{where} was written by a run that read other data: {'; '.join(changed)}. Resume "
        f"on the data it was written with; or continue on this data on purpose with "
        f"Checkpointing(accept_changed_data=True); "
        f"or use another checkpoint directory to start fresh"
    )


def _raw(leaf: Any) -> Any:
    """A typed PRNG key array (``jax.random.key``, NNX's ``Rngs``) as its uint32
    key data, which numpy can hold; any other leaf as it is. Orbax saves and
    restores key arrays themselves."""
    if isinstance(leaf, jax.Array) and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        return jax.random.key_data(leaf)
    return leaf


def _host(leaf: Any) -> np.ndarray:
    """A leaf's values on the host: one copy of a replicated array (each
    process of a job holds it whole)."""
    leaf = _raw(leaf)
    if isinstance(leaf, jax.Array) and leaf.is_fully_replicated:
        leaf = leaf.addressable_data(0)
    return np.asarray(leaf, order="C")  # (np.ascontiguousarray makes a scalar 1-d)


def fingerprints(tree: Any) -> dict[str, dict[str, Any]]:
    """Path -> shape, dtype and CRC-32 of every array of ``tree``: what a restore
    checks before it is trusted."""
    out = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
        values = _host(leaf)
        out[jax.tree_util.keystr(path)] = {
            "shape": list(values.shape),
            "dtype": values.dtype.str,
            "crc32": zlib.crc32(values.reshape(-1).view(np.uint8)),
        }
    return out


def check_structure(saved: Mapping[str, Any], target: Any, where: str) -> None:
    """Refuses a checkpoint whose arrays are not this run's (another model or optimizer)."""
    mine = {
        jax.tree_util.keystr(path): f"{np.dtype(raw.dtype).name}{list(np.shape(raw))}"
        for path, raw in jax.tree_util.tree_leaves_with_path(jax.tree.map(_raw, target))
    }
    theirs = {path: f"{np.dtype(f['dtype']).name}{f['shape']}" for path, f in saved.items()}
    if mine != theirs:
        differ = sorted(set(mine) ^ set(theirs)) or [p for p in mine if mine[p] != theirs[p]]
        path = differ[0]
        raise ValueError(
            f"{where} holds a train state that does not fit this run's (another model or "
            f"optimizer?): {path} is {theirs.get(path, 'absent')} there, "
            f"{mine.get(path, 'absent')} here"
        )
