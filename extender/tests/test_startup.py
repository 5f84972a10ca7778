"""The start-up responder: probes are answered before the web stack is imported, and the port never closes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import httpx
import pytest

from gpufleet_extender import startup

from extender_helpers import gpus, write_metrics

STARTING = {"status": "starting"}


@pytest.fixture
def responder():
    sock = startup.bind("127.0.0.1", 0)
    answering = startup.StartupResponder(sock).start()
    try:
        yield answering, f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        answering.handover().close()


def test_healthz_is_alive_and_everything_else_is_not_ready_yet(responder):
    _, url = responder
    with httpx.Client(base_url=url, timeout=2) as client:
        healthz = client.get("/healthz")
        assert (healthz.status_code, healthz.json()) == (200, STARTING)
        for method, path in [("GET", "/readyz"), ("POST", "/filter"), ("POST", "/prioritize"), ("GET", "/metrics")]:
            answer = client.request(method, path, content=b"{}")
            # kube-scheduler counts a non-200 as an error and retries the pod: never a decision before settings load
            assert (answer.status_code, answer.json()) == (503, STARTING), path
            assert answer.headers["retry-after"] == "1"


def test_a_client_that_sends_nothing_does_not_block_the_probes(responder):
    _, url = responder
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as silent:
        silent.sendall(b"GET /heal")  # a head that never ends: dropped after the client timeout
        assert httpx.get(f"{url}/healthz", timeout=5).status_code == 200


def test_handover_keeps_the_port_open_and_stops_answering(responder):
    answering, _ = responder
    sock = answering.handover()
    assert sock.gettimeout() is None  # blocking again, as uvicorn expects
    port = sock.getsockname()[1]
    # Nobody answers now, but the kernel still queues connections for the next server: no "connection refused".
    with socket.create_connection(("127.0.0.1", port), timeout=2) as waiting:
        waiting.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        waiting.settimeout(0.3)
        with pytest.raises(TimeoutError):
            waiting.recv(100)
        conn, _ = sock.accept()  # the real server's first accept gets the queued client
        conn.close()


def test_a_port_in_use_is_a_one_line_error(capsys):
    from gpufleet_extender.cli import EXIT_CANNOT_LISTEN, main

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "--port", str(port)]) == EXIT_CANNOT_LISTEN
    err = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{port}" in err and "Traceback" not in err


@pytest.mark.integration
def test_serve_answers_from_its_first_moments_and_never_refuses(tmp_path):
    """A real `serve`: every poll from the first answer on gets an HTTP answer, until the app itself serves."""
    metrics = write_metrics(tmp_path / "dcgm.prom", {"n1": gpus(0.1)})
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "KUBE_API": "off", "METRICS_SOURCE": "file", "METRICS_FILE": str(metrics)}
    command = [sys.executable, "-m", "gpufleet_extender", "serve", "--port", str(port), "--log-level", "warning"]
    process = subprocess.Popen(command, env=env)
    seen: list[dict] = []
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5) as client:
            deadline = time.monotonic() + 60
            while not seen and time.monotonic() < deadline:
                try:
                    seen.append(client.get("/healthz").json())
                except httpx.ConnectError:
                    time.sleep(0.005)  # before the socket is bound
            while seen[-1] != {"status": "ok"} and time.monotonic() < deadline:
                seen.append(client.get("/healthz").json())  # a ConnectError here fails the test: the port closed
            assert process.poll() is None
            assert seen[-1] == {"status": "ok"}
            assert set(map(str, seen)) <= {str(STARTING), str({"status": "ok"})}
            assert client.get("/readyz").status_code == 200
    finally:
        process.terminate()
        process.wait(10)
