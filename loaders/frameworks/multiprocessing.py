"""The standard library's door: the processes of a process pool.

Checked against Python 3.11.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing


def pool_processes(pool: concurrent.futures.ProcessPoolExecutor) -> list[multiprocessing.Process]:
    """The worker processes a ``ProcessPoolExecutor`` started so far: it keeps
    them in the private ``_processes``, a dict by pid."""
    return list(getattr(pool, "_processes", {}).values())
