"""Read-ahead asks the kernel for the coming batches' rows of on-disk fields."""

import time

import numpy as np
from jaxfeed.loaders.sampler import Sampler
from jaxfeed.loaders.workers import disk_read_ahead
from jaxfeed.loaders.workers.disk_read_ahead import DiskReadAhead, mapped_rows

from jaxfeed import loaders


def test_read_ahead_asks_for_the_coming_blocks_as_long_ranges(tmp_path, monkeypatch):
    asked = []
    monkeypatch.setattr(disk_read_ahead, "_MADVISE", lambda *a: asked.append(a[:2]))
    monkeypatch.setattr(disk_read_ahead, "_MINCORE", None)  # as if nothing were cached
    directory = tmp_path / "d"
    directory.mkdir()
    np.save(directory / "x.npy", np.zeros((4000, 1024), np.uint8))
    (x,) = loaders.load_dataset(directory).arrays.values()
    for shuffle, kwargs in (("blocks", {"block_rows": 100, "window_blocks": 2}), (True, {})):
        asked.clear()
        plan = [i for i, _ in Sampler(4000, 200, shuffle=shuffle, **kwargs).epoch_plan(0)]
        ahead = DiskReadAhead(mapped_rows([x]), plan)  # no reader yet: all 20 are ahead
        deadline = time.monotonic() + 10
        while len(asked) < 20 and time.monotonic() < deadline:
            time.sleep(0.01)
        ahead.close()
        assert all(start % 4096 == 0 for start, _ in asked)  # madvise wants pages
        if shuffle == "blocks":  # a batch is one window: 2 blocks, 1 or 2 ranges of 100 rows
            assert 20 <= len(asked) <= 40, asked
            assert all(100 << 10 <= length < (200 << 10) + 4096 for _, length in asked), asked
        else:  # 200 random rows of 4,000: gaps under 64 KiB merge them into long ranges
            assert len(asked) >= 20
