"""Helpers shared by the test files (not tests themselves)."""

import socket

import numpy as np
from jaxfeed.loaders import ArrayDataset


def indexed_dataset(n: int = 300) -> ArrayDataset:
    """Label ``i`` and pixels ``i % 256`` in row ``i``: order and coverage are visible."""
    images = np.broadcast_to(
        (np.arange(n) % 256).astype(np.uint8)[:, None, None, None], (n, 28, 28, 1)
    )
    return ArrayDataset(
        "indexed/train",
        {"image": np.ascontiguousarray(images), "label": np.arange(n, dtype=np.int32)},
    )


def valid_labels(source, epoch: int = 0) -> np.ndarray:
    """The labels of one epoch's real (unpadded) rows, in order."""
    batches = list(source.iter_epoch(epoch))
    assert len(batches) == source.num_batches
    return np.concatenate([b["label"][b["mask"]] if "mask" in b else b["label"] for b in batches])


def assert_same_batches(got: list[dict], want: list[dict]) -> None:
    """Same number of batches, same keys, dtypes, shapes and bytes."""
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            assert a[key].dtype == b[key].dtype and a[key].shape == b[key].shape, key
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def free_port() -> int:
    """A TCP port free on every address now, and the port after it too, for
    a loopback multi-process job: process 0 listens on both (JAX's
    coordinator, and the roll call on the next). The kernel picks the first
    from the ephemeral range, where the next can be any connection's local
    port (a CI run once failed on that)."""
    while True:
        with socket.socket() as first:
            first.bind(("", 0))
            port = first.getsockname()[1]
            try:
                with socket.create_server(("", port + 1)):
                    return port
            except OSError:
                continue


def process_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, exited but not yet reaped, is gone)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            return not any(line.startswith("State:\tZ") for line in status)
    except FileNotFoundError:
        return False


class StartsAfter:
    """A process target that a spawned child finishes unpickling only once
    ``path`` exists, so the child is still starting while the test acts (kills
    its parent); then it waits forever, for its parent's watch to end it."""

    def __init__(self, path: str):
        self.path = path

    def __getstate__(self) -> str:
        return self.path

    def __setstate__(self, path: str) -> None:
        import os
        import time

        self.path = path
        while not os.path.exists(path):  # the test's event: a file it creates
            time.sleep(0.05)

    def __call__(self) -> None:
        import threading

        threading.Event().wait()
