"""A field stored in the other byte order (a `.npy` written big-endian on
another machine) is served as the same numbers by every backend, or refused by
name; never as byte-swapped values (hf and tf stored the raw bytes as native)."""

import numpy as np
import pytest

import jaxfeed
from jaxfeed import loaders

BACKENDS = ["numpy", "torch", "tf", "grain", "hf"]


def _big_endian(n: int = 40) -> dict[str, np.ndarray]:
    return {
        "x": np.arange(n * 3, dtype=">f4").reshape(n, 3) / 4,
        "label": np.arange(n, dtype=">i4"),
    }


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_big_endian_field_is_served_as_the_same_numbers(backend):
    data = _big_endian()
    source = loaders.make(backend, dataset=data, batch_size=8, shuffle=False)
    batches = list(source.iter_epoch(0))
    x = np.concatenate([b["x"] for b in batches])
    label = np.concatenate([b["label"] for b in batches])
    assert x.dtype == np.float32 and x.dtype.isnative and label.dtype == np.int32
    np.testing.assert_array_equal(x, data["x"])  # compares values, not bytes
    np.testing.assert_array_equal(label, data["label"])
    assert label[1] == 1 and x[0, 1] == 0.25  # not 16777216, not 4.6e-41


def test_a_big_endian_file_read_in_place_is_refused_by_name(tmp_path):
    np.save(tmp_path / "x.npy", np.arange(12, dtype=">f4").reshape(4, 3))
    np.save(tmp_path / "label.npy", np.arange(4, dtype="<i4"))
    with pytest.raises(ValueError, match=r"field 'x' is stored as >f4.*x\.npy.*astype\('<f4'\)"):
        loaders.load_dataset(tmp_path)


def test_the_feed_names_a_field_jax_cannot_place():
    batches = [{"x": np.ones((8, 2), ">f4"), "y": np.arange(8, dtype=np.int32)}] * 2
    with (
        pytest.raises(TypeError, match=r"batch field 'x' is >f4.*astype\('<f4'\)"),
        jaxfeed.DeviceFeed(jaxfeed.wrap(batches)) as feed,
    ):
        next(iter(feed))
