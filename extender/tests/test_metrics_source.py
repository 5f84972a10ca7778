"""Metrics sources: the file re-read only on change, Prometheus answers parsed, failures kept off requests."""

from __future__ import annotations

import asyncio
import os

import httpx
import pytest

from gpufleet_extender.metrics_source import (
    FileSource,
    MetricsSourceError,
    PrometheusSource,
    SnapshotRefresher,
    exporter_matchers,
)

from extender_helpers import gpus, mig, write_metrics

LABELS = ("Hostname", "hostname")


def run(coro):
    return asyncio.run(coro)


def test_file_source_rereads_only_when_the_file_changes(tmp_path):
    path = write_metrics(tmp_path / "m.prom", {"n1": gpus(0.1)})
    source = FileSource(path, LABELS)
    first = run(source.fetch(1))
    assert first.nodes["n1"].devices["nvidia.com/gpu"][0].util == pytest.approx(0.1)
    assert first.nodes["n1"].sample_time == pytest.approx(os.stat(path).st_mtime)
    assert run(source.fetch(2)) is None  # unchanged: nothing parsed
    write_metrics(path, {"n1": gpus(0.9), "n2": gpus(0.2)})
    os.utime(path, ns=(os.stat(path).st_atime_ns, os.stat(path).st_mtime_ns + 1_000_000))
    second = run(source.fetch(2))
    assert second.version == 2 and set(second.nodes) == {"n1", "n2"}
    assert second.nodes["n1"].devices["nvidia.com/gpu"][0].util == pytest.approx(0.9)


def test_file_source_errors(tmp_path):
    with pytest.raises(MetricsSourceError, match="cannot stat METRICS_FILE"):
        run(FileSource(tmp_path / "absent.prom", LABELS).fetch(1))
    bad = tmp_path / "bad.prom"
    bad.write_text('DCGM_FI_DEV_GPU_UTIL{gpu="0" 5\n')
    with pytest.raises(MetricsSourceError, match="not Prometheus text format"):
        run(FileSource(bad, LABELS).fetch(1))


def test_refresher_keeps_the_last_snapshot_and_counts_errors(tmp_path):
    path = write_metrics(tmp_path / "m.prom", {"n1": gpus(0.1)})
    errors: list[str] = []
    clock = iter([100.0, 101.0, 102.0, 103.0, 104.0])
    refresher = SnapshotRefresher(FileSource(path, LABELS), 5, on_error=errors.append, clock=lambda: next(clock))
    assert run(refresher.refresh_once()) is True
    version = refresher.snapshot.version
    assert run(refresher.refresh_once()) is True  # unchanged file: same version, age reset
    assert refresher.snapshot.version == version
    path.unlink()
    assert run(refresher.refresh_once()) is False
    assert errors == ["file"] and "cannot stat" in refresher.last_error
    assert set(refresher.snapshot.nodes) == {"n1"}  # previous data kept (and ageing)


def prometheus_answers(series, times, status=200):
    def handler(request: httpx.Request) -> httpx.Response:
        query = request.url.params["query"]
        result = times if "timestamp(" in query else series
        return httpx.Response(status, json={"status": "success", "data": {"resultType": "vector", "result": result}})

    return httpx.MockTransport(handler)


def vector(name, labels, value, ts=1000.0):
    return {"metric": {"__name__": name, **labels}, "value": [ts, str(value)]}


def test_prometheus_source_parses_instant_queries_and_sample_times():
    series = [
        vector("DCGM_FI_DEV_GPU_UTIL", {"gpu": "0", "Hostname": "n1"}, 40),
        vector("DCGM_FI_DEV_FB_USED", {"gpu": "0", "Hostname": "n1"}, 100),
        vector("DCGM_FI_DEV_FB_FREE", {"gpu": "0", "Hostname": "n1"}, 300),
        vector(
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
            {"gpu": "1", "GPU_I_ID": "3", "GPU_I_PROFILE": "1g.10gb", "hostname": "n2"},
            0.25,
        ),
    ]
    times = [
        {"metric": {"Hostname": "n1"}, "value": [1000.0, "990.5"]},
        {"metric": {"hostname": "n2"}, "value": [1000.0, "980"]},
    ]
    source = PrometheusSource("http://prom.invalid", LABELS, 1.0, transport=prometheus_answers(series, times))
    snap = run(source.fetch(7))
    gpu = snap.nodes["n1"].devices["nvidia.com/gpu"][0]
    assert (gpu.util, gpu.mem) == (pytest.approx(0.4), pytest.approx(0.25))
    assert snap.nodes["n1"].sample_time == 990.5 and snap.nodes["n2"].sample_time == 980.0
    assert snap.nodes["n2"].devices["nvidia.com/mig-1g.10gb"][0].util == 0.25
    assert snap.version == 7


def test_prometheus_source_failures_are_metrics_source_errors():
    def broken(request):
        return httpx.Response(400, json={"status": "error", "error": "parse error"})

    with pytest.raises(MetricsSourceError, match="parse error"):
        run(PrometheusSource("http://p.invalid", LABELS, 1.0, transport=httpx.MockTransport(broken)).fetch(1))

    def down(request):
        raise httpx.ConnectError("connection refused")

    with pytest.raises(MetricsSourceError, match="Prometheus unreachable"):
        run(PrometheusSource("http://p.invalid", LABELS, 1.0, transport=httpx.MockTransport(down)).fetch(1))

    def html(request):
        return httpx.Response(502, text="<html>bad gateway</html>")

    with pytest.raises(MetricsSourceError, match="without JSON"):
        run(PrometheusSource("http://p.invalid", LABELS, 1.0, transport=httpx.MockTransport(html)).fetch(1))


def test_prometheus_queries_name_the_configured_host_labels():
    seen = []

    def handler(request):
        seen.append(request.url.params["query"])
        return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": []}})

    run(
        PrometheusSource("http://p.invalid", ("node", "Hostname"), 1.0, transport=httpx.MockTransport(handler)).fetch(1)
    )
    metrics = ["DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"]
    # Both queries go out together (gather), so either may arrive first.
    assert sorted(seen) == sorted(
        [
            "max by (__name__, node, Hostname, gpu, UUID, GPU_I_ID, GPU_I_PROFILE, pod, namespace, exported_pod, "
            'exported_namespace) ({__name__=~"' + "|".join(metrics) + '"})',
            # the sample time from one metric every device reports: Prometheus' cost is per series read
            "max by (node, Hostname) (timestamp(DCGM_FI_DEV_FB_FREE))",
        ]
    )
    _ = mig

    seen.clear()
    matchers = exporter_matchers("dcgm-exporter", 'node-"agents"')
    pinned = PrometheusSource(
        "http://p.invalid", ("node",), 1.0, transport=httpx.MockTransport(handler), matchers=matchers
    )
    run(pinned.fetch(1))
    assert matchers == 'job="dcgm-exporter",namespace="node-\\"agents\\""'  # label values escaped
    assert all(q.count(matchers) == 1 for q in seen), seen
    assert exporter_matchers() == "" and exporter_matchers(namespace="n") == 'namespace="n"'


def test_a_stuck_refresh_is_an_error_not_a_silent_hang():
    class Hanging:
        name = "prometheus"
        report = None

        async def fetch(self, version):
            await asyncio.Event().wait()  # a source that never answers (mid-run trickle, hung mount)

    errors: list[str] = []
    refresher = SnapshotRefresher(Hanging(), 5, on_error=errors.append, deadline=0.2)

    async def timed():
        started = asyncio.get_running_loop().time()
        answered = await refresher.refresh_once()
        return answered, asyncio.get_running_loop().time() - started

    answered, seconds = run(timed())
    assert answered is False and seconds < 2
    assert errors == ["prometheus"] and "stuck for more than 0.2s" in refresher.last_error


def test_the_source_deadline_is_the_refreshers_default(tmp_path):
    source = PrometheusSource("http://p.invalid", LABELS, 1.5, transport=prometheus_answers([], []))
    assert SnapshotRefresher(source, 5)._deadline == 2.5
    assert SnapshotRefresher(FileSource(tmp_path / "m.prom", LABELS), 5)._deadline == FileSource.deadline


def test_the_token_file_is_read_at_each_refresh_so_a_rotated_token_is_sent(tmp_path):
    seen = []

    def answer(request):
        seen.append(request.headers.get("authorization"))
        return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": []}})

    token = tmp_path / "token"
    token.write_text("first\n")  # a trailing newline (echo, kubectl create secret --from-file) is not the token
    source = PrometheusSource("http://p.invalid", LABELS, 1.0, transport=httpx.MockTransport(answer), token_file=token)
    run(source.fetch(1))
    token.write_text("second")
    run(source.fetch(2))
    assert seen == ["Bearer first", "Bearer first", "Bearer second", "Bearer second"]  # two queries a refresh


@pytest.mark.parametrize(("content", "says"), [(None, "cannot read PROMETHEUS_TOKEN_FILE"), ("\n", "is empty")])
def test_a_missing_or_empty_token_fails_the_refresh_without_querying(tmp_path, content, says):
    queried = []
    token = tmp_path / "token"
    if content is not None:
        token.write_text(content)
    transport = httpx.MockTransport(lambda request: queried.append(request) or httpx.Response(200))
    source = PrometheusSource("http://p.invalid", LABELS, 1.0, transport=transport, token_file=token)
    with pytest.raises(MetricsSourceError, match=says):
        run(source.fetch(1))
    assert queried == []  # nothing goes out without the token


def test_an_unusable_ca_file_is_a_clear_error(tmp_path):
    not_pem = tmp_path / "ca.crt"
    not_pem.write_text("not a certificate")
    for ca in (not_pem, tmp_path / "missing.crt"):
        with pytest.raises(MetricsSourceError, match=f"cannot use PROMETHEUS_CA_FILE {ca}"):
            PrometheusSource("https://p.invalid", LABELS, 1.0, ca_file=ca)
