"""The one runner of `jaxfeed compare`: every row of a workload, interleaved.

Each round measures every row in turn (A B C A B C ...), so drift on a noisy
machine hits all of them alike; warm-up rounds come first and are not kept.
A workload (`jaxfeed.compare.workloads`) says what its rows are, how one row
is measured and what its result holds; the runner owns the rounds, the
progress bar, the per-repeat figures and the machine's load.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any, Protocol

from tqdm import tqdm  # not tqdm.auto: it warns in Jupyter without ipywidgets


class Row(Protocol):
    """One line of a comparison.

    Attributes:
      label: the row in the progress bar.
      runs: the figures of each timed repeat, one dict each; `run` fills it.
    """

    label: str
    runs: list[dict[str, Any]]


class Workload(Protocol):
    """What `run` measures: a plug-in of `jaxfeed.compare.workloads`.

    Attributes:
      name: the title of the progress bar.
      warmup, repeats: the untimed rounds, then the timed ones.
    """

    name: str
    warmup: int
    repeats: int

    def rows(self) -> Sequence[Row]:
        """Builds every row, once, before the first round."""
        ...

    def schedule(self, rows: Sequence[Row], warm_up: bool) -> list[tuple[str, Row]]:
        """One round: ``(what, row)`` for each ``measure`` call, in order."""
        ...

    def measure(self, row: Row, what: str, round_: int, warm_up: bool) -> dict[str, Any]:
        """Measures ``what`` on ``row``; returns its figures (dropped in a warm-up round)."""
        ...

    def result(self, rows: Sequence[Row], command: list[str], seconds: float) -> dict[str, Any]:
        """Every figure as one JSON-able dict with a ``machine`` entry; ``seconds``:
        the time the rows took, building included."""
        ...


def run(workload: Workload, command: list[str]) -> dict[str, Any]:
    """Runs every round of ``workload`` and returns its result.

    The result's ``machine`` gains ``load_average`` at the start and the end
    (other work on the machine skews every figure).
    """
    started, load = time.perf_counter(), load_average()
    rows = workload.rows()
    tasks = [
        (round_, what, row)
        for round_ in range(workload.warmup + workload.repeats)
        for what, row in workload.schedule(rows, round_ < workload.warmup)
    ]
    for row in rows:
        row.runs = [{} for _ in range(workload.repeats)]
    with tqdm(total=len(tasks), desc=workload.name, disable=not sys.stderr.isatty()) as bar:
        for round_, what, row in tasks:
            bar.set_postfix_str(f"{what} {row.label}")
            warm_up = round_ < workload.warmup
            figures = workload.measure(row, what, round_, warm_up)
            if not warm_up:
                row.runs[round_ - workload.warmup].update(figures)
            bar.update()
    result = workload.result(rows, command, time.perf_counter() - started)
    result["machine"]["load_average"] = {"start": load, "end": load_average()}
    return result


def medians(runs: list[dict[str, Any]]) -> dict[str, float]:
    """The median of each number the repeats recorded (lists and strings left out)."""
    keys = [k for k, v in runs[0].items() if isinstance(v, int | float)] if runs else []
    return {k: float(statistics.median(run[k] for run in runs)) for k in keys}


def load_average() -> list[float] | None:
    """1, 5 and 15 minute load averages, or None where the system has none."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None
