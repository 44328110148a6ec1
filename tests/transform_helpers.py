"""Per-record transforms for the tests, at module level so worker processes
(spawned, so they import this module by name) can run them."""

import io

import numpy as np
from jaxfeed.loaders import ArrayDataset
from jaxfeed.loaders.data.encoded import augment, encode_png, tinted_rgb


def encoded_digits(n: int = 96) -> ArrayDataset:
    """``n`` real digits as 64x64 RGB PNG bytes, with their labels and row numbers."""
    from conftest import sample_digits  # here: workers import this module too

    images, labels = sample_digits()
    png = encode_png(tinted_rgb(images[:n]))
    fields = {"png": png, "label": labels[:n].astype(np.int32), "row": np.arange(n)}
    return ArrayDataset("encoded/train", fields)


def random_augment(record: dict, rng: np.random.Generator) -> dict:
    """The digits-png augmentation (decode, random crop, flip, normalise) plus
    two random numbers, so every row's draw shows in the batch; its row number."""
    out = augment(record, rng)
    out["row"] = record["row"]
    out["noise"] = rng.standard_normal(2).astype(np.float32)
    return out


def fail_on_row_7(record: dict, rng: np.random.Generator) -> dict:
    if int(record["label_row"]) == 7:
        raise KeyError("no such thing")
    return {"x": np.float32(record["label_row"])}


def shape_changes_on_row_5(record: dict, rng: np.random.Generator) -> dict:
    size = 3 if int(record["label_row"]) == 5 else 2
    return {"x": np.zeros(size, np.float32)}


def first_bytes(record: dict, rng: np.random.Generator) -> dict:
    """Every byte of a variable-length record, zero-padded to 16, and its length."""
    raw = np.frombuffer(record["blob"], np.uint8)
    out = np.zeros(16, np.uint8)
    out[: len(raw)] = raw
    return {"bytes": out, "size": np.int32(len(raw)), "y": record["y"]}


def decode_png_size(record: dict, rng: np.random.Generator) -> dict:
    from PIL import Image

    return {"side": np.int32(Image.open(io.BytesIO(record["png"])).size[0])}


def torch_augment(record: dict, rng: np.random.Generator) -> dict:
    """torchvision-style augmentation written with torch ops, drawing from
    `torch_generator`: a random crop, a flip, noise, and one draw of ``rng``'s."""
    import torch
    from jaxfeed.loaders.transform import torch_generator

    g = torch_generator(rng)
    image = torch.from_numpy(np.asarray(record["image"], np.float32))
    top, left = torch.randint(0, 3, (2,), generator=g).tolist()
    image = image[top : top + 6, left : left + 6]
    if torch.rand((), generator=g) < 0.5:
        image = image.flip(1)
    image = image + 0.1 * torch.randn(image.shape, generator=g)
    return {"image": image.numpy(), "row": record["row"], "after": np.float32(rng.random())}


def augment_image(record: dict, rng: np.random.Generator) -> dict:
    """The digits-png augmentation of a record read from files (an ``image``
    field of PNG bytes, a ``label``), plus two random numbers."""
    out = augment({"png": record["image"], "label": record["label"]}, rng)
    out["noise"] = rng.standard_normal(2).astype(np.float32)
    return out


def augment_where_it_runs(record: dict, rng: np.random.Generator) -> dict:
    """`random_augment`, and the process that ran it."""
    import os

    return {**random_augment(record, rng), "pid": np.int64(os.getpid())}


def noise_where_it_runs(record: dict, rng: np.random.Generator) -> dict:
    """The row number, three random numbers and the process that drew them:
    a second transform, unlike `augment_where_it_runs`, for two loaders at once."""
    import os

    return {"row": record["row"], "noise": rng.standard_normal(3), "pid": np.int64(os.getpid())}
