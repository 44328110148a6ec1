"""Each package's public face is its ``__init__``: a sorted ``__all__`` of names
that resolve, and a docstring that lists the package's modules (or sends the
reader to docs/architecture.md and lists none), checked against its folder so
the list cannot drift. docs/architecture.md's public names are `jaxfeed.__all__`."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"jaxfeed": "jaxfeed", "loaders": "jaxfeed.loaders", "sharding": "jaxfeed.sharding"}
MAP = ROOT / "docs" / "architecture.md"
# A docstring line "- `name`: ..." or "- `a`, `b`: ..." names modules.
LISTED = re.compile(r"^- ((?:`\w+`(?:, )?)+):", re.M)
POINTER = "see docs/architecture.md"


def _packages() -> dict[str, Path]:
    return {
        ".".join([package, *init.parent.relative_to(ROOT / folder).parts]): init.parent
        for folder, package in FOLDERS.items()
        for init in sorted((ROOT / folder).rglob("__init__.py"))
        if "__pycache__" not in init.parts
    }


PACKAGES = _packages()


@pytest.mark.parametrize("name", sorted(PACKAGES))
def test_a_package_exports_a_sorted_all_of_names_that_resolve(name):
    package = importlib.import_module(name)
    public = getattr(package, "__all__", None)
    assert isinstance(public, list), f"{name} has no __all__: say what its public face is"
    assert public == sorted(set(public)), f"{name}.__all__ is not sorted and unique: {public}"
    missing = [n for n in public if not hasattr(package, n)]
    assert not missing, f"{name}.__all__ names {missing}, which it does not define"


def listed_modules(docstring: str) -> list[str]:
    return [
        name for match in LISTED.finditer(docstring) for name in re.findall(r"`(\w+)`", match[1])
    ]


def docstring_drift(folder: Path) -> str | None:
    """What a package's docstring gets wrong about its folder, or None."""
    docstring = ast.get_docstring(ast.parse((folder / "__init__.py").read_text())) or ""
    listed = listed_modules(docstring)
    present = {
        path.stem if path.suffix == ".py" else path.name
        for path in folder.iterdir()
        if (path.suffix == ".py" and path.name != "__init__.py")
        or (path.is_dir() and (path / "__init__.py").is_file())
    }
    if not listed:
        return None if POINTER in docstring else "lists no modules and does not say " + POINTER
    if len(listed) != len(set(listed)):
        return f"lists a module twice: {listed}"
    missing, gone = sorted(present - set(listed)), sorted(set(listed) - present)
    if missing or gone:
        return f"does not list {missing}; lists {gone}, which are not in the folder"
    return None


@pytest.mark.parametrize("name", sorted(PACKAGES))
def test_a_package_docstring_lists_its_modules(name):
    drift = docstring_drift(PACKAGES[name])
    assert drift is None, f"{name}'s docstring {drift}"


def test_the_docstring_check_finds_drift(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "__init__.py").write_text("")
    (tmp_path / "a.py").write_text("")
    init = tmp_path / "__init__.py"
    init.write_text('"""Pkg.\n\n- `a`: one.\n- `sub`: two.\n"""\n')
    assert docstring_drift(tmp_path) is None
    init.write_text('"""Pkg.\n\n- `a`, `gone`: one.\n"""\n')
    assert (
        docstring_drift(tmp_path)
        == "does not list ['sub']; lists ['gone'], which are not in the folder"
    )
    init.write_text('"""Pkg: see docs/architecture.md."""\n')
    assert docstring_drift(tmp_path) is None
    init.write_text('"""Pkg."""\n')
    assert docstring_drift(tmp_path) == "lists no modules and does not say " + POINTER


def test_the_map_lists_exactly_the_public_names():
    import jaxfeed

    section = MAP.read_text().split("### Public names", 1)[1].split("\n#", 1)[0]
    named = set(re.findall(r"`(?:jaxfeed\.)?(\w+)`", section))
    public = set(jaxfeed.__all__)
    assert named == public, (
        f"docs/architecture.md's public names miss {sorted(public - named)} and name "
        f"{sorted(named - public)}, which jaxfeed.__all__ does not have"
    )
