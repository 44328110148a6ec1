"""No module outside `loaders/_doors/` reads another library's private
attributes: they go through that framework's door, where a test pins them."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("loaders", "sharding", "jaxfeed")
DOORS = Path("loaders", "_doors")

# Names with an underscore that the standard library documents as public:
# os._exit, and a namedtuple's _fields / _asdict / _replace / _make.
PUBLIC_STDLIB = {"_exit", "_fields", "_asdict", "_replace", "_make"}

# Reads kept outside the doors, each with why (matched by the expression read).
ALLOWED = {
    # jaxfeed's own: WrappedSource's view without data state, in the same module.
    "self._source._iter_epoch",
    # A type annotation only: the class add_subparsers() returns has no public name.
    "argparse._SubParsersAction",
}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and name not in PUBLIC_STDLIB


def _own(node: ast.expr) -> bool:
    """``self``, ``cls`` or ``super()``: the class's own attributes."""
    if isinstance(node, ast.Name):
        return node.id in ("self", "cls")
    return (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"
    )


def _attribute_read(node: ast.AST) -> bool:
    """``x._name``, or ``getattr(x, "_name")`` and kin, with ``x`` not the class's own."""
    if isinstance(node, ast.Attribute):
        return _private(node.attr) and not _own(node.value)
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("getattr", "hasattr", "setattr", "delattr")
        and len(node.args) >= 2
        and isinstance(node.args[1], ast.Constant)
        and isinstance(node.args[1].value, str)
        and _private(node.args[1].value)
        and not _own(node.args[0])
    )


def _private_import(node: ast.AST) -> bool:
    """An import of another library's private module (``jax._src``)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
        names = [node.module or ""]
    else:
        return False
    return any(
        not name.startswith("jaxfeed") and any(map(_private, name.split("."))) for name in names
    )


def _reads(tree: ast.AST):
    """``(line, expression)`` of every read of a private attribute of an
    object not the class's own, and every import of a private module."""
    for node in ast.walk(tree):
        if _attribute_read(node) or _private_import(node):
            yield node.lineno, ast.unparse(node)


def private_reads(root: Path) -> list[str]:
    """``path:line: expression`` for each private read outside the doors under ``root``."""
    found = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            relative = path.relative_to(root)
            if relative.is_relative_to(DOORS):
                continue
            for line, expression in _reads(ast.parse(path.read_text(encoding="utf-8"))):
                if expression not in ALLOWED:
                    found.append(f"{relative}:{line}: {expression}")
    return found


def test_private_attributes_are_read_only_in_the_doors():
    found = private_reads(ROOT)
    assert not found, (
        "private attributes of other libraries read outside loaders/_doors/; add an "
        "accessor to that framework's door (with the versions it was checked against) and "
        "a test in tests/loaders/doors/:\n" + "\n".join(sorted(found))
    )


def test_the_scan_finds_each_kind_of_read():
    code = (
        "import jax._src.api\n"
        "from jax._src import distributed\n"
        "x = loader._sampler\n"
        "y = getattr(node, '_seed', None)\n"
        "z = hasattr(node, '_inputs')\n"
        "ok = self._mine, cls._ours, super()._base, os._exit, row._fields, obj.__dict__\n"
    )
    found = [expression for _, expression in _reads(ast.parse(code))]
    assert found == [
        "import jax._src.api",
        "from jax._src import distributed",
        "loader._sampler",
        "getattr(node, '_seed', None)",
        "hasattr(node, '_inputs')",
    ]
