"""A wrapped torch DataLoader's workers: spawned, not forked, under JAX.

Forking a process that runs JAX's threads can deadlock (the threads are
copied mid-work). `wrap` switches a loader whose workers would fork to spawn
when spawning works, and otherwise warns once, naming the fix.
"""

from __future__ import annotations

import ast
import multiprocessing
import pickle
import sys
import types
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np


def worker_context(loader: Any) -> Any:
    """The multiprocessing context `wrap` gives ``loader``'s workers.

    Forking a process that runs JAX's threads can deadlock, so workers that
    would fork by default are spawned instead when spawning works (the
    dataset, collate_fn and worker_init_fn pickle, and a script re-run by
    spawn starts no work). Otherwise, and for an explicit ``"fork"``, the
    loader keeps its context and one warning names the fix.
    """
    context = loader.multiprocessing_context
    if not loader.num_workers:
        return context
    if context is None:
        method = multiprocessing.get_start_method(allow_none=True)
        method = method or multiprocessing.get_all_start_methods()[0]
    else:
        method = context.get_start_method()
    if method != "fork":
        return context
    problem = "it was built with multiprocessing_context='fork'" if context else None
    parts = ("dataset", "collate_fn", "worker_init_fn")
    problem = problem or _spawn_problem({name: getattr(loader, name) for name in parts})
    if problem is None:
        return "spawn"
    warnings.warn(
        f"the wrapped DataLoader starts its {loader.num_workers} workers with fork, which "
        f"can deadlock a process that runs JAX (JAX's threads are copied mid-work), and "
        f"wrap cannot switch them to spawn: {problem}. Build the DataLoader with "
        f"multiprocessing_context='spawn' and a picklable dataset, collate_fn and "
        f"worker_init_fn (defined at module level of an importable file), and start the "
        f"work under `if __name__ == '__main__':`",
        RuntimeWarning,
        stacklevel=4,  # wrap()'s caller (through wrap_kinds._torch)
    )
    return context


def _spawn_problem(parts: Mapping[str, Any]) -> str | None:
    """Why spawned workers could not run ``parts``, or None."""
    main = sys.modules["__main__"]
    main_file = getattr(main, "__file__", None)
    in_main: list[str] = []

    class Probe(pickle.Pickler):
        def persistent_id(self, obj: Any) -> Any:
            if isinstance(obj, np.ndarray) and not obj.dtype.hasobject:
                return 0  # arrays always pickle: skip their bytes
            if type(obj).__module__.startswith("torch") and type(obj).__name__ == "Tensor":
                return 0
            if isinstance(obj, type | types.FunctionType) and obj.__module__ == "__main__":
                in_main.append(obj.__qualname__)
            return None

    for name, value in parts.items():
        try:
            Probe(_Discard(), protocol=pickle.HIGHEST_PROTOCOL).dump(value)
        except Exception as error:  # whatever fails, it does not pickle
            return f"its {name} does not pickle ({type(error).__name__}: {error})"
        if in_main and main_file is None:
            return (
                f"its {name} uses {in_main[0]}, defined in an interactive session, which "
                f"spawned workers cannot import"
            )
    if main_file is not None and not _called_under_main_guard(main, main_file):
        return f"{main_file} calls wrap() outside `if __name__ == '__main__':` (spawn re-runs it)"
    return None


class _Discard:
    def write(self, data: bytes) -> int:
        return len(data)


def _called_under_main_guard(main: types.ModuleType, main_file: str) -> bool:
    """Whether the main script's top-level code reaches this call from inside
    ``if __name__ == "__main__":`` (spawn re-runs everything outside it)."""
    frame, line = sys._getframe(), None
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
