"""A transform that draws from anything but its ``rng`` is told so when the
source is made: its batches would differ between backends, runs and resumes."""

import random
import warnings

import numpy as np
import pytest
from jaxfeed.loaders.transform import TransformRandomnessWarning

from jaxfeed import loaders

DATA = {"x": np.arange(40, dtype=np.float32)[:, None], "label": np.zeros(40, np.int32)}


def _numpy_global(record, rng):
    return {"x": record["x"] + np.random.random(), "label": record["label"]}


def _python_random(record, rng):
    return {"x": record["x"] + random.random(), "label": record["label"]}


def _fresh_entropy(record, rng):
    return {"x": record["x"] + np.random.default_rng().random(), "label": record["label"]}


def _torch_global(record, rng):
    import torch

    return {"x": record["x"] + torch.rand(1).numpy(), "label": record["label"]}


def _from_its_rng(record, rng):
    return {"x": record["x"] + rng.random(), "label": record["label"]}


@pytest.mark.parametrize(
    ("fn", "said"),
    [
        (_numpy_global, "drew from numpy's global np.random"),
        (_python_random, "drew from Python's random module"),
        (_fresh_entropy, r"two calls on row 0 with the same rng gave different \['x'\]"),
        (_torch_global, "drew from torch's global generator"),
    ],
)
@pytest.mark.parametrize("backend", ["numpy", "grain"])
def test_a_transform_drawing_from_a_global_generator_is_warned_of(backend, fn, said):
    import torch  # noqa: F401  (torch's generator is watched once torch is imported)

    with pytest.warns(TransformRandomnessWarning, match=said):
        loaders.make(backend, dataset=DATA, batch_size=8, transform=fn)


def test_a_transform_of_record_and_rng_alone_is_not_warned_of():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaders.make("numpy", dataset=DATA, batch_size=8, transform=_from_its_rng)
