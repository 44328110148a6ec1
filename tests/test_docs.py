"""The Markdown docs run: README.md and docs/*.md cannot rot.

Every ```python block of a page is executed: the page's blocks are joined in
order and run as one fresh Python process, offline, on 8 simulated CPU
devices, in an empty directory with an empty jaxfeed cache. A block that only
sketches (it needs a fresh process, a GPU, several hosts, a user's object) is
fenced ```py with an HTML comment ``<!-- not run: why -->`` right above it, or
as ```bash / ```text. Every relative Markdown link must name an existing file
(and, for a Markdown file, an existing heading); notebooks/README.md's links too.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINKED = [*PAGES, ROOT / "notebooks" / "README.md"]  # pages whose links are checked
TIMEOUT_SECONDS = 300  # per page
RUN = "python"  # the fence of a block that is executed
NOT_RUN = "py"  # the fence of a Python sketch; needs a "<!-- not run: why -->" above it
LANGUAGES = {RUN, NOT_RUN, "bash", "text"}
NOT_RUN_NOTE = re.compile(r"^<!--\s*not run:\s*\S.*-->$")
OPENING = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[^\s`]*)")
LINK = re.compile(r"!?\[[^\]]*\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)")


class Block(NamedTuple):
    page: Path
    line: int  # 1-based line of the opening fence
    end: int  # 1-based line of the closing fence
    lang: str
    code: str
    before: str  # the last non-blank line above the fence


def blocks(page: Path) -> list[Block]:
    """The fenced code blocks of ``page``, in order."""
    lines = page.read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        opening = OPENING.match(lines[i])
        if not opening:
            i += 1
            continue
        indent = opening["indent"]
        end = next(
            (j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"),
            None,
        )
        assert end is not None, f"{page.name}:{i + 1}: code fence never closed"
        body = [
            line[len(indent) :] if line.startswith(indent) else line for line in lines[i + 1 : end]
        ]
        before = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        code = textwrap.dedent("\n".join(body))
        found.append(Block(page, i + 1, end + 1, opening["lang"], code, before))
        i = end + 1
    return found


def _script(page: Path) -> tuple[str, list[int]]:
    """The page's runnable blocks as one program, and the Markdown line of each program line."""
    code, where = [], []
    for block in blocks(page):
        if block.lang != RUN:
            continue
        for offset, line in enumerate(block.code.splitlines(), start=1):
            code.append(line)
            where.append(block.line + offset)
        code.append("")
        where.append(block.line)
    return "\n".join(code) + "\n", where


def _failure_line(stderr: str, where: list[int]) -> str:
    """Where in the page the traceback's innermost ``<string>`` frame is."""
    lines = [int(n) for n in re.findall(r'File "<string>", line (\d+)', stderr)]
    if not lines or not 0 < lines[-1] <= len(where):
        return ""
    return f" (the error is at line {where[lines[-1] - 1]} of the page)"


def _params() -> list:
    return [
        pytest.param(page, id=page.relative_to(ROOT).as_posix())
        for page in PAGES
        if any(block.lang == RUN for block in blocks(page))
    ]


def test_the_docs_exist():
    names = {page.relative_to(ROOT).as_posix() for page in PAGES}
    assert {"README.md", "docs/README.md"} <= names
    assert len(_params()) >= 2  # this test would pass vacuously without runnable blocks


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(ROOT).as_posix())
def test_every_block_says_whether_it_runs(page: Path):
    for block in blocks(page):
        where = f"{page.relative_to(ROOT)}:{block.line}"
        assert block.lang in LANGUAGES, (
            f"{where}: fence a block as one of {sorted(LANGUAGES)} (```{block.lang}); "
            f"```python blocks run in tests/test_docs.py"
        )
        if block.lang == NOT_RUN:
            assert NOT_RUN_NOTE.match(block.before), (
                f"{where}: a ```py block is a sketch that does not run; put "
                f"'<!-- not run: why -->' on the line above it, or fence it ```python to run it"
            )


@pytest.mark.slow  # a subprocess per page, about a minute in all
@pytest.mark.parametrize("page", _params())
def test_python_blocks_run(page: Path, tmp_path: Path):
    code, where = _script(page)
    env = {
        **os.environ,
        "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
        "JAX_PLATFORMS": "cpu",
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "CUDA_VISIBLE_DEVICES": "",
        "JAXFEED_MNIST_MIRRORS": "http://127.0.0.1:9/",  # nothing reaches the network
        "JAXFEED_CACHE_DIR": str(tmp_path / "cache"),
    }
    work = tmp_path / "work"
    work.mkdir()
    name = page.relative_to(ROOT)
    try:
        done = subprocess.run(
            [sys.executable, "-c", code],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_SECONDS,
        )
    except subprocess.TimeoutExpired as timeout:
        stderr = timeout.stderr or ""
        if isinstance(stderr, bytes):
            stderr = stderr.decode(errors="replace")
        pytest.fail(f"{name}: its Python blocks ran past {TIMEOUT_SECONDS} s\n{stderr[-8000:]}")
    assert done.returncode == 0, (
        f"{name}: its Python blocks failed with status {done.returncode}"
        f"{_failure_line(done.stderr, where)}\n--- stdout\n{done.stdout[-4000:]}"
        f"\n--- stderr\n{done.stderr[-8000:]}"
    )


def _slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = _without_blocks(page)
    return {_slug(m[1]) for m in re.finditer(r"^#{1,6}\s+(.*)$", text, re.MULTILINE)}


def _without_blocks(page: Path) -> str:
    lines = page.read_text().splitlines()
    for block in blocks(page):
        lines[block.line - 1 : block.end] = [""] * (block.end - block.line + 1)
    return "\n".join(lines)


def _prose(page: Path) -> str:
    """The page without its fenced blocks and code spans (code, not links)."""
    return re.sub(r"(`+)(.+?)\1", "", _without_blocks(page))


@pytest.mark.parametrize("page", LINKED, ids=lambda page: page.relative_to(ROOT).as_posix())
def test_relative_links_point_to_files(page: Path):
    broken = []
    for match in LINK.finditer(_prose(page)):
        target = match["target"]
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            broken.append(f"{target} (no heading #{anchor} in {file.name})")
    assert not broken, f"{page.relative_to(ROOT)}: broken links: {broken}"
