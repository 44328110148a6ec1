"""The standard library's door: the processes of a process pool, how a
spawned child is launched, and how a child leaves.

Checked against Python 3.11; spawn's hooks (`around_spawn_launch`,
`around_spawn_fork`, `spawn_without_main_when`, `AroundBootstrap`) against
3.11-3.13's ``Lib/multiprocessing`` (the tests run on 3.11).
"""

from __future__ import annotations

import concurrent.futures
import functools
import multiprocessing
from collections.abc import Callable
from typing import Any


def pool_processes(pool: concurrent.futures.ProcessPoolExecutor) -> list[multiprocessing.Process]:
    """The worker processes a ``ProcessPoolExecutor`` started so far: it keeps
    them in the private ``_processes``, a dict by pid."""
    return list(getattr(pool, "_processes", {}).values())


def pool_broken(pool: concurrent.futures.ProcessPoolExecutor) -> bool:
    """Whether a ``ProcessPoolExecutor`` lost a worker and takes no more work:
    it says so in the private ``_broken``."""
    return bool(getattr(pool, "_broken", False))


def process_target(process: multiprocessing.process.BaseProcess) -> Any:
    """The function ``process`` runs (``Process(target=...)``), which it keeps
    in the private ``_target``; None for a ``Process`` subclass's own ``run``."""
    return getattr(process, "_target", None)


def around_spawn_launch(around: Callable[[Any, Callable[[], None]], None]) -> None:
    """Has spawn launch every process through ``around(process, launch)``,
    which must call ``launch()``: in the thread that starts ``process``, around
    the fork and exec of its child and the sending of its pickled state. Spawn
    (POSIX) launches in the private ``popen_spawn_posix.Popen._launch``."""
    import platform
    from multiprocessing import popen_spawn_posix

    launch = vars(popen_spawn_posix.Popen).get("_launch")  # its own: fork's Popen has one too
    if launch is None:
        raise RuntimeError(
            f"Python {platform.python_version()}'s spawn has no Popen._launch, where jaxfeed "
            "keeps its workers' Ctrl-C and SIGTERM to their parent: "
            "loaders/_doors/multiprocessing.py needs updating for this Python"
        )

    def launching(popen: Any, process: Any) -> None:
        around(process, lambda: launch(popen, process))

    popen_spawn_posix.Popen._launch = launching


def around_spawn_fork(around: Callable[[Callable[[], int]], int]) -> None:
    """Has spawn fork and exec every child (a process's, the resource
    tracker's) through ``around(fork)``, which must return ``fork()``'s pid:
    in the thread that launches it, with nothing else between. Spawn (POSIX)
    forks in the undocumented ``multiprocessing.util.spawnv_passfds``, looked
    up at each launch (Python 3.11-3.13)."""
    from multiprocessing import util

    spawnv_passfds = util.spawnv_passfds

    def forking(*args: Any) -> int:
        return around(lambda: spawnv_passfds(*args))

    util.spawnv_passfds = forking


def spawn_without_main_when(skip: Callable[[], bool]) -> None:
    """Has spawn leave the parent's main module out of a child's set-up
    whenever ``skip()`` is true in the thread launching it: the child then does
    not run the parent's main script first. Spawn sends that module as
    ``init_main_from_name`` or ``init_main_from_path`` in the undocumented dict
    of ``multiprocessing.spawn.get_preparation_data``, looked up at each launch
    (Python 3.11-3.13)."""
    from multiprocessing import spawn

    get_preparation_data = spawn.get_preparation_data

    def preparation_data(name: str) -> dict[str, Any]:
        data = get_preparation_data(name)
        if skip():
            data.pop("init_main_from_name", None)
            data.pop("init_main_from_path", None)
        return data

    spawn.get_preparation_data = preparation_data


class AroundBootstrap:
    """A base for a ``multiprocessing`` Process class, before the standard
    library's (``class P(AroundBootstrap, SpawnProcess)``): the child runs all
    it does, from before anything of its set-up to its exit code, inside
    ``self.around_bootstrap(bootstrap)``, which must call ``bootstrap()`` and
    return its exit code (or leave the process). A child runs in the private
    ``BaseProcess._bootstrap(parent_sentinel=None)`` (Python 3.11-3.13)."""

    def around_bootstrap(self, bootstrap: Callable[[], int]) -> int:
        return bootstrap()

    def _bootstrap(self, *args: Any, **kwargs: Any) -> int:
        return self.around_bootstrap(functools.partial(super()._bootstrap, *args, **kwargs))


def name_shared_memory(prefix: str) -> None:
    """In this process, names every new ``SharedMemory(create=True)`` segment
    ``/<prefix><random hex>`` instead of ``/psm_<random hex>``: the standard
    library draws the name from the private ``shared_memory._make_filename``
    (a segment whose name is taken is retried with a new one)."""
    import secrets
    from multiprocessing import shared_memory

    shared_memory._make_filename = lambda: f"/{prefix}{secrets.token_hex(8)}"


def run_exit_hooks() -> None:
    """Runs this process's ``atexit`` hooks now, as interpreter exit does
    first (through the private ``atexit._run_exitfuncs``): for a child that
    then leaves with ``os._exit``, skipping the interpreter's finalization."""
    import atexit

    atexit._run_exitfuncs()
