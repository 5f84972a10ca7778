"""Where GPU metrics come from, and the background task that keeps the snapshot fresh.

Requests never wait on a source: ``SnapshotRefresher.run()`` polls every METRICS_REFRESH_SECONDS and swaps
in a new immutable ``MetricsSnapshot``; handlers read whichever snapshot is current.

- ``FileSource``: a Prometheus text exposition file of dcgm-exporter series (the lab, the simulator and
  tests write one). Re-read only when its mtime or size changes; samples without a timestamp are dated by
  the file's mtime. Files from WORKER_MIN_BYTES up are parsed in a worker process (parse_worker.py).
- ``PrometheusSource``: two instant queries of the dcgm series: the device loads and the newest sample time per
  node (``timestamp()``, since an instant query's own timestamp is the evaluation time, not the scrape's).
  PROMETHEUS_TIMEOUT_SECONDS bounds the whole refresh (httpx's own timeout is per read: a Prometheus that
  trickles a byte a second would never time out). Over https with PROMETHEUS_CA_FILE, Prometheus' certificate
  must chain to that CA alone; PROMETHEUS_TOKEN_FILE's bearer token is re-read at each refresh, so a rotated
  token (a Secret the kubelet updates in place) is used from the next refresh on.

Data a source delivers is screened before it is trusted (``screen_samples``, ``drop_future_nodes``): a node
with a value out of its metric's range (utilisation below 0 or above 100 %, a negative framebuffer) or with
samples dated further in the future than METRICS_MAX_CLOCK_SKEW_SECONDS is left out of the snapshot, so the
missing-metrics policy decides for it; duplicate series and refreshes without any dcgm series are kept but
reported. Each refresh's findings (``FetchReport``) go to ``/readyz`` and a counter per kind.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import ssl
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol, cast

import httpx
import msgspec
from prometheus_client.parser import text_string_to_metric_families

from gpufleet_extender.errors import ExtenderError
from gpufleet_extender.parse_worker import ParseWorker, WorkerUnavailable
from gpufleet_extender.snapshot import (
    DCGM_METRICS,
    EMPTY_SNAPSHOT,
    FB_FREE,
    FB_USED,
    GPU_UTIL,
    GR_ENGINE_ACTIVE,
    MetricsSnapshot,
    Sample,
    build_snapshot,
    keep_unchanged,
    node_name_of,
    snapshot_of,
)

WORKER_MIN_BYTES = 256 * 1024  # about 2,000 lines: smaller files parse in a thread in a few milliseconds

log = logging.getLogger(__name__)


class MetricsSourceError(ExtenderError, RuntimeError):
    """The source could not be read; the previous snapshot stays and ages.

    ``status``: the HTTP status Prometheus answered with, when it answered; ``unreachable``: no answer at all (the
    connection, the name, a timeout); ``tls``: the connection failed on TLS (the certificate, its CA or its name)."""

    def __init__(self, message: str, *, status: int | None = None, unreachable: bool = False, tls: bool = False):
        super().__init__(message)
        self.status = status
        self.unreachable = unreachable or tls
        self.tls = tls


def _tls_failure(exc: BaseException) -> bool:
    """Whether a transport error comes from TLS (httpx wraps the ssl error in its own, once or twice)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


# Kinds of findings a refresh can report (the ``fault`` label of gpufleet_extender_metrics_faults_total).
OUT_OF_RANGE = "out_of_range"
FUTURE_TIMESTAMP = "future_timestamp"
DUPLICATE_SERIES = "duplicate_series"
NO_DCGM_SERIES = "no_dcgm_series"
FAULT_KINDS = (OUT_OF_RANGE, FUTURE_TIMESTAMP, DUPLICATE_SERIES, NO_DCGM_SERIES)

# The range each metric's values must lie in (percent, ratio, MiB); anything else is a broken exporter.
_VALID_RANGE = {
    GPU_UTIL: (0.0, 100.0),
    GR_ENGINE_ACTIVE: (0.0, 1.0),
    FB_USED: (0.0, math.inf),
    FB_FREE: (0.0, math.inf),
}
DEFAULT_MAX_CLOCK_SKEW = 5.0


@dataclass
class FetchReport:
    """What a refresh found wrong with the data it still delivered: counts per fault kind and lines for people."""

    faults: Counter[str] = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)

    def add(self, kind: str, count: int, note: str) -> None:
        self.faults[kind] += count
        self.notes.append(note)


class MetricsSource(Protocol):
    name: str
    # Findings of the last fetch that returned a snapshot (None: nothing to report or not screened).
    report: FetchReport | None

    async def fetch(self, version: int) -> MetricsSnapshot | None:
        """A new snapshot numbered ``version``, or None when nothing changed since the last fetch."""


def _names(nodes: Iterable[str], limit: int = 5) -> str:
    nodes = sorted(nodes)
    shown = ", ".join(nodes[:limit])
    return shown + (f" and {len(nodes) - limit} more" if len(nodes) > limit else "")


def screen_samples(samples: Iterable[Sample], node_labels: tuple[str, ...], report: FetchReport) -> list[Sample]:
    """The samples worth folding into a snapshot; what is wrong goes to ``report``.

    A value out of its metric's range (or not finite) makes the whole node's data untrustworthy: its samples are
    dropped, so the node counts as having no metrics. A series seen twice keeps its last value, as before, but
    is reported: two exporters on one node disagree and the extender cannot tell which is right.
    """
    samples = list(samples)
    bad_nodes: set[str] = set()
    bad_count = 0
    seen: set[tuple[Any, ...]] = set()
    duplicates = 0
    duplicate_nodes: set[str] = set()
    # What the labels say, read once per labels object (a device's series often share one; build_snapshot says
    # more); the memo holds the object, so that its id is not reused while the screening runs.
    read: dict[int, tuple[Mapping[str, str], str | None, str, str]] = {}
    for sample in samples:
        labels = sample.labels
        known = read.get(id(labels))
        if known is None or known[0] is not labels:
            known = read[id(labels)] = (
                labels,
                node_name_of(labels, node_labels),
                labels.get("gpu") or labels.get("UUID") or "",
                labels.get("GPU_I_ID", ""),
            )
        _, node, device, instance = known
        if node is None:
            continue
        low, high = _VALID_RANGE.get(sample.name, (-math.inf, math.inf))
        if not (low <= sample.value <= high):  # also NaN
            bad_nodes.add(node)
            bad_count += 1
        key = (sample.name, node, device, instance)
        if key in seen:
            duplicates += 1
            duplicate_nodes.add(node)
        seen.add(key)
    if not seen:
        report.add(NO_DCGM_SERIES, 1, "no dcgm-exporter series (" + ", ".join(DCGM_METRICS) + ") with a node label")
    if duplicates:
        report.add(
            DUPLICATE_SERIES,
            duplicates,
            f"{duplicates} duplicate series (last value kept) on {_names(duplicate_nodes)}",
        )
    if bad_nodes:
        report.add(
            OUT_OF_RANGE,
            bad_count,
            f"{bad_count} values out of range on {_names(bad_nodes)}: those nodes count as without metrics",
        )
        samples = [s for s in samples if node_name_of(s.labels, node_labels) not in bad_nodes]
    return samples


def drop_future_nodes(snapshot: MetricsSnapshot, now: float, max_skew: float, report: FetchReport) -> MetricsSnapshot:
    """Leave out nodes whose samples are dated beyond ``now + max_skew``.

    A sample from the future would count as fresh until that time, whatever METRICS_MAX_AGE_SECONDS says:
    some clock is wrong, and the node's data cannot be dated.
    """
    future = {name for name, node in snapshot.nodes.items() if node.sample_time > now + max_skew}
    if not future:
        return snapshot
    ahead = max(snapshot.nodes[name].sample_time - now for name in future)
    report.add(
        FUTURE_TIMESTAMP,
        len(future),
        f"samples of {_names(future)} are dated up to {ahead:.0f}s in the future (clock skew allowed: "
        f"{max_skew:g}s): those nodes count as without metrics",
    )
    nodes = {name: node for name, node in snapshot.nodes.items() if name not in future}
    return replace(
        snapshot,
        nodes=MappingProxyType(nodes),
        newest_sample=max((node.sample_time for node in nodes.values()), default=None),
    )


def parse_exposition(text: str) -> Iterator[Sample]:
    """dcgm-exporter samples from Prometheus text exposition (other metrics are skipped)."""
    wanted = set(DCGM_METRICS)
    for family in text_string_to_metric_families(text):
        if family.name not in wanted:
            continue
        for sample in family.samples:
            # The text-format parser gives float timestamps; Timestamp objects come only from the OpenMetrics parser.
            yield Sample(sample.name, sample.labels, float(sample.value), cast("float | None", sample.timestamp))


def load_file(
    path: str | os.PathLike[str],
    node_labels: tuple[str, ...],
    default_time: float,
    taken_at: float,
    version: int,
) -> tuple[MetricsSnapshot, FetchReport]:
    """Read, parse and screen a METRICS_FILE into a snapshot and what was wrong in it (raises MetricsSourceError).
    Runs in this process (small files) or in the parse worker (large ones)."""
    report = FetchReport()
    try:
        text = Path(path).read_text(encoding="utf-8")
        samples = screen_samples(parse_exposition(text), node_labels, report)
    except OSError as exc:
        raise MetricsSourceError(f"cannot read METRICS_FILE {path}: {exc.strerror}") from None
    except ValueError as exc:  # the parser's way of saying the text is not an exposition (or not UTF-8)
        raise MetricsSourceError(f"METRICS_FILE {path} is not Prometheus text format: {exc}") from None
    snapshot = build_snapshot(samples, node_labels, default_time=default_time, taken_at=taken_at, version=version)
    return snapshot, report


def load_file_in_worker(path: str, node_labels: tuple[str, ...], mtime: float) -> tuple[MetricsSnapshot, FetchReport]:
    """load_file as the parse worker runs it (parse_worker.ParseWorker's loader: module-level, so it pickles)."""
    return load_file(path, node_labels, default_time=mtime, taken_at=0.0, version=0)


class FileSource:
    name = "file"
    # A refresh stuck longer than this (a hung network filesystem) is reported as an error by the refresher.
    # Generous: a million-line file takes the parse worker a minute or more on a small machine.
    deadline = 300.0

    def __init__(
        self,
        path: Path,
        node_labels: tuple[str, ...],
        clock: Callable[[], float] = time.time,
        max_skew: float = DEFAULT_MAX_CLOCK_SKEW,
    ):
        self.path = Path(path)
        self._node_labels = node_labels
        self._clock = clock
        self._max_skew = max_skew
        self._seen: tuple[int, int] | None = None
        self.report: FetchReport | None = None
        self._worker = ParseWorker(load_file_in_worker)
        self._previous = EMPTY_SNAPSHOT

    async def fetch(self, version: int) -> MetricsSnapshot | None:
        try:
            stat = self.path.stat()
        except OSError as exc:
            raise MetricsSourceError(f"cannot stat METRICS_FILE {self.path}: {exc.strerror}") from None
        signature = (stat.st_mtime_ns, stat.st_size)
        if signature == self._seen:
            return None
        snapshot: MetricsSnapshot | None = None
        if stat.st_size >= WORKER_MIN_BYTES and self._worker.usable:
            try:
                nodes, report = await self._worker.load(str(self.path), self._node_labels, stat.st_mtime)
                snapshot = snapshot_of(nodes, taken_at=self._clock(), version=version)
            except WorkerUnavailable as exc:
                log.warning("%s: parsing METRICS_FILE in a thread, requests will wait on it", exc)
        if snapshot is None:  # small: a thread is quicker than a round trip to the worker
            loaded = await asyncio.to_thread(self._load, stat.st_mtime, version)
            snapshot, report = loaded  # unpacked apart from the await, which mypy would not narrow through
        snapshot = drop_future_nodes(snapshot, self._clock(), self._max_skew, report)
        self._seen = signature
        self._previous = snapshot
        self.report = report
        return snapshot

    def _load(self, mtime: float, version: int) -> tuple[MetricsSnapshot, FetchReport]:
        loaded, report = load_file(
            self.path, self._node_labels, default_time=mtime, taken_at=self._clock(), version=version
        )
        return snapshot_of(keep_unchanged(loaded.nodes, self._previous), loaded.taken_at, version), report

    async def aclose(self) -> None:
        self._worker.close()


def exporter_matchers(job: str = "", namespace: str = "") -> str:
    """PromQL label matchers pinning series to the exporter's scrape job and namespace ('' for what is not pinned),
    as ``job="dcgm-exporter",namespace="gpufleet-node-agents"``."""
    pinned = {"job": job, "namespace": namespace}
    return ",".join(f"{label}={json.dumps(value)}" for label, value in pinned.items() if value)


# The labels a decision reads besides the node's (snapshot.build_snapshot): the device, its MIG instance and
# profile, and the pod a time-sliced device serves (exported_*: Prometheus renames the exporter's own when they
# clash with target labels).
DECISION_LABELS = ("gpu", "UUID", "GPU_I_ID", "GPU_I_PROFILE", "pod", "namespace", "exported_pod", "exported_namespace")


# The one metric every device reports (the roles require it): the node's sample time is its newest timestamp.
SAMPLE_TIME_METRIC = FB_FREE


def prometheus_queries(node_labels: Iterable[str], matchers: str = "") -> tuple[str, str]:
    """(series query, sample-time query) of a refresh that reads the dcgm series.

    The series come aggregated by the labels decisions read (``max by``), so Prometheus drops the exporter's
    other labels (PCI bus, model, driver, container, its own job and instance) before encoding the answer: a
    third less JSON at 1,000 nodes, and series only two exporters disagree on fold into their maximum (the
    hotter reading) instead of arriving twice. `matchers` (exporter_matchers) keep out series of the same names
    from any other scrape job. The sample time per node is read from one metric, SAMPLE_TIME_METRIC: Prometheus'
    cost is per series read, and all four of a device are scraped together.
    """
    node_labels = tuple(node_labels)
    names = '__name__=~"' + "|".join(DCGM_METRICS) + '"'
    keep = ", ".join(("__name__", *node_labels, *DECISION_LABELS))
    series = f"max by ({keep}) ({{{names}{',' + matchers if matchers else ''}}})"
    selector = "{" + matchers + "}" if matchers else ""
    times = f"max by ({', '.join(node_labels)}) (timestamp({SAMPLE_TIME_METRIC}{selector}))"
    return series, times


def decode_vector(status: int, content: bytes) -> list[dict[str, Any]]:
    """The vector of an instant query's answer (raises MetricsSourceError). Runs in the refresh's thread: tens of
    megabytes of JSON at thousands of nodes would hold the event loop, and every request with it, for seconds."""
    try:
        payload = msgspec.json.decode(content)
    except msgspec.DecodeError:
        raise MetricsSourceError(f"Prometheus answered HTTP {status} without JSON", status=status) from None
    if not isinstance(payload, dict):
        raise MetricsSourceError(f"Prometheus answered HTTP {status} without a JSON object", status=status)
    if status != 200 or payload.get("status") != "success":
        raise MetricsSourceError(f"Prometheus query failed (HTTP {status}): {payload.get('error')}", status=status)
    data = payload.get("data") or {}
    if data.get("resultType") != "vector":
        raise MetricsSourceError(f"Prometheus returned {data.get('resultType')!r}, expected a vector")
    return cast("list[dict[str, Any]]", data.get("result") or [])


class PrometheusSource:
    name = "prometheus"

    def __init__(
        self,
        url: str,
        node_labels: tuple[str, ...],
        timeout: float,
        clock: Callable[[], float] = time.time,
        transport: httpx.AsyncBaseTransport | None = None,
        max_skew: float = DEFAULT_MAX_CLOCK_SKEW,
        matchers: str = "",
        ca_file: Path | None = None,
        token_file: Path | None = None,
        server_name: str = "",
    ):
        """``server_name``: the name Prometheus' certificate is checked against (and sent as SNI) when the URL
        reaches it by another one, as through a port-forward; '' takes the URL's host."""
        verify: ssl.SSLContext | bool = True
        if ca_file is not None:
            try:
                verify = ssl.create_default_context(cafile=str(ca_file))
            except (OSError, ssl.SSLError) as exc:
                raise MetricsSourceError(f"cannot use PROMETHEUS_CA_FILE {ca_file}: {exc}") from None
        if server_name and transport is None:
            transport = _ServerName(httpx.AsyncHTTPTransport(verify=verify), server_name)
        self._client = httpx.AsyncClient(base_url=url, timeout=timeout, transport=transport, verify=verify)
        self._token_file = token_file
        self._timeout = timeout
        # The refresher's safety net sits above the source's own whole-request deadline.
        self.deadline = timeout + 1.0
        self._node_labels = node_labels
        self._clock = clock
        self._max_skew = max_skew
        self.report: FetchReport | None = None
        self._series_query, self._times_query = prometheus_queries(node_labels, matchers)

    async def aclose(self) -> None:
        await self._client.aclose()

    def _headers(self) -> dict[str, str]:
        """The Authorization header of this refresh (the token file as it is now)."""
        if self._token_file is None:
            return {}
        try:
            token = self._token_file.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise MetricsSourceError(f"cannot read PROMETHEUS_TOKEN_FILE {self._token_file}: {exc}") from None
        if not token:
            raise MetricsSourceError(f"PROMETHEUS_TOKEN_FILE {self._token_file} is empty")
        return {"Authorization": f"Bearer {token}"}

    async def _query(self, promql: str, headers: dict[str, str]) -> tuple[int, bytes]:
        """The HTTP status and body of one instant query (decoded later, off the event loop: decode_vector)."""
        try:
            response = await self._client.get("/api/v1/query", params={"query": promql}, headers=headers)
        except httpx.HTTPError as exc:
            raise MetricsSourceError(
                f"Prometheus unreachable: {exc.__class__.__name__}: {exc}", unreachable=True, tls=_tls_failure(exc)
            ) from None
        return response.status_code, response.content

    async def fetch(self, version: int) -> MetricsSnapshot | None:
        """The fleet's snapshot."""
        queried_at = self._clock()
        headers = self._headers()
        try:
            async with asyncio.timeout(self._timeout):
                series, times = await asyncio.gather(
                    self._query(self._series_query, headers), self._query(self._times_query, headers)
                )
        except TimeoutError:
            raise MetricsSourceError(
                f"Prometheus did not answer both queries within PROMETHEUS_TIMEOUT_SECONDS ({self._timeout:g}s)",
                unreachable=True,
            ) from None
        snapshot, self.report = await asyncio.to_thread(self._decode_and_build, series, times, queried_at, version)
        return snapshot

    def _decode_and_build(
        self, series: tuple[int, bytes], times: tuple[int, bytes], queried_at: float, version: int
    ) -> tuple[MetricsSnapshot, FetchReport]:
        return self._build(decode_vector(*series), decode_vector(*times), queried_at, version)

    def _build(
        self, series: list[dict[str, Any]], times: list[dict[str, Any]], queried_at: float, version: int
    ) -> tuple[MetricsSnapshot, FetchReport]:
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
        report = FetchReport()
        samples = screen_samples(samples, self._node_labels, report)
        now = self._clock()
        snapshot = build_snapshot(
            samples,
            self._node_labels,
            default_time=queried_at,
            taken_at=now,
            version=version,
            node_sample_times=node_times,
        )
        return drop_future_nodes(snapshot, now, self._max_skew, report), report


class _ServerName(httpx.AsyncBaseTransport):
    """Sends every request with this TLS server name (SNI, and the name the certificate must hold)."""

    def __init__(self, transport: httpx.AsyncBaseTransport, server_name: str):
        self._transport = transport
        self._server_name = server_name

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        request.extensions["sni_hostname"] = self._server_name
        return await self._transport.handle_async_request(request)

    async def aclose(self) -> None:
        await self._transport.aclose()


class SnapshotRefresher:
    """Owns the current snapshot; ``run()`` is the background loop started by the app's lifespan."""

    def __init__(
        self,
        source: MetricsSource,
        refresh_seconds: float,
        on_error: Callable[[str], None] = lambda source: None,
        on_update: Callable[[MetricsSnapshot], None] = lambda snapshot: None,
        clock: Callable[[], float] = time.time,
        on_fault: Callable[[str, str, int], None] = lambda source, fault, count: None,
        deadline: float | None = None,
    ):
        self.source = source
        self.snapshot: MetricsSnapshot = EMPTY_SNAPSHOT
        self.last_error: str | None = None
        self.warnings: list[str] = []  # what the last delivered snapshot's refresh found wrong (for /readyz)
        self.first_attempt = asyncio.Event()  # set once the source answered or failed for the first time
        self._refresh_seconds = refresh_seconds
        self._on_error = on_error
        self._on_update = on_update
        self._on_fault = on_fault
        self._clock = clock
        # No refresh may hang the loop silently (nor the app's start-up, which awaits the first one).
        self._deadline = deadline if deadline is not None else getattr(source, "deadline", None)

    async def refresh_once(self) -> bool:
        """One poll; True when the source answered. Errors are logged and counted, never raised."""
        try:
            return await self._refresh()
        finally:
            self.first_attempt.set()

    async def _refresh(self) -> bool:
        try:
            async with asyncio.timeout(self._deadline):
                fresh = await self.source.fetch(self.snapshot.version + 1)
        except TimeoutError:
            self._fail(f"refresh from {self.source.name} stuck for more than {self._deadline:g}s; abandoned")
            return False
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
            self._take_report(getattr(self.source, "report", None))
        if self.last_error is not None:
            log.info("metrics source %s answers again", self.source.name)
        self.last_error = None
        self._on_update(self.snapshot)
        return True

    def _take_report(self, report: FetchReport | None) -> None:
        notes = report.notes if report is not None else []
        if notes and notes != self.warnings:
            log.warning("metrics source %s: %s", self.source.name, "; ".join(notes))
        self.warnings = list(notes)
        for kind, count in report.faults.items() if report is not None else ():
            self._on_fault(self.source.name, kind, count)

    def _fail(self, message: str) -> None:
        if message != self.last_error:
            log.warning("metrics source %s: %s", self.source.name, message)
        self.last_error = message
        self._on_error(self.source.name)

    async def run(self, after: Callable[[], None] = lambda: None) -> None:
        """Refresh every METRICS_REFRESH_SECONDS; ``after`` runs after each refresh (the app checks blindness)."""
        while True:
            await self.refresh_once()
            after()
            await asyncio.sleep(self._refresh_seconds)
