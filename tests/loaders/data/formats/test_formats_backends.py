"""Every backend reads the user's files in the shared order: byte-identical
batches across the five backends (two epochs, a random PNG augmentation),
and with worker processes, which get the memory-mapped fields by path."""

import numpy as np
import pytest
from backend_helpers import assert_same_batches
from format_files import augmented_epochs, write_all
from transform_helpers import augment_image

from jaxfeed import loaders

BACKENDS = ("numpy", "torch", "tf", "grain", "hf")


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    return write_all(tmp_path_factory.mktemp("formats"))


@pytest.mark.parametrize("name", ["imagefolder", "tfrecord", "arrayrecord", "parquet"])
def test_five_backends_give_byte_identical_batches(written, name):
    want = augmented_epochs("numpy", written[name])
    assert not np.array_equal(want[0][0]["image"], want[1][0]["image"])  # a new order each epoch
    for backend in BACKENDS[1:]:
        got = augmented_epochs(backend, written[name])
        for epoch in (0, 1):
            assert_same_batches(got[epoch], want[epoch])


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["numpy", "torch", "grain"])
def test_workers_read_the_files_by_path(written, backend):
    want = augmented_epochs("numpy", written["tfrecord"])
    got = augmented_epochs(backend, written["tfrecord"], num_workers=2)
    for epoch in (0, 1):
        assert_same_batches(got[epoch], want[epoch])


def test_grain_reads_arrayrecord_files_in_place_through_its_own_source(written):
    source = loaders.make("grain", dataset=written["arrayrecord"], batch_size=7, seed=5,
                          transform=augment_image)  # fmt: skip
    assert source.source == "files"
    assert type(source.records.source).__name__ == "ArrayRecordDataSource"
    memory = loaders.make("grain", dataset=written["arrayrecord"], batch_size=7, seed=5,
                          transform=augment_image, source="memory")  # fmt: skip
    assert memory.source == "memory"
    for epoch in (0, 1):
        assert_same_batches(list(source.iter_epoch(epoch)), list(memory.iter_epoch(epoch)))
