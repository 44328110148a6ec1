"""Processes of one job check that they agree on their settings before the first step.

Two processes with a different seed or batch size do not fail on their own: they
read overlapping data, or block in a collective until gloo aborts. So each
process posts its settings to JAX's coordination service (a key-value store
that needs no collective) and compares them with every other process's.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Mapping
from typing import Any

import jax
from jaxfeed.sharding.job.distributed import current_job, peer_timeout

_PREFIX = "jaxfeed/agreement"
# Every process calls check_agreement() the same number of times, in the same
# order, so the n-th call of each meets the n-th call of the others.
_rounds = itertools.count()


def _key(round_: int, process: int) -> str:
    return f"{_PREFIX}/{round_}/{process}"


def _post(record: dict) -> int:
    client, me, _ = current_job()
    round_ = next(_rounds)
    client.key_value_set(_key(round_, me), json.dumps(record))
    return round_


def announce_failure(error: BaseException) -> None:
    """Tells the other processes that this one failed before :func:`check_agreement`.

    They stop waiting for this process's settings and raise ``ConnectionError``
    with ``error``'s message, instead of waiting out the peer timeout. A no-op
    outside a multi-process job.
    """
    if current_job() is not None:
        _post({"failed": f"{type(error).__name__}: {error}"})


def _gather(round_: int, timeout_s: float) -> tuple[dict[int, dict], list[int]]:
    """The other processes' records of ``round_``, and the processes that posted none in time."""
    client, me, count = current_job()
    deadline = time.monotonic() + timeout_s
    records, missing = {}, []
    for process in (p for p in range(count) if p != me):
        key = _key(round_, process)
        left_ms = int(1000 * (deadline - time.monotonic()))
        try:
            # Once time is up, only collect what is already there.
            if left_ms > 0:
                text = client.blocking_key_value_get(key, left_ms)
            else:
                text = client.key_value_try_get(key)
        except jax.errors.JaxRuntimeError:  # DEADLINE_EXCEEDED or NOT_FOUND
            missing.append(process)
            continue
        records[process] = json.loads(text)
    return records, missing


def _processes(ids: list[int]) -> str:
    return f"process {ids[0]}" if len(ids) == 1 else f"processes {', '.join(map(str, ids))}"


def disagreements(settings: dict[int, dict[str, str]]) -> list[str]:
    """One ``name: process 0 has X, process 1 has Y`` per setting that differs."""
    names = dict.fromkeys(name for values in settings.values() for name in values)
    found = []
    for name in names:
        by_value: dict[str, list[int]] = {}
        for process, values in settings.items():
            by_value.setdefault(values.get(name, "nothing"), []).append(process)
        if len(by_value) > 1:
            has = [
                f"{_processes(ids)} {'has' if len(ids) == 1 else 'have'} {value}"
                for value, ids in sorted(by_value.items(), key=lambda item: item[1])
            ]
            found.append(f"{name}: {', '.join(has)}")
    return found


def check_agreement(settings: Mapping[str, Any], *, timeout_s: float | None = None) -> None:
    """Checks that every process of the job was given the same ``settings``.

    Every process calls it at the same point, before the first step, with the
    values that must match (seed, batch size, dataset fingerprint,
    hyper-parameters...); values are compared as JSON. Outside a
    multi-process job it does nothing.

    Args:
      settings: setting name -> a JSON-serialisable value (others compare by ``str``).
      timeout_s: seconds to wait for the other processes; None: the job's peer
        timeout (see :func:`sharding.initialize`).

    Raises:
      ValueError: settings differ; names each one and every process's value.
      ConnectionError: another process failed before this check (see
        :func:`announce_failure`); gives its error.
      TimeoutError: a process did not post its settings within ``timeout_s``.

    Example:
      >>> sharding.check_agreement({"seed": 0, "batch_size": 128, "learning_rate": 0.05})
    """
    job = current_job()
    if job is None:
        return
    _, me, _ = job
    timeout = peer_timeout(timeout_s)
    as_json = {name: json.dumps(v, sort_keys=True, default=str) for name, v in settings.items()}
    mine = {"settings": as_json}
    records, missing = _gather(_post(mine), timeout)
    records[me] = mine
    failed = {p: r["failed"] for p, r in records.items() if "failed" in r}
    if failed:
        first = min(failed)
        where = "" if len(failed) == 1 else f"; process {first}"
        raise ConnectionError(
            f"{_processes(sorted(failed))} failed before training{where}: {failed[first]}. "
            f"Fix that and restart every process"
        )
    if missing:
        raise TimeoutError(
            f"process {me} waited {timeout:g} s for the settings of "
            f"{_processes(missing)}, which did not arrive. Check that "
            f"{'it is' if len(missing) == 1 else 'they are'} still running and reached "
            f"training (see {'its' if len(missing) == 1 else 'their'} log for an earlier "
            f"error), or raise initialize(timeout_s=...) / $JAXFEED_PEER_TIMEOUT if "
            f"{'it is' if len(missing) == 1 else 'they are'} slow to start"
        )
    differences = disagreements({p: r["settings"] for p, r in sorted(records.items())})
    if differences:
        raise ValueError(
            f"processes disagree on {'; on '.join(differences)}. Start every process with "
            f"the same settings and data"
        )
