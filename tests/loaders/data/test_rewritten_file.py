"""A `.npy` file rewritten or replaced under a live source is refused by name
when the next epoch starts, the same on every backend: hf reads an Arrow copy
made when the source was, so it would keep serving the old rows while the
others read the new ones (issue 42)."""

import os

import numpy as np
import pytest

from jaxfeed import loaders

BACKENDS = ["numpy", "torch", "tf", "grain", "hf", "ray"]
_REFUSED = (
    r"dataset '.*', field 'x': .*x\.npy changed after the source was made \({}\ differ\): "
    r"some backends would read its new rows and others keep the old ones"
)


def _dataset(directory):
    directory.mkdir()
    x = np.arange(512 * 8, dtype=np.float32).reshape(512, 8)
    np.save(directory / "x.npy", x)
    np.save(directory / "label.npy", np.arange(512, dtype=np.int32))
    for name in ("x.npy", "label.npy"):  # written long before the run
        os.utime(directory / name, ns=(10**18, 10**18))
    return x


def _epoch(source, epoch):
    return np.concatenate([b["x"][b["mask"]] for b in source.iter_epoch(epoch)])


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_file_rewritten_in_place_between_epochs_is_refused_by_name(tmp_path, backend):
    x = _dataset(tmp_path / "data")
    source = loaders.make(backend, dataset=tmp_path / "data", batch_size=64, shuffle=False)
    assert np.array_equal(_epoch(source, 0), x)
    assert np.array_equal(_epoch(source, 1), x)  # unchanged: read on
    inode = os.stat(tmp_path / "data" / "x.npy").st_ino
    np.save(tmp_path / "data" / "x.npy", -x)  # same shape, other values, in place
    assert os.stat(tmp_path / "data" / "x.npy").st_ino == inode
    with pytest.raises(ValueError, match=_REFUSED.format("mtime_ns")):
        source.iter_epoch(2)
    source.close()


def test_a_file_replaced_by_another_is_refused_and_memory_is_not_checked(tmp_path):
    x = _dataset(tmp_path / "data")
    source = loaders.make("numpy", dataset=tmp_path / "data", batch_size=64)
    in_memory = loaders.make("numpy", dataset={"x": x, "label": np.zeros(512)}, batch_size=64)
    _epoch(source, 0)
    np.save(tmp_path / "new.npy", x)  # the same bytes, as another file moved over it
    os.replace(tmp_path / "new.npy", tmp_path / "data" / "x.npy")
    with pytest.raises(ValueError, match=_REFUSED.format(r"mtime_ns, inode")):
        source.iter_epoch(1)
    x[:] = 0  # an in-memory array is the caller's: no file, nothing to check
    _epoch(in_memory, 1)
