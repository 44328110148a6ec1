"""`jaxfeed.compare.runner`: the rounds every workload shares, on a stand-in workload."""

import dataclasses

from jaxfeed.compare import runner


@dataclasses.dataclass
class _Row:
    label: str
    runs: list = dataclasses.field(default_factory=list)


class _Workload:
    name = "test"
    warmup, repeats = 1, 2

    def __init__(self):
        self.calls = []

    def rows(self):
        return [_Row("a"), _Row("b")]

    def schedule(self, rows, warm_up):
        return [(what, row) for what in (("x",) if warm_up else ("x", "y")) for row in rows]

    def measure(self, row, what, round_, warm_up):
        self.calls.append((round_, what, row.label))
        return {what: float(round_), f"{what}_history": [round_]}

    def result(self, rows, command, seconds):
        return {
            "command": command,
            "rows": {r.label: {"runs": r.runs, "median": runner.medians(r.runs)} for r in rows},
            "machine": {},
            "seconds": seconds,
        }


def test_rounds_interleave_rows_and_keep_only_timed_repeats():
    workload = _Workload()
    result = runner.run(workload, ["compare"])
    # Warm-up first, then each round's measurements in turn over every row (A B, A B).
    assert workload.calls == [
        (0, "x", "a"), (0, "x", "b"),
        (1, "x", "a"), (1, "x", "b"), (1, "y", "a"), (1, "y", "b"),
        (2, "x", "a"), (2, "x", "b"), (2, "y", "a"), (2, "y", "b"),
    ]  # fmt: skip
    a = result["rows"]["a"]
    assert a["runs"] == [
        {"x": 1.0, "x_history": [1], "y": 1.0, "y_history": [1]},
        {"x": 2.0, "x_history": [2], "y": 2.0, "y_history": [2]},
    ]
    assert a["median"] == {"x": 1.5, "y": 1.5}  # numbers only
    assert result["command"] == ["compare"] and result["seconds"] >= 0
    assert set(result["machine"]["load_average"]) == {"start", "end"}
