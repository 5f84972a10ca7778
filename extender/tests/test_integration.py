"""End to end on 127.0.0.1: the real uvicorn server, and a real Prometheus scraping a fake dcgm-exporter.

Prometheus comes from Debian's package (/usr/bin/prometheus). Without it these tests skip, unless
GPUFLEET_REQUIRE_PROMETHEUS=1 (CI) makes its absence a failure. Every process started here is stopped by PID.
"""

from __future__ import annotations

import asyncio
import http.server
import json
import os
import shutil
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from gpufleet_testsupport import servers
from gpufleet_testsupport.controlplane import serving_files
from gpufleet_testsupport.exposition import render_exposition
from gpufleet_testsupport.extender import start_extender
from gpufleet_testsupport.ports import free_port
from gpufleet_testsupport.processes import stop_process
from gpufleet_testsupport.prometheus import Exporter, launch
from gpufleet_testsupport.scheduler_requests import make_pod, names_args
from gpufleet_testsupport.servers import QuietHandler
from gpufleet_testsupport.waits import wait_for

from gpufleet_extender.metrics_source import MetricsSourceError, PrometheusSource

from extender_helpers import gpus, mig, write_metrics

pytestmark = pytest.mark.integration

PROMETHEUS = os.environ.get("GPUFLEET_PROMETHEUS_BINARY", "/usr/bin/prometheus")
GPU_POD = make_pod({"nvidia.com/gpu": "1"})
MIG_POD = make_pod({"nvidia.com/mig-3g.40gb": "1"})


class FakeDcgmExporter(Exporter):
    """Serves dcgm-exporter text for a fleet that the test changes at will."""

    def __init__(self, fleet: dict):
        self.fleet = fleet
        super().__init__(lambda _path: render_exposition(self.fleet, host_label="Hostname"))


def filter_names(url: str, pod: dict, names: list[str]) -> dict:
    answer = httpx.post(f"{url}/filter", json=names_args(pod, names), timeout=5)
    assert answer.status_code == 200, answer.text
    return answer.json()


def scores(url: str, pod: dict, names: list[str]) -> dict[str, int]:
    answer = httpx.post(f"{url}/prioritize", json=names_args(pod, names), timeout=5)
    assert answer.status_code == 200, answer.text
    return {entry["Host"]: entry["Score"] for entry in answer.json()}


def test_serve_with_a_config_file_over_real_http(tmp_path):
    metrics = write_metrics(tmp_path / "dcgm.prom", {"n1": gpus(0.1), "n2": gpus(0.95)})
    config = tmp_path / "extender.yaml"
    config.write_text(f"METRICS_SOURCE: file\nMETRICS_FILE: {metrics}\nMETRICS_REFRESH_SECONDS: 0.2\n")
    process, url = start_extender(tmp_path, {"KUBE_API": "off"}, "--config", str(config), ready=False)
    try:
        assert filter_names(url, GPU_POD, ["n1", "n2"])["NodeNames"] == ["n1"]
        assert httpx.post(f"{url}/filter", content=b"{", timeout=5).status_code == 400
        assert httpx.get(f"{url}/readyz").status_code == 200
        assert "gpufleet_extender_request_duration_seconds_bucket" in httpx.get(f"{url}/metrics").text
    finally:
        stop_process(process)


def test_bad_settings_stop_the_server_with_exit_code_2(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "gpufleet_extender", "serve", "--port", str(free_port())],
        env={**os.environ, "ON_MISSING_METRICS": "sometimes"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "ON_MISSING_METRICS" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("tls_args", "says"),
    [
        (["--tls-cert-file", "/nonexistent/tls.crt"], "--tls-cert-file and --tls-key-file go together"),
        (["--tls-client-ca-file", "/nonexistent/ca.crt"], "--tls-client-ca-file needs --tls-cert-file"),
        (["--tls-cert-file", "/nonexistent/tls.crt", "--tls-key-file", "/nonexistent/tls.key"], "cannot use the TLS"),
    ],
)
def test_unusable_tls_files_stop_the_server_with_exit_code_2(tls_args, says):
    result = subprocess.run(
        [sys.executable, "-m", "gpufleet_extender", "serve", "--port", str(free_port()), *tls_args],
        env={**os.environ, "KUBE_API": "off"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert says in result.stderr and "Traceback" not in result.stderr


@pytest.fixture
def prometheus_binary() -> str:
    if shutil.which(PROMETHEUS) is None:
        message = f"Prometheus binary {PROMETHEUS} not found (Debian package 'prometheus')"
        if os.environ.get("GPUFLEET_REQUIRE_PROMETHEUS") == "1":
            pytest.fail(message + " and GPUFLEET_REQUIRE_PROMETHEUS=1")
        pytest.skip(message)
    return PROMETHEUS


@pytest.fixture
def prometheus(prometheus_binary, tmp_path) -> Iterator[tuple[str, FakeDcgmExporter, subprocess.Popen]]:
    fleet = {
        "hk-gpu-01": gpus(0.05, 0.10),
        "hk-gpu-02": gpus(0.95, 0.90),
        "hk-gpu-17": [*mig(0, "3g.40gb", 0.92, 0.97), *mig(1, "3g.40gb", 0.20, first_id=3)],
    }
    with FakeDcgmExporter(fleet) as exporter:
        process, url = launch(
            tmp_path,
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            "scrape_configs:\n  - job_name: dcgm-exporter\n"
            f"    static_configs:\n      - targets: ['127.0.0.1:{exporter.port}']\n",
            binary=prometheus_binary,
        )
        try:

            def series_present():
                answer = httpx.get(f"{url}/api/v1/query", params={"query": "DCGM_FI_PROF_GR_ENGINE_ACTIVE"})
                return (
                    answer.status_code == 200 and len(answer.json()["data"]["result"]) == 3
                )  # MIG instances of hk-gpu-17

            wait_for(series_present, what="Prometheus to scrape the fake dcgm-exporter")
            yield url, exporter, process
        finally:
            stop_process(process)


def test_decisions_follow_prometheus_and_the_policy_applies_when_it_stops(prometheus, tmp_path):
    prometheus_url, exporter, prometheus_process = prometheus
    env = {
        "PROMETHEUS_URL": prometheus_url,
        "METRICS_REFRESH_SECONDS": "0.5",
        "METRICS_MAX_AGE_SECONDS": "4",
        "PROMETHEUS_TIMEOUT_SECONDS": "3",
        "ON_MISSING_METRICS": "deny",
    }
    extender, url = start_extender(tmp_path, {"KUBE_API": "off", **env}, ready=False)
    try:
        names = ["hk-gpu-01", "hk-gpu-02", "hk-gpu-17"]
        wait_for(lambda: httpx.get(f"{url}/readyz").status_code == 200, what="fresh metrics")
        first = filter_names(url, GPU_POD, names)
        assert first["NodeNames"] == ["hk-gpu-01"]
        assert "util 0.90 > 0.80" in first["FailedNodes"]["hk-gpu-02"]
        assert "no nvidia.com/gpu GPU in the metrics" in first["FailedNodes"]["hk-gpu-17"]
        assert filter_names(url, MIG_POD, names)["NodeNames"] == ["hk-gpu-17"]
        before = scores(url, GPU_POD, ["hk-gpu-01", "hk-gpu-02"])
        assert before["hk-gpu-01"] > before["hk-gpu-02"]

        # The load moves: the exporter now reports hk-gpu-01 busy and hk-gpu-02 idle.
        exporter.fleet = {**exporter.fleet, "hk-gpu-01": gpus(0.97, 0.99), "hk-gpu-02": gpus(0.0, 0.02)}
        wait_for(
            lambda: filter_names(url, GPU_POD, names)["NodeNames"] == ["hk-gpu-02"],
            what="decisions to follow the new load",
        )
        after = scores(url, GPU_POD, ["hk-gpu-01", "hk-gpu-02"])
        assert after["hk-gpu-02"] > after["hk-gpu-01"]

        # Prometheus goes away: samples age past METRICS_MAX_AGE_SECONDS, the deny policy applies,
        # and answers do not wait for Prometheus (its timeout is 3 s).
        stop_process(prometheus_process)
        wait_for(lambda: httpx.get(f"{url}/readyz").status_code == 503, what="readyz to report stale metrics")
        for _ in range(5):
            started = time.monotonic()
            result = filter_names(url, GPU_POD, names)
            assert time.monotonic() - started < 1.0
            assert result["NodeNames"] == []
            assert "(ON_MISSING_METRICS=deny)" in result["FailedNodes"]["hk-gpu-02"]
        metrics = httpx.get(f"{url}/metrics").text
        assert 'gpufleet_extender_metrics_source_errors_total{source="prometheus"}' in metrics
        assert 'gpufleet_extender_filter_decisions_total{outcome="missing_metrics_denied"}' in metrics
        assert "gpufleet_extender_ready 0.0" in metrics
    finally:
        stop_process(extender)


def test_a_4mb_body_does_not_stall_the_event_loop(tmp_path):
    # ~170,000 names no snapshot knows: deciding them takes a while in Python. On the event loop that would hold
    # up every other request; decided on a worker thread, /healthz keeps answering meanwhile.
    metrics = write_metrics(tmp_path / "dcgm.prom", {"n1": gpus(0.1)})
    env = {"METRICS_SOURCE": "file", "METRICS_FILE": str(metrics), "ON_MISSING_METRICS": "deny"}
    names = [f"unknown-node-{i:06d}" for i in range(170_000)]
    content = json.dumps(names_args(GPU_POD, names)).encode()
    assert 3_500_000 < len(content) < 4 * 1024 * 1024
    done: dict[str, float] = {}
    process, url = start_extender(tmp_path, {"KUBE_API": "off", **env}, ready=False)  # stopped in the finally below

    def big_request():
        started = time.monotonic()
        answer = httpx.post(f"{url}/prioritize", content=content, timeout=60)
        done["status"], done["seconds"] = answer.status_code, time.monotonic() - started

    try:
        worker = threading.Thread(target=big_request)
        worker.start()
        latencies = []
        with httpx.Client(base_url=url, timeout=60) as client:
            while worker.is_alive():
                started = time.monotonic()
                assert client.get("/healthz").status_code == 200
                latencies.append(time.monotonic() - started)
                time.sleep(0.01)
        worker.join()
        assert done["status"] == 200
        # A blocked loop answers /healthz only once the big request is done: its latency is about that long.
        assert len(latencies) >= 3 and max(latencies) < max(0.2, done["seconds"] / 3), (latencies, done)
    finally:
        stop_process(process)


def test_out_of_range_values_through_a_real_prometheus_leave_the_node_to_the_policy(prometheus, tmp_path):
    prometheus_url, exporter, _process = prometheus
    env = {
        "PROMETHEUS_URL": prometheus_url,
        "METRICS_REFRESH_SECONDS": "0.5",
        "PROMETHEUS_TIMEOUT_SECONDS": "3",
        "ON_MISSING_METRICS": "deny",
    }
    extender, url = start_extender(tmp_path, {"KUBE_API": "off", **env}, ready=False)
    try:
        names = ["hk-gpu-01", "hk-gpu-02"]
        wait_for(lambda: filter_names(url, GPU_POD, names)["NodeNames"] == ["hk-gpu-01"], what="fresh metrics")
        # A broken exporter reports -20 % on the idle-looking node: once that would have won the best score.
        exporter.fleet = {**exporter.fleet, "hk-gpu-02": gpus(-0.2, 0.0)}

        def refused_as_missing():
            result = filter_names(url, GPU_POD, names)
            reason = result["FailedNodes"].get("hk-gpu-02", "")
            return "no GPU metrics for this node" in reason and result

        wait_for(refused_as_missing, what="hk-gpu-02 to count as without metrics")
        warnings = httpx.get(f"{url}/readyz").json()["metrics_source_warnings"]
        assert any("out of range on hk-gpu-02" in note for note in warnings), warnings
        metrics = httpx.get(f"{url}/metrics").text
        assert 'gpufleet_extender_metrics_faults_total{fault="out_of_range",source="prometheus"}' in metrics
    finally:
        stop_process(extender)


def test_series_are_read_only_from_the_exporters_job_and_namespace(prometheus_binary, tmp_path):
    """A tenant runs an exporter of its own that Prometheus scrapes too (its job, its namespace) and claims the
    busy node idle: pinned to the fleet exporter's job and namespace, the extender never sees it; unpinned, the
    fake series reach it (reported as duplicates, the decision then up to which came last)."""
    real = {"hk-gpu-01": gpus(0.05, 0.10), "hk-gpu-02": gpus(0.95, 0.90)}
    fake = {"hk-gpu-02": gpus(0.0, 0.0), "hk-gpu-66": gpus(0.0, 0.0)}
    with FakeDcgmExporter(real) as exporter, FakeDcgmExporter(fake) as impostor:
        process, prometheus_url = launch(
            tmp_path,
            "global:\n  scrape_interval: 1s\n"
            "scrape_configs:\n"
            "  - job_name: dcgm-exporter\n"
            f"    static_configs: [{{targets: ['127.0.0.1:{exporter.port}'],\n"
            "                      labels: {namespace: gpufleet-node-agents}}]\n"
            "  - job_name: dcgm-exporter-fake\n"
            f"    static_configs: [{{targets: ['127.0.0.1:{impostor.port}'], labels: {{namespace: finnlp}}}}]\n",
            binary=prometheus_binary,
        )
        try:

            def both_scraped():
                answer = httpx.get(f"{prometheus_url}/api/v1/query", params={"query": "count(DCGM_FI_DEV_GPU_UTIL)"})
                result = answer.json()["data"]["result"] if answer.status_code == 200 else []
                return result and result[0]["value"][1] == "8"  # 2 GPUs x 4 nodes' worth of series

            wait_for(both_scraped, what="Prometheus to scrape both exporters")
            base = {"PROMETHEUS_URL": prometheus_url, "METRICS_REFRESH_SECONDS": "0.5", "ON_MISSING_METRICS": "deny"}
            pinned_env = {**base, "EXPORTER_JOB": "dcgm-exporter", "EXPORTER_NAMESPACE": "gpufleet-node-agents"}
            names = ["hk-gpu-01", "hk-gpu-02", "hk-gpu-66"]
            pinned, pinned_url = start_extender(tmp_path, {"KUBE_API": "off", **pinned_env}, ready=False)
            open_, open_url = start_extender(tmp_path, {"KUBE_API": "off", **base}, ready=False)
            try:
                wait_for(lambda: httpx.get(f"{pinned_url}/readyz").status_code == 200, what="fresh metrics")
                result = filter_names(pinned_url, GPU_POD, names)
                assert result["NodeNames"] == ["hk-gpu-01"]
                assert "util 0.90 > 0.80" in result["FailedNodes"]["hk-gpu-02"]
                assert "no GPU metrics for this node" in result["FailedNodes"]["hk-gpu-66"]
                assert httpx.get(f"{pinned_url}/readyz").json().get("metrics_source_warnings") in (None, [])

                wait_for(lambda: httpx.get(f"{open_url}/readyz").status_code == 200, what="fresh metrics")
                assert "hk-gpu-66" in filter_names(open_url, GPU_POD, names)["NodeNames"]
                warnings = httpx.get(f"{open_url}/readyz").json()["metrics_source_warnings"]
                assert any("duplicate series" in warning for warning in warnings), warnings
            finally:
                stop_process(pinned)
                stop_process(open_)
        finally:
            stop_process(process)


class BearerTlsProxy:
    """https on 127.0.0.1 in front of Prometheus, as kube-rbac-proxy would be: a request without the expected bearer
    token gets 401; the others are passed on. ``token`` may change while it runs (a rotation)."""

    def __init__(self, upstream: str, cert: Path, key: Path, token: str):
        self.token = token
        self.seen: list[str | None] = []
        proxy = self

        class Handler(QuietHandler):
            def do_GET(self) -> None:
                authorization = self.headers.get("Authorization")
                proxy.seen.append(authorization)
                if authorization != f"Bearer {proxy.token}":
                    status, body, kind = 401, b"Unauthorized\n", "text/plain"
                else:
                    answer = httpx.get(upstream + self.path, timeout=5)
                    status, body, kind = answer.status_code, answer.content, answer.headers["content-type"]
                self.send_body(body, kind, status)

        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key)

        class Server(http.server.ThreadingHTTPServer):
            daemon_threads = True

            # The handshake runs in the request's thread: a client that refuses the certificate never blocks accept.
            def finish_request(self, request, client_address) -> None:
                request.settimeout(5)
                super().finish_request(context.wrap_socket(request, server_side=True), client_address)

            def handle_error(self, request, client_address) -> None:
                pass  # refused handshakes: the client's error is what the test checks

        self.server = servers.start(Handler, server_class=Server)
        self.url = servers.url(self.server, "https")

    def __enter__(self) -> BearerTlsProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        servers.stop(self.server)


def test_prometheus_over_https_with_a_pinned_ca_and_a_rotating_token(prometheus, tmp_path):
    prometheus_url, _exporter, _process = prometheus
    ca, cert, key = serving_files(tmp_path / "pki", "server", ("127.0.0.1",)).values()
    other_ca, _cert, _key = serving_files(tmp_path / "other", "server", ("127.0.0.1",)).values()
    token = tmp_path / "token"
    token.write_text("reader-1\n")
    with BearerTlsProxy(prometheus_url, cert, key, "reader-1") as proxy:

        def source(ca_file: Path | None) -> PrometheusSource:
            return PrometheusSource(proxy.url, ("Hostname", "hostname"), 3.0, ca_file=ca_file, token_file=token)

        snapshot = asyncio.run(source(ca).fetch(1))
        assert set(snapshot.nodes) == {"hk-gpu-01", "hk-gpu-02", "hk-gpu-17"}
        assert proxy.seen == ["Bearer reader-1"] * 2

        # The token is rotated (the Secret's file changes): the next refresh sends the new one.
        proxy.token = "reader-2"
        with pytest.raises(MetricsSourceError, match="HTTP 401"):
            asyncio.run(source(ca).fetch(2))
        token.write_text("reader-2")
        assert set(asyncio.run(source(ca).fetch(3)).nodes) == {"hk-gpu-01", "hk-gpu-02", "hk-gpu-17"}

        # A server whose certificate another CA issued (or no CA pinned: the system's) is not asked anything.
        proxy.seen.clear()
        for wrong in (other_ca, None):
            with pytest.raises(MetricsSourceError, match=r"Prometheus unreachable: ConnectError.*CERTIFICATE_VERIFY"):
                asyncio.run(source(wrong).fetch(4))
        assert proxy.seen == []
