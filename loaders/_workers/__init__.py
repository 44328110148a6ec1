"""Everything that starts, feeds, signals and stops processes and threads.

- `spawn`: the spawn contexts whose workers leave Ctrl-C and SIGTERM to
  their parent, the start method, the report of a slow start, a dead worker
  named as an error.
- `main_script`: what a spawned worker would need from the user's main
  script, and whether that script can be run again.
- `record_pool`: the numpy and hf backends' transform worker processes.
- `shared_pool`: those processes, one pool per job and worker count that
  every loader shares.
- `shared_batches`: finished batches handed back as files in shared memory.
- `read_ahead`: one thread body reading an iterator into a bounded queue.
- `disk_read_ahead`: threads reading the coming rows of memory-mapped
  fields into the page cache.
- `read_depth`: how many of those reads to keep outstanding, from the
  throughput they reach.
- `mapped_files`: where a memory-mapped field lies, the kernel's read
  advice, and an on-disk field pickled as where it lies.
- `torch_epochs`: torch DataLoaders serving epochs, their workers watched.
- `ray_instance`: the Ray cluster the ray backend joins, or the local
  instance it starts (and shuts down at exit).

None of them imports a backend, a wrap module or a dataset module.
"""
