"""The read-ahead's depth follows the throughput it sees (a fake clock and disk)."""

from jaxfeed.loaders._io import read_depth
from jaxfeed.loaders._io.read_depth import ReadDepth


class FakeDisk:
    """Reads of 1 MiB; ``limit`` reads in flight reach the disk's top rate."""

    def __init__(self, limit: int):
        self.limit = limit
        self.now = 0.0

    def run(self, depth: ReadDepth, periods: int, backlog: bool = True) -> list[int]:
        """Feeds ``depth`` ten reads per period at the rate its depth reaches; the depths seen."""
        seen = []
        for _ in range(periods * 10):
            rate = min(depth.depth, self.limit) * 100.0  # MiB/s
            self.now += read_depth.PERIOD_SECONDS / 10
            seen.append(depth.done(int(rate * read_depth.PERIOD_SECONDS / 10 * 2**20), backlog))
        return seen


def test_depth_grows_while_throughput_rises_then_backs_off_to_the_disk_limit():
    disk = FakeDisk(limit=8)
    depth = ReadDepth(ceiling=64, floor=2, clock=lambda: disk.now)
    seen = disk.run(depth, periods=8)
    assert max(seen) == 16  # 2, 4, 8 raised the rate; 16 was tried
    assert seen[-1] == 8  # and given up: it did not
    # Held at 8; after RETRY_PERIODS it tries 16 again and comes back.
    seen = disk.run(depth, periods=read_depth.RETRY_PERIODS + 4)
    assert 16 in seen and seen[-1] == 8
    # A faster disk (or one another job left): it climbs further.
    disk.limit = 48
    seen = disk.run(depth, periods=2 * read_depth.RETRY_PERIODS)
    assert max(seen) == 64 and seen[-1] == 64


def test_depth_never_passes_the_memory_budget():
    disk = FakeDisk(limit=1000)
    depth = ReadDepth(ceiling=12, floor=2, clock=lambda: disk.now)
    seen = disk.run(depth, periods=40)
    assert max(seen) == 12 and seen[-1] == 12


def test_periods_without_backlog_do_not_move_the_depth():
    # The batches' reader, not the disk, set the pace: nothing to learn.
    disk = FakeDisk(limit=64)
    depth = ReadDepth(ceiling=64, floor=2, clock=lambda: disk.now)
    assert set(disk.run(depth, periods=10, backlog=False)) == {2}
    assert max(disk.run(depth, periods=10)) > 2
