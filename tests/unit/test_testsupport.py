"""The shared set-up (gpufleet_testsupport) itself: the wait, the one local HTTP server, the exporter stand-in."""

from __future__ import annotations

import socket

import httpx
import pytest
from gpufleet_testsupport import servers
from gpufleet_testsupport.ports import free_port
from gpufleet_testsupport.prometheus import Exporter
from gpufleet_testsupport.servers import QuietHandler
from gpufleet_testsupport.waits import wait_for


def test_wait_for_returns_the_first_truthy_value_and_counts_errors_as_not_yet():
    answers = iter([OSError("refused"), httpx.ConnectError("refused"), 0, [], {"ready": True}])

    def condition():
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert wait_for(condition, timeout=5, interval=0) == {"ready": True}


def test_wait_for_fails_naming_what_and_the_last_answer():
    with pytest.raises(pytest.fail.Exception, match=r"waiting for the moon \(last: OSError\('refused'\)\)"):
        wait_for(lambda: (_ for _ in ()).throw(OSError("refused")), timeout=0.1, interval=0.01, what="the moon")


def test_wait_for_lets_other_errors_through():
    with pytest.raises(KeyError):
        wait_for(lambda: {}["missing"], timeout=5)


def test_serve_answers_on_127_0_0_1_and_closes_the_port_on_exit():
    class Handler(QuietHandler):
        def do_GET(self):
            self.send_json({"path": self.path}, 418)

    with servers.serve(Handler) as server:
        host, port = server.server_address[:2]
        assert host == "127.0.0.1"
        answer = httpx.get(f"{servers.url(server)}/x")
        assert (answer.status_code, answer.json()) == (418, {"path": "/x"})
    with socket.socket() as probe, pytest.raises(ConnectionRefusedError):
        probe.connect(("127.0.0.1", port))


def test_the_exporter_serves_its_page_and_404_where_there_is_none():
    with Exporter({"/metrics": "up 1\n"}.get) as exporter:
        base = f"http://127.0.0.1:{exporter.port}"
        assert httpx.get(f"{base}/metrics").text == "up 1\n"
        assert httpx.get(f"{base}/other").status_code == 404
    with Exporter() as exporter:
        exporter.text = 'DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="0"} 0.5\n'
        text = httpx.get(f"http://127.0.0.1:{exporter.port}/metrics").text
        assert text == '# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge\nDCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="0"} 0.5\n'


def test_free_port_is_free():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", free_port()))
