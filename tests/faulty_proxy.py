"""A fault-injecting HTTP reverse proxy on 127.0.0.1 for the object-storage
tests (not a test itself; standard library only).

It forwards each request to an upstream server (the moto S3 server) and, by
a counter (deterministic, never by time), injects faults: a small latency on
every request, and on every ``every``-th request the next fault of `FAULTS`
in turn (`FaultyProxy._fault`): a dropped connection (closed without a response), a 500, a 503, a
429, S3's 503 ``SlowDown``, or a truncated body (a full ``Content-Length``
but half the bytes, then the connection closed). `counts` says how many of
each were injected, so a test can show it did not pass vacuously.
"""

from __future__ import annotations

import collections
import http.client
import http.server
import threading
import time
from collections.abc import Callable

from local_http import LocalHTTPServer

__all__ = ["FAULTS", "FaultyProxy"]

FAULTS = ("truncate", "drop", "500", "503", "429", "slowdown")
_ERRORS = {  # fault -> (status, S3 error code)
    "500": (500, "InternalError"),
    "503": (503, "ServiceUnavailable"),
    "429": (429, "TooManyRequests"),
    "slowdown": (503, "SlowDown"),
}
_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length"}


class FaultyProxy(LocalHTTPServer):
    """``with FaultyProxy(upstream_port) as proxy:`` serves on ``proxy.url``.

    Args:
      upstream_port: the port of the server on 127.0.0.1 it forwards to.
      every: one request in ``every`` gets a fault (1: every request).
      faults: the faults taken in turn ("truncate" first: it waits for a
        response with a body, an object's bytes, and the reads come early).
      latency_s: added to every request.
      only: which requests may get a fault (method, path, headers) -> bool;
        all by default.
    """

    def __init__(
        self,
        upstream_port: int,
        *,
        every: int = 2,
        faults: tuple[str, ...] = FAULTS,
        latency_s: float = 0.002,
        only: Callable[[str, str, dict], bool] = lambda *_: True,
    ):
        self.counts: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()
        self._seen = self._turn = 0
        self._due = False
        self._upstream_port, self._every, self._faults = upstream_port, every, faults
        self._latency_s, self._only = latency_s, only
        super().__init__(self._serve, "faulty-proxy")

    def _fault(self, has_body: bool, eligible: bool) -> str | None:
        """The fault for this request, by the counter: every ``every``-th
        eligible request makes the next fault due, and it stays due until a
        request it applies to comes (a truncation waits for a body)."""
        with self._lock:
            self.counts["latency"] += 1
            if not eligible:
                return None
            self._seen += 1
            self._due = self._due or self._seen % self._every == 0
            fault = self._faults[self._turn % len(self._faults)]
            if not self._due or (fault == "truncate" and not has_body):
                return None
            self._due, self._turn = False, self._turn + 1
            self.counts[fault] += 1
            return fault

    def _serve(self, handler: http.server.BaseHTTPRequestHandler) -> None:
        time.sleep(self._latency_s)
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else b""
        headers = dict(handler.headers.items())
        has_body = handler.command == "GET" and "Range" in headers
        fault = self._fault(has_body, self._only(handler.command, handler.path, headers))
        if fault == "drop":  # no response at all
            handler.close_connection = True
            return
        if fault in _ERRORS:
            status, code = _ERRORS[fault]
            message = f"<Message>injected {status} {code}</Message>"
            error = f"<Error><Code>{code}</Code>{message}</Error>".encode()
            self._reply(handler, status, [("Content-Type", "application/xml")], error)
            return
        upstream = http.client.HTTPConnection("127.0.0.1", self._upstream_port, timeout=30)
        try:
            upstream.putrequest(
                handler.command, handler.path, skip_host=True, skip_accept_encoding=True
            )
            for name, value in handler.headers.items():
                upstream.putheader(name, value)
            upstream.endheaders(body)
            response = upstream.getresponse()
            data = response.read()
            kept = [(k, v) for k, v in response.getheaders() if k.lower() not in _HOP]
            if handler.command == "HEAD":  # the object's length, and no body
                kept.append(("Content-Length", response.getheader("Content-Length", "0")))
                self._reply(handler, response.status, kept, b"", length=False)
            elif fault == "truncate" and len(data) > 1:
                kept.append(("Content-Length", str(len(data))))
                self._reply(handler, response.status, kept, data[: len(data) // 2], length=False)
                handler.close_connection = True
            else:
                self._reply(handler, response.status, kept, data)
        finally:
            upstream.close()

    @staticmethod
    def _reply(handler, status: int, headers: list, body: bytes, length: bool = True) -> None:
        handler.send_response_only(status)
        for name, value in headers:
            handler.send_header(name, value)
        if length:
            handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        if handler.command != "HEAD":  # a reply to HEAD never has a body (RFC 9110 9.3.2)
            handler.wfile.write(body)
        handler.wfile.flush()
