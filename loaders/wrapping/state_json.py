"""A wrapped stream's framework state as JSON values, for checkpoints, and back."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np


def encode(value: Any, kind: str = "stream") -> Any:
    """A framework's state as JSON values: bytes, arrays and tensors base64,
    tuples and dicts with non-string keys tagged, numpy scalars as Python's.

    Raises:
      TypeError: a value JSON cannot hold, naming its type.
    """
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, bytes | bytearray):
        return {"__bytes__": base64.b64encode(bytes(value)).decode("ascii")}
    if type(value).__module__.partition(".")[0] == "torch" and hasattr(value, "numpy"):
        return {"__tensor__": encode(value.detach().cpu().numpy(), kind)["__ndarray__"]}
    if isinstance(value, np.ndarray):
        data = base64.b64encode(np.ascontiguousarray(value).tobytes()).decode("ascii")
        return {"__ndarray__": {"data": data, "dtype": value.dtype.str, "shape": value.shape}}
    if isinstance(value, list):
        return [encode(v, kind) for v in value]
    if isinstance(value, tuple):
        return {"__tuple__": [encode(v, kind) for v in value]}
    if isinstance(value, dict):
        if all(isinstance(k, str) and not k.startswith("__") for k in value):
            return {k: encode(v, kind) for k, v in value.items()}
        return {"__dict__": [[encode(k, kind), encode(v, kind)] for k, v in value.items()]}
    raise TypeError(
        f"the wrapped {kind}'s state holds a {type(value).__module__}.{type(value).__name__}, "
        f"which a checkpoint cannot store as JSON"
    )


def decode(value: Any) -> Any:
    """The inverse of `encode`."""
    if isinstance(value, list):
        return [decode(v) for v in value]
    if not isinstance(value, dict):
        return value
    if "__bytes__" in value:
        return base64.b64decode(value["__bytes__"])
    if "__ndarray__" in value or "__tensor__" in value:
        spec = value.get("__ndarray__") or value["__tensor__"]
        array = np.frombuffer(base64.b64decode(spec["data"]), np.dtype(spec["dtype"]))
        array = array.reshape(spec["shape"]).copy()
        if "__tensor__" in value:
            import torch  # a torch state: torch is the user's

            return torch.from_numpy(array)
        return array
    if "__tuple__" in value:
        return tuple(decode(v) for v in value["__tuple__"])
    if "__dict__" in value:
        return {decode(k): decode(v) for k, v in value["__dict__"]}
    return {k: decode(v) for k, v in value.items()}
