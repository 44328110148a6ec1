"""The Ray cluster the ray backend runs its tasks on: joined, or started here.

``ray_address=`` (else ``RAY_ADDRESS``) joins an existing cluster, once it
answers there (Ray itself would wait for it, and print reconnection warnings,
without end); without one, a local instance is started with a bounded number of CPUs, no dashboard,
and the workers' output kept off this process's stdout. What jaxfeed started
it shuts down at exit, and a `ray_reaper` ends what Ray leaves of it when this
process is killed; a SIGTERM handler that was in place (jaxfeed's, which
stops a run at a step and saves) stays in place.
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import signal
import socket
import sys
import threading
import time
import warnings
from typing import Any

from jaxfeed.loaders._workers import ray_reaper

__all__ = ["connect"]

# Set once jaxfeed itself started (or joined) the instance this process uses.
_STARTED: list[bool] = []
# The reapers of the local instances started here: kept, as dropping one closes its pipe.
_REAPERS: list[Any] = []
CONNECT_TIMEOUT_ENV = "JAXFEED_RAY_CONNECT_TIMEOUT"
DEFAULT_CONNECT_TIMEOUT_S = 30.0
# Ray Client's port when a ray:// address names none.
_CLIENT_PORT = 10001


def connect_timeout(timeout_s: float | None, name: str = "connect_timeout_s") -> float:
    """``timeout_s`` (the argument ``name``), else ``$JAXFEED_RAY_CONNECT_TIMEOUT``,
    else 30 s.

    Raises:
      ValueError: not a finite number of seconds > 0.
    """
    if timeout_s is None:
        name, timeout_s = f"${CONNECT_TIMEOUT_ENV}", os.environ.get(CONNECT_TIMEOUT_ENV)
        if not timeout_s:
            return DEFAULT_CONNECT_TIMEOUT_S
    try:
        value = float(timeout_s)
    except (TypeError, ValueError):
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise ValueError(
            f"the ray connect timeout must be a finite number of seconds > 0, got "
            f"{name}={timeout_s!r}"
        )
    return value


def connect(
    address: str | None, num_cpus: int | None, debug: bool = False, timeout_s: float | None = None
) -> Any:
    """The ``ray`` module, connected: to ``address`` (else ``RAY_ADDRESS``),
    else to a local instance started now with ``num_cpus`` CPUs (None: this
    machine's). A process already connected (by the user) is used as it is.

    Args:
      address: a cluster's address (``"ray://host:10001"``, ``"host:6379"``,
        ``"auto"``), or None.
      num_cpus: CPUs of a locally started instance.
      debug: keep Ray's workers' output and info logs on this process's
        stdout/stderr (``JAXFEED_DEBUG=1`` does too).
      timeout_s: how long a cluster at ``address`` has to answer (see
        `connect_timeout`).

    Raises:
      ConnectionError: nothing at ``address`` answers as Ray does within the
        timeout; says how to start a cluster there or to run one here.
    """
    import ray

    if ray.is_initialized():
        return ray
    source = "ray_address" if address else "RAY_ADDRESS"
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address is not None:
        _check_answers(address, source, connect_timeout(timeout_s))
    debug = debug or os.environ.get("JAXFEED_DEBUG") == "1"
    options: dict[str, Any] = dict(
        address=address,
        log_to_driver=debug,
        configure_logging=True,
        logging_level=logging.INFO if debug else logging.ERROR,
    )
    if address is None:
        cpus = os.cpu_count() or 1
        options.update(
            address="local",  # a new instance, not one found running on this machine
            num_cpus=min(num_cpus or cpus, cpus * 4),
            include_dashboard=False,
            # The workers import what this process imports (a transform's module),
            # as spawned record-pool workers do; a joined cluster ships code its own
            # way (runtime_env's working_dir / py_modules).
            runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}},
        )
    # ray.init installs a SIGTERM handler (sys.exit); one already in place
    # (jaxfeed's run stops at a step and saves) must keep its job.
    main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if main else None
    before = _children()
    with warnings.catch_warnings():
        # Ray starts its processes by fork + exec; JAX's warning about forking a
        # multithreaded process is for children that go on running Python.
        warnings.filterwarnings("ignore", r"os\.fork\(\) was called", RuntimeWarning)
        ray.init(**options)
    if address is None and before is not None:  # started here: the new children are Ray's
        _REAPERS.append(ray_reaper.watch(sorted(_children() - before)))
    if main and previous not in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, previous)
    _quiet_progress(ray, debug)
    if not _STARTED:
        _STARTED.append(True)
        atexit.register(_shutdown)
    return ray


def _check_answers(address: str, source: str, timeout_s: float) -> None:
    """Raises ConnectionError unless a gRPC server (a Ray cluster's GCS, or its Ray
    Client server for ``ray://``) answers at ``address`` within ``timeout_s``.
    Addresses that name no host and port ("auto", another scheme's) and TLS
    clusters (``RAY_USE_TLS``) are left to Ray."""
    import grpc  # a dependency of ray's

    scheme, _, target = address.rpartition("://")
    host, _, port = target.rpartition(":")
    if scheme == "ray" and not port.isdigit():
        host, port = target, str(_CLIENT_PORT)
    if scheme not in ("", "ray") or not host or not port.isdigit():
        return
    target = f"{host}:{port}"
    if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
        return
    deadline = time.monotonic() + timeout_s
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            pass
    except OSError as err:
        why = f"nothing answers there ({err.strerror or err})"
    else:
        channel = grpc.insecure_channel(target)
        try:
            grpc.channel_ready_future(channel).result(max(0.0, deadline - time.monotonic()))
            return
        except grpc.FutureTimeoutError:
            why = (
                f"something listens there, but it did not answer as Ray does (gRPC) "
                f"within {timeout_s:g} s"
            )
        finally:
            channel.close()
    where = "ray_address" if source == "ray_address" else "the RAY_ADDRESS environment variable"
    raise ConnectionError(
        f"no Ray cluster at {address!r} (from {where}): {why}. Start one there "
        f"(`ray start --head` on that host), or "
        f"{'pass no ray_address' if source == 'ray_address' else 'unset RAY_ADDRESS'} "
        f"to start a local instance here (connect_timeout_s= or ${CONNECT_TIMEOUT_ENV} "
        f"sets how long a cluster has to answer)"
    )


def _children() -> set[int] | None:
    """This process's children; None without psutil (the ``ray`` extra has it),
    and then no reaper."""
    try:
        import psutil
    except ImportError:
        return None
    return {child.pid for child in psutil.Process().children()}


def _quiet_progress(ray: Any, debug: bool) -> None:
    """Ray Data's progress bars write to stderr on every pass: off unless debugging."""
    if debug:
        return
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    context.print_on_execution_start = False


def _shutdown() -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()
