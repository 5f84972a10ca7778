"""The recorded form (PROMETHEUS_QUERY=recorded) decides as the raw dcgm series do.

A real Prometheus (Debian's package) scrapes gpufleet_testsupport.dcgm_fleet's fleet (every instance of the Hong Kong
layouts,
whole GPUs, both host label spellings, busy devices with a pod label, hot nodes) and evaluates the rules
metrics_source.recording_rules generates; the extender's PrometheusSource reads it both ways, and the two snapshots
must hold the same nodes, resources, devices and pods, with loads equal within the packing's quantum (0.001).
Without Prometheus this test skips, unless CI or GPUFLEET_REQUIRE_PROMETHEUS=1 makes its absence a failure.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from gpufleet_extender.metrics_source import PrometheusSource, exporter_matchers, recording_rules
from gpufleet_extender.snapshot import MetricsSnapshot
from gpufleet_testsupport.collection import require_tool
from gpufleet_testsupport.dcgm_fleet import EXPORTER_NAMESPACE, FleetPrometheus, make_fleet

NODE_LABELS = ("Hostname", "hostname")
MATCHERS = exporter_matchers("dcgm-exporter", EXPORTER_NAMESPACE)
NODES = 30  # ten of each pool, three hot
INTERVAL = 2  # seconds between scrapes and between rule evaluations


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory) -> str:
    prometheus_binary = require_tool("prometheus", "prometheus", override="GPUFLEET_PROMETHEUS_BINARY")
    fleet = make_fleet(NODES)
    rules = recording_rules(NODE_LABELS, MATCHERS)
    workdir = tmp_path_factory.mktemp("prometheus")
    with FleetPrometheus(fleet, workdir, prometheus_binary, interval=INTERVAL, rules=rules) as url:
        yield url


def _snapshot(url: str, query: str) -> MetricsSnapshot:
    async def fetch() -> MetricsSnapshot:
        source = PrometheusSource(url, NODE_LABELS, timeout=60.0, matchers=MATCHERS, query=query)
        try:
            snapshot = await source.fetch(1)
            assert source.report is not None and not source.report.notes, source.report
            return snapshot
        finally:
            await source.aclose()

    return asyncio.run(fetch())


def test_recorded_snapshot_equals_the_raw_one(prometheus):
    raw, recorded = _snapshot(prometheus, "raw"), _snapshot(prometheus, "recorded")
    assert len(raw.nodes) == NODES
    assert recorded.nodes.keys() == raw.nodes.keys()
    kinds = {"whole": 0, "mig": 0, "hot": 0, "with pods": 0, "without pods": 0}
    for name, node in raw.nodes.items():
        other = recorded.nodes[name]
        assert other.devices.keys() == node.devices.keys(), name
        # FB_FREE's newest scrape as the rules last saw it: at most an evaluation interval (and the moment between
        # the two fetches) behind the raw query's
        assert other.sample_time == pytest.approx(node.sample_time, abs=2 * INTERVAL + 1), name
        for resource, devices in node.devices.items():
            got = other.devices[resource]
            assert [d.key for d in got] == [d.key for d in devices], (name, resource)
            for want, have in zip(devices, got, strict=True):
                assert have.util == pytest.approx(want.util, abs=0.001), (name, want)
                assert want.mem is not None and have.mem is not None
                assert have.mem == pytest.approx(want.mem, abs=0.001), (name, want)
                assert have.pods == want.pods, (name, want)
                kinds["whole" if resource == "nvidia.com/gpu" else "mig"] += 1
                kinds["hot"] += want.util >= 0.9
                kinds["with pods" if want.pods else "without pods"] += 1
    # the fleet exercised every case the packing distinguishes
    assert all(kinds.values()), kinds


def test_a_refresh_reads_the_recorded_series_once_per_rule_evaluation(prometheus):
    """Refreshing ten times per evaluation interval, a refresh reads the fleet's series only after Prometheus
    evaluated the rules again: the others answer "unchanged" (None) after one small query."""

    async def poll() -> list[bool]:
        source = PrometheusSource(prometheus, NODE_LABELS, timeout=60.0, matchers=MATCHERS, query="recorded")
        read: list[bool] = []
        try:
            deadline = time.monotonic() + 3 * INTERVAL
            while time.monotonic() < deadline:
                read.append(await source.fetch(len(read) + 1) is not None)
                await asyncio.sleep(INTERVAL / 10)
        finally:
            await source.aclose()
        return read

    read = asyncio.run(poll())
    assert read[0], "the first refresh reads the series"
    # Three intervals: two to four evaluations after the first read, whatever the phase.
    assert 2 <= sum(read[1:]) <= 4, read
    assert len(read) - sum(read) >= len(read) // 2, read
