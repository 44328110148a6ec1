"""Datasets at URLs: ``s3://``, ``gs://``, ``hf://``, ``https://``, ``file://``.

A URL names one object or a prefix of them, laid out as a local dataset
would be (``<field>.npy`` files, ``train/`` and ``test/``, Parquet shards...).
Its objects are listed with their identity (ETag or generation, and size),
fetched in ranged reads of `BLOCK_BYTES` into the bounded `ObjectCache`
(each read retried within `RETRY_ENV`'s budget and checked for length), and
the dataset is then read from a directory of links to those entries by the
local readers, so every backend reads the same bytes as from a local copy.
The objects are listed again at every epoch's start (`RemoteObjects.check`):
one that changed since the source was made is refused by name.
"""

from __future__ import annotations

import concurrent.futures
import functools
import glob
import hashlib
import itertools
import os
import posixpath
import urllib.parse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from jaxfeed.loaders._doors import fsspec as door
from jaxfeed.loaders._io.retry import with_retries
from jaxfeed.loaders.data.cache import cache_root, writable_dir
from jaxfeed.loaders.data.object_cache import ObjectCache, entry_key

__all__ = [
    "CACHE_BYTES_ENV",
    "RETRY_ENV",
    "RemoteObjects",
    "cache_bytes",
    "fetch",
    "fetched",
    "is_glob",
    "is_url",
    "listed_objects",
    "public_url",
    "shown_url",
    "without_secrets",
]

CACHE_BYTES_ENV = "JAXFEED_CACHE_BYTES"
DEFAULT_CACHE_BYTES = 4 << 30
RETRY_ENV = "JAXFEED_RETRY_SECONDS"
DEFAULT_RETRY_S = 60.0
BLOCK_BYTES = 8 << 20  # one ranged read: long enough to amortise a request's latency
FETCH_THREADS = 8  # objects fetched at once
_SECRET_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "HF_TOKEN", "GOOGLE_API_KEY")


def is_url(name: object) -> bool:
    """Whether ``name`` is a dataset URL jaxfeed reads (a store it knows)."""
    return isinstance(name, str) and door.url_protocol(name) is not None


def public_url(url: str) -> str:
    """``url`` without what may be a secret: a user and password, a query (a
    presigned URL's signature)."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host  # an IPv6 address
    host += f":{parts.port}" if parts.port is not None else ""  # part of the address
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", ""))


def shown_url(url: str) -> str:
    """`public_url`, keeping a glob's ``?`` (a wildcard there, not a query)."""
    query = urllib.parse.urlsplit(url).query
    return public_url(url) + (f"?{query}" if is_glob(url) and "?" in url else "")


def fetch(url: str, storage_options: Mapping[str, Any] | None) -> tuple[Path, RemoteObjects]:
    """The objects at ``url`` in the local cache: a local path that reads as
    the URL would (a directory of links for a prefix, a link for an object),
    and what checks them later.

    Raises:
      FileNotFoundError: nothing at ``url`` (a missing bucket, object or
        empty prefix), naming it.
      PermissionError: the store refused access or credentials are missing,
        naming the URL.
      ValueError: an object whose store gives no version (identity), one
        that changed while it was read, or objects past the cache's bound.
      OSError: a transient failure past the retry budget, naming the URL,
        the byte range and the last error.
    """
    objects = listed_objects(url, storage_options)
    return fetched(objects), objects


def listed_objects(
    url: str | Sequence[str], storage_options: Mapping[str, Any] | None
) -> RemoteObjects:
    """The objects at ``url`` (a URL, a glob of object URLs, or a list of
    them, of one store), listed (`RemoteObjects.made_from`) and each with a
    version; raises as `fetch` does for a missing, empty or unversioned URL,
    and ValueError for a list of URLs of several stores."""
    options = dict(storage_options or {})
    if isinstance(url, str) and not is_glob(url):
        objects = RemoteObjects(url, options)
    else:
        objects = _of_many(url, options)
    listed = objects.listing()
    if objects.members is not None and len(listed) < len(objects.members):
        missing = [objects.object_url(m) for m in objects.members if m not in listed]
        raise FileNotFoundError(f"{missing[:3]}: not found (a missing object); pass existing ones")
    if not listed:
        raise FileNotFoundError(
            f"{objects.url}: no objects there (an empty or missing prefix); pass the URL of a "
            "dataset's objects (a prefix of <field>.npy files, train/ and test/, or shards)"
        )
    unversioned = sorted(k or objects.url for k, v in listed.items() if v.identity is None)
    if unversioned:
        raise ValueError(
            f"{objects.url}: the store gives no version (ETag, generation) for {unversioned[:3]}, "
            "so jaxfeed could not tell a changed object from the one it cached; serve them "
            "from a store that does"
        )
    return objects


def is_glob(url: object) -> bool:
    """Whether ``url`` is a glob of object URLs (``s3://b/p/part-*.parquet``);
    an HTTP URL never is (its ``?`` starts a query)."""
    return is_url(url) and door.url_protocol(url) not in ("http", "https") and glob.has_magic(url)


def _of_many(urls: str | Sequence[str], options: dict[str, Any]) -> RemoteObjects:
    """The objects of a glob, or of a list of object URLs of one store, as the
    members of the directory they share."""
    given = [urls] if isinstance(urls, str) else list(urls)
    stores = sorted({_store(u) for u in given})
    if len(stores) > 1:
        raise ValueError(
            f"dataset URLs of several stores ({', '.join(stores)}): a list of URLs is read "
            "from one store (one bucket); pass one store's objects, or make a Mixture of them"
        )
    if len(given) > 1 and any(map(is_glob, given)):
        raise ValueError(
            f"a list of dataset URLs holds a glob ({next(filter(is_glob, given))}); pass the "
            "glob alone, or a list of object URLs"
        )
    scheme, paths = given[0].split("://")[0], [u.split("://", 1)[1] for u in given]
    if is_glob(given[0]):  # its leading directories without a wildcard
        parts = paths[0].split("/")
        fixed = list(itertools.takewhile(lambda part: not glob.has_magic(part), parts))
        parent, pattern = "/".join(fixed), "/".join(parts[len(fixed) :])
    else:
        parent = posixpath.commonpath([posixpath.dirname(p) for p in paths])
    objects = RemoteObjects(f"{scheme}://{parent}/", options)
    if is_glob(given[0]):
        objects.members = objects.expand(pattern)
        if not objects.members:
            raise FileNotFoundError(
                f"{shown_url(given[0])}: the glob matches no object; "
                "pass a glob of the dataset's objects (s3://bucket/prefix/part-*.parquet)"
            )
    else:
        objects.members = tuple(p[len(parent) :].lstrip("/") for p in paths)
    return objects


def _store(url: str) -> str:
    """The store of a URL: its scheme and bucket (host)."""
    if not is_url(url):
        raise TypeError(
            f"a list of dataset URLs holds {url!r}, not a URL; pass URLs of one store, or "
            "local paths"
        )
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.hostname or ''}"


def fetched(objects: RemoteObjects) -> Path:
    """`fetch`'s local path for objects already listed."""
    listed = objects.made_from
    keys = {k: entry_key(objects.object_url(k), *v) for k, v in listed.items()}
    cache = ObjectCache(writable_dir(cache_root() / "objects"), cache_bytes())
    keep = set(keys.values())

    def one(relative: str) -> Path:
        name = Path(relative or objects.path).name
        size = listed[relative].size
        write = functools.partial(objects.download, relative, listed[relative])
        return cache.entry(keys[relative], name, size, write, keep)

    with concurrent.futures.ThreadPoolExecutor(FETCH_THREADS, "jaxfeed-fetch") as pool:
        entries = dict(zip(listed, pool.map(one, listed), strict=True))
    view = _view(objects.url, entries)
    return view / (Path(objects.path).name if "" in entries else "")


def _view(url: str, entries: Mapping[str, Path]) -> Path:
    """A directory of links, laid out as the objects are under ``url``, to
    their cache entries (made once per set of versions; a rename publishes it)."""
    digest = hashlib.sha256(repr((url, sorted(map(str, entries.items())))).encode())
    view = cache_root() / "remote" / digest.hexdigest()[:32]
    if view.is_dir():
        return view
    scratch = writable_dir(view.parent) / f".{view.name}.{os.getpid()}"
    for relative, entry in entries.items():
        link = scratch / (relative or entry.name)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(entry)
    try:
        os.rename(scratch, view)
    except OSError:  # another process published the same view first
        import shutil

        shutil.rmtree(scratch, ignore_errors=True)
    return view


class RemoteObjects:
    """The objects at a URL, their versions as the source was made from them,
    and the store they are read from (an `Origin` of `ArrayDataset`)."""

    def __init__(self, url: str, storage_options: dict[str, Any]):
        self.url = public_url(url)
        self._secrets = _secrets(storage_options)
        self._budget_s = _retry_seconds()
        self._fs, self.path = self._call(lambda: door.open_store(url, storage_options), url)
        self.made_from: dict[str, door.Listed] = {}
        # What a worker opens the store with: its credentials come from the
        # store's standard chain there (the environment), never from a pickle.
        self._public_options = without_secrets(storage_options)
        self._reader: Any = None  # a worker's own store, opened at its first `read`
        # The objects a list or glob of URLs named, relative to the URL (their
        # directory); None: every object under it.
        self.members: tuple[str, ...] | None = None

    def __getstate__(self) -> dict:
        # Never into a worker or a file: the store holds the credentials.
        return {**self.__dict__, "_fs": None, "_secrets": (), "_reader": None}

    def object_url(self, relative: str) -> str:
        return f"{self.url.rstrip('/')}/{relative}" if relative else self.url

    def _object_path(self, relative: str) -> str:
        return f"{self.path.rstrip('/')}/{relative}" if relative else self.path

    def listing(self) -> dict[str, door.Listed]:
        """Every object under the URL with its size and version, now."""
        if self.members is None:
            listing = functools.partial(door.list_objects, self._fs, self.path)
        else:
            listing = functools.partial(door.list_members, self._fs, self.path, self.members)
        listed = self._retried(listing, self.url)
        if not self.made_from:
            self.made_from = dict(listed)
        return listed

    def expand(self, pattern: str) -> tuple[str, ...]:
        """The objects matching the glob ``pattern`` under the URL, sorted."""
        found = functools.partial(door.glob_objects, self._fs, self.path, pattern)
        return tuple(self._retried(found, f"{self.url}{pattern}"))

    def read(self, relative: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of one object, in one ranged read, retried and
        never short; in a worker, through a store it opens itself."""
        fs = self._fs
        if fs is None:
            if self._reader is None:
                self._secrets = _secrets(self._public_options)
                opened = self._call(
                    lambda: door.open_store(self.url, self._public_options), self.url
                )
                self._reader = opened[0]
            fs = self._reader
        read = functools.partial(door.read_range, fs, self._object_path(relative), start, end)
        return self._retried(read, f"{self.object_url(relative)} bytes {start}-{end - 1}")

    def download(self, relative: str, listed: door.Listed, file: BinaryIO) -> None:
        """One object into ``file``, in ranged reads, each retried and checked."""
        path = self._object_path(relative)
        where = self.object_url(relative)
        for start in range(0, listed.size, BLOCK_BYTES):
            file.write(self.read(relative, start, min(start + BLOCK_BYTES, listed.size)))
        now = self._retried(lambda: door.list_objects(self._fs, path), where)
        if now.get("", listed) != listed:
            raise ValueError(
                f"{where} changed while it was read (version {listed.identity} -> "
                f"{now[''].identity}); read it again once it is no longer being written"
            )

    def check(self) -> None:
        """Refuses objects that changed (or went) since the source was made.

        Raises:
          ValueError: naming the first object that changed, and how.
        """
        if self._fs is None:  # a copy in a worker: the source's process checks
            return
        now = self.listing()
        for relative, was in self.made_from.items():
            if now.get(relative) != was:
                how = "is gone" if relative not in now else f"is now {now[relative]}, was {was}"
                raise ValueError(
                    f"{self.object_url(relative)} changed after the source was made ((size, "
                    f"version) {how}): its cached copy would no longer be what the store "
                    "holds, so it is refused; make the source again to read the new objects, "
                    "and write new data under a new name, not over objects a run reads"
                )

    def _retried(self, call: Any, what: str) -> Any:
        return self._call(
            lambda: with_retries(
                call, what=what, transient=door.is_transient, budget_s=self._budget_s
            ),
            what,
        )

    def _call(self, call: Any, what: str) -> Any:
        """``call()``, its store errors named with ``what`` and any secret blanked."""
        try:
            return call()
        except (ImportError, ValueError):
            raise
        except FileNotFoundError as error:
            raise FileNotFoundError(self._say(f"{what}: not found ({_text(error)})")) from None
        except PermissionError as error:
            raise PermissionError(self._say(_denied(what, error))) from None
        except Exception as error:
            if type(error).__name__ == "NoCredentialsError":  # botocore's
                raise PermissionError(self._say(_denied(what, error))) from None
            raise OSError(self._say(f"{_text(error)}")) from None

    def _say(self, message: str) -> str:
        for secret in self._secrets:
            message = message.replace(secret, "***")
        return message


def _text(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def _denied(what: str, error: BaseException) -> str:
    return (
        f"{what}: access denied ({_text(error)}); check the credentials (the store's standard "
        "chain: AWS_* variables, ~/.aws, an instance role; GOOGLE_APPLICATION_CREDENTIALS; "
        "HF_TOKEN) or pass them in storage_options=, or anon=True in storage_options= for a "
        "public bucket"
    )


def without_secrets(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` without the values of keys that look like secrets (`_secrets`)."""
    return {
        key: without_secrets(value) if isinstance(value, Mapping) else value
        for key, value in options.items()
        if isinstance(value, Mapping) or not _secret(key, value)
    }


# What a store's credential option may name instead of holding a credential
# (gcsfs's `token` modes): kept, so that workers read as the source does.
_CREDENTIAL_MODES = ("anon", "google_default", "cache", "cloud", "browser")


def _secret(key: str, value: Any) -> bool:
    """Whether ``value`` under ``key`` may be a credential: any value of a key
    that looks like one (a number too), but a mode such as ``"anon"``."""
    words = ("secret", "token", "password", "key", "auth")
    return any(word in key.lower() for word in words) and value not in _CREDENTIAL_MODES


def _secrets(options: Mapping[str, Any]) -> tuple[str, ...]:
    """Strings that must never appear in a message: credentials passed in
    ``storage_options`` and those in the environment."""
    found = [os.environ.get(name, "") for name in _SECRET_ENV]
    stack = [options]
    while stack:
        for key, value in stack.pop().items():
            if isinstance(value, Mapping):
                stack.append(value)
            elif isinstance(value, str) and _secret(key, value):
                found.append(value)
    return tuple(s for s in found if len(s) >= 4)


def cache_bytes() -> int:
    """`CACHE_BYTES_ENV`, the bound of what jaxfeed caches of a store."""
    value = os.environ.get(CACHE_BYTES_ENV, "")
    try:
        return int(float(value)) if value else DEFAULT_CACHE_BYTES
    except ValueError:
        raise ValueError(f"{CACHE_BYTES_ENV}={value!r} is not a number of bytes") from None


def _retry_seconds() -> float:
    value = os.environ.get(RETRY_ENV, "")
    try:
        return float(value) if value else DEFAULT_RETRY_S
    except ValueError:
        raise ValueError(f"{RETRY_ENV}={value!r} is not a number of seconds") from None
