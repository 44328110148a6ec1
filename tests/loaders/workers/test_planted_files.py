"""What a neighbour on a shared machine plants under the names jaxfeed looks
for in /dev/shm and $TMPDIR: a FIFO or a symlink to one where a lock should be
never hangs a run (each case runs in a subprocess under a hard timeout, so a
regression fails instead of hanging), another user's lock is never taken for a
dead run's, and a lock name with glob characters never makes a run remove a
live run's shared-memory segments."""

import contextlib
import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from jaxfeed.loaders._io import owner_lock
from jaxfeed.loaders._workers import owned_segments

HANG = 60  # seconds: each run below takes about one without a plant

# What a run does first in each place: clean up what dead runs left, then own
# a fresh name (and give it back: these runs leave nothing).
_RUNS = {
    "batches": """
from jaxfeed.loaders._workers import shared_batches
shared_batches.remove_directory(shared_batches.make_directory())
""",
    "segments": """
from jaxfeed.loaders._workers import owned_segments
owned_segments.remove_dead_segments()
""",
    "autograph": """
import shutil, tempfile
from jaxfeed.loaders._doors.tf import AUTOGRAPH_PREFIX
from jaxfeed.loaders._io.owner_lock import owned_directory
directory, _ = owned_directory(tempfile.gettempdir(), AUTOGRAPH_PREFIX)
shutil.rmtree(directory)
""",
}


def _lock_path(place: str, tmp: Path) -> Path:
    """A predictable lock name in ``place``, unique to this test run, so that
    nothing another run made is touched (the test removes only its own)."""
    unique = f"planted-{os.getpid()}-{secrets.token_hex(4)}"
    if place == "batches":
        return Path(f"/dev/shm/jaxfeed-batches-{unique}/.owner.lock")
    if place == "segments":  # the form a tag takes, or the sweep would not look at it
        return Path(f"/dev/shm/jaxfeed-segments-{secrets.token_hex(6)}.lock")
    return tmp / f"jaxfeed-autograph-{unique}" / ".owner.lock"


def _unblock(fifo: Path) -> None:
    """Lets go of anyone (another run on the machine) blocked opening ``fifo``."""
    with contextlib.suppress(OSError):
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


@pytest.mark.skipif(not os.access("/dev/shm", os.W_OK), reason="no writable /dev/shm")
@pytest.mark.parametrize("kind", ["fifo", "symlink to a fifo"])
@pytest.mark.parametrize("place", sorted(_RUNS))
def test_a_planted_fifo_at_a_lock_name_never_hangs_a_run(place, kind, tmp_path):
    private = tmp_path / "tmp"
    private.mkdir()
    lock = _lock_path(place, private)
    fifo = tmp_path / "fifo" if kind != "fifo" else lock
    made = lock.parent if place != "segments" else None
    if made is not None:
        made.mkdir()
    try:
        os.mkfifo(fifo)
        if fifo != lock:
            os.symlink(fifo, lock)
        try:
            run = subprocess.run(
                [sys.executable, "-c", _RUNS[place]],
                env={**os.environ, "TMPDIR": str(private)},
                capture_output=True,
                text=True,
                timeout=HANG,
            )
        except subprocess.TimeoutExpired:
            pytest.fail(f"a run hung on a {kind} planted at {lock}")
        assert run.returncode == 0, run.stderr
        # Not a lock of this user's: left alone, not taken for a dead run's.
        assert os.path.lexists(lock)
    finally:
        _unblock(fifo)
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock)


@pytest.mark.skipif(os.geteuid() != 0, reason="making another user's file takes root")
def test_another_users_free_lock_is_not_a_dead_run_of_this_users(tmp_path):
    directory = tmp_path / "jaxfeed-batches-theirs"
    directory.mkdir()
    lock = directory / ".owner.lock"
    lock.write_bytes(b"")
    os.chown(lock, 65534, 65534)  # nobody's: free, but not ours to judge
    assert not owner_lock.owner_gone(lock)
    assert owner_lock.remove_dead_directories(tmp_path, "jaxfeed-batches-") == []
    assert lock.exists()
    # A directory of another user's is left alone whatever its lock says.
    os.chown(lock, os.geteuid(), os.getegid())
    os.chown(directory, 65534, 65534)
    assert owner_lock.remove_dead_directories(tmp_path, "jaxfeed-batches-") == []
    # Ours, its owner gone: removed, as before.
    os.chown(directory, os.geteuid(), os.getegid())
    assert owner_lock.remove_dead_directories(tmp_path, "jaxfeed-batches-") == [str(directory)]


@pytest.mark.parametrize(
    "planted",
    ["jaxfeed-segments-*.lock", "jaxfeed-segments-?*.lock", "jaxfeed-segments-[0-9a-f]*.lock"],
)
def test_a_lock_named_with_glob_characters_removes_no_live_runs_segments(
    planted, tmp_path, monkeypatch
):
    # A private /dev/shm: a regression here must not remove the segments of
    # the runs on this machine.
    monkeypatch.setattr(owned_segments, "SHM", str(tmp_path))
    live_tag, dead_tag = secrets.token_hex(6), secrets.token_hex(6)
    held = owner_lock.hold(tmp_path / f"jaxfeed-segments-{live_tag}.lock")
    try:
        live = tmp_path / f"{owned_segments.SEGMENT_PREFIX}{live_tag}-00"
        dead = tmp_path / f"{owned_segments.SEGMENT_PREFIX}{dead_tag}-00"
        os.close(owner_lock.hold(tmp_path / f"jaxfeed-segments-{dead_tag}.lock"))
        (tmp_path / planted).write_bytes(b"")  # its lock is free: it reads as dead
        for segment in (live, dead):
            segment.write_bytes(b"x")
        assert owned_segments.remove_dead_segments() == [str(dead)]
        assert live.exists()
    finally:
        os.close(held)
