"""TensorFlow's door: TF and TFDS imported quietly, and a tf.data pipeline's
private structure (its inputs, a shuffle's seeds and reshuffling).

Checked against tensorflow 2.21.0 and tensorflow-datasets 4.9.10 (the pins in
``constraints.txt``). TF has no public way to walk a pipeline: its steps are
told apart by their classes' names, and read through private attributes.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
import tempfile
from collections.abc import Iterator
from types import ModuleType
from typing import Any


@contextlib.contextmanager
def quiet_stderr() -> Iterator[None]:
    """Captures everything written to file descriptor 2, from Python and C++
    alike, and replays it only if the block fails.

    TensorFlow's import and device setup print oneDNN notices, absl
    pre-initialisation warnings and ``failed call to cuInit`` lines straight
    to fd 2 (TF 2.21 ignores ``TF_CPP_MIN_LOG_LEVEL`` for some of them). The
    capture is process-wide, so it is kept to those few seconds.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        except BaseException:
            os.dup2(saved, 2)
            captured.seek(0)
            sys.stderr.write(captured.read().decode(errors="replace"))
            raise
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


@functools.cache
def import_tensorflow() -> ModuleType:
    """Imports TensorFlow without its start-up noise, kept off any GPU (JAX owns those)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    with quiet_stderr():
        import tensorflow as tf

        # Raises RuntimeError once TF is initialised; its devices are then fixed.
        with contextlib.suppress(RuntimeError):
            tf.config.set_visible_devices([], "GPU")
    _autograph_files_in_an_owned_directory()
    return tf


def _autograph_files_in_an_owned_directory() -> None:
    """Sends the modules autograph generates to a directory this process owns.

    Autograph writes the code it generates for every function it converts (a
    tf.data map's) to ``$TMPDIR/__autograph_generated_file*.py`` through the
    private module reference ``tensorflow.python.autograph.pyct.loader.tempfile``
    (tensorflow 2.21.0), which is replaced here, and removes them at exit only
    (``atexit``): a killed process left them for good. Here they go to
    ``$TMPDIR/jaxfeed-autograph-*`` (`owner_lock`), removed at exit, and by the
    next run's TF import when this process is killed.
    """
    import atexit
    import shutil
    import types

    from jaxfeed.loaders._io.owner_lock import owned_directory
    from tensorflow.python.autograph.pyct import loader

    directory, _ = owned_directory(tempfile.gettempdir(), AUTOGRAPH_PREFIX)
    loader.tempfile = types.SimpleNamespace(
        NamedTemporaryFile=functools.partial(tempfile.NamedTemporaryFile, dir=directory)
    )
    atexit.register(shutil.rmtree, directory, ignore_errors=True)


AUTOGRAPH_PREFIX = "jaxfeed-autograph-"


@functools.cache
def import_tfds() -> ModuleType:
    """Imports tensorflow_datasets (after TensorFlow, quietly).

    Raises:
      ImportError: tensorflow_datasets failed to import. Its ``__init__``
        logs its own import error (e.g. protobuf's ``VersionError`` from a
        tensorflow-metadata built for another protobuf) and returns a module
        without its API (tfds 4.9.6-4.9.10); that logged error is raised here
        as the cause.
    """
    import_tensorflow()
    records: list[logging.LogRecord] = []
    logged = logging.Handler(logging.ERROR)
    logged.emit = records.append  # its stderr copy stays captured below
    absl_logger = logging.getLogger("absl")
    absl_logger.addHandler(logged)
    try:
        with quiet_stderr():
            import tensorflow_datasets as tfds
    finally:
        absl_logger.removeHandler(logged)
    if not hasattr(tfds, "__all__"):  # its __init__ sets __all__ last, if all went well
        errors = [r.exc_info[1] for r in records if r.exc_info and r.exc_info[1]]
        cause = errors[-1] if errors else None
        sys.modules.pop("tensorflow_datasets", None)  # let a fixed install import again
        raise ImportError(
            "tensorflow_datasets failed to import"
            + (f": {type(cause).__name__}: {str(cause).rstrip('.')}" if cause else "")
            + ". Check that tensorflow, tensorflow-datasets, tensorflow-metadata and"
            " protobuf are versions that work together (constraints.txt pins a tested set)"
        ) from cause
    return tfds


@contextlib.contextmanager
def temporary_files_in(directory: str | os.PathLike) -> Iterator[None]:
    """Python's temporary files and directories go to ``directory`` inside
    the block: tfds 4.9.6-4.9.10 leaves an empty ``tmp*tfds`` directory in
    ``$TMPDIR`` (``DatasetInfo.initialize_from_bucket``'s ``mkdtemp``) for
    every builder made before its data exists, which a store build does.
    Process-wide while it lasts, so kept to the build."""
    os.makedirs(directory, exist_ok=True)
    saved, tempfile.tempdir = tempfile.tempdir, os.fspath(directory)
    try:
        yield
    finally:
        tempfile.tempdir = saved


@contextlib.contextmanager
def no_gcs_lookups(tfds: ModuleType) -> Iterator[None]:
    """tfds makes no network call inside the block: before 4.9.10 (checked on
    4.9.6) a builder made before its data exists asks tfds's public GCS bucket
    for its metadata (and TF prints its failed credential lookups on stderr),
    which a store of jaxfeed's own arrays never needs. tfds 4.9.10 has it off
    already. The switch is tfds's private ``gcs_utils._is_gcs_disabled``,
    put back after the block (a user's own ``tfds.load`` keeps its setting)."""
    gcs_utils = tfds.core.utils.gcs_utils
    saved = getattr(gcs_utils, "_is_gcs_disabled", None)
    if saved is None:  # moved or gone in another tfds: nothing to switch
        yield
        return
    gcs_utils._is_gcs_disabled = True
    try:
        yield
    finally:
        gcs_utils._is_gcs_disabled = saved


# tf.data's (mostly private) class names, by which wrap tells a pipeline's steps apart.
BATCHING = frozenset(
    {  # steps whose elements are batches of their input's
        "_BatchDataset",
        "_PaddedBatchDataset",
        "_ParallelBatchDataset",
        "_DenseToRaggedDataset",
        "_RebatchDataset",
        "_GroupByWindowDataset",  # bucket_by_sequence_length
        "BatchDataset",
        "PaddedBatchDataset",
    }
)
ROWS = frozenset(
    {  # sources (and .unbatch()) whose elements are rows
        "_TensorSliceDataset",
        "_RangeDataset",
        "TFRecordDatasetV2",
        "TextLineDatasetV2",
        "FixedLengthRecordDatasetV2",
        "_UnbatchDataset",
    }
)
NESTED = frozenset(
    {  # one input, but elements from the datasets a function makes of it
        "_FlatMapDataset",
        "_InterleaveDataset",
        "_ParallelInterleaveDataset",
    }
)
PASS_THROUGH = frozenset(
    {  # steps that pass their input's end on at once; any other (batch, prefetch,
        # a parallel map...) may hold a used-up shuffle iterator between two reads
        "_MapDataset",
        "_FilterDataset",
        "_OptionsDataset",
        "_ShardDataset",
        "_TakeDataset",
        "_SkipDataset",
    }
)
REPEAT = "_RepeatDataset"
RANDOM = "_RandomDataset"  # Dataset.random(), and sample_from_datasets' choice of source
MIX = "_DirectedInterleaveDataset"  # sample/choose_from_datasets: inputs[0] picks the source
OPAQUE = "_VariantDataset"  # a dataset known only by its graph (choose_from_datasets' choice)
# Graph ops that draw random numbers, and the positions of their (seed, seed2) inputs.
SEEDED_OPS = {
    "RandomDataset": (0, 1),
    "RandomDatasetV2": (0, 1),
    "ShuffleDataset": (2, 3),
    "ShuffleDatasetV3": (2, 3),
    "ShuffleAndRepeatDataset": (2, 3),
    "ShuffleAndRepeatDatasetV2": (2, 3),
}


def pipeline_inputs(node: Any) -> list[Any]:
    """The datasets a tf.data dataset reads from (private ``_inputs()``; []
    for a source)."""
    return list(node._inputs()) if hasattr(node, "_inputs") else []


def shuffle_seeds(node: Any) -> tuple[Any, Any]:
    """``(seed, seed2)`` of a shuffle dataset, both 0 when unseeded (private
    ``_seed`` / ``_seed2``; ``(None, None)`` for a dataset without them)."""
    return getattr(node, "_seed", None), getattr(node, "_seed2", None)


def reshuffles_each_iteration(node: Any) -> bool:
    """Whether ``node`` is a ``.shuffle()`` (the private class ``_ShuffleDataset``)
    that reshuffles on each iteration (private ``_reshuffle_each_iteration``)."""
    return type(node).__name__ == "_ShuffleDataset" and bool(
        getattr(node, "_reshuffle_each_iteration", 0)
    )


def unseeded_in_graph(dataset: Any) -> bool:
    """Whether a random op of ``dataset``'s graph has no seed (both 0), for a
    dataset whose Python inputs are hidden: choose_from_datasets rewrites its
    choice dataset into an `OPAQUE` one (private ``_as_serialized_graph``)."""
    import tensorflow as tf

    graph = tf.compat.v1.GraphDef.FromString(dataset._as_serialized_graph().numpy())
    nodes = {node.name: node for node in graph.node}

    def constant(name: str) -> int | None:
        node = nodes.get(name.split(":")[0])
        if node is None or node.op != "Const":
            return None
        return int(tf.make_ndarray(node.attr["value"].tensor))

    return any(
        all(constant(node.input[i]) == 0 for i in SEEDED_OPS[node.op])
        for node in graph.node
        if node.op in SEEDED_OPS
    )
