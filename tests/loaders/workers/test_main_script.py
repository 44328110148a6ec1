"""The probe of what spawned workers would need from the user's main script."""

import json
import subprocess
import sys

SCRIPT = """
import json
from jaxfeed.loaders._workers.main_script import (
    from_main, main_script_names, main_script_uses, rerun_problem)

class Local:
    pass

def probe():
    problem, uses = main_script_uses({"dataset": Local(), "collate_fn": len})
    return {
        "names": main_script_names([Local(), len]),
        "from_main": from_main(Local()),
        "plain": from_main([1, 2]),
        "uses": uses,
        "problem": problem,
        "lambda": main_script_uses({"collate_fn": lambda x: x})[0],
        "rerun": rerun_problem(uses, "wrap()"),
    }

outside = probe()
if __name__ == "__main__":
    print(json.dumps({"outside": outside, "inside": probe()}))
"""


def test_a_script_s_classes_are_found_and_its_unguarded_call_named(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=120, check=True).stdout  # fmt: skip
    report = json.loads(out)
    for where in ("outside", "inside"):
        got = report[where]
        assert got["names"] == ["Local"] and got["from_main"] and not got["plain"]
        assert got["uses"] == [["dataset", "Local"]] and got["problem"] is None
        assert got["lambda"].startswith("its collate_fn does not pickle (")
    assert report["outside"]["rerun"] == (
        f"{script} calls wrap() outside `if __name__ == '__main__':` (spawn re-runs it)"
    )
    assert report["inside"]["rerun"] is None
