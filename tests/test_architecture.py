"""docs/architecture.md is the map of the tree, and the map cannot drift: every
module of the three packages is linked from it, and every module it links
exists (the links themselves are checked by test_docs)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("loaders", "sharding", "jaxfeed")
MAP = ROOT / "docs" / "architecture.md"
LINKED_MODULE = re.compile(r"\]\(\.\./(?P<path>[\w/]+\.py)\)")


def _modules() -> set[str]:
    return {
        path.relative_to(ROOT).as_posix()
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        if "__pycache__" not in path.parts and path.name != "__main__.py"
    }


def test_every_module_is_on_the_map():
    linked = {match["path"] for match in LINKED_MODULE.finditer(MAP.read_text())}
    missing = sorted(_modules() - linked)
    assert not missing, (
        f"docs/architecture.md links no entry for {missing}; add a line saying what each holds"
    )


def test_the_map_names_no_module_that_is_gone():
    linked = {match["path"] for match in LINKED_MODULE.finditer(MAP.read_text())}
    gone = sorted(path for path in linked if not (ROOT / path).is_file())
    assert not gone, f"docs/architecture.md links modules that do not exist: {gone}"


TEST_PATH = re.compile(r"\btests/[\w/]+\.py\b")


def test_every_test_file_named_in_the_tree_exists():
    """Comments, docstrings and docs that send a reader to a test name one that exists."""
    texts = [
        path
        for folder in (*PACKAGES, "docs", "benchmarks")
        for path in (ROOT / folder).rglob("*")
        if path.suffix in (".py", ".md") and "__pycache__" not in path.parts
    ]
    dead = sorted(
        f"{path.relative_to(ROOT)}: {match[0]}"
        for path in [*texts, ROOT / "README.md", ROOT / "pyproject.toml"]
        for match in TEST_PATH.finditer(path.read_text(encoding="utf-8"))
        if not (ROOT / match[0]).is_file()
    )
    assert not dead, "these name test files that do not exist:\n" + "\n".join(dead)
