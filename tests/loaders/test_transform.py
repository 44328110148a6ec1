"""Encoded bytes fields and per-record transforms, on every backend.

The promise: one ``transform(record, rng)`` with ``rng`` seeded from
``(seed, epoch, row)`` gives byte-identical batches on the five backends,
with and without worker processes, from any ``start``, on any process
count, and a new draw every epoch; a transform that fails names the row.
"""

import subprocess
import sys

import numpy as np
import pytest
from backend_helpers import assert_same_batches
from jaxfeed.loaders import ArrayDataset
from jaxfeed.loaders.bytes_field import BytesField
from jaxfeed.loaders.transform import TransformError
from transform_helpers import (
    decode_png_size,
    encoded_digits,
    fail_on_row_7,
    first_bytes,
    random_augment,
    shape_changes_on_row_5,
)

from jaxfeed import loaders

BACKENDS = ["numpy", "torch", "tf", "grain", "hf"]


def _epoch(source, epoch: int = 0, start: int = 0) -> list[dict]:
    batches = list(source.iter_epoch(epoch, start=start))
    if hasattr(source, "close"):
        source.close()  # worker processes stop now, not at garbage collection
    return batches


@pytest.fixture(scope="module")
def digits() -> ArrayDataset:
    return encoded_digits(96)


@pytest.fixture(scope="module")
def reference(digits) -> list[dict]:
    """Epoch 1 from batch 2, numpy in this process: what every backend must give."""
    source = loaders.make("numpy", dataset=digits, batch_size=20, seed=5, transform=random_augment)
    return _epoch(source, 1, start=2)


# --- bytes fields ---------------------------------------------------------------


def test_bytes_field_keeps_every_byte_and_gathers_rows():
    rows = [b"", b"\x00", b"ab\x00\x00", b"\x89PNG\r\n", bytes(range(256))]
    field = BytesField.from_values(rows)
    assert len(field) == 5 and field.shape == (5,) and field.dtype == object
    assert [field[i] for i in range(5)] == rows  # trailing zero bytes kept
    assert field[-1] == rows[-1]
    assert list(field[np.array([3, 0, 3])]) == [rows[3], rows[0], rows[3]]
    assert list(field[1:3][np.arange(2)]) == rows[1:3]
    with pytest.raises(IndexError, match="outside"):
        field[5]


def test_a_dataset_takes_bytes_as_a_list_an_object_array_or_a_field():
    blobs = [b"x" * i for i in range(4)]
    for value in (blobs, np.array(blobs, dtype=object), BytesField.from_values(blobs)):
        ds = ArrayDataset("b/train", {"blob": value, "y": np.arange(4)})
        assert ds.bytes_fields() == ["blob"] and ds["blob"][3] == b"xxx"
    with pytest.raises(ValueError, match=r"field 'blob'.*row 2 is str"):
        ArrayDataset("b/train", {"blob": [b"a", b"b", "c"], "y": np.arange(3)})
    with pytest.raises(ValueError, match="numbers, bools or encoded bytes"):
        ArrayDataset("b/train", {"text": np.array(["a", "b"]), "y": np.arange(2)})


def test_a_bytes_field_without_a_transform_is_refused_by_name():
    data = {"blob": [b"ab", b"c"] * 10, "y": np.arange(20)}
    with pytest.raises(ValueError, match=r"\['blob'\] hold encoded bytes.*transform=fn"):
        loaders.make("numpy", dataset=data, batch_size=4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bytes_fields_reach_the_transform_intact_on_every_backend(backend):
    rng = np.random.default_rng(1)
    blobs = [rng.integers(0, 256, rng.integers(0, 17), dtype=np.uint8).tobytes() for _ in range(50)]
    blobs[3] = b"\x01\x00\x00"  # trailing zero bytes survive every store
    data = ArrayDataset("blobs/train", {"blob": blobs, "y": np.arange(50)})
    got = _epoch(loaders.make(backend, dataset=data, batch_size=8, transform=first_bytes))
    want = _epoch(loaders.make("numpy", dataset=data, batch_size=8, transform=first_bytes))
    assert_same_batches(got, want)
    rows = {int(y): (b, int(n)) for batch in got for b, n, y, m in zip(
        batch["bytes"], batch["size"], batch["y"], batch["mask"], strict=True) if m}  # fmt: skip
    assert sorted(rows) == list(range(50))
    for y, (padded, size) in rows.items():
        assert padded[:size].tobytes() == blobs[y] and size == len(blobs[y])


# --- one augmentation, every backend -----------------------------------------------


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_random_transform_is_byte_identical_on_every_backend(backend, workers, digits, reference):
    source = loaders.make(backend, dataset=digits, batch_size=20, seed=5,
                          transform=random_augment, num_workers=workers)  # fmt: skip
    assert source.element_spec["image"] == loaders.ArraySpec((20, 56, 56, 3), np.dtype("float32"))
    assert_same_batches(_epoch(source, 1, start=2), reference)


def _by_row(batches: list[dict]) -> dict[int, tuple[bytes, bytes]]:
    """Each real row's (image, noise) bytes, keyed by its row number."""
    return {
        int(row): (image.tobytes(), noise.tobytes())
        for b in batches
        for row, image, noise, real in zip(b["row"], b["image"], b["noise"], b["mask"], strict=True)
        if real
    }


def test_the_augmentation_is_new_every_epoch_and_belongs_to_the_row(digits):
    def epoch(epoch, batch_size):
        return _by_row(_epoch(loaders.make("numpy", dataset=digits, batch_size=batch_size,
                                           seed=5, transform=random_augment), epoch))  # fmt: skip

    first, second = epoch(0, 20), epoch(1, 20)
    assert sorted(first) == sorted(second) == list(range(96))
    assert all(first[r][1] != second[r][1] for r in first), "a row drew the same numbers twice"
    changed = sum(first[r][0] != second[r][0] for r in first)
    assert changed >= 90, f"only {changed} of 96 images were augmented differently"
    # The draw belongs to (seed, epoch, row): another batch size gives the same rows.
    assert epoch(1, 7) == second


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_processes_together_read_the_single_process_batch(backend, digits):
    def make(index, count, batch):
        return loaders.make(backend, dataset=digits, batch_size=batch, seed=2,
                            transform=random_augment, process_index=index,
                            process_count=count)  # fmt: skip

    whole = _epoch(make(0, 1, 32), 1)
    halves = [_epoch(make(i, 2, 16), 1) for i in range(2)]
    for step, batch in enumerate(whole):
        for key in batch:
            joined = np.concatenate([halves[0][step][key], halves[1][step][key]])
            np.testing.assert_array_equal(joined, batch[key], err_msg=f"{key} batch {step}")


# --- what a transform may not do -----------------------------------------------------


@pytest.mark.parametrize(("backend", "workers"), [(b, 0) for b in BACKENDS] + [
    ("numpy", 1), ("torch", 1), ("grain", 1), ("tf", 2), ("hf", 1)])  # fmt: skip
def test_a_failing_transform_names_the_row_even_from_a_worker(backend, workers):
    data = {"label_row": np.arange(40), "other": np.zeros(40)}
    source = loaders.make(backend, dataset=data, batch_size=10, shuffle=False,
                          transform=fail_on_row_7, num_workers=workers)  # fmt: skip
    with pytest.raises(Exception, match=r"transform failed on row 7 \(epoch 0\).*KeyError"):
        _epoch(source)


def test_a_record_of_another_shape_is_refused_by_row_and_field():
    data = {"label_row": np.arange(12)}
    source = loaders.make("numpy", dataset=data, batch_size=4, shuffle=False,
                          transform=shape_changes_on_row_5)  # fmt: skip
    with pytest.raises(
        TransformError, match=r"field 'x' of shape \(3,\) for row 5.*\(2,\) for row"
    ):
        _epoch(source)


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        (lambda r, rng: [1, 2], "returned list for row 0"),
        (lambda r, rng: {"s": "text"}, r"field 's' of kind 'U'"),
        (lambda r, rng: {"mask": 1}, "'mask' is reserved"),
        (lambda r, rng: 1 / 0, r"failed on row 0 \(epoch 0\): ZeroDivisionError"),
    ],
)
def test_a_bad_first_record_is_refused_when_the_source_is_made(fn, message):
    with pytest.raises(TransformError, match=message):
        loaders.make("numpy", dataset={"x": np.arange(8)}, batch_size=4, transform=fn)


@pytest.mark.parametrize("backend", ["numpy", "torch", "tf", "hf"])
def test_a_transform_workers_cannot_receive_is_refused_at_once(backend):
    with pytest.raises(TypeError, match="define it at the top level of a module"):
        loaders.make(backend, dataset={"x": np.arange(8)}, batch_size=4,
                     transform=lambda r, rng: {"x": r["x"]}, num_workers=1)  # fmt: skip


def test_grain_workers_take_a_lambda_by_value():
    source = loaders.make("grain", dataset={"x": np.arange(8.0)}, batch_size=4, num_workers=1,
                          shuffle=False,
                          transform=lambda r, rng: {"x": r["x"] * 2})  # fmt: skip
    assert _epoch(source)[1]["x"].tolist() == [8.0, 10.0, 12.0, 14.0]


def test_a_notebooks_function_is_refused_for_spawned_workers(tmp_path):
    # python -c has a __main__ without a file, as a notebook kernel does.
    code = (
        "import numpy as np\n"
        "from jaxfeed import loaders\n"
        "def f(record, rng): return {'x': record['x']}\n"
        "try:\n"
        "    loaders.make('numpy', dataset={'x': np.arange(8)}, batch_size=4,\n"
        "                 transform=f, num_workers=1)\n"
        "except TypeError as err: print(err)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout  # fmt: skip
    assert "is defined in an interactive __main__" in out and "a .py file" in out, out


@pytest.mark.parametrize("backend", ["numpy", "tf", "hf"])
def test_workers_without_a_transform_are_refused(backend):
    with pytest.raises(ValueError, match="workers run a transform, and there is none"):
        loaders.make(backend, dataset={"x": np.arange(8)}, batch_size=4, num_workers=2)


def test_a_transform_with_a_native_order_is_refused():
    with pytest.raises(ValueError, match="transform runs in the shared sampler's order"):
        loaders.make("torch", dataset={"x": np.arange(8)}, batch_size=4, order="native",
                     transform=lambda r, rng: {"x": r["x"]})  # fmt: skip


def test_digits_png_is_real_encoded_digits_with_its_augmentation():
    source = loaders.make("numpy", dataset="digits-png", split="test", batch_size=50,
                          shuffle=False)  # fmt: skip
    assert source.dataset.bytes_fields() == ["png"]
    assert source.dataset["png"][0][:8] == b"\x89PNG\r\n\x1a\n"
    batch = next(source.iter_epoch(0))
    assert batch["image"].shape == (50, 56, 56, 3) and batch["image"].dtype == np.float32
    assert abs(float(batch["image"].mean())) < 1.0 and batch["image"].std() > 0.3
    sizes = loaders.make("numpy", dataset="digits-png", split="test", batch_size=50,
                         transform=decode_png_size)  # fmt: skip
    assert set(next(sizes.iter_epoch(0))["side"].tolist()) == {64}
