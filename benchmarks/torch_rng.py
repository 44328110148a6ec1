"""What seeding torch per record costs a ``make(transform=fn(record, rng))``.

One torchvision-style augmentation written with torch ops (random crop of a
64x64x3 image to 56x56, flip, normalise, noise), run record by record as a
backend runs it, with ``rng = numpy.random.default_rng((seed, epoch, row))``;
three ways to make its torch draws follow the row's ``rng``:

- ``unseeded``: torch's global generator, never seeded: the floor, and not
  reproducible.
- ``manual_seed``: ``torch.manual_seed(int(rng.integers(2**63)))`` per record,
  then the global generator (what issue 30 measured: byte-identical, slow).
- ``torch_generator``: ``jaxfeed.loaders.transform.torch_generator(rng)``,
  one reused generator per thread, passed as ``generator=``.

Each row: µs per record, the median of ``--repeats`` passes over
``--records`` records, interleaved. From the repository root::

    python3 benchmarks/torch_rng.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import numpy as np
from common import write_record  # also puts the repo on sys.path

ROWS = ("unseeded", "manual_seed", "torch_generator")


def augment(image, generator) -> np.ndarray:
    """The augmentation, drawing from ``generator`` (None: torch's global one)."""
    import torch

    top, left = torch.randint(0, 9, (2,), generator=generator).tolist()
    crop = image[top : top + 56, left : left + 56]
    if torch.rand((), generator=generator) < 0.5:
        crop = crop.flip(1)
    crop = (crop.float() / 255 - 0.5) / 0.25
    return (crop + 0.01 * torch.randn(crop.shape, generator=generator)).numpy()


def ways() -> dict[str, Callable]:
    import torch
    from jaxfeed.loaders.transform import torch_generator

    def unseeded(image, rng):
        return augment(image, None)

    def manual_seed(image, rng):
        torch.manual_seed(int(rng.integers(2**63)))
        return augment(image, None)

    def generator(image, rng):
        return augment(image, torch_generator(rng))

    return {"unseeded": unseeded, "manual_seed": manual_seed, "torch_generator": generator}


def one_pass(fn: Callable, images, records: int) -> float:
    """µs per record over ``records`` records."""
    started = time.perf_counter()
    for row in range(records):
        fn(images[row % len(images)], np.random.default_rng((0, 1, row)))
    return (time.perf_counter() - started) / records * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--tag", default="cpu")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)  # a loader worker's setting
    pixels = np.random.default_rng(0).integers(0, 255, (64, 64, 64, 3), np.uint8)
    images = [torch.from_numpy(p) for p in pixels]
    fns = ways()
    times: dict[str, list[float]] = {name: [] for name in ROWS}
    for _ in range(args.repeats):
        for name in ROWS:
            times[name].append(one_pass(fns[name], images, args.records))
    results = []
    print(f"{'way':<16} {'µs/record':>10}   (median of {args.repeats}, {args.records} records)")
    for name in ROWS:
        median = statistics.median(times[name])
        results.append({"way": name, "us_per_record": median, "repeats": times[name]})
        print(f"{name:<16} {median:>10.1f}")
    write_record("torch-rng", args, results, load_before=os.getloadavg())


if __name__ == "__main__":
    main()
