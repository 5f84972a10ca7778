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
import time
from collections.abc import Callable

CHUNK = 65536


class RoundRobinProxy:
    def __init__(
        self,
        backends: list[tuple[str, int]],
        on_send: Callable[[int, bytes], None] | None = None,
        drop_after: float = 0.0,
    ):
        self.backends = list(backends)
        self.alive = [True] * len(backends)
        self.connections = [0] * len(backends)  # client connections sent to each backend
        self.dropped: list[int] = []  # backends dropped after a failed connect, in order
        # A Service slow to drop a dead endpoint: for this long after a backend's first failed connect, connections
        # still go to it in turn and fail (the client's connection is closed), then it is dropped.
        self.drop_after = drop_after
        self.failed_connects = [0] * len(backends)  # client connections lost on a dead backend
        self._first_failure: dict[int, float] = {}
        self.on_send = on_send or (lambda backend, data: None)
        self._next = 0
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._clients: dict[int, set[socket.socket]] = {i: set() for i in range(len(backends))}  # open, by backend
        self._accepted = 0  # client connections accepted so far; each has its number, from 1
        self._closed_upto: dict[int, int] = {}  # backend -> its connections numbered up to this are to be ended
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
            with self._lock:
                self._accepted += 1
                number = self._accepted
            threading.Thread(target=self._serve, args=(client, number), name="proxy-conn", daemon=True).start()

    def _pick(self) -> int | None:
        with self._lock:
            live = [i for i in range(len(self.backends)) if self.alive[i]]
            if not live:
                return None
            index = next((i for i in live if i >= self._next), live[0])
            self._next = index + 1
            return index

    def send_next_to(self, index: int) -> None:
        """The next client connection goes to backend `index` (as a Service's random pick may send it)."""
        with self._lock:
            self._next = index

    def close_connections_to(self, index: int) -> None:
        """End the client connections of backend `index`, as the backend's keep-alive timeout ends idle ones: the
        client's next request needs a new connection. Every connection accepted so far is ended, those open and those
        still connecting to the backend (a client may be dialing one at that moment)."""
        with self._lock:
            self._closed_upto[index] = self._accepted
            clients = list(self._clients[index])
        for client in clients:
            with contextlib.suppress(OSError):
                client.shutdown(socket.SHUT_RDWR)

    def _connect(self) -> tuple[int, socket.socket] | None:
        while (index := self._pick()) is not None:
            try:
                return index, socket.create_connection(self.backends[index], timeout=2)
            except OSError:
                with self._lock:
                    self.failed_connects[index] += 1
                    first = self._first_failure.setdefault(index, time.monotonic())
                    slow_to_drop = time.monotonic() - first < self.drop_after
                    if self.alive[index] and not slow_to_drop:
                        self.alive[index] = False
                        self.dropped.append(index)
                if slow_to_drop:
                    return None  # the connection went to the dead endpoint: it fails, no other is tried
        return None

    def _serve(self, client: socket.socket, number: int) -> None:
        picked = self._connect()
        if picked is None:
            client.close()
            return
        index, backend = picked
        backend.settimeout(None)
        with self._lock:
            self.connections[index] += 1
            self._sockets |= {client, backend}
            self._clients[index].add(client)
            ended = number <= self._closed_upto.get(index, 0)  # close_connections_to ran while it connected
        if ended:
            with contextlib.suppress(OSError):
                client.shutdown(socket.SHUT_RDWR)
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
                self._clients[index].discard(sock)

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        with self._lock:
            open_sockets = list(self._sockets)
        for sock in open_sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


class ServiceProxy(RoundRobinProxy):
    """A RoundRobinProxy that sends new connections only to the backends whose readiness probe answers 200, as a
    Service sends only to ready endpoints: every `period` s it probes each backend's `probe_path` and admits or
    withdraws it. `admitted` records when each backend was admitted (index, time.monotonic()), in order; a
    backend can be replaced (`replace`: a restarted pod on a new port), and is then withdrawn until it is ready."""

    def __init__(self, backends: list[tuple[str, int]], probe_path: str = "/readyz", period: float = 0.5, **kwargs):
        super().__init__(backends, **kwargs)
        self.probe_path, self.period = probe_path, period
        self.alive = [False] * len(self.backends)  # nothing is ready before its first probe
        self.admitted: list[tuple[int, float]] = []
        threading.Thread(target=self._probe_loop, name="proxy-probe", daemon=True).start()

    def replace(self, index: int, backend: tuple[str, int]) -> None:
        with self._lock:
            self.backends[index] = backend
            self.alive[index] = False
            self._first_failure.pop(index, None)

    def _ready(self, backend: tuple[str, int]) -> bool:
        try:
            with socket.create_connection(backend, timeout=1) as sock:
                sock.settimeout(1)
                sock.sendall(f"GET {self.probe_path} HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n".encode())
                return sock.recv(64).startswith(b"HTTP/1.1 200")
        except OSError:
            return False

    def _probe_loop(self) -> None:
        while not self._closed.wait(self.period):
            for index, backend in enumerate(list(self.backends)):
                ready = self._ready(backend)
                with self._lock:
                    if backend != self.backends[index]:
                        continue  # replaced while probing
                    if ready and not self.alive[index]:
                        self.admitted.append((index, time.monotonic()))
                    self.alive[index] = ready
