"""Joining a multi-process (multi-host) JAX job, also on CPUs over loopback."""

from __future__ import annotations

import os

import jax

# Our own names first, then the ones JAX's launcher documentation uses.
_ENV = {
    "coordinator": ("JAXFEED_COORDINATOR", "JAX_COORDINATOR_ADDRESS"),
    "num_processes": ("JAXFEED_NUM_PROCESSES", "JAX_NUM_PROCESSES"),
    "process_id": ("JAXFEED_PROCESS_ID", "JAX_PROCESS_ID"),
}


def _from_env(name: str) -> str | None:
    for variable in _ENV[name]:
        if os.environ.get(variable):
            return os.environ[variable]
    return None


def initialize(
    coordinator: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
) -> bool:
    """Joins a multi-process job, or does nothing for a single process.

    Call it before anything else touches jax devices. Unset arguments are
    read from ``JAXFEED_COORDINATOR`` / ``JAXFEED_NUM_PROCESSES`` /
    ``JAXFEED_PROCESS_ID`` (or JAX's ``JAX_COORDINATOR_ADDRESS`` /
    ``JAX_NUM_PROCESSES`` / ``JAX_PROCESS_ID``). CPU collectives use gloo, so
    the same command runs on several CPU processes on one machine.

    Args:
      coordinator: ``HOST:PORT`` of process 0's coordinator service.
      num_processes: processes in the job.
      process_id: this process, in ``[0, num_processes)``.

    Returns:
      True if a multi-process job was joined, False for a single process.

    Raises:
      ValueError: some but not all of the three are given, or they are
        inconsistent.

    Example:
      >>> # on each of 2 hosts, with process_id 0 and 1:
      >>> sharding.initialize("10.0.0.1:1234", num_processes=2, process_id=0)
    """
    coordinator = coordinator or _from_env("coordinator")
    num_processes = num_processes if num_processes is not None else _from_env("num_processes")
    process_id = process_id if process_id is not None else _from_env("process_id")
    given = {"coordinator": coordinator, "num_processes": num_processes, "process_id": process_id}
    if all(v is None for v in given.values()):
        return False
    missing = [k for k, v in given.items() if v is None]
    if missing:
        raise ValueError(
            f"multi-process run needs coordinator, num_processes and process_id; missing "
            f"{missing} (got {given}). Pass --coordinator HOST:PORT --num-processes N "
            f"--process-id I, or set JAXFEED_COORDINATOR etc."
        )
    num_processes, process_id = int(num_processes), int(process_id)
    host, _, port = str(coordinator).rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"coordinator must be HOST:PORT, got {coordinator!r}")
    if num_processes < 1 or not 0 <= process_id < num_processes:
        raise ValueError(
            f"process_id {process_id} is not in [0, num_processes={num_processes}); "
            f"number the processes 0..{max(num_processes, 1) - 1}"
        )
    # Cross-process collectives on CPU need an implementation; gloo ships with jaxlib.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=str(coordinator), num_processes=num_processes, process_id=process_id
    )
    return True
