#!/usr/bin/env python3
"""What one metrics refresh costs at fleet scale: wall time and bytes of the extender's PrometheusSource (the
queries GPUScore sends too) against a real Prometheus (Debian's package) holding a fleet's dcgm-exporter series
as a real exporter publishes them (gpufleet_testsupport.dcgm_fleet: every instance of the Hong Kong layouts, the
full label set, both host label spellings, fields no decision reads), for each way of asking, in one run:

- ``full``: every DCGM series of the fleet with all its labels (the queries before issue 30), the baseline;
- ``reduced``: the same series aggregated by the labels decisions read (metrics_source.prometheus_queries,
  what the extender and GPUScore ask when they pull).

    python3 benchmarks/bench_metrics_refresh.py [--nodes 1000,5000] [--repeat 3]

Per size and way: the refresh's wall time (both queries, JSON decoding and the snapshot built; median and worst of
--repeat, the ways taking turns so that both see the same load), how long Prometheus takes to answer each query (to
the last byte), the bytes on the wire (gzip, as httpx and Go's client ask for it) and decoded, and the series.
Prints figures only, with the load average beside them: no goal is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
from gpufleet_extender.metrics_source import PrometheusSource, exporter_matchers, prometheus_queries
from gpufleet_extender.snapshot import DCGM_METRICS
from gpufleet_testsupport.dcgm_fleet import EXPORTER_NAMESPACE, FleetPrometheus, make_fleet

REPO = Path(__file__).resolve().parents[1]

NODE_LABELS = ("Hostname", "hostname")
MATCHERS = exporter_matchers("dcgm-exporter", EXPORTER_NAMESPACE)  # as the roles pin them
FIGURES = ("seconds", "wire", "decoded", "count")


def full_queries() -> tuple[str, str]:
    """The queries before issue 30: every series with every label, and the newest sample time per node."""
    series = '{__name__=~"' + "|".join(DCGM_METRICS) + '",' + MATCHERS + "}"
    times = " or ".join(f"max by (Hostname, hostname) (timestamp({m}{{{MATCHERS}}}))" for m in DCGM_METRICS)
    return series, times


def answer(url: str, promql: str) -> tuple[float, int, int, int]:
    """(seconds to the last byte, bytes on the wire with gzip, bytes decoded, series) of one query's answer."""
    with httpx.Client(timeout=300) as client:
        began = time.perf_counter()
        response = client.get(f"{url}/api/v1/query", params={"query": promql})
        seconds = time.perf_counter() - began
        return seconds, response.num_bytes_downloaded, len(response.content), len(response.json()["data"]["result"])


async def refresh(url: str, queries: tuple[str, str]) -> tuple[float, int]:
    """(wall seconds, nodes in the snapshot) of one refresh of the extender's source asking `queries`."""
    source = PrometheusSource(url, NODE_LABELS, timeout=300.0, matchers=MATCHERS)
    source._series_query, source._times_query = queries  # the way being measured
    try:
        began = time.perf_counter()
        snapshot = await source.fetch(1)
        return time.perf_counter() - began, len(snapshot.nodes)
    finally:
        await source.aclose()


def measure(url: str, ways: dict[str, tuple[str, str]], repeat: int) -> dict[str, dict[str, list[float]]]:
    figures: dict[str, dict[str, list[float]]] = {way: {} for way in ways}
    for _ in range(repeat):  # the ways take turns, so that both see the same load
        for way, queries in ways.items():
            record = figures[way]
            for part, promql in zip(("series", "times"), queries, strict=True):
                for key, value in zip(FIGURES, answer(url, promql), strict=True):
                    record.setdefault(f"{part} {key}", []).append(value)
            wall, nodes = asyncio.run(refresh(url, queries))
            record.setdefault("wall", []).append(wall)
            record.setdefault("nodes", []).append(nodes)
            record.setdefault("load", []).append(os.getloadavg()[0])
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", default="1000,5000", help="comma-separated fleet sizes")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--prometheus", default="/usr/bin/prometheus")
    args = parser.parse_args()
    if not Path(args.prometheus).exists():
        print(f"no Prometheus at {args.prometheus} (Debian package 'prometheus'): nothing measured.")
        return 0
    ways = {
        "full": full_queries(),
        "reduced": prometheus_queries(NODE_LABELS, MATCHERS),
    }
    for size in (int(n) for n in args.nodes.split(",") if n):
        fleet = make_fleet(size)
        workdir = Path(tempfile.mkdtemp(prefix="gpufleet-bench-refresh-"))
        began = time.monotonic()
        with FleetPrometheus(fleet, workdir, args.prometheus) as url:
            print(
                f"bench-metrics-refresh: {size} nodes, {fleet.series} exporter series, {fleet.devices} devices "
                f"(loaded in {time.monotonic() - began:.0f} s), load average {os.getloadavg()[0]:.1f}"
            )
            figures = measure(url, ways, args.repeat)
        for way, record in figures.items():
            med = {key: statistics.median(values) for key, values in record.items()}
            wire = med["series wire"] + med["times wire"]
            decoded = med["series decoded"] + med["times decoded"]
            print(
                f"  {way:8s} refresh median {med['wall']:.2f} s (worst {max(record['wall']):.2f} s); Prometheus "
                f"answers the series in {med['series seconds']:.2f} s, the sample times in "
                f"{med['times seconds']:.2f} s; {wire / 1e6:.2f} MB on the wire (gzip), {decoded / 1e6:.2f} MB "
                f"decoded; {med['series count']:.0f} series; {med['nodes']:.0f} nodes in the snapshot; "
                f"load average {min(record['load']):.1f}-{max(record['load']):.1f}"
            )
        full, reduced = (statistics.median(figures[way]["wall"]) for way in ways)
        print(f"  ratio reduced / full wall time: {reduced / full:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
