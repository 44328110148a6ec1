"""A local stand-in for GCS, the Hugging Face Hub and a static HTTPS host, on
127.0.0.1, serving one directory (not a test itself; standard library only).

It speaks just the requests the real clients make, found in their source
(gcsfs 2026.8, huggingface_hub 2.4, fsspec 2026.9's HTTPFileSystem), so the
tests point each real client at it by its endpoint alone:

- static, for fsspec's HTTP (``http://HOST/files/<path>``): HEAD and GET of a
  file (``Content-Length``, an ``ETag``, ``Range`` -> 206 + ``Content-Range``),
  and GET of a directory -> an HTML page linking its entries (``name/`` for a
  directory), which is how fsspec lists a prefix; the same under
  ``/plain/<path>`` without an ETag (``Last-Modified`` only, as Python's
  ``http.server`` serves), a host that gives no version.
- GCS's JSON API, for gcsfs with ``endpoint_url=``: ``GET
  /storage/v1/b/<bucket>/o?prefix=&delimiter=`` (a listing, all in one page),
  ``GET /storage/v1/b/<bucket>/o/<object>`` (an object's metadata, with
  ``size`` and ``generation``), ``GET /storage/v1/b/<bucket>`` and ``GET
  /download/storage/v1/b/<bucket>/o/<object>?alt=media`` with ``Range``.
- the Hub's API, for ``HfFileSystem(endpoint=...)``: ``GET
  /api/<type>s/<org>/<name>[/revision/<rev>]`` (repo info), ``GET
  .../tree/<rev>[/<path>]?recursive=`` (entries with a git blob id as
  ``oid``), ``POST .../paths-info/<rev>`` and ``GET
  /<type>s/<org>/<name>/resolve/<rev>/<path>`` with ``Range``.

A GCS bucket is a directory under the root; a Hub repo ``<org>/<name>`` the
directory ``<org>/<name>``. Versions come from the bytes (a changed file gets
a new ETag, generation and blob id). Any other request is answered 501 and
kept in `unhandled`, so a test can say the client asked for nothing else.
"""

from __future__ import annotations

import base64
import collections
import hashlib
import html
import http.server
import json
import re
import sys
import threading
import urllib.parse
from pathlib import Path

from local_http import LocalHTTPServer

__all__ = ["StoreServer"]

_RANGE = re.compile(r"bytes=(\d*)-(\d*)$")
_REVISION = "main"
_COMMIT = "0" * 40


class StoreServer(LocalHTTPServer):
    """``with StoreServer(root) as server:`` serves ``root`` on ``server.url``.

    ``requests`` counts the requests served by kind (``"gcs list"``,
    ``"hf resolve"``...); ``unhandled`` holds those it does not speak.
    """

    def __init__(self, root: Path):
        self.root = Path(root)
        self.requests: collections.Counter[str] = collections.Counter()
        self.unhandled: list[str] = []
        self._lock = threading.Lock()
        super().__init__(self._serve, "store-server", _Server)

    def _serve(self, handler: http.server.BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else b""
        parts = urllib.parse.urlsplit(handler.path)
        query = urllib.parse.parse_qs(parts.query, keep_blank_values=True)
        path = parts.path
        for kind, pattern, serve in self._routes():
            match = re.fullmatch(pattern, path)
            if match and (handler.command, kind) in _METHODS:
                with self._lock:
                    self.requests[kind] += 1
                groups = [g if g is None else urllib.parse.unquote(g) for g in match.groups()]
                serve(handler, *groups, query, body)
                return
        with self._lock:
            self.unhandled.append(f"{handler.command} {handler.path}")
        _reply(handler, 501, b"not served by tests/store_servers.py", "text/plain")

    def _routes(self) -> list:
        return [
            ("static", r"/files/(.*)", self._static),
            ("static, no ETag", r"/plain/(.*)", self._static),
            ("gcs bucket", r"/storage/v1/b/([^/]+)", self._gcs_bucket),
            ("gcs list", r"/storage/v1/b/([^/]+)/o", self._gcs_list),
            ("gcs object", r"/storage/v1/b/([^/]+)/o/(.+)", self._gcs_object),
            ("gcs media", r"/download/storage/v1/b/([^/]+)/o/(.+)", self._gcs_media),
            # (a one-part id too: huggingface_hub 0.x also asks for the repo "org" of
            # "org/name/path" when "org/name" is missing)
            ("hf repo", r"/api/(\w+)s/([^/]+(?:/[^/]+)?)(?:/revision/([^/]+))?", self._hf_repo),
            ("hf tree", r"/api/(\w+)s/([^/]+/[^/]+)/tree/([^/]+)(?:/(.*))?", self._hf_tree),
            ("hf paths-info", r"/api/(\w+)s/([^/]+/[^/]+)/paths-info/([^/]+)", self._hf_paths),
            ("hf resolve", r"/(\w+)s/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", self._hf_resolve),
        ]

    @staticmethod
    def versions(path: Path) -> dict[str, str]:
        """The version each store gives the file ``path``: its ETag
        (``"https"``), GCS generation (``"gs"``) and Hub blob id (``"hf"``)."""
        data = Path(path).read_bytes()
        return {"https": _sha1(data), "gs": _generation(data), "hf": _blob_id(data)}

    def _file(self, *parts: str) -> Path | None:
        """The file or directory under the root, None if absent or outside it."""
        path = self.root.joinpath(*parts).resolve()
        root = self.root.resolve()
        inside = path == root or root in path.parents
        return path if inside and path.exists() else None

    # static files, as fsspec's HTTPFileSystem reads them

    def _static(self, handler, relative: str, query: dict, body: bytes) -> None:
        path = self._file(relative)
        top = handler.path.split("/")[1]  # files, or plain: no ETag
        if path is None:
            _reply(handler, 404, b"not found", "text/plain")
        elif path.is_dir():
            base = f"/{top}/" + "/".join(p for p in relative.split("/") if p)
            links = [
                f'<a href="{html.escape(urllib.parse.quote(f"{base}/{p.name}"))}'
                f'{"/" if p.is_dir() else ""}">{html.escape(p.name)}</a>'
                for p in sorted(path.iterdir())
            ]
            page = "<html><body>" + "<br>".join(links) + "</body></html>"
            _reply(handler, 200, page.encode(), "text/html; charset=utf-8")
        elif top == "plain":
            _send_file(handler, path, {"Last-Modified": "Thu, 01 Jan 2026 00:00:00 GMT"})
        else:
            _send_file(handler, path, {"ETag": f'"{_sha1(path.read_bytes())}"'})

    # GCS's JSON API, as gcsfs calls it

    def _gcs_bucket(self, handler, bucket: str, query: dict, body: bytes) -> None:
        if self._file(bucket) is None:
            _json(handler, {"error": {"code": 404, "message": "bucket not found"}}, 404)
        else:
            _json(handler, {"kind": "storage#bucket", "name": bucket, "id": bucket})

    def _gcs_resource(self, bucket: str, key: str, path: Path) -> dict:
        data = path.read_bytes()
        return {
            "kind": "storage#object",
            "bucket": bucket,
            "name": key,
            "size": str(len(data)),
            "generation": _generation(data),
            "metageneration": "1",
            "etag": base64.b64encode(hashlib.md5(data).digest()).decode(),
            "contentType": "application/octet-stream",
            "updated": "2026-01-01T00:00:00.000Z",
        }

    def _gcs_list(self, handler, bucket: str, query: dict, body: bytes) -> None:
        root = self._file(bucket)
        if root is None:
            _json(handler, {"error": {"code": 404, "message": "bucket not found"}}, 404)
            return
        prefix = query.get("prefix", [""])[0]
        delimiter = query.get("delimiter", [""])[0]
        items, prefixes = [], set()
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            key = path.relative_to(root).as_posix()
            if not key.startswith(prefix):
                continue
            rest = key[len(prefix) :]
            if delimiter and delimiter in rest:
                prefixes.add(prefix + rest.split(delimiter, 1)[0] + delimiter)
            else:
                items.append(self._gcs_resource(bucket, key, path))
        page = {"kind": "storage#objects", "items": items, "prefixes": sorted(prefixes)}
        _json(handler, page)

    def _gcs_object(self, handler, bucket: str, key: str, query: dict, body: bytes) -> None:
        path = self._file(bucket, key)
        if path is None or not path.is_file():
            _json(handler, {"error": {"code": 404, "message": "No such object"}}, 404)
        else:
            _json(handler, self._gcs_resource(bucket, key, path))

    def _gcs_media(self, handler, bucket: str, key: str, query: dict, body: bytes) -> None:
        path = self._file(bucket, key)
        if path is None or not path.is_file() or query.get("alt") != ["media"]:
            _json(handler, {"error": {"code": 404, "message": "No such object"}}, 404)
        else:
            generation = self._gcs_resource(bucket, key, path)["generation"]
            _send_file(handler, path, {"x-goog-generation": generation})

    # the Hugging Face Hub's API, as HfFileSystem calls it

    def _hf_missing(self, handler, code: str) -> None:
        headers = {"X-Error-Code": code, "X-Error-Message": f"{code} (local server)"}
        _reply(handler, 404, json.dumps({"error": code}).encode(), "application/json", headers)

    def _hf_repo_dir(self, handler, kind: str, repo: str, revision: str) -> Path | None:
        path = self._file(repo) if "/" in repo else None  # served repos are org/name
        if path is None or not path.is_dir():
            self._hf_missing(handler, "RepoNotFound")
            return None
        if revision not in (None, _REVISION, _COMMIT):
            self._hf_missing(handler, "RevisionNotFound")
            return None
        return path

    def _hf_entry(self, root: Path, path: Path) -> dict:
        relative = path.relative_to(root).as_posix()
        if path.is_dir():
            tree = hashlib.sha1(relative.encode()).hexdigest()
            return {"type": "directory", "oid": tree, "size": 0, "path": relative}
        data = path.read_bytes()
        return {"type": "file", "oid": _blob_id(data), "size": len(data), "path": relative}

    def _hf_repo(self, handler, kind: str, repo: str, revision: str, query, body) -> None:
        if self._hf_repo_dir(handler, kind, repo, revision) is not None:
            _json(handler, {"id": repo, "sha": _COMMIT, "private": False})

    def _hf_tree(self, handler, kind: str, repo: str, revision: str, inner, query, body) -> None:
        root = self._hf_repo_dir(handler, kind, repo, revision)
        if root is None:
            return
        folder = self._file(repo, inner or "")
        if folder is None or not folder.is_dir():
            self._hf_missing(handler, "EntryNotFound")
            return
        recursive = query.get("recursive", ["False"])[0].lower() == "true"
        found = sorted(folder.rglob("*") if recursive else folder.iterdir())
        _json(handler, [self._hf_entry(root, p) for p in found])

    def _hf_paths(self, handler, kind: str, repo: str, revision: str, query, body) -> None:
        root = self._hf_repo_dir(handler, kind, repo, revision)
        if root is None:
            return
        asked = urllib.parse.parse_qs(body.decode()).get("paths", [])
        found = [self._file(repo, p) for p in asked]
        _json(handler, [self._hf_entry(root, p) for p in found if p is not None])

    def _hf_resolve(self, handler, kind: str, repo: str, revision: str, inner, query, body):
        root = self._hf_repo_dir(handler, kind, repo, revision)
        if root is None:
            return
        path = self._file(repo, inner)
        if path is None or not path.is_file():
            self._hf_missing(handler, "EntryNotFound")
            return
        entry = self._hf_entry(root, path)
        _send_file(handler, path, {"ETag": f'"{entry["oid"]}"', "X-Repo-Commit": _COMMIT})


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        # A client that closes a kept-alive connection, or leaves a body it
        # does not want (fsspec's HTTP checks a file exists by a GET), is no
        # error of the server's; anything else is printed as usual.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


_METHODS = {
    ("GET", "static"),
    ("HEAD", "static"),
    ("GET", "static, no ETag"),
    ("HEAD", "static, no ETag"),
    ("GET", "gcs bucket"),
    ("GET", "gcs list"),
    ("GET", "gcs object"),
    ("GET", "gcs media"),
    ("GET", "hf repo"),
    ("GET", "hf tree"),
    ("POST", "hf paths-info"),
    ("GET", "hf resolve"),
}


def _sha1(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()


def _generation(data: bytes) -> str:
    return str(int(_sha1(data)[:13], 16))  # a new one for new bytes, as GCS gives


def _blob_id(data: bytes) -> str:
    return _sha1(b"blob %d\0" % len(data) + data)  # git's, as the Hub gives


def _send_file(handler, path: Path, headers: dict) -> None:
    """A file's bytes, or the range ``Range:`` asks for (206)."""
    data = path.read_bytes()
    headers = {**headers, "Accept-Ranges": "bytes"}
    asked = _RANGE.match(handler.headers.get("Range", "").strip())
    if not asked or not (asked[1] or asked[2]):
        _reply(handler, 200, data, "application/octet-stream", headers)
        return
    if asked[1]:
        start, end = int(asked[1]), int(asked[2]) + 1 if asked[2] else len(data)
    else:  # a suffix: the last N bytes
        start, end = max(len(data) - int(asked[2]), 0), len(data)
    end = min(end, len(data))
    if start >= end:
        headers["Content-Range"] = f"bytes */{len(data)}"
        _reply(handler, 416, b"", "text/plain", headers)
        return
    headers["Content-Range"] = f"bytes {start}-{end - 1}/{len(data)}"
    _reply(handler, 206, data[start:end], "application/octet-stream", headers)


def _json(handler, value: object, status: int = 200) -> None:
    _reply(handler, status, json.dumps(value).encode(), "application/json")


def _reply(handler, status: int, body: bytes, kind: str, headers: dict | None = None) -> None:
    handler.send_response_only(status)
    handler.send_header("Content-Type", kind)
    for name, value in (headers or {}).items():
        handler.send_header(name, value)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    if handler.command != "HEAD":  # a HEAD says the length, and sends no body
        handler.wfile.write(body)
    handler.wfile.flush()
