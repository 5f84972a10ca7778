"""Prometheus for the tests and benchmarks: launch() starts a real one (Debian's package, /usr/bin/prometheus, or
GPUFLEET_PROMETHEUS_BINARY) on 127.0.0.1, the one way every suite starts it; Exporter is the dcgm-exporter stand-in
it scrapes; prometheus() is both, with MIG series a test sets at will (skipped when the binary is missing)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpufleet_testsupport import servers
from gpufleet_testsupport.ports import free_port
from gpufleet_testsupport.processes import stop_process
from gpufleet_testsupport.servers import QuietHandler

PROMETHEUS = os.environ.get("GPUFLEET_PROMETHEUS_BINARY", "/usr/bin/prometheus")


def mig_series(host: str, gi: int, profile: str, activity: float, host_label: str = "Hostname") -> str:
    """One MIG instance's DCGM_FI_PROF_GR_ENGINE_ACTIVE line, labelled as dcgm-exporter labels it (the host label
    is `Hostname` in released images, `hostname` in newer ones)."""
    return (
        f'DCGM_FI_PROF_GR_ENGINE_ACTIVE{{gpu="0",GPU_I_ID="{gi}",GPU_I_PROFILE="{profile}",{host_label}="{host}"}} '
        f"{activity}\n"
    )


class Exporter:
    """A dcgm-exporter stand-in on 127.0.0.1 until close() (or the end of a `with` block): answers each path with
    `page(path)`, 404 where that is None; by default every path with the current `text`, which a test sets at will."""

    def __init__(self, page: Callable[[str], str | None] | None = None) -> None:
        self.text = ""
        page = page or (lambda _path: "# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge\n" + self.text)

        class Handler(QuietHandler):
            def do_GET(self) -> None:
                text = page(self.path)
                self.send_body(b"" if text is None else text.encode(), status=404 if text is None else 200)

        self.server = servers.start(Handler)
        self.port = self.server.server_address[1]

    def close(self) -> None:
        servers.stop(self.server)

    def __enter__(self) -> Exporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def query(url: str, promql: str) -> list:
    with urllib.request.urlopen(f"{url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}", timeout=5) as r:
        return json.loads(r.read())["data"]["result"]


def busy_count(url: str, host: str, profile: str) -> int:
    series = f'DCGM_FI_PROF_GR_ENGINE_ACTIVE{{Hostname="{host}",GPU_I_PROFILE="{profile}"}} > 0.05'
    return sum(int(float(s["value"][1])) for s in query(url, f"count({series})"))


def launch(
    workdir: Path, config: str | None = None, port: int | None = None, binary: str = PROMETHEUS
) -> tuple[subprocess.Popen, str]:
    """A real Prometheus on 127.0.0.1 and its URL, returned at once (the caller waits for what it needs): `config`
    written as workdir/prometheus.yml (None: the one already there, for a restart), its TSDB in workdir/tsdb, its log
    appended to workdir/prometheus.log; `port` a given one (a restart on the same address), else a free one. Stop it
    with processes.stop_process."""
    path = workdir / "prometheus.yml"
    if config is not None:
        path.write_text(config)
    port = port or free_port()
    with (workdir / "prometheus.log").open("a") as log:
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={path}",
                f"--storage.tsdb.path={workdir / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    return process, f"http://127.0.0.1:{port}"


@contextlib.contextmanager
def prometheus(tmp_path: Path) -> Iterator[tuple[str, Exporter]]:
    """(Prometheus' URL, the exporter it scrapes every second); both stopped on exit."""
    if shutil.which(PROMETHEUS) is None:
        pytest.skip(f"Prometheus binary {PROMETHEUS} not found (Debian package 'prometheus')")
    with Exporter() as exporter:
        process, url = launch(
            tmp_path,
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: dcgm-exporter\n"
            f"    static_configs:\n      - targets: ['127.0.0.1:{exporter.port}']\n",
        )
        try:
            yield url, exporter
        finally:
            stop_process(process)
