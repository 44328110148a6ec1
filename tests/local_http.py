"""An HTTP server on 127.0.0.1, on a thread of its own, for the tests' fake
stores and proxies (not a test itself; standard library only)."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Callable


class LocalHTTPServer:
    """``with LocalHTTPServer(serve, name):`` calls ``serve(handler)`` for each
    request, of any method, on ``url``; keep-alive (HTTP/1.1), as a real store."""

    def __init__(
        self,
        serve: Callable[[http.server.BaseHTTPRequestHandler], None],
        name: str,
        server_class: type[http.server.HTTPServer] = http.server.ThreadingHTTPServer,
    ):
        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:  # quiet
                pass

            def do_GET(self) -> None:
                serve(self)

            do_HEAD = do_PUT = do_POST = do_DELETE = do_GET

        self._server = server_class(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name=name, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
