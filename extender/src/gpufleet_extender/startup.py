"""Answer probes from the first moments of the process, before the web stack is imported.

Importing FastAPI, pydantic and uvicorn takes the better part of a second (several on a busy node); a kubelet
probing ``/healthz`` in that window would see connection refused. ``serve`` therefore binds its listening socket
first, with the standard library only, and answers on it from a thread:

- ``GET /healthz`` → 200 ``{"status":"starting"}``: the process is alive;
- anything else → 503 ``{"status":"starting"}`` with ``Retry-After: 1``: ``/readyz`` is not ready, and the scheduler
  verbs must not be decided before settings and metrics are loaded (kube-scheduler counts a 503 as an error, the
  same as a refused connection, so nothing is lost).

When uvicorn is ready, ``handover()`` stops the thread and returns the same socket: connections waiting in its
backlog are accepted by uvicorn, so there is no moment when the port is closed.

This module must stay import-light (standard library only): its whole point is to run before the heavy imports.
"""

from __future__ import annotations

import socket
import threading

_READ_LIMIT = 8192  # a probe's request head is a few hundred bytes
_CLIENT_TIMEOUT_SECONDS = 1.0
_POLL_SECONDS = 0.02  # how long handover() may wait for the thread to notice

_BODY = b'{"status":"starting"}'


def _response(status: str) -> bytes:
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(_BODY)}\r\n"
        "Retry-After: 1\r\nConnection: close\r\n\r\n"
    )
    return head.encode("ascii") + _BODY


_HEALTHY = _response("200 OK")
_STARTING = _response("503 Service Unavailable")


def bind(host: str, port: int, backlog: int = 2048) -> socket.socket:
    """The listening socket uvicorn will serve on (``SO_REUSEADDR`` as uvicorn sets it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.listen(backlog)
    return sock


def _answer(conn: socket.socket) -> None:
    with conn:
        conn.settimeout(_CLIENT_TIMEOUT_SECONDS)
        head = b""
        try:
            while b"\r\n\r\n" not in head and len(head) < _READ_LIMIT:
                chunk = conn.recv(_READ_LIMIT)
                if not chunk:
                    return
                head += chunk
            request_line = head.split(b"\r\n", 1)[0].split()
            healthz = len(request_line) >= 2 and request_line[0] == b"GET" and request_line[1] == b"/healthz"
            conn.sendall(_HEALTHY if healthz else _STARTING)
        except OSError:
            pass  # a client gone or too slow: it retries, as probes do


class StartupResponder:
    """Answers probes on ``sock`` from a daemon thread until ``handover()``."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="startup-responder", daemon=True)

    def start(self) -> StartupResponder:
        self._sock.settimeout(_POLL_SECONDS)
        self._thread.start()
        return self

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # the socket was closed under us: the process is exiting
            _answer(conn)

    def handover(self) -> socket.socket:
        """Stop answering and give the socket back, blocking again, for the real server."""
        self._stop.set()
        self._thread.join()
        self._sock.settimeout(None)
        return self._sock
