"""One local HTTP server: a handler class served on 127.0.0.1 from a thread, shut down and closed on exit."""

from __future__ import annotations

import contextlib
import json
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class QuietHandler(BaseHTTPRequestHandler):
    """A request handler that keeps the test output free of access-log lines."""

    def log_message(self, *args: object) -> None:
        pass

    def send_body(self, payload: bytes, content_type: str = "text/plain; version=0.0.4", status: int = 200) -> None:
        """One whole answer: status, Content-Type, Content-Length and the payload (to a client that may have given
        up: a scraper past its timeout tries again, which is no error of the server's)."""
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        with contextlib.suppress(ConnectionError):
            self.wfile.write(payload)

    def send_json(self, body: object, status: int = 200) -> None:
        self.send_body(json.dumps(body).encode(), "application/json", status)


def start(
    handler: type[BaseHTTPRequestHandler],
    tls: ssl.SSLContext | None = None,
    server_class: type[ThreadingHTTPServer] = ThreadingHTTPServer,
) -> ThreadingHTTPServer:
    """`handler` served on a free 127.0.0.1 port from a daemon thread (https with `tls`, or as `server_class` does
    it); stop it with stop()."""
    server = server_class(("127.0.0.1", 0), handler)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def stop(server: ThreadingHTTPServer) -> None:
    server.shutdown()
    server.server_close()


def url(server: ThreadingHTTPServer, scheme: str = "") -> str:
    """http(s)://127.0.0.1:<port> of a started server."""
    scheme = scheme or ("https" if isinstance(server.socket, ssl.SSLSocket) else "http")
    return f"{scheme}://127.0.0.1:{server.server_address[1]}"


@contextlib.contextmanager
def serve(
    handler: type[BaseHTTPRequestHandler],
    tls: ssl.SSLContext | None = None,
    server_class: type[ThreadingHTTPServer] = ThreadingHTTPServer,
) -> Iterator[ThreadingHTTPServer]:
    """`handler` served on 127.0.0.1 for the `with` block (its port: `.server_address[1]`, or url(server))."""
    server = start(handler, tls, server_class)
    try:
        yield server
    finally:
        stop(server)
