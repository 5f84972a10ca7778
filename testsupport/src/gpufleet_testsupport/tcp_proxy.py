"""A small TCP round-robin proxy on 127.0.0.1, in front of replicas of a server: what a Kubernetes Service does for
its endpoints, as far as a client sees it. Each client connection goes to the next backend in turn and stays with
it (kube-proxy balances connections, not requests); a backend whose connect fails is dropped, as a Service drops
the endpoint of a dead pod, and the connection tries the next one.

`on_send` sees every chunk a client sends before it is forwarded (backend index, bytes): a test uses it to act at a
precise point of the traffic, for instance to kill a replica while a request is in flight on it.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable

CHUNK = 65536


class RoundRobinProxy:
    def __init__(self, backends: list[tuple[str, int]], on_send: Callable[[int, bytes], None] | None = None):
        self.backends = list(backends)
        self.alive = [True] * len(backends)
        self.connections = [0] * len(backends)  # client connections sent to each backend
        self.dropped: list[int] = []  # backends dropped after a failed connect, in order
        self.on_send = on_send or (lambda backend, data: None)
        self._next = 0
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._closed = threading.Event()
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), name="proxy-conn", daemon=True).start()

    def _pick(self) -> int | None:
        with self._lock:
            live = [i for i in range(len(self.backends)) if self.alive[i]]
            if not live:
                return None
            index = next((i for i in live if i >= self._next), live[0])
            self._next = index + 1
            return index

    def _connect(self) -> tuple[int, socket.socket] | None:
        while (index := self._pick()) is not None:
            try:
                return index, socket.create_connection(self.backends[index], timeout=2)
            except OSError:
                with self._lock:
                    if self.alive[index]:
                        self.alive[index] = False
                        self.dropped.append(index)
        return None

    def _serve(self, client: socket.socket) -> None:
        picked = self._connect()
        if picked is None:
            client.close()
            return
        index, backend = picked
        backend.settimeout(None)
        with self._lock:
            self.connections[index] += 1
            self._sockets |= {client, backend}
        done = threading.Event()

        def pipe(source: socket.socket, target: socket.socket, upstream: bool) -> None:
            with contextlib.suppress(OSError):
                while data := source.recv(CHUNK):
                    if upstream:
                        self.on_send(index, data)
                    target.sendall(data)
            done.set()

        threading.Thread(target=pipe, args=(backend, client, False), daemon=True).start()
        threading.Thread(target=pipe, args=(client, backend, True), daemon=True).start()
        done.wait()  # either direction ended (EOF, reset): close both, as a dead endpoint's connections end
        for sock in (client, backend):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
            with self._lock:
                self._sockets.discard(sock)

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        with self._lock:
            open_sockets = list(self._sockets)
        for sock in open_sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
