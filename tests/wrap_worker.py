"""Datasets for the wrap tests, and one process of their multi-process runs.

Importable (the torch dataset here pickles into spawned DataLoader workers),
and a script:

  python wrap_worker.py rows PROCESS_COUNT PROCESS_INDEX OUT
      wraps each random-access kind with this process's share (passed to
      wrap explicitly) and writes, per kind and epoch, the labels of the
      valid rows it read, to OUT (JSON).
  python wrap_worker.py fork [bare]
      initialises JAX, wraps a DataLoader(num_workers=2) built with the
      default (fork) context, reads an epoch (``bare``: the DataLoader
      itself) and prints a JSON report with the warnings seen.
  python wrap_worker.py spawn OUT
      imports JAX and Flax as a training script does, wraps a shuffled
      DataLoader(num_workers=2, multiprocessing_context="spawn"), reads 3
      epochs into OUT/epoch-E.npz, its workers noting themselves there
      (`note_worker`), and prints a JSON report: the worker pids alive after
      each epoch, and what this process imported.
"""

import contextlib
import json
import os
import sys
import warnings

import numpy as np
import torch.utils.data

N, B = 100, 16  # 6 full batches and a short one of 4
SEED = 3


def make_arrays(n: int = N) -> dict[str, np.ndarray]:
    """A small non-MNIST dataset; ``label`` is the row number, so order is visible."""
    rng = np.random.default_rng(0)
    return {
        "x": rng.standard_normal((n, 3, 8, 8)).astype(np.float32),
        "label": np.arange(n, dtype=np.int64),
        "meta": rng.standard_normal((n, 4)).astype(np.float32),
    }


class Records:
    """A random-access source of row dicts (for Grain); records the rows it reads."""

    def __init__(self, arrays: dict[str, np.ndarray]):
        self.arrays = arrays
        self.reads: list[int] = []

    def __len__(self) -> int:
        return len(self.arrays["label"])

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        self.reads.append(int(index))
        return {key: array[index] for key, array in self.arrays.items()}


class ArraysDataset(Records, torch.utils.data.Dataset):
    """`Records` as a map-style torch Dataset."""


def _imported() -> list[str]:
    return [name for name in ("jax", "flax") if name in sys.modules]


def note_worker(out: str, worker_id: int) -> None:
    """A DataLoader ``worker_init_fn`` (through ``functools.partial``): the
    worker's pid, and which of JAX and Flax it imported, in a file of ``out``."""
    with open(os.path.join(out, f"worker-{worker_id}-{os.getpid()}.json"), "w") as file:
        json.dump({"pid": os.getpid(), "imported": _imported()}, file)


def random_access_kinds(arrays: dict[str, np.ndarray]) -> dict:
    """name -> (object, wrap options) for the multi-process run, each shuffled."""
    import datasets
    import grain

    rows = grain.MapDataset.source(Records(arrays))
    loader = grain.DataLoader(
        data_source=Records(arrays),
        sampler=grain.samplers.IndexSampler(
            N, shard_options=grain.sharding.NoSharding(), shuffle=True, num_epochs=1, seed=1
        ),
        operations=[grain.transforms.Batch(B)],
    )
    return {
        "torch-dataset": (ArraysDataset(arrays), {"batch_size": B, "shuffle": True}),
        "torch-loader": (torch.utils.data.DataLoader(ArraysDataset(arrays), B, True), {}),
        "grain-map": (rows.shuffle(seed=0).batch(B), {}),
        "grain-loader": (loader, {}),
        "hf-dataset": (datasets.Dataset.from_dict(arrays), {"batch_size": B, "shuffle": True}),
    }


def _rows(count: int, index: int, out: str) -> None:
    from jaxfeed import loaders

    report = {}
    for name, (obj, options) in random_access_kinds(make_arrays()).items():
        source = loaders.wrap(obj, seed=SEED, process_index=index, process_count=count, **options)
        epochs = []
        for epoch in (0, 1):
            epochs.append([b["label"][b["mask"]].tolist() for b in source.iter_epoch(epoch)])
        report[name] = {"num_batches": source.num_batches, "epochs": epochs}
    with open(out, "w") as file:
        json.dump(report, file)


def _fork(bare: bool) -> None:
    import jax

    from jaxfeed import loaders

    jax.devices()  # JAX's threads run from here on: a fork now is what JAX warns about
    loader = torch.utils.data.DataLoader(ArraysDataset(make_arrays()), B, num_workers=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if bare:
            labels = [label for b in loader for label in b["label"].tolist()]
        else:
            source = loaders.wrap(loader)
            labels = [label for b in source.iter_epoch(0) for label in b["label"][b["mask"]]]
    report = {"labels": [int(x) for x in labels], "warnings": [str(w.message) for w in caught]}
    print(json.dumps(report))


def _spawn(out: str) -> None:
    import functools
    import multiprocessing

    import jax

    # The dataset and worker_init_fn from an importable module, as a script
    # imports them: run as a script, this file is __main__ (which workers
    # would have to run again to unpickle what it defines).
    from wrap_worker import ArraysDataset as Dataset
    from wrap_worker import note_worker

    from jaxfeed import loaders

    with contextlib.suppress(ImportError):
        import flax  # noqa: F401 (what a training script imports: its workers need not)
    jax.devices()
    loader = torch.utils.data.DataLoader(
        Dataset(make_arrays()),
        B,
        shuffle=True,
        num_workers=2,
        multiprocessing_context="spawn",
        worker_init_fn=functools.partial(note_worker, out),
    )
    source = loaders.wrap(loader, seed=SEED)
    pids = []
    for epoch in range(3):
        batches = list(source.iter_epoch(epoch))
        leaves = {f"{i}-{key}": v for i, batch in enumerate(batches) for key, v in batch.items()}
        np.savez(os.path.join(out, f"epoch-{epoch}.npz"), **leaves)
        pids.append(sorted(p.pid for p in multiprocessing.active_children()))
    print(json.dumps({"pids": pids, "imported": _imported()}))


if __name__ == "__main__":
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    if sys.argv[1] == "rows":
        _rows(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
    elif sys.argv[1] == "fork":
        _fork(bare=sys.argv[2:] == ["bare"])
    elif sys.argv[1] == "spawn":
        _spawn(sys.argv[2])
    else:
        raise SystemExit(f"unknown mode {sys.argv[1]!r}")
