"""The mixtures workload's plain-text table, from the JSON-able dict
`Mixtures.result` returns (so a saved ``--json`` file re-renders)."""

from __future__ import annotations

from typing import Any

from jaxfeed.compare.report import fixed_table


def _columns(names: list[str], window: int) -> tuple[tuple[str, int], ...]:
    shares = [(f"{name[:12]}", max(7, len(name[:12]))) for name in names]
    return (
        ("backend", 7),
        ("pipeline", 13),
        ("rows/s", 10),
        *shares,
        (f"last {window}", 9),
        ("gap sd", 6),
        ("first s", 7),
        ("digest", 8),
    )


def _cells(row: dict, names: list[str], window: int) -> list[str]:
    m = row["median"]

    def num(key: str, fmt: str) -> str:
        return format(m[key], fmt) if key in m else "-"

    digest = row["runs"][0].get("digest") if row["runs"] else None
    return [
        row["backend"],
        row["pipeline"],
        num("rows_per_s", ",.0f"),
        *[num(f"share {name}", ".2%") for name in names],
        num(f"last {window} share {names[0]}", ".1%"),
        num("largest_gap_sd", ".1f"),
        num("first_batch_s", ".2f"),
        digest[:8] if digest else "-",
    ]


def format_report(result: dict[str, Any]) -> str:
    """The result as a plain-text table, then whether jaxfeed's batches agree."""
    config, parts, window = result["config"], result["components"], result["window"]
    names = list(parts)
    repeats = len(result["rows"][0]["runs"]) if result["rows"] else 0
    limit = config["max_batches"]
    asked = ", ".join(f"{n} {p['weight']:.2%} of {p['rows']:,} rows" for n, p in parts.items())
    lines = [
        f"mixtures workload: {asked}; an epoch ends when {names[0]!r} has been read once",
        f"batch {config['batch_size']}, epoch 0 then {result['timed_epochs']} timed epochs"
        f"{'' if limit is None else f' of at most {limit} batches'}, median of {repeats} "
        f"repeat(s), {result['machine']['cpu_count']} CPUs",
        "",
    ]
    rows = [_cells(row, names, window) for row in result["rows"]]
    lines += fixed_table(_columns(names, window), rows, left=3)
    words = {True: "identical", False: "DIFFERENT", None: "one backend only"}
    lines += [
        "",
        "rows/s: rows of the timed epochs per second; each component's share of the rows "
        f"read in the timed epochs (counted from the batches), and {names[0]!r}'s over the "
        f"last {window} batches; gap sd: the largest gap from the asked weights in binomial "
        "standard deviations (a seeded draw: ~1; exact proportions: ~0); first s: a fresh "
        "pipeline to its first batch; digest: epoch 0's batches, every field",
        f"jaxfeed's batches across backends: {words[result['same_batches']]}",
    ]
    return "\n".join(lines)
