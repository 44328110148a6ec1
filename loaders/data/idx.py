"""Strict reader and writer for the IDX format used by the MNIST files.

An IDX file is two zero bytes, a dtype code byte, a dimension-count byte, one
big-endian uint32 per dimension, then the array in C order (big-endian for
multi-byte dtypes). Files may be gzip-compressed; gzip is recognised by its
magic bytes, never by the file name, because renamed downloads are common.
"""

from __future__ import annotations

import gzip
import math
import os
import zlib
from pathlib import Path

import numpy as np

__all__ = ["read_idx", "write_idx"]

_GZIP_MAGIC = b"\x1f\x8b"
_MAX_DIMS = 4  # MNIST-style data never needs more; a larger count means garbage.

# IDX dtype code -> big-endian numpy dtype.
_CODE_TO_DTYPE: dict[int, np.dtype] = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_DTYPE_TO_CODE: dict[np.dtype, int] = {
    dtype.newbyteorder("="): code for code, dtype in _CODE_TO_DTYPE.items()
}
_REDOWNLOAD = "delete it and download it again"


def _read_bytes(path: Path) -> bytes:
    """Returns the file's content, decompressed when it starts with the gzip magic."""
    data = path.read_bytes()
    if not data.startswith(_GZIP_MAGIC):
        return data
    try:
        return gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as err:
        raise ValueError(
            f"{path}: corrupt gzip data ({type(err).__name__}: {err}); the file is "
            f"damaged or incomplete, {_REDOWNLOAD}"
        ) from err


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Reads an IDX file (raw or gzip) into a numpy array in native byte order.

    Args:
      path: the IDX file, e.g. ``t10k-images-idx3-ubyte.gz``.

    Returns:
      A new, writable array with the file's shape and dtype (uint8, int8,
      int16, int32, float32 or float64).

    Raises:
      FileNotFoundError: the file does not exist.
      ValueError: the file is not a valid IDX file (bad magic, unknown dtype
        code, bad dimension count, truncated or oversized payload, corrupt
        gzip); the message names the file and what is wrong.

    Example:
      >>> images = read_idx("t10k-images-idx3-ubyte.gz")  # doctest: +SKIP
      >>> images.shape, images.dtype
      ((10000, 28, 28), dtype('uint8'))
    """
    path = Path(path)
    data = _read_bytes(path)
    if len(data) < 4:
        raise ValueError(
            f"{path}: file has {len(data)} bytes, expected at least a 4-byte IDX "
            f"header; it is empty or truncated, {_REDOWNLOAD}"
        )
    if data[0:2] != b"\x00\x00":
        raise ValueError(
            f"{path}: bad magic {data[0:2].hex(' ')}, expected 00 00; this is not an "
            f"IDX file (or it is damaged), {_REDOWNLOAD}"
        )
    code, ndim = data[2], data[3]
    if code not in _CODE_TO_DTYPE:
        known = ", ".join(f"0x{c:02X} ({d.name})" for d, c in _DTYPE_TO_CODE.items())
        raise ValueError(
            f"{path}: unknown IDX dtype code 0x{code:02X}, expected one of {known}; "
            f"the file is damaged or not IDX, {_REDOWNLOAD}"
        )
    if not 1 <= ndim <= _MAX_DIMS:
        raise ValueError(
            f"{path}: header says {ndim} dimensions, expected 1 to {_MAX_DIMS}; the "
            f"file is damaged or not IDX, {_REDOWNLOAD}"
        )
    header_len = 4 + 4 * ndim
    if len(data) < header_len:
        raise ValueError(
            f"{path}: file has {len(data)} bytes, expected a {header_len}-byte header "
            f"for {ndim} dimensions; the file is truncated, {_REDOWNLOAD}"
        )
    shape = tuple(int(d) for d in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    dtype = _CODE_TO_DTYPE[code]
    expected = math.prod(shape) * dtype.itemsize
    got = len(data) - header_len
    if got != expected:
        problem = (
            "the file is truncated"
            if got < expected
            else (f"the file has {got - expected} bytes of trailing data")
        )
        raise ValueError(
            f"{path}: payload has {got} bytes, expected {expected} for shape {shape} "
            f"{dtype.newbyteorder('=').name}; {problem}, {_REDOWNLOAD}"
        )
    array = np.frombuffer(data, dtype=dtype, offset=header_len).reshape(shape)
    # astype copies: the result owns writable memory in native byte order.
    return array.astype(dtype.newbyteorder("="))


def write_idx(path: str | os.PathLike, array: np.ndarray) -> Path:
    """Writes an array as an IDX file; gzip-compressed iff the name ends in ``.gz``.

    Args:
      path: destination file.
      array: 1 to 4 dimensions of uint8, int8, int16, int32, float32 or float64.

    Returns:
      The path written.

    Raises:
      TypeError: the array's dtype has no IDX code.
      ValueError: the array has 0 or more than 4 dimensions.
    """
    path = Path(path)
    array = np.asarray(array)
    native = array.dtype.newbyteorder("=")
    if native not in _DTYPE_TO_CODE:
        names = ", ".join(d.name for d in _DTYPE_TO_CODE)
        raise TypeError(
            f"write_idx({path}): dtype {array.dtype} has no IDX code, expected one of "
            f"{names}; convert with array.astype(...) first"
        )
    if not 1 <= array.ndim <= _MAX_DIMS:
        raise ValueError(
            f"write_idx({path}): array has {array.ndim} dimensions (shape {array.shape}), "
            f"expected 1 to {_MAX_DIMS}; reshape it first"
        )
    code = _DTYPE_TO_CODE[native]
    header = bytes([0, 0, code, array.ndim]) + np.asarray(array.shape, dtype=">u4").tobytes()
    payload = np.ascontiguousarray(array, dtype=_CODE_TO_DTYPE[code]).tobytes()
    if path.name.endswith(".gz"):
        # mtime=0 keeps the output byte-identical across runs (stable checksums).
        path.write_bytes(gzip.compress(header + payload, mtime=0))
    else:
        path.write_bytes(header + payload)
    return path
