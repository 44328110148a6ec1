"""Layers point one way (docs/architecture.md, "The layers"): a module imports
only from its own room or from the rooms its room stands on. Every import
counts, function-level and ``TYPE_CHECKING`` ones included, and so does
``importlib.import_module("jaxfeed...")`` with a literal name."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"jaxfeed": "jaxfeed", "loaders": "jaxfeed.loaders", "sharding": "jaxfeed.sharding"}

# Each room and the rooms it may import, bottom up. The application's rooms
# may import every room of the library under them.
LIBRARY = {
    "io": set(),
    "doors": {"io"},
    "core": {"io", "doors"},
    "data": {"core", "io", "doors"},
    "workers": {"core", "io", "doors"},
    "backends": {"data", "workers", "core", "io", "doors"},
    "wrapping": {"workers", "core", "io", "doors"},
    "loaders": {"backends", "wrapping", "data", "workers", "core", "io", "doors"},
    # Placement knows nothing of datasets, processes, backends or wraps.
    "placement": {"core", "io", "doors"},
    "job": {"placement", "workers", "core", "io", "doors"},
    "sharding": {"placement", "job"},
}
APPLICATION = {
    "training": set(),
    "bridges": {"training"},
    "compare": {"training", "bridges", "jaxfeed"},
    "cli": {"training", "bridges", "compare", "jaxfeed"},
    "jaxfeed": {"training", "bridges"},
}
MAY_IMPORT = {
    **LIBRARY,
    **{room: {*below, *LIBRARY} for room, below in APPLICATION.items()},
}

# A module's room: the first entry whose name is the module or a package above it.
ROOMS = [
    ("jaxfeed.loaders._io", "io"),
    ("jaxfeed.loaders._doors", "doors"),
    ("jaxfeed.loaders._workers", "workers"),
    ("jaxfeed.loaders.data", "data"),
    ("jaxfeed.loaders.backends", "backends"),
    ("jaxfeed.loaders.wrapping", "wrapping"),
    ("jaxfeed.sharding.job", "job"),
    ("jaxfeed.sharding.mesh", "placement"),
    ("jaxfeed.sharding.placement", "placement"),
    ("jaxfeed.sharding.prefetch", "placement"),
    ("jaxfeed.training", "training"),
    ("jaxfeed.keras", "bridges"),
    ("jaxfeed.nnx", "bridges"),
    ("jaxfeed.mnist", "bridges"),
    ("jaxfeed.textlm", "bridges"),
    ("jaxfeed.compare", "compare"),
    ("jaxfeed.cli", "cli"),
    ("jaxfeed.__main__", "cli"),
]
FACES = {"jaxfeed.loaders": "loaders", "jaxfeed.sharding": "sharding", "jaxfeed": "jaxfeed"}


def room_of(module: str) -> str:
    for prefix, room in ROOMS:
        if module == prefix or module.startswith(prefix + "."):
            return room
    if module in FACES:
        return FACES[module]
    if module.startswith("jaxfeed.loaders."):
        return "core"  # the modules at the top of loaders/
    raise AssertionError(f"{module} is in no room: add it to ROOMS in tests/test_layers.py")


def modules(root: Path) -> dict[str, tuple[Path, bool]]:
    """Dotted name -> (file, is a package's __init__) of every module."""
    found = {}
    for folder, package in FOLDERS.items():
        for path in (root / folder).rglob("*.py"):
            if "__pycache__" in path.parts:
                continue
            parts = list(path.relative_to(root / folder).with_suffix("").parts)
            is_init = parts[-1] == "__init__"
            found[".".join([package, *(parts[:-1] if is_init else parts)])] = (path, is_init)
    return found


def _imported(tree: ast.AST, module: str, is_init: bool, known: set[str]):
    """``(line, imported module)`` for each of jaxfeed's modules a tree imports."""
    package = module if is_init else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            # ``from package import module`` imports the module.
            names = [
                (node.lineno, f"{base}.{a.name}" if f"{base}.{a.name}" in known else base)
                for a in node.names
            ]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            names = [(node.lineno, node.args[0].value)]
        else:
            continue
        yield from ((line, name) for line, name in names if name.split(".")[0] == "jaxfeed")


def upward_imports(root: Path, room_of=room_of) -> list[str]:
    """``path:line: module (room) imports module (room)`` for each import that
    points up a layer or sideways into a room its room does not stand on."""
    known = modules(root)
    found = []
    for module, (path, is_init) in sorted(known.items()):
        mine = room_of(module)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for line, target in dict.fromkeys(_imported(tree, module, is_init, set(known))):
            theirs = room_of(target)
            if theirs != mine and theirs not in MAY_IMPORT[mine]:
                where = path.relative_to(root).as_posix()
                found.append(f"{where}:{line}: {module} ({mine}) imports {target} ({theirs})")
    return found


def test_imports_point_down_the_layers():
    found = upward_imports(ROOT)
    assert not found, (
        "imports that climb a layer or cross into a room this one does not stand on "
        "(docs/architecture.md, 'The layers'); move the code to the room it belongs in, "
        "or pass what it needs in from above:\n" + "\n".join(found)
    )


def test_every_room_is_in_the_table():
    rooms = {room_of(module) for module in modules(ROOT)}
    assert rooms <= set(MAY_IMPORT), sorted(rooms - set(MAY_IMPORT))
    for room, allowed in MAY_IMPORT.items():
        assert allowed <= set(MAY_IMPORT), (room, sorted(allowed - set(MAY_IMPORT)))


def test_the_scan_finds_each_kind_of_import(tmp_path):
    (tmp_path / "sharding").mkdir()
    (tmp_path / "loaders" / "_io").mkdir(parents=True)
    (tmp_path / "jaxfeed").mkdir()
    for init in ("sharding", "loaders", "loaders/_io", "jaxfeed"):
        (tmp_path / init / "__init__.py").write_text("")
    for module in ("_workers", "sampler", "protocol"):
        (tmp_path / "loaders" / f"{module}.py").write_text("")
    (tmp_path / "loaders" / "_io" / "pages.py").write_text(
        "import importlib\n"
        "from jaxfeed.loaders import sampler\n"  # up: io -> core
        "def later():\n"
        "    from .. import protocol\n"  # function level, relative: io -> core
        "    importlib.import_module('jaxfeed.sharding.prefetch')\n"  # io -> placement
        "from . import __init__ as fine\n"  # its own room
    )
    (tmp_path / "sharding" / "prefetch.py").write_text(
        "import jaxfeed.loaders._io.pages\n"  # placement -> io: allowed
        "from jaxfeed.loaders._workers import spawn\n"  # placement -> workers: refused
    )

    def rooms(module: str) -> str:
        return "workers" if module.startswith("jaxfeed.loaders._workers") else room_of(module)

    found = [line.split(": ", 1)[1] for line in upward_imports(tmp_path, rooms)]
    assert found == [
        "jaxfeed.loaders._io.pages (io) imports jaxfeed.loaders.sampler (core)",
        "jaxfeed.loaders._io.pages (io) imports jaxfeed.loaders.protocol (core)",
        "jaxfeed.loaders._io.pages (io) imports jaxfeed.sharding.prefetch (placement)",
        "jaxfeed.sharding.prefetch (placement) imports jaxfeed.loaders._workers (workers)",
    ]
