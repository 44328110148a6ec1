"""What every `jaxfeed compare` report is made of: tables, targets, verdicts.

A workload (`jaxfeed.compare.workloads`) declares its tables' columns and
renders its result with these; everything works on the JSON-able result,
so a saved ``--json`` file can be re-rendered without measuring.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def table(title: str, columns: list[tuple[str, Callable]], rows: dict[str, dict]) -> str:
    """A plain-text table: one line per row for which every cell is known."""
    cells = []
    for name, row in rows.items():
        values = [get(name, row) for _, get in columns]
        if all(v is not None for v in values[1:]):
            cells.append([str(v) for v in values])
    heads = [h for h, _ in columns]
    widths = [max(map(len, col)) for col in zip(heads, *cells, strict=True)]

    def line(c: list[str]) -> str:
        return "  ".join(
            [c[0].ljust(widths[0]), *(x.rjust(w) for x, w in zip(c[1:], widths[1:], strict=True))]
        )

    return "\n".join([title, line(heads), line(["-" * w for w in widths]), *map(line, cells), ""])


def fig(key: str, spec: str, scale: float = 1.0, part: str = "median") -> Callable:
    """A `table` cell: ``row[part][key]`` formatted, or None where the row lacks it."""

    def get(name: str, row: dict) -> str | None:
        value = row[part].get(key)
        return None if value is None else format(value * scale, spec)

    return get


def load_text(machine: dict[str, Any], when: str) -> str:
    """The load average `jaxfeed.compare.runner.run` recorded, as ``1.0/0.8/0.5``."""
    load = machine.get("load_average", {}).get(when)
    return "/".join(f"{x:.1f}" for x in load) if load else "unknown"


def fixed_table(columns: Sequence[tuple[str, int]], cells: list[list[str]], left: int) -> list[str]:
    """Lines of a table with fixed column widths (wider cells overflow), a
    header line first; the first ``left`` columns are left-aligned."""
    lines = []
    for row in [[name for name, _ in columns], *cells]:
        padded = [
            c.ljust(w) if i < left else c.rjust(w)
            for i, (c, (_, w)) in enumerate(zip(row, columns, strict=True))
        ]
        lines.append("  ".join(padded).rstrip())
    return lines


def verdict(target: dict[str, Any]) -> str:
    """``met   `` or ``MISSED``, for a target's line."""
    return "met   " if target["met"] else "MISSED"


def target(
    target: str, row: str, value: float, limit: float, *, at_most: bool, meaning: str | None = None
) -> dict[str, Any]:
    """One target check: ``target``, ``row``, ``value``, ``limit``, ``met``
    (``value`` at most, or ``at_most=False``: at least, ``limit``), and ``meaning``
    where given: what missing it says about the row."""
    met = value <= limit if at_most else value >= limit
    entry = dict(target=target, row=row, value=value, limit=limit, met=met)
    return entry if meaning is None else entry | {"meaning": meaning}
