"""The standard library's door: the processes of a process pool, and the
exit hooks a process runs before it leaves.

Checked against Python 3.11.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing


def pool_processes(pool: concurrent.futures.ProcessPoolExecutor) -> list[multiprocessing.Process]:
    """The worker processes a ``ProcessPoolExecutor`` started so far: it keeps
    them in the private ``_processes``, a dict by pid."""
    return list(getattr(pool, "_processes", {}).values())


def pool_broken(pool: concurrent.futures.ProcessPoolExecutor) -> bool:
    """Whether a ``ProcessPoolExecutor`` lost a worker and takes no more work:
    it says so in the private ``_broken``."""
    return bool(getattr(pool, "_broken", False))


def name_shared_memory(prefix: str) -> None:
    """In this process, names every new ``SharedMemory(create=True)`` segment
    ``/<prefix><random hex>`` instead of ``/psm_<random hex>``: the standard
    library draws the name from the private ``shared_memory._make_filename``
    (a segment whose name is taken is retried with a new one)."""
    import secrets
    from multiprocessing import shared_memory

    shared_memory._make_filename = lambda: f"/{prefix}{secrets.token_hex(8)}"


def run_exit_hooks() -> None:
    """Runs this process's ``atexit`` hooks now (for a process that then
    leaves with ``os._exit``, as a forked child does): the private
    ``atexit._run_exitfuncs``, which also clears them."""
    import atexit

    atexit._run_exitfuncs()
