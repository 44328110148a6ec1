"""torch DataLoaders read through the worker watch: a worker's error reaches
the consumer in order."""

import faulthandler

import numpy as np
import pytest
from jaxfeed.loaders._workers.torch_epochs import iterate, keep_batch
from jaxfeed.loaders.backends import torch as torch_backend

from jaxfeed import loaders


@pytest.fixture
def deadlock_guard():
    """Fails loudly (traceback + exit) instead of hanging CI if workers deadlock."""
    faulthandler.dump_traceback_later(240, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


def test_worker_errors_reach_the_consumer_in_order(deadlock_guard):
    import torch

    data = loaders.make("numpy", dataset="mnist-sample").dataset
    loader = torch.utils.data.DataLoader(
        torch_backend.ArrayTorchDataset(data.arrays),
        batch_sampler=[[0, 1], [4000]],  # the second batch reads past the 4,000 rows
        num_workers=1,
        multiprocessing_context="spawn",
        collate_fn=keep_batch,
    )
    batches = iterate(loader)
    np.testing.assert_array_equal(next(batches)["label"], data["label"][:2])
    with pytest.raises(IndexError, match="Caught IndexError in DataLoader worker process 0"):
        next(batches)
