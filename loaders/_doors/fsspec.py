"""fsspec and the stores behind it (s3fs, gcsfs, HTTP, ``huggingface_hub``):
opening a URL, listing objects with their identity, ranged reads, and which
errors are worth a retry. Checked against fsspec and s3fs 2025.3.0 and
2026.9.0, aiobotocore 2.x and 3.x, gcsfs 2026.8.2 and huggingface_hub 2.4.0
(against tests/store_servers.py); public APIs only, except the error
classes read by name below (botocore's, aiohttp's), which live in modules
jaxfeed does not import.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping
from typing import Any

__all__ = [
    "INSTALL",
    "Listed",
    "S3_CONNECTIONS",
    "is_transient",
    "glob_objects",
    "list_members",
    "list_objects",
    "open_store",
    "read_range",
    "url_protocol",
]

INSTALL = {
    "s3": "pip install 'jaxfeed[s3]'",
    "gs": "pip install 'jaxfeed[gcs]'",
    "gcs": "pip install 'jaxfeed[gcs]'",
    "http": "pip install 'jaxfeed[http]'",
    "https": "pip install 'jaxfeed[http]'",
    "hf": "pip install 'jaxfeed[hf]'",
}
"""The stores a dataset URL may name, and the extra that brings each one's client."""

S3_CONNECTIONS = 64
"""s3fs's connections, unless ``storage_options`` set ``config_kwargs``'
``max_pool_connections``: botocore's default of 10 caps the reads in flight
at 10 whatever the read window's depth (up to 64, `ranged_npy.DEPTH_CEILING`).
Measured through a proxy adding 100 ms a request, a full shuffle of 128-byte
rows: 60-62 rows/s and 6.5-6.8 reads in flight with 10, 79-106 rows/s and
10.5-14.4 with 64 (docs/storage.md)."""

_URL = re.compile(r"^([a-z][a-z0-9+.-]*)://")
# Errors a retry can cure, by class name: their modules (botocore, aiohttp,
# urllib3) are the stores' dependencies, not jaxfeed's.
_TRANSIENT_CLASSES = {
    "EndpointConnectionError",
    "ConnectTimeoutError",
    "ReadTimeoutError",
    "ConnectionClosedError",
    "ResponseStreamingError",
    "IncompleteReadError",
    "ServerDisconnectedError",
    "ClientConnectionError",
    "ClientOSError",
    "ClientPayloadError",
    "ContentLengthError",
    "TransferEncodingError",
    "ProtocolError",
}
_TRANSIENT_CODES = {
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "TooManyRequests",
    "RequestLimitExceeded",
    "RequestTimeout",
    "InternalError",
    "ServiceUnavailable",
    "500",
    "502",
    "503",
    "504",
    "429",
}


class Listed(tuple):
    """One object: ``(size, identity)``; identity is the store's version of it
    (an ETag, a GCS generation, a Hub blob id), None where it gives none."""

    __slots__ = ()

    def __new__(cls, size: int, identity: str | None) -> Listed:
        return super().__new__(cls, (size, identity))

    def __getnewargs__(self) -> tuple[int, str | None]:  # pickled into a worker
        return tuple(self)

    @property
    def size(self) -> int:
        return self[0]

    @property
    def identity(self) -> str | None:
        return self[1]


def url_protocol(name: str) -> str | None:
    """The store a dataset URL names (``"s3"``, ``"gs"``, ...), or None when
    ``name`` is not such a URL (a path, a name)."""
    match = _URL.match(name)
    return match[1] if match and match[1] in (*INSTALL, "file") else None


def open_store(url: str, storage_options: Mapping[str, Any]) -> tuple[Any, str]:
    """The fsspec filesystem for ``url`` and the path inside it.

    Raises:
      ImportError: fsspec or the store's client is missing, with the install line.
    """
    protocol = url_protocol(url)
    if protocol == "s3":  # connections for the read window (`S3_CONNECTIONS`)
        config = {
            "max_pool_connections": S3_CONNECTIONS,
            **storage_options.get("config_kwargs", {}),
        }
        storage_options = {**storage_options, "config_kwargs": config}
    try:
        import fsspec

        # A new instance: fsspec's instance cache would keep listings (dircache)
        # across calls, and a check of the objects must see the store as it is.
        return fsspec.core.url_to_fs(url, skip_instance_cache=True, **storage_options)
    except ImportError as error:
        raise ImportError(
            f"reading {protocol}:// URLs needs fsspec and the store's client: "
            f"{INSTALL.get(protocol or '', 'pip install fsspec')} ({error})"
        ) from None


def list_objects(fs: Any, path: str) -> dict[str, Listed]:
    """Every object at or under ``path``: its path relative to ``path`` ("" for
    ``path`` itself, an object) -> `Listed`. Empty when nothing is there."""
    # HfFileSystem answers a find from the listings it keeps: a check must see
    # the store as it is now.
    fs.invalidate_cache()
    found = fs.find(path, detail=True)
    if not found and fs.isfile(path):
        found = {path: fs.info(path)}
    root = path.rstrip("/")
    listed = {}
    for key, info in found.items():
        if info.get("type", "file") != "file":
            continue
        info = _complete(fs, key, info)
        relative = "" if key.rstrip("/") == root else key[len(root) :].lstrip("/")
        listed[relative] = Listed(int(info["size"]), _identity(info))
    return listed


def glob_objects(fs: Any, root: str, pattern: str) -> list[str]:
    """The objects matching ``pattern`` (relative to ``root``), relative to
    ``root``, sorted; empty when none does."""
    root = root.rstrip("/")
    fs.invalidate_cache()  # the store as it is now, not an earlier listing
    found = fs.glob(f"{root}/{pattern}", detail=True)
    return sorted(
        key[len(root) :].lstrip("/")
        for key, info in found.items()
        if info.get("type", "file") == "file"
    )


def list_members(fs: Any, root: str, members: tuple[str, ...]) -> dict[str, Listed]:
    """`list_objects` for the objects ``members`` (paths relative to ``root``)
    only: one listing per directory that holds them, and a look-up of each
    one a listing leaves out or names only (HTTP); a missing one is absent."""
    root = root.rstrip("/")
    wanted = {f"{root}/{m}": m for m in members}
    fs.invalidate_cache()  # the store as it is now, not an earlier listing
    infos = {}
    for directory in sorted({path.rpartition("/")[0] for path in wanted}):
        # (no listing there, HTTP without an index page: each is looked up below)
        with contextlib.suppress(FileNotFoundError):
            infos |= {i["name"].rstrip("/"): i for i in fs.ls(directory, detail=True)}
    listed = {}
    for path, member in wanted.items():
        try:
            info = _complete(fs, path, infos.get(path))
        except FileNotFoundError:
            continue
        if info.get("type", "file") == "file":
            listed[member] = Listed(int(info["size"]), _identity(info))
    return listed


def _complete(fs: Any, path: str, info: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """``path``'s listing entry ``info`` with its size and version: looked up
    by itself when not listed, or listed by name only (fsspec's HTTP lists an
    index page's links: a HEAD of each gives its size and ETag)."""
    if info is None or info.get("size") is None or _identity(info) is None:
        return fs.info(path)
    return info


def _identity(info: Mapping[str, Any]) -> str | None:
    """An object's version as its store reports it: S3's and HTTP's ETag, a GCS
    object's generation (before its etag, which changes with its metadata
    too), a Hub file's blob id or LFS hash."""
    for name in ("ETag", "generation", "blob_id", "etag", "VersionId"):
        if info.get(name):
            return str(info[name]).strip('"')
    if isinstance(info.get("lfs"), Mapping) and info["lfs"].get("sha256"):
        return str(info["lfs"]["sha256"])
    return None


def read_range(fs: Any, path: str, start: int, end: int) -> bytes:
    """Bytes ``[start, end)`` of an object, in one ranged read.

    Raises:
      ConnectionError: fewer bytes came than asked (a body cut short), which
        is transient; the store's own errors otherwise.
    """
    data = fs.cat_file(path, start=start, end=end)
    if len(data) != end - start:
        raise ConnectionError(f"got {len(data)} bytes of {end - start}: the body was cut short")
    return data


def is_transient(error: BaseException) -> bool:
    """Whether another try may succeed: a time-out, a dropped or reset
    connection, a short body, a 5xx, a 429 or S3's ``SlowDown``; not a missing
    object or bucket, a refused permission or missing credentials."""
    seen = 0
    while error is not None and seen < 8:
        if isinstance(error, FileNotFoundError | PermissionError):
            return False
        if isinstance(error, TimeoutError | ConnectionError):
            return True
        if type(error).__name__ in _TRANSIENT_CLASSES:
            return True
        response = getattr(error, "response", None)  # botocore's ClientError
        if isinstance(response, Mapping):
            code = str(response.get("Error", {}).get("Code", ""))
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            if code in _TRANSIENT_CODES or status == 429 or status >= 500:
                return True
        status = getattr(error, "status", None)  # aiohttp's ClientResponseError
        if isinstance(status, int) and (status == 429 or status >= 500):
            return True
        error, seen = error.__cause__ or error.__context__, seen + 1
    return False
