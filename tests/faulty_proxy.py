"""A fault-injecting HTTP reverse proxy on 127.0.0.1 for the object-storage
tests (not a test itself; standard library only).

It forwards each request to an upstream server (the moto S3 server) and, by
a counter (deterministic, never by time), injects faults: a small latency on
every request, and on every ``every``-th request the next fault of `FAULTS`
in turn (`FaultyProxy._fault`): a dropped connection (closed without a response), a 500, a 503, a
429, S3's 503 ``SlowDown``, or a truncated body (a full ``Content-Length``
but half the bytes, then the connection closed). `counts` says how many of
each were injected, so a test can show it did not pass vacuously. With no
``faults`` it only delays; ``bytes_per_s`` caps the bytes it sends, over all
connections together (a `TokenBucket`), and `stats` says how many requests
it served at once (benchmarks/object_storage.py measures through it).
"""

from __future__ import annotations

import collections
import http.client
import http.server
import io
import threading
import time
from collections.abc import Callable
from typing import BinaryIO

from local_http import LocalHTTPServer

__all__ = ["FAULTS", "FaultyProxy", "TokenBucket"]

FAULTS = ("truncate", "drop", "500", "503", "429", "slowdown")
_ERRORS = {  # fault -> (status, S3 error code)
    "500": (500, "InternalError"),
    "503": (503, "ServiceUnavailable"),
    "429": (429, "TooManyRequests"),
    "slowdown": (503, "SlowDown"),
}
_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length"}
_CHUNK = 64 << 10  # bytes written, and taken from the bucket, at a time


class TokenBucket:
    """``take(n)`` returns once ``n`` bytes may go: at most ``burst`` at once,
    then ``rate`` bytes/s over all callers together. A caller that overdraws
    the bucket sleeps until its debt is paid, outside the lock."""

    def __init__(self, rate: float, burst: int = _CHUNK):
        self.rate, self.burst = rate, burst
        self._tokens, self._stamp = float(burst), time.monotonic()
        self._lock = threading.Lock()

    def take(self, n: int) -> None:
        with self._lock:
            now = time.monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
            self._stamp = now
            self._tokens -= n
            wait = -self._tokens / self.rate if self._tokens < 0 else 0.0
        time.sleep(wait)


class FaultyProxy(LocalHTTPServer):
    """``with FaultyProxy(upstream_port) as proxy:`` serves on ``proxy.url``.

    Args:
      upstream_port: the port of the server on 127.0.0.1 it forwards to.
      every: one request in ``every`` gets a fault (1: every request).
      faults: the faults taken in turn ("truncate" first: it waits for a
        response with a body, an object's bytes, and the reads come early).
      latency_s: added to every request.
      bytes_per_s: the bytes of every response together, per second; None:
        no cap.
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
        bytes_per_s: float | None = None,
    ):
        self.counts: collections.Counter[str] = collections.Counter()
        self.sent = 0  # response body bytes sent
        self.in_flight = self.peak_in_flight = 0  # requests being served
        self.busy_s = 0.0  # the integral of in_flight over time: / seconds = mean
        self._since = time.monotonic()
        self._bucket = TokenBucket(bytes_per_s) if bytes_per_s else None
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
            if not self._faults:
                return None
            self._due = self._due or self._seen % self._every == 0
            fault = self._faults[self._turn % len(self._faults)]
            if not self._due or (fault == "truncate" and not has_body):
                return None
            self._due, self._turn = False, self._turn + 1
            self.counts[fault] += 1
            return fault

    def _count(self, change: int) -> None:
        with self._lock:
            now = time.monotonic()
            self.busy_s += self.in_flight * (now - self._since)
            self._since, self.in_flight = now, self.in_flight + change
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)

    def stats(self) -> dict[str, float]:
        """Requests seen, body bytes sent, the most served at once, and the
        seconds of requests in flight summed (`busy_s`), so far."""
        self._count(0)
        with self._lock:
            return {
                "requests": self.counts["latency"],
                "sent": self.sent,
                "peak_in_flight": self.peak_in_flight,
                "busy_s": self.busy_s,
            }

    def _serve(self, handler: http.server.BaseHTTPRequestHandler) -> None:
        self._count(+1)
        try:
            self._forward(handler)
        finally:
            self._count(-1)

    def _forward(self, handler: http.server.BaseHTTPRequestHandler) -> None:
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
            kept = [(k, v) for k, v in response.getheaders() if k.lower() not in _HOP]
            size = response.getheader("Content-Length")
            if handler.command == "HEAD":  # the object's length, and no body
                kept.append(("Content-Length", size or "0"))
                self._reply(handler, response.status, kept, b"", send=0)
                return
            # Streamed as it comes (a store's bytes pass a link, not a buffer),
            # unless it has no length.
            body = response if size is not None else response.read()
            size = int(size) if size is not None else len(body)
            kept.append(("Content-Length", str(size)))
            cut = fault == "truncate" and size > 1
            self._reply(handler, response.status, kept, body, send=size // 2 if cut else size)
            if cut:
                handler.close_connection = True
        finally:
            upstream.close()

    def _reply(
        self, handler, status: int, headers: list, body: bytes | BinaryIO, send: int | None = None
    ) -> None:
        """Sends ``headers`` and ``send`` bytes of ``body`` (all of it, and its
        ``Content-Length``, by default), through the bucket if capped."""
        handler.send_response_only(status)
        for name, value in headers:
            handler.send_header(name, value)
        if send is None:
            send = len(body)
            handler.send_header("Content-Length", str(send))
        handler.end_headers()  # the status line and headers are sent here, uncapped
        if handler.command == "HEAD":  # a reply to HEAD never has a body (RFC 9110 9.3.2)
            send = 0
        reader = io.BytesIO(body) if isinstance(body, bytes) else body
        while send > 0:
            chunk = reader.read(min(_CHUNK, send))
            if not chunk:
                break
            if self._bucket is not None:
                self._bucket.take(len(chunk))
            handler.wfile.write(chunk)
            send -= len(chunk)
            with self._lock:
                self.sent += len(chunk)
        handler.wfile.flush()
