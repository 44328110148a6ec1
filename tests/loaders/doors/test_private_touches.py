"""No module outside `loaders/_doors/` touches another library's internals:
reads or writes its private attributes, patches its modules, or overrides
its classes' private methods. Those go through that library's door, where a
test pins them."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("loaders", "sharding", "jaxfeed")
DOORS = Path("loaders", "_doors")

# Names with an underscore that the standard library documents as public:
# os._exit, and a namedtuple's _fields / _asdict / _replace / _make.
PUBLIC_STDLIB = {"_exit", "_fields", "_asdict", "_replace", "_make"}

# Touches kept outside the doors, each with why (matched by the expression touched).
ALLOWED = {
    # jaxfeed's own: WrappedSource's view without data state, in the same module.
    "self._source._iter_epoch",
    # A type annotation only: the class add_subparsers() returns has no public name.
    "argparse._SubParsersAction",
    # Hooks the standard library documents as there to be replaced.
    "patch: sys.unraisablehook",
    "patch: warnings.showwarning",
    # jaxfeed's own property beside torch's Dataset, which has no _plain.
    "override: ArrayTorchDataset._plain",
}

# Bases with no private method to override (abstract, a protocol, the abstract
# Mapping, a NamedTuple's fields): a subclass's private methods are its own.
MARKERS = {
    *("abc.ABC", "ABC", "typing.Protocol", "Protocol", "typing.Generic", "Generic"),
    *("Mapping", "typing.NamedTuple", "NamedTuple"),
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


def _named_attribute(node: ast.AST) -> tuple[ast.expr, str] | None:
    """``(x, "name")`` for ``x.name``, or ``getattr(x, "name")`` and kin."""
    if isinstance(node, ast.Attribute):
        return node.value, node.attr
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("getattr", "hasattr", "setattr", "delattr")
        and len(node.args) >= 2
        and isinstance(node.args[1], ast.Constant)
        and isinstance(node.args[1].value, str)
    ):
        return node.args[0], node.args[1].value
    return None


def _private_attribute(node: ast.AST) -> bool:
    """``x._name`` read, written or deleted, or ``getattr(x, "_name")`` and kin,
    with ``x`` not the class's own."""
    named = _named_attribute(node)
    return named is not None and _private(named[1]) and not _own(named[0])


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


def _imported_names(tree: ast.AST) -> set[str]:
    """The names an ``import`` of another library binds in the file (anywhere in it)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliases = [alias for alias in node.names if not alias.name.startswith("jaxfeed")]
            names.update(alias.asname or alias.name.partition(".")[0] for alias in aliases)
        elif isinstance(node, ast.ImportFrom) and _another_library(node):
            names.update(alias.asname or alias.name for alias in node.names)
    return names


def _another_library(node: ast.ImportFrom) -> bool:
    """Whether ``from x import ...`` imports from another library (a
    relative import is jaxfeed's own)."""
    return node.level == 0 and not (node.module or "").startswith("jaxfeed")


def _root(node: ast.expr) -> str | None:
    """The name an attribute chain starts from (``a`` of ``a.b.c``, ``a.B[T]``)."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _patches(node: ast.AST, imported: set[str]) -> list[ast.AST]:
    """The targets through which ``node`` writes or deletes an attribute of
    something imported from another library (``util.spawnv_passfds = f``)."""
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        targets = [node.target]
    elif isinstance(node, ast.Delete):
        targets = node.targets
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        targets = [node] if node.func.id in ("setattr", "delattr") else []
    else:
        return []
    unpacked = []
    while targets:
        target = targets.pop()
        if isinstance(target, (ast.Tuple, ast.List)):
            targets.extend(target.elts)
        elif isinstance(target, ast.Starred):
            targets.append(target.value)
        else:
            unpacked.append(target)
    return [
        target
        for target in unpacked
        if (named := _named_attribute(target)) is not None and _root(named[0]) in imported
    ]


def _overrides(node: ast.AST, imported: set[str]) -> list[ast.AST]:
    """The private methods (``def _bootstrap``) of a class whose bases include
    a class of another library."""
    if not isinstance(node, ast.ClassDef):
        return []
    bases = [base.value if isinstance(base, ast.Subscript) else base for base in node.bases]
    if not any(_root(base) in imported and ast.unparse(base) not in MARKERS for base in bases):
        return []
    return [
        method
        for method in node.body
        if isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)) and _private(method.name)
    ]


def _touches(tree: ast.AST):
    """``(line, what)`` of every read or write of a private attribute of an
    object not the class's own, every import of a private module, every patch
    of an imported library and every override of its private methods."""
    imported = _imported_names(tree)
    for node in ast.walk(tree):
        if _private_attribute(node) or _private_import(node):
            yield node.lineno, ast.unparse(node)
        for target in _patches(node, imported):
            if not _private_attribute(target):  # (found above already)
                yield target.lineno, f"patch: {ast.unparse(target)}"
        for method in _overrides(node, imported):
            yield method.lineno, f"override: {node.name}.{method.name}"


def private_touches(root: Path) -> list[str]:
    """``path:line: what`` for each private touch outside the doors under ``root``."""
    found = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            relative = path.relative_to(root)
            if relative.is_relative_to(DOORS):
                continue
            for line, what in _touches(ast.parse(path.read_text(encoding="utf-8"))):
                if what not in ALLOWED:
                    found.append(f"{relative}:{line}: {what}")
    return found


def test_other_libraries_internals_are_touched_only_in_the_doors():
    found = private_touches(ROOT)
    assert not found, (
        "other libraries' internals touched outside loaders/_doors/ (a private attribute "
        "read or written, a module patched, a private method overridden); add a function "
        "to that library's door (with the versions it was checked against) and a test in "
        "tests/loaders/doors/:\n" + "\n".join(sorted(found))
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
    found = [what for _, what in _touches(ast.parse(code))]
    assert found == [
        "import jax._src.api",
        "from jax._src import distributed",
        "loader._sampler",
        "getattr(node, '_seed', None)",
        "hasattr(node, '_inputs')",
    ]


def test_the_scan_finds_each_kind_of_write_and_override():
    code = (
        "import abc, multiprocessing, typing\n"
        "import numpy as np\n"
        "from multiprocessing import util\n"
        "from multiprocessing.context import SpawnProcess\n"
        "from jaxfeed.loaders import rows\n"
        "def f():\n"
        "    from tensorflow.python.autograph.pyct import loader\n"
        "    loader.tempfile = None\n"
        "shared_memory._make_filename = f\n"
        "node._seed += 1\n"
        "del node._cache\n"
        "setattr(node, '_seed', 3)\n"
        "util.spawnv_passfds = f\n"
        "multiprocessing.spawn.get_preparation_data: object = f\n"
        "np.random.seed, other = f, 1\n"
        "setattr(util, 'spawnv_passfds', f)\n"
        "del multiprocessing.util.spawnv_passfds\n"
        "class Spawned(multiprocessing.Process):\n"
        "    def _bootstrap(self): ...\n"
        "class Mine(SpawnProcess):\n"
        "    def _own_helper(self):\n"
        "        self._x = cls._y = 1\n"
        "        self._z += 1\n"
        "        del self._x\n"
        "    def run(self): ...\n"
        "    def __init__(self): ...\n"
        "class Abstract(abc.ABC, typing.Generic[T]):\n"
        "    def _step(self): ...\n"
        "class Ours(rows.Rows):\n"
        "    def _helper(self): ...\n"
        "rows.thing = 1\n"
        "local = object()\n"
        "local.name = 1\n"
    )
    found = sorted(what for _, what in _touches(ast.parse(code)))
    assert found == sorted(
        [
            "patch: loader.tempfile",
            "shared_memory._make_filename",
            "node._seed",
            "node._cache",
            "setattr(node, '_seed', 3)",
            "patch: util.spawnv_passfds",
            "patch: multiprocessing.spawn.get_preparation_data",
            "patch: np.random.seed",
            "patch: setattr(util, 'spawnv_passfds', f)",
            "patch: multiprocessing.util.spawnv_passfds",
            "override: Spawned._bootstrap",
            "override: Mine._own_helper",
        ]
    )
