"""File and memory-map I/O (internal): the lowest layer; it imports nothing
else of jaxfeed, so every room above may use it.

- `mapped_files`: where a memory-mapped field lies, the kernel's read advice,
  and an on-disk field pickled as where it lies.
- `disk_read_ahead`: threads reading the coming rows of memory-mapped fields
  into the page cache.
- `read_depth`: how many of those reads to keep outstanding, from the
  throughput they reach.
- `read_ahead`: one thread body reading an iterator into a bounded queue.
- `on_disk_fields`: a source's fields as the disk holds them: page-cache
  advice, read-ahead set up, and the check that their files were not cut short.
- `retry`: a call retried with backoff and jitter within a time budget.
- `owner_lock`: who owns a scratch or batch directory, by an ``flock`` that
  dies with its process.
"""

__all__: list[str] = []  # internal: nothing here is public
