"""What both benchmark scripts share: the repository on sys.path, and the
record of which code a figure was measured on."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
import time
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


def write_record(
    script: str, args: object, results: list, out_dir: Path = RESULTS, **about: object
) -> Path:
    """Writes ``<out_dir>/<script>-<args.tag>.json`` (``results/`` by default):
    the command that made it (every argument spelled out), the code measured,
    ``about`` the machine, and the results."""
    options = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items())
    out = Path(out_dir) / f"{script}-{args.tag}.json"
    record = {
        "command": f"python3 benchmarks/{script.replace('-', '_')}.py {options}",
        "git": git_state(),
        **about,
        "results": results,
    }
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {out}")
    return out


def run_compare(command: list[str], stem: Path, script: str) -> int:
    """Runs ``jaxfeed COMMAND`` (which writes ``<stem>.json``), prints its
    table and saves it as ``<stem>.txt``, and adds the code measured to the
    JSON; the exit status."""
    from jaxfeed.cli import main as jaxfeed

    state = git_state()  # before the run: what was imported
    started = time.perf_counter()
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = jaxfeed(command)
    table = printed.getvalue()
    print(table, end="")
    if code != 0:
        return code
    Path(f"{stem}.txt").write_text(table)
    result = json.loads(Path(f"{stem}.json").read_text())
    result["git"] = state
    Path(f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nbenchmarks/{script} took {time.perf_counter() - started:.0f} s; wrote {stem}.*")
    return code
