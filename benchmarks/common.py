"""What both benchmark scripts share: the repository on sys.path, and the
record of which code a figure was measured on."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SHARED_MNIST = REPO.parent / "shared" / "data" / "mnist"
RESULTS = HERE / "results"
sys.path.insert(0, str(REPO))  # runnable from a plain checkout, without `pip install -e .`


def git_state() -> dict[str, object]:
    """The commit measured, and which tracked files differed from it (uncommitted work)."""

    def git(*args: str) -> str:
        result = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)
        return result.stdout.rstrip() if result.returncode == 0 else ""

    changed = git("status", "--porcelain", "--untracked-files=no").splitlines()
    return {"commit": git("rev-parse", "HEAD") or None, "modified": [c[3:] for c in changed]}


def write_record(script: str, args: object, results: list, **about: object) -> Path:
    """Writes ``results/<script>-<args.tag>.json``: the command that made it
    (every argument spelled out), the code measured, ``about`` the machine, and
    the results."""
    options = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items())
    out = RESULTS / f"{script}-{args.tag}.json"
    record = {
        "command": f"python3 benchmarks/{script.replace('-', '_')}.py {options}",
        "git": git_state(),
        **about,
        "results": results,
    }
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {out}")
    return out
