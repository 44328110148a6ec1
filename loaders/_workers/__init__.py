"""Everything that starts, feeds, signals and stops processes and threads
(internal). None of it imports a backend, a wrap or a dataset module.

- `spawn`: the spawn contexts whose workers leave Ctrl-C and SIGTERM to
  their parent, the start method, the report of a slow start, a dead worker
  named as an error.
- `main_script`: what a spawned worker would need from the user's main
  script, and whether that script can be run again.
- `record_pool`: the numpy and hf backends' transform worker processes.
- `shared_pool`: those processes, one pool per job and worker count that
  every loader shares.
- `shared_batches`: finished batches handed back as files in shared memory.
- `batch_ring`: torch's workers hand batches back through a ring of reused
  slots in shared memory.
- `owned_segments`: Grain's workers ended with their parent, their shared
  memory named after its run.
- `torch_epochs`: torch DataLoaders serving epochs, their workers watched.
- `ray_instance`: the Ray cluster the ray backend joins, or the local
  instance it starts (and shuts down at exit).
- `ray_reaper`: a small process that ends what Ray leaves of that instance
  when its driver is killed.
- `hard_exit`: what a process leaving through ``os._exit`` ends first.
"""

__all__: list[str] = []  # internal: nothing here is public
