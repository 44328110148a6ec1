"""`jaxfeed.keras_data`: Keras 3 on the JAX backend trains on a BatchSource as on tf.data.

Keras picks its backend when it is imported, and this process may hold it on
another already, so whatever runs Keras runs in ``tests/keras_worker.py``, in
a process of its own (one run, read by several tests). The refusals come
before Keras is imported, so they run here.
"""

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import jaxfeed
from jaxfeed.compare.workloads.copy.fresh import child_env

WORKER = Path(__file__).resolve().parents[1] / "keras_worker.py"
TRAIN_BATCHES, TEST_BATCHES = 32, 8  # mnist-sample at batch 128: 4,000 and 1,000 rows


@pytest.fixture(scope="module")
def keras_run(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("keras") / "result.json"
    done = subprocess.run(
        [sys.executable, str(WORKER), str(out)],
        env=child_env(),  # KERAS_BACKEND=jax, one CPU device as Keras uses
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.slow
def test_fit_trains_exactly_as_on_tf_data_over_the_same_rows(keras_run):
    """Same weights, same rows in the same order: the padded last batch (weighted
    out) trains as tf.data's short one, epoch after epoch, with fit's default
    shuffle=True; so the masked metrics are tf.data's."""
    run = keras_run["native"]
    # Any batch out of order, repeated, or counted with its padding moves weights by ~1e-2.
    assert run["weight_gap"] < 1e-5 * run["weight_scale"], run["weight_gap"]
    assert run["drop_gap"] < 1e-5 * run["weight_scale"], run["drop_gap"]
    native, weight, drop = run["tf_data"], run["weight"], run["drop"]
    for key in ("accuracy", "crossentropy", "val_accuracy", "val_crossentropy"):
        assert len(weight[key]) == 2
        assert weight[key] == pytest.approx(native[key], abs=1e-3), key
    for key in ("loss", "val_loss"):  # weight's is Keras's per-batch mean (docs/keras.md)
        assert drop[key] == pytest.approx(native[key], abs=1e-3), key
    # Keras's default compile (build_model's) names its accuracy metric so.
    for key in ("accuracy", "val_accuracy"):
        name = key.replace("accuracy", "sparse_categorical_accuracy")
        assert drop[name] == pytest.approx(native[key], abs=1e-3), name


@pytest.mark.slow
def test_padding_rows_count_in_no_weighted_metric(keras_run):
    """The padding rows are real digits with wrong labels: counted, they would cost
    accuracy. Evaluated through keras_data, the result is exactly the real rows'."""
    run = keras_run["padding"]
    real, every = run["real_rows"], run["every_row"]
    assert every["accuracy"] < real["accuracy"] - 0.01  # the garbage would show
    for name in ("weight", "wrapped_tf_data"):
        for key in ("accuracy", "crossentropy"):
            assert run[name][key] == pytest.approx(real[key], abs=1e-6), (name, key)
    assert run["drop"] == pytest.approx(real, abs=1e-6)  # the loss entry too
    # Documented: Keras's plain `metrics` ignore sample weights (use weighted_metrics).
    assert run["plain_metrics"]["accuracy"] == pytest.approx(
        run["plain_metrics_every_row"]["accuracy"]
    )


@pytest.mark.slow
def test_each_pass_reads_the_next_epoch_once_in_order(keras_run):
    run = keras_run["passes"]
    assert run["num_batches"] == [TRAIN_BATCHES, TEST_BATCHES]

    def epochs(*numbers: int, batches: int) -> list[list[int]]:
        return [[e, i] for e in numbers for i in range(batches)]

    # A new model: the batch Keras looked at before epoch 0 is served again, not re-read.
    assert run["fit"] == epochs(0, 1, batches=TRAIN_BATCHES)
    assert run["fit_reading_ahead"] == epochs(0, 1, batches=TRAIN_BATCHES)  # it looked at 2
    assert run["validation"] == epochs(0, 1, batches=TEST_BATCHES)
    assert run["steps_per_epoch"] == epochs(5, 6, batches=3)  # keras_data(..., epoch=5)
    assert run["evaluate"] == epochs(7, batches=TEST_BATCHES)
    assert run["predict"] == epochs(0, batches=TEST_BATCHES)
    assert run["predicted_rows"] == TEST_BATCHES * 128  # padding rows predicted too


@pytest.mark.slow
def test_batches_are_the_fields_chosen(keras_run):
    images, labels = ["uint8", [128, 28, 28, 1]], ["int32", [128]]
    weights = ["float32", [128]]
    assert keras_run["passes"]["shapes"] == {
        "padded": [images, labels, weights],
        "dropped": [images, labels],  # drop_remainder: no mask, no weights
        "x_only": [images],
        "several": [[images, labels], {"out": labels}, weights],
    }


@pytest.mark.slow
def test_plain_metrics_on_padded_batches_are_warned_about_by_name(keras_run):
    """Plain `metrics` count the padding rows (issue 30, item 6): the first padded
    batch a model so compiled reads names them and the fix; weighted ones pass."""
    said = keras_run["warnings"]
    assert said["weighted_metrics"] == []
    assert len(said["metrics"]) == 1, said
    expected = (
        r"model '\w+' was compiled with metrics=\['accuracy'\], which Keras computes without "
        r"sample weights, so the 24 padding rows of this batch count in them .* compile them "
        r"as weighted_metrics=\['accuracy'\] instead, or pass keras_data\(..., padding='drop'\)"
    )
    assert re.search(expected, said["metrics"][0]), said["metrics"][0]


@pytest.mark.slow
def test_epoch_1_trains_as_plain_keras_fit_on_the_tf_data_pipeline(keras_run):
    """Plain Keras looks at a new model's data through a first iterator of the
    dataset, so its first epoch trains on tf.data's second shuffle order; keras_data's
    epoch=1 is that order (issue 30, item 7, docs/keras.md)."""
    gaps = keras_run["tf_order"]
    assert gaps["epoch=1"] < 1e-6, gaps
    assert gaps["epoch=0"] > 1e-5, gaps  # the first order: other batches, other weights


@pytest.mark.slow
def test_a_grain_image_folder_from_keras_needs_no_steps_per_epoch(keras_run):
    """image_dataset_from_directory(format="grain") is a MapDataset made a
    batched IterDataset: wrap counts its batches (issue 30, item 8)."""
    run = keras_run["grain_folder"]
    assert run["num_batches"] == 3  # 10 images in batches of 4
    assert run["fit"] == [[0, 0], [0, 1], [0, 2]]


@pytest.fixture(scope="module")
def source() -> jaxfeed.BatchSource:
    return jaxfeed.make("numpy", dataset="mnist-sample", batch_size=64)


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        (
            dict(x="pixels"),
            ValueError,
            r"x names 'pixels', which the source lacks; its fields: \['image', 'label'\]",
        ),
        (dict(x="image", y="mask"), ValueError, r"y names 'mask', which marks padding rows"),
        (dict(x=3), TypeError, r"x must be a field name, a tuple or list of names, or a dict"),
        (dict(x=[]), TypeError, r"x must be a field name.*got \[\]"),
        (dict(x="image", y={"out": "lbl"}), ValueError, r"y names 'lbl', which the source lacks"),
        (
            dict(x="image", padding="trim"),
            ValueError,
            r"padding must be one of \('weight', 'drop'\), got 'trim'",
        ),
        (dict(x="image", epoch=-1), ValueError, r"epoch must be an int in \[0, 4294967295\]"),
    ],
)
def test_bad_arguments_are_refused_before_keras_is_imported(source, options, error, match):
    with pytest.raises(error, match=match):
        jaxfeed.keras_data(source, **options)


def test_a_feed_a_list_and_a_stream_of_unknown_length_are_refused(source):
    import jax

    feed = jaxfeed.DeviceFeed(source, jaxfeed.data_mesh(jax.devices()[:1]))
    with pytest.raises(TypeError, match=r"got a DeviceFeed.*Pass the feed's BatchSource"):
        jaxfeed.keras_data(feed, x="image", y="label")
    feed.close()
    with pytest.raises(TypeError, match=r"takes a BatchSource .* got list; wrap a loader"):
        jaxfeed.keras_data([], x="image")
    batches = [{"image": np.zeros((4, 2), np.float32), "label": np.zeros(4, np.int32)}]
    stream = jaxfeed.wrap(lambda: iter(batches))
    with pytest.raises(ValueError, match=r"num_batches is None.*wrap\(obj, steps_per_epoch=N\)"):
        jaxfeed.keras_data(stream, x="image", y="label")


def test_keras_on_another_backend_is_refused():
    code = (
        "import jaxfeed; "
        "s = jaxfeed.make('numpy', dataset='mnist-sample', batch_size=64); "
        "jaxfeed.keras_data(s, x='image', y='label')"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=child_env() | {"KERAS_BACKEND": "numpy"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    expected = "ValueError: Keras runs on the 'numpy' backend here, not 'jax': set KERAS_BACKEND"
    assert expected in done.stderr


@pytest.mark.slow
def test_keras_splits_the_batches_over_devices_itself():
    """keras.distribution.DataParallel places each batch of keras_data over 2 devices."""
    code = """
import jax, keras
import jaxfeed
from jaxfeed.compare.workloads.copy.keras_fit import build_model

keras.distribution.set_distribution(keras.distribution.DataParallel(devices=jax.devices()))
source = jaxfeed.make("numpy", dataset="mnist-sample", batch_size=128)
model = build_model(keras, 0, metrics=[], weighted_metrics=["accuracy"])
history = model.fit(jaxfeed.keras_data(source, x="image", y="label"), epochs=2, verbose=0)
print(len(jax.devices()), history.history["accuracy"][-1])
"""
    env = child_env()
    env["XLA_FLAGS"] = f"{env['XLA_FLAGS']} --xla_force_host_platform_device_count=2"
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    devices, accuracy = done.stdout.split()
    assert devices == "2" and float(accuracy) > 0.8
