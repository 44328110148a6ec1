"""`torch_generator`: torch's random ops in a ``make(transform=)`` function,
byte-identical on the five backends, new every epoch, torch's global
generator untouched (issue 30, item 10)."""

import numpy as np
import pytest
from backend_helpers import assert_same_batches
from jaxfeed.loaders import ArrayDataset
from jaxfeed.loaders.transform import torch_generator
from transform_helpers import torch_augment

from jaxfeed import loaders

BACKENDS = ["numpy", "torch", "tf", "grain", "hf"]


@pytest.fixture(scope="module")
def images() -> ArrayDataset:
    rng = np.random.default_rng(0)
    fields = {"image": rng.integers(0, 255, (24, 8, 8), np.uint8), "row": np.arange(24)}
    return ArrayDataset("images/train", fields)


def _epoch(backend: str, images: ArrayDataset, epoch: int, **options) -> list[dict]:
    source = loaders.make(backend, dataset=images, batch_size=10, seed=3,
                          transform=torch_augment, **options)  # fmt: skip
    batches = list(source.iter_epoch(epoch, start=1))
    if hasattr(source, "close"):
        source.close()
    return batches


@pytest.fixture(scope="module")
def reference(images) -> list[dict]:
    return _epoch("numpy", images, 1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_torch_ops_on_the_row_generator_are_byte_identical_on_every_backend(
    backend, images, reference
):
    assert_same_batches(_epoch(backend, images, 1), reference)


@pytest.mark.slow
def test_the_same_in_spawned_workers(images, reference):
    assert_same_batches(_epoch("numpy", images, 1, num_workers=2), reference)


def test_each_epoch_draws_anew_and_the_global_generator_is_untouched(images, reference):
    import torch

    before = torch.random.get_rng_state()
    other = _epoch("numpy", images, 2)
    assert not np.array_equal(other[0]["image"], reference[0]["image"])
    assert torch.equal(torch.random.get_rng_state(), before)
    # The same rng draw seeds the same stream, and rng's next draws stay the row's own.
    a, b = np.random.default_rng(7), np.random.default_rng(7)
    first = torch.rand(3, generator=torch_generator(a))
    assert torch.equal(first, torch.rand(3, generator=torch_generator(b)))
    assert a.random() == b.random()
