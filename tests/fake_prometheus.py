"""A real Prometheus (Debian package, /usr/bin/prometheus) on 127.0.0.1 scraping a dcgm-exporter stand-in whose MIG
series a test sets at will. Skips the test when the binary is missing."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

PROMETHEUS = os.environ.get("GPUFLEET_PROMETHEUS_BINARY", "/usr/bin/prometheus")


def mig_series(host: str, gi: int, profile: str, activity: float, host_label: str = "Hostname") -> str:
    """One MIG instance's DCGM_FI_PROF_GR_ENGINE_ACTIVE line, labelled as dcgm-exporter labels it (the host label
    is `Hostname` in released images, `hostname` in newer ones)."""
    return (
        f'DCGM_FI_PROF_GR_ENGINE_ACTIVE{{gpu="0",GPU_I_ID="{gi}",GPU_I_PROFILE="{profile}",{host_label}="{host}"}} '
        f"{activity}\n"
    )


class Exporter:
    """Serves the current `text` as a dcgm-exporter scrape."""

    def __init__(self) -> None:
        self.text = ""
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                payload = ("# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge\n" + owner.text).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def query(url: str, promql: str) -> list:
    with urllib.request.urlopen(f"{url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}", timeout=5) as r:
        return json.loads(r.read())["data"]["result"]


def busy_count(url: str, host: str, profile: str) -> int:
    series = f'DCGM_FI_PROF_GR_ENGINE_ACTIVE{{Hostname="{host}",GPU_I_PROFILE="{profile}"}} > 0.05'
    return sum(int(float(s["value"][1])) for s in query(url, f"count({series})"))


def wait_for(what: str, check: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if check():
                return
        time.sleep(0.3)
    pytest.fail(f"timed out waiting for {what}")


@contextlib.contextmanager
def prometheus(tmp_path: Path) -> Iterator[tuple[str, Exporter]]:
    """(Prometheus' URL, the exporter it scrapes every second); both stopped on exit."""
    if shutil.which(PROMETHEUS) is None:
        pytest.skip(f"Prometheus binary {PROMETHEUS} not found (Debian package 'prometheus')")
    exporter = Exporter()
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: dcgm-exporter\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{exporter.port}']\n"
    )
    with (tmp_path / "prometheus.log").open("w") as log:
        process = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        yield f"http://127.0.0.1:{port}", exporter
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)
        exporter.server.shutdown()
        exporter.server.server_close()
