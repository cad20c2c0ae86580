"""A real HTTP server on loopback for the request-timing unit tests: a fixed payload, 404 at ``/missing``, 503 at
``/busy``, kept-alive connections (so one connection can carry several requests)."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from contextlib import contextmanager

PAYLOAD = bytes(range(256)) * 40  # 10,240 bytes


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):  # noqa: N802 (http.server's naming)
        status = {"/missing": 404, "/busy": 503}.get(self.path, 200)
        body = PAYLOAD if status == 200 else b"no"
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_HEAD(self):  # noqa: N802
        self.send_response(200)
        self.send_header("Content-Length", str(len(PAYLOAD)))
        self.end_headers()

    def log_message(self, *args):
        pass


@contextmanager
def serving() -> Iterator[str]:
    """The server's ``host:port``, for as long as the block runs."""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
