"""Where GPU metrics come from, and the background task that keeps the snapshot fresh.

Requests never wait on a source: ``SnapshotRefresher.run()`` polls every METRICS_REFRESH_SECONDS and swaps
in a new immutable ``MetricsSnapshot``; handlers read whichever snapshot is current.

- ``FileSource``: a Prometheus text exposition file of dcgm-exporter series (the lab, the simulator and
  tests write one). Re-read only when its mtime or size changes; samples without a timestamp are dated by
  the file's mtime. Files from WORKER_MIN_BYTES up are parsed in a worker process (parse_worker.py).
- ``PrometheusSource``: two instant queries: the dcgm series themselves, and the newest sample time per
  node (``timestamp()``), since an instant query's own timestamp is the evaluation time, not the scrape's.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Protocol

import httpx
from prometheus_client.parser import text_string_to_metric_families

from gpufleet_extender.parse_worker import ParseWorker, WorkerUnavailable
from gpufleet_extender.snapshot import (
    DCGM_METRICS,
    EMPTY_SNAPSHOT,
    MetricsSnapshot,
    Sample,
    build_snapshot,
    keep_unchanged,
    node_name_of,
    snapshot_of,
)

WORKER_MIN_BYTES = 256 * 1024  # about 2,000 lines: smaller files parse in a thread in a few milliseconds

log = logging.getLogger(__name__)


class MetricsSourceError(RuntimeError):
    """The source could not be read; the previous snapshot stays and ages."""


class MetricsSource(Protocol):
    name: str

    async def fetch(self, version: int) -> MetricsSnapshot | None:
        """A new snapshot numbered ``version``, or None when nothing changed since the last fetch."""


def parse_exposition(text: str) -> Iterator[Sample]:
    """dcgm-exporter samples from Prometheus text exposition (other metrics are skipped)."""
    wanted = set(DCGM_METRICS)
    for family in text_string_to_metric_families(text):
        if family.name not in wanted:
            continue
        for sample in family.samples:
            yield Sample(sample.name, sample.labels, float(sample.value), sample.timestamp)


def load_file(
    path: str | os.PathLike[str], node_labels: tuple[str, ...], default_time: float, taken_at: float, version: int
) -> MetricsSnapshot:
    """Read and parse a METRICS_FILE into a snapshot (raises MetricsSourceError)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
        # Streamed into the snapshot: a million parsed samples at once would take gigabytes.
        samples = parse_exposition(text)
        return build_snapshot(samples, node_labels, default_time=default_time, taken_at=taken_at, version=version)
    except OSError as exc:
        raise MetricsSourceError(f"cannot read METRICS_FILE {path}: {exc.strerror}") from None
    except ValueError as exc:  # the parser's way of saying the text is not an exposition
        raise MetricsSourceError(f"METRICS_FILE {path} is not Prometheus text format: {exc}") from None


class FileSource:
    name = "file"

    def __init__(self, path: Path, node_labels: tuple[str, ...], clock: Callable[[], float] = time.time):
        self.path = Path(path)
        self._node_labels = node_labels
        self._clock = clock
        self._seen: tuple[int, int] | None = None
        self._worker = ParseWorker()
        self._previous = EMPTY_SNAPSHOT

    async def fetch(self, version: int) -> MetricsSnapshot | None:
        try:
            stat = os.stat(self.path)
        except OSError as exc:
            raise MetricsSourceError(f"cannot stat METRICS_FILE {self.path}: {exc.strerror}") from None
        signature = (stat.st_mtime_ns, stat.st_size)
        if signature == self._seen:
            return None
        snapshot = None
        if stat.st_size >= WORKER_MIN_BYTES and self._worker.usable:
            try:
                nodes = await self._worker.load(str(self.path), self._node_labels, stat.st_mtime)
                snapshot = snapshot_of(nodes, taken_at=self._clock(), version=version)
            except WorkerUnavailable as exc:
                log.warning("%s: parsing METRICS_FILE in a thread, requests will wait on it", exc)
        if snapshot is None:  # small: a thread is quicker than a round trip to the worker
            snapshot = await asyncio.to_thread(self._load, stat.st_mtime, version)
        self._seen = signature
        self._previous = snapshot
        return snapshot

    def _load(self, mtime: float, version: int) -> MetricsSnapshot:
        loaded = load_file(self.path, self._node_labels, default_time=mtime, taken_at=self._clock(), version=version)
        return snapshot_of(keep_unchanged(loaded.nodes, self._previous), loaded.taken_at, version)

    async def aclose(self) -> None:
        self._worker.close()


class PrometheusSource:
    name = "prometheus"

    def __init__(
        self,
        url: str,
        node_labels: tuple[str, ...],
        timeout: float,
        clock: Callable[[], float] = time.time,
        transport: httpx.AsyncBaseTransport | None = None,
    ):
        self._client = httpx.AsyncClient(base_url=url, timeout=timeout, transport=transport)
        self._node_labels = node_labels
        self._clock = clock
        selector = '{__name__=~"' + "|".join(DCGM_METRICS) + '"}'
        self._series_query = selector
        # timestamp() drops the metric name, so one timestamp() over all four metrics would produce duplicate
        # label sets (Prometheus refuses); one per metric, joined with `or`, does not.
        by = ", ".join(node_labels)
        self._times_query = " or ".join(f"max by ({by}) (timestamp({metric}))" for metric in DCGM_METRICS)

    async def aclose(self) -> None:
        await self._client.aclose()

    async def _query(self, promql: str) -> list[dict]:
        try:
            response = await self._client.get("/api/v1/query", params={"query": promql})
        except httpx.HTTPError as exc:
            raise MetricsSourceError(f"Prometheus unreachable: {exc.__class__.__name__}: {exc}") from None
        try:
            payload = response.json()
        except ValueError:
            raise MetricsSourceError(f"Prometheus answered HTTP {response.status_code} without JSON") from None
        if response.status_code != 200 or payload.get("status") != "success":
            raise MetricsSourceError(f"Prometheus query failed (HTTP {response.status_code}): {payload.get('error')}")
        data = payload.get("data") or {}
        if data.get("resultType") != "vector":
            raise MetricsSourceError(f"Prometheus returned {data.get('resultType')!r}, expected a vector")
        return data.get("result") or []

    async def fetch(self, version: int) -> MetricsSnapshot:
        queried_at = self._clock()
        series, times = await asyncio.gather(self._query(self._series_query), self._query(self._times_query))
        return await asyncio.to_thread(self._build, series, times, queried_at, version)

    def _build(self, series: list[dict], times: list[dict], queried_at: float, version: int) -> MetricsSnapshot:
        samples = []
        for item in series:
            labels = item.get("metric") or {}
            try:
                value = float(item["value"][1])
            except (KeyError, IndexError, TypeError, ValueError):
                continue
            samples.append(Sample(labels.get("__name__", ""), labels, value))
        node_times: dict[str, float] = {}
        for item in times:
            node = node_name_of(item.get("metric") or {}, self._node_labels)
            try:
                stamp = float(item["value"][1])
            except (KeyError, IndexError, TypeError, ValueError):
                continue
            if node and math.isfinite(stamp):
                node_times[node] = max(node_times.get(node, stamp), stamp)
        return build_snapshot(
            samples,
            self._node_labels,
            default_time=queried_at,
            taken_at=self._clock(),
            version=version,
            node_sample_times=node_times,
        )


class SnapshotRefresher:
    """Owns the current snapshot; ``run()`` is the background loop started by the app's lifespan."""

    def __init__(
        self,
        source: MetricsSource,
        refresh_seconds: float,
        on_error: Callable[[str], None] = lambda source: None,
        on_update: Callable[[MetricsSnapshot], None] = lambda snapshot: None,
        clock: Callable[[], float] = time.time,
    ):
        self.source = source
        self.snapshot: MetricsSnapshot = EMPTY_SNAPSHOT
        self.last_error: str | None = None
        self.first_attempt = asyncio.Event()  # set once the source answered or failed for the first time
        self._refresh_seconds = refresh_seconds
        self._on_error = on_error
        self._on_update = on_update
        self._clock = clock

    async def refresh_once(self) -> bool:
        """One poll; True when the source answered. Errors are logged and counted, never raised."""
        try:
            return await self._refresh()
        finally:
            self.first_attempt.set()

    async def _refresh(self) -> bool:
        try:
            fresh = await self.source.fetch(self.snapshot.version + 1)
        except MetricsSourceError as exc:
            self._fail(str(exc))
            return False
        except Exception as exc:  # a refresher that dies silently would leave decisions on stale data
            log.exception("metrics refresh crashed")
            self._fail(f"{exc.__class__.__name__}: {exc}")
            return False
        if fresh is None:  # unchanged: the same decisions stay valid, only the age resets
            self.snapshot = replace(self.snapshot, taken_at=self._clock())
        else:
            self.snapshot = fresh
        if self.last_error is not None:
            log.info("metrics source %s answers again", self.source.name)
        self.last_error = None
        self._on_update(self.snapshot)
        return True

    def _fail(self, message: str) -> None:
        if message != self.last_error:
            log.warning("metrics source %s: %s", self.source.name, message)
        self.last_error = message
        self._on_error(self.source.name)

    async def run(self) -> None:
        while True:
            await self.refresh_once()
            await asyncio.sleep(self._refresh_seconds)
