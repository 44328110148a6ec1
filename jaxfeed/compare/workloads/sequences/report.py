"""The sequences workload's plain-text table, from the JSON-able dict
`Sequences.result` returns (so a saved ``--json`` file re-renders)."""

from __future__ import annotations

from typing import Any

from jaxfeed.compare.report import fixed_table

_COLUMNS = (
    ("backend", 7),
    ("pipeline", 19),
    ("layout", 22),
    ("tokens/s", 10),
    ("cores", 5),
    ("padding", 7),
    ("shapes", 6),
    ("first s", 7),
    ("peak MB", 7),
    ("+MB", 5),
    ("digest", 8),
)


def _cells(row: dict) -> list[str]:
    m = row["median"]

    def num(key: str, fmt: str) -> str:
        return format(m[key], fmt) if key in m else "-"

    digest = row["runs"][0].get("digest") if row["runs"] else None
    return [
        row["backend"],
        row["pipeline"],
        row["layout"],
        num("tokens_per_s", ",.0f"),
        num("cores_busy", ".2f"),
        num("padding_fraction", ".1%"),
        num("shapes", ".0f"),
        num("first_batch_s", ".2f"),
        num("peak_mb", ",.0f"),
        num("peak_added_mb", ",.0f"),
        digest[:8] if digest else "-",
    ]


def _same(same: dict[str, bool | None]) -> str:
    words = {True: "identical", False: "DIFFERENT", None: "one backend only"}
    return ", ".join(f"{layout} {words[value]}" for layout, value in same.items())


def format_report(result: dict[str, Any]) -> str:
    """The result as a plain-text table, then whether jaxfeed's batches agree."""
    config, data = result["config"], result["dataset"]
    repeats = len(result["rows"][0]["runs"]) if result["rows"] else 0
    lengths = data["lengths"]
    limit = config["max_batches"]
    lines = [
        f"sequences workload: {data['name']}, {data['rows']:,} rows, {data['tokens']:,} "
        f"tokens ({data['tokenizer']}; {lengths['min']}-{lengths['max']} long, median "
        f"{lengths['median']:.0f})",
        f"batch {config['batch_size']}, epoch 0 then {result['timed_epochs']} timed epochs"
        f"{'' if limit is None else f' of at most {limit} batches'}, median of {repeats} "
        f"repeat(s), {result['machine']['cpu_count']} CPUs",
        "",
    ]
    lines += fixed_table(_COLUMNS, [_cells(row) for row in result["rows"]], left=3)
    lines += [
        "",
        "tokens/s: real tokens of the timed epochs per second; cores: CPU seconds of this "
        "process and any workers per wall second of them; padding: places of input_ids "
        "holding no token; shapes: distinct batch shapes read (the compiles of a jitted "
        "step); first s: a fresh pipeline to its first batch; peak MB: this process's peak "
        "(+MB: over its memory when the row began); digest: epoch 0's batches, every field",
        f"jaxfeed's batches across backends: {_same(result['same_batches'])}",
    ]
    return "\n".join(lines)
