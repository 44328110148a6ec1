"""What a spawned worker would need from the user's main script (``__main__``).

Spawn starts each worker by running the parent's main script again, then
unpickling what the worker was given. A worker started without that run
(`SPAWN_WITHOUT_MAIN`) cannot load a class or function defined there; one
started with it re-runs the script's top level, so that script must not
start the work outside ``if __name__ == "__main__":``.
"""

from __future__ import annotations

import ast
import inspect
import pickle
import sys
import types
from collections.abc import Mapping
from typing import Any


def main_script_names(obj: object) -> list[str]:
    """The classes and functions defined in the main script (``__main__``) that
    pickling ``obj`` needs: workers started with `SPAWN_WITHOUT_MAIN` could not
    load them. Arrays' and tensors' bytes are skipped, so the probe costs
    nothing like a real pickle.

    Raises:
      Whatever pickling ``obj`` raises: it cannot reach a spawned worker.
    """
    import numpy as np

    names: list[str] = []

    class _Probe(pickle.Pickler):
        def persistent_id(self, value: Any) -> Any:
            kind = type(value)
            if isinstance(value, np.ndarray) and not value.dtype.hasobject:
                return 0  # arrays always pickle: skip their bytes
            if kind.__name__ == "Tensor" and kind.__module__.startswith("torch"):
                return 0
            if isinstance(value, type | types.FunctionType) and value.__module__ == "__main__":
                names.append(value.__qualname__)
            return None

    _Probe(_Discard(), protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return names


def from_main(*objects: object) -> bool:
    """Whether pickling ``objects`` needs the main script (then workers must
    start with `SPAWN`, which runs the script again, not `SPAWN_WITHOUT_MAIN`)."""
    try:
        return bool(main_script_names(objects))
    except Exception:
        return True  # cannot tell: keep the main script


class _Discard:
    """A file that forgets what is written to it."""

    def write(self, data: bytes) -> int:
        return len(data)


def main_script_uses(parts: Mapping[str, Any]) -> tuple[str | None, list[tuple[str, str]]]:
    """Why ``parts`` (a loader's "dataset", "collate_fn", ...) do not pickle (or
    None), and the ``(part, name)`` of each class or function defined in the
    main script that they use."""
    from_main: list[tuple[str, str]] = []
    for part, value in parts.items():
        try:
            from_main += [(part, name) for name in main_script_names(value)]
        except Exception as error:  # whatever fails, it does not pickle
            return f"its {part} does not pickle ({type(error).__name__}: {error})", from_main
    return None, from_main


def rerun_problem(from_main: list[tuple[str, str]], call: str) -> str | None:
    """Why workers that run the main script again (spawn's way) could not
    start, or None. ``from_main``: what they use from the script
    (`main_script_uses`); ``call``: what started them ("wrap()")."""
    main = sys.modules["__main__"]
    main_file = getattr(main, "__file__", None)
    if from_main and main_file is None:
        part, name = from_main[0]
        return (
            f"its {part} uses {name}, defined in an interactive session, which spawned "
            f"workers cannot import"
        )
    if main_file is not None and not called_under_main_guard(main, main_file):
        return f"{main_file} calls {call} outside `if __name__ == '__main__':` (spawn re-runs it)"
    return None


def called_under_main_guard(main: types.ModuleType, main_file: str) -> bool:
    """Whether the main script's top-level code reaches this call from inside
    ``if __name__ == "__main__":`` (spawn re-runs everything outside it)."""
    frame, line = inspect.currentframe(), None
    while frame is not None:
        if frame.f_globals is vars(main) and frame.f_code.co_name == "<module>":
            line = frame.f_lineno
        frame = frame.f_back
    if line is None:
        return True  # not called from the script's top-level code
    try:
        with open(main_file, encoding="utf-8") as file:
            tree = ast.parse(file.read())
    except (OSError, SyntaxError, ValueError):
        return False
    return any(
        isinstance(node, ast.If)
        and ast.unparse(node.test).replace("'", '"') in _GUARDS
        and node.lineno <= line <= (node.end_lineno or node.lineno)
        for node in tree.body
    )


_GUARDS = ('__name__ == "__main__"', '"__main__" == __name__')
