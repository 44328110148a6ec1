"""Training measurements in a fresh Python process, for jaxfeed and for Keras alike.

Keras picks its backend once, at import, and ``import tensorflow`` imports
Keras on the TensorFlow backend: in the parent (which has run tf.data) it
may be too late for JAX. So each Keras ``fit`` runs in a new process with
``KERAS_BACKEND=jax``, and so does each jaxfeed run it is compared with,
under the same conditions: same environment, a fresh interpreter, one
device (Keras's default), the loader object built by the same code
(`jaxfeed.compare.workloads.copy.baselines`) from the same data, batch size and seed.

The parent calls `measure`; the child is ``python -m jaxfeed.compare.workloads.copy.fresh
SPEC OUT``, which writes its figures to the JSON file ``OUT``.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import jaxfeed
from jaxfeed.loaders.protocol import MASK_KEY

SIDES = ("jaxfeed", "keras", "keras-jaxfeed")  # keras-jaxfeed: fit on keras_data(wrap(obj))
# The tutorial loop whose object each framework's wrap and Keras rows reuse.
BARE = {
    "torch": "torch-dataloader",
    "tf": "tf-data",
    "grain": "grain-mapdataset",
    "hf": "hf-iter",
}
TIMEOUT_S = 1800.0  # one training run; a hang becomes an error, not a stuck compare
_ROOT = Path(jaxfeed.__file__).resolve().parents[1]  # where jaxfeed, loaders, sharding live


def spec(
    side: str,
    framework: str,
    *,
    dataset: str,
    data_dir: str | None,
    batch_size: int,
    storage_options: dict[str, Any] | None = None,
    seed: int,
    epochs: int,
    max_batches: int | None,
    steps_per_transfer: int = 1,
) -> dict[str, Any]:
    """What one child measures (JSON-able); checked here, before a process starts."""
    if side not in SIDES:
        raise ValueError(f"side must be one of {SIDES}, got {side!r}")
    if framework not in BARE:
        raise ValueError(f"no user loader for framework {framework!r}; choose one of {list(BARE)}")
    return dict(
        side=side,
        framework=framework,
        dataset=dataset,
        data_dir=data_dir,
        storage_options=storage_options,
        batch_size=batch_size,
        seed=seed,
        epochs=epochs,
        max_batches=max_batches,
        steps_per_transfer=steps_per_transfer,
    )


def child_env() -> dict[str, str]:
    """The parent's environment, with Keras on JAX and jax's own device count."""
    env = dict(os.environ, KERAS_BACKEND="jax")
    # --devices simulates N CPU devices; both sides train on one, as Keras does.
    flags = [f for f in env.get("XLA_FLAGS", "").split() if "device_count" not in f]
    env["XLA_FLAGS"] = " ".join(flags)
    env["PYTHONPATH"] = os.pathsep.join([str(_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return env


def measure(what: dict[str, Any], timeout: float = TIMEOUT_S) -> dict[str, Any]:
    """Runs `spec` ``what`` in a fresh process and returns its figures.

    Raises:
      RuntimeError: the child failed (its last stderr lines are in the
        message) or ran past ``timeout`` seconds.
    """
    name = f"the {what['side']} training measurement on the {what['framework']} loader"
    with tempfile.TemporaryDirectory(prefix="jaxfeed-fresh-") as tmp:
        out = Path(tmp) / "figures.json"
        command = [sys.executable, "-m", __name__, json.dumps(what), str(out)]
        try:
            done = subprocess.run(
                command, env=child_env(), capture_output=True, text=True, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"{name} did not finish in {timeout:g} s; it was stopped") from None
        if done.returncode != 0 or not out.exists():
            tail = "\n".join(done.stderr.strip().splitlines()[-8:])
            raise RuntimeError(
                f"{name} failed in its fresh process (exit {done.returncode}):\n{tail}"
            )
        return json.loads(out.read_text())


def _test_arrays(test: Any) -> tuple[np.ndarray, np.ndarray]:
    """The test split's valid rows, for ``model.evaluate``."""
    batches = list(test.iter_epoch(0))
    kept = [b.get(MASK_KEY, slice(None)) for b in batches]  # no padding rows
    images = np.concatenate([b["image"][k] for b, k in zip(batches, kept, strict=True)])
    labels = np.concatenate([b["label"][k] for b, k in zip(batches, kept, strict=True)])
    return images, labels


def _jaxfeed(loop: Any, test: Any, what: dict[str, Any]) -> dict[str, Any]:
    """``jaxfeed.mnist.train`` on ``loaders.wrap(loop.obj)``, as a user would call it."""
    import jax

    from jaxfeed.compare import training
    from jaxfeed.compare.training import Limited
    from jaxfeed.loaders.protocol import SkipsDataState
    from jaxfeed.mnist.train import TrainConfig, evaluate, train
    from jaxfeed.sharding import data_mesh

    source = loop.wrap(what["batch_size"])
    if isinstance(source, SkipsDataState):  # as train reads it (no checkpoint); Limited hides it
        source = source.without_data_state()
    source = Limited(source, what["max_batches"])
    mesh = data_mesh(jax.devices()[:1])
    k = what["steps_per_transfer"]
    epochs = training.trained_epochs(what["epochs"])
    config = TrainConfig(epochs=epochs, seed=what["seed"], steps_per_transfer=k)
    ends = [time.process_time()]  # CPU time, all threads, at each epoch's end
    # The test split is evaluated once, after training, as Keras's is.
    params, history = train(
        source,
        None,
        config,
        sharding=mesh,
        progress=False,
        on_epoch=lambda metrics: ends.append(time.process_time()),
    )
    for metrics, begin, end in zip(history, ends[:-1], ends[1:], strict=True):
        metrics["cpu_s"] = end - begin
    timed = training.steady(history, what["epochs"])
    return {
        "epoch_s": statistics.median(m["seconds"] for m in timed),
        "epoch_cpu_s": statistics.median(m["cpu_s"] for m in timed),
        "data_wait_fraction": statistics.median(m["data_wait_fraction"] for m in timed),
        "test_accuracy": evaluate(params, test, mesh),
        "history": history,
        "how": f"jaxfeed.mnist.train(loaders.wrap(obj)), steps_per_transfer={k}",
    }


def _keras_source(loop: Any, what: dict[str, Any], rows: int) -> Any:
    """``loaders.wrap(loop.obj)`` for `jaxfeed.keras_data`, as a Keras user would call it."""
    from jaxfeed.compare.training import Limited
    from jaxfeed.loaders.protocol import SkipsDataState

    size = what["batch_size"]
    source = loop.wrap(size)
    if source.num_batches is None:  # a Grain IterDataset: keras_data asks for its length
        source = loop.wrap(size, steps_per_epoch=-(-rows // size))
    if isinstance(source, SkipsDataState):  # as keras_data reads it; Limited would hide it
        source = source.without_data_state()
    return Limited(source, what["max_batches"])


def _run(what: dict[str, Any]) -> dict[str, Any]:
    from jaxfeed import loaders
    from jaxfeed.compare.training import Limited
    from jaxfeed.compare.workloads.copy import baselines, keras_fit

    if what["side"] != "jaxfeed":
        keras_fit.import_keras()  # before a framework imports tensorflow
    storage = what.get("storage_options")
    common = dict(dataset=what["dataset"], data_dir=what["data_dir"], storage_options=storage)
    data = loaders.load_dataset(
        what["dataset"], "train", data_dir=what["data_dir"], storage_options=storage
    )
    size, seed, limit = what["batch_size"], what["seed"], what["max_batches"]
    made = baselines.tutorials([what["framework"]], data["image"], data["label"], size, seed)
    loops = [loop for loop in made if loop.name == BARE[what["framework"]]]
    if not loops:
        raise RuntimeError(f"the {what['framework']} framework is not installed in this Python")
    test_source = loaders.make(
        "numpy", split="test", shuffle=False, batch_size=size, seed=seed, **common
    )
    test = Limited(test_source, limit)
    if what["side"] == "jaxfeed":
        figures = _jaxfeed(loops[0], test, what)
    else:
        bridge = what["side"] == "keras-jaxfeed"  # fit(keras_data(wrap(obj))), not fit(obj)
        source = _keras_source(loops[0], what, len(data)) if bridge else None
        figures = keras_fit.measure(
            loops[0], size, seed, _test_arrays(test), what["epochs"], limit, source
        )
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return figures | {"process_peak_rss_mb": rss / (1 << 20 if sys.platform == "darwin" else 1024)}


def main(argv: list[str]) -> int:
    what, out = json.loads(argv[0]), Path(argv[1])
    figures = _run(spec(**what))  # spec(): a bad field fails here, named
    out.write_text(json.dumps(figures, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
