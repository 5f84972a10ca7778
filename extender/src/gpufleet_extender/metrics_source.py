"""Where GPU metrics come from, and the background task that keeps the snapshot fresh.

Requests never wait on a source: ``SnapshotRefresher.run()`` polls every METRICS_REFRESH_SECONDS and swaps
in a new immutable ``MetricsSnapshot``; handlers read whichever snapshot is current.

- ``FileSource``: a Prometheus text exposition file of dcgm-exporter series (the lab, the simulator and
  tests write one). Re-read only when its mtime or size changes; samples without a timestamp are dated by
  the file's mtime. Files from WORKER_MIN_BYTES up are parsed in a worker process (parse_worker.py).
- ``PrometheusSource``: two instant queries: the device loads and the newest sample time per node
  (``timestamp()``, since an instant query's own timestamp is the evaluation time, not the scrape's). With
  PROMETHEUS_QUERY=recorded both are series the recording rules precompute (``recording_rules``: one per device,
  one per node); with raw, the dcgm series themselves.
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


def prometheus_queries(node_labels: Iterable[str], matchers: str = "") -> tuple[str, str]:
    """(series query, sample-time query) of a refresh that reads the raw dcgm series (PROMETHEUS_QUERY=raw).

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


# --- the recorded form (PROMETHEUS_QUERY=recorded) ------------------------------------------------------------
# Prometheus' answer costs per series, so the rules the dcgm_exporter role installs precompute one series per
# device and one sample time per node in its rule evaluation; a refresh reads those two.
RECORDED = "recorded"
RAW = "raw"
QUERY_FORMS = (RECORDED, RAW)
PACKED_SERIES = "gpufleet:dcgm_device:packed"
NODE_SAMPLE_TIME_SERIES = "gpufleet:dcgm_node_sample_time:seconds"
UTIL_SERIES = "gpufleet:dcgm_device_util:ratio"  # a step of the packed rule, kept for the Prometheus UI
MEMORY_SERIES = "gpufleet:dcgm_device_memory:ratio"  # another step
RULE_GROUP = "gpufleet-dcgm-recorded"
# The one metric every device reports (the roles require it): the node's sample time is its newest timestamp.
SAMPLE_TIME_METRIC = FB_FREE
# The labels of a device's recorded series besides the node's: the device and its MIG instance.
DEVICE_LABELS = ("gpu", "UUID", "GPU_I_ID", "GPU_I_PROFILE")
# Packed value, in decimal fixed point (readable in the Prometheus UI): util permille x UTIL_SCALE + memory-used
# permille x MEMORY_SCALE + pods. Sentinels: memory unknown (no framebuffer metrics, or a total of 0) and pods
# unknown (no series of the device carried a pod label); a NaN value: a value of the device was out of range.
UTIL_SCALE = 10_000_000
MEMORY_SCALE = 1_000
MEMORY_UNKNOWN = 1001
PODS_UNKNOWN = 999
PODS_MAX = 998


def _screened_avg(by: str, metric: str, matchers: str, high: float | None, extra: str = "") -> str:
    """The device's mean of `metric`, NaN when any of its series is out of [0, high] (or [0, +Inf) without `high`)
    or NaN, reading each series once: acos and sqrt are NaN outside their domain, and cos(acos(v)) and sqrt(v)^2
    give v back (to a unit in the last place), so one selector both screens and keeps the value; avg keeps a NaN.
    """
    inside = ",".join(m for m in (matchers, extra) if m)
    selector = metric + ("{" + inside + "}" if inside else "")
    if high is None:
        screened = f"sqrt({selector}) ^ 2"
    else:
        screened = f"(cos(acos({selector} * {2 / high:g} - 1)) + 1) * {high / 2:g}"
    return f"avg by ({by}) ({screened})"


def recording_rules_described() -> list[str]:
    """What each recorded series computes and why, one paragraph per series: the comment block above the rules file
    `gpufleet-extender recording-rules` prints, so that an operator reading their Prometheus knows what it holds."""
    return [
        "gpufleet's recorded form of dcgm-exporter's series: the GPU load the scheduler extender and the GPUScore "
        "plugin read (PROMETHEUS_QUERY / prometheusQuery recorded), one series per device instead of the raw ones, "
        "so that each refresh reads a few series per GPU rather than every raw sample of the fleet.",
        f"{UTIL_SERIES}: each device's utilisation, 0..1: DCGM_FI_DEV_GPU_UTIL / 100 for a whole GPU, "
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE for a MIG instance (the GPU's own utilisation is not reported per instance).",
        f"{MEMORY_SERIES}: each device's framebuffer in use, FB_USED / (FB_USED + FB_FREE), 0..1; absent when the "
        "total is 0 (unknown).",
        f"{PACKED_SERIES}: both ratios and the device's pods in one number, for one query: "
        f"round(1000 x util) x {UTIL_SCALE:,} + round(1000 x memory) x {MEMORY_SCALE:,} + pods (memory unknown: "
        f"{MEMORY_UNKNOWN}; pods unknown: {PODS_UNKNOWN}; pods counted up to {PODS_MAX}).",
        f"{NODE_SAMPLE_TIME_SERIES}: the newest sample's timestamp per node: how fresh the node's figures are, so "
        "that a node whose exporter stopped is decided as a node without metrics instead of by old figures.",
        "Screening: a value outside its metric's range (utilisation below 0 or above 100 %, an engine-active ratio "
        "outside 0..1, a negative framebuffer) or NaN makes the device's figures NaN, and the readers leave that "
        "node out, as they do with the raw series: a broken exporter must not make a busy GPU look idle.",
    ]


def recording_rules_file(group: Mapping[str, Any]) -> str:
    """The rules file: the described comment block, then the group (YAML)."""
    import textwrap

    import yaml

    comments = []
    for paragraph in recording_rules_described():
        comments += [f"# {line}" for line in textwrap.wrap(paragraph, 112)] + ["#"]
    body = yaml.safe_dump({"groups": [dict(group)]}, sort_keys=False, width=1_000_000)
    return "\n".join(comments[:-1]) + "\n" + body


def recording_rules(node_labels: Iterable[str], matchers: str = "", interval: str = "") -> dict[str, Any]:
    """The Prometheus rule group of the recorded form (what `gpufleet-extender recording-rules` prints and the
    dcgm_exporter role installs): the one specification, in PromQL, of build_snapshot's device loads.

    - UTIL_SERIES per device: DCGM_FI_DEV_GPU_UTIL / 100 for a whole GPU, else DCGM_FI_PROF_GR_ENGINE_ACTIVE;
    - MEMORY_SERIES per device: FB_USED / (FB_USED + FB_FREE), absent when the total is 0;
    - PACKED_SERIES per device: both as permille and the distinct pods (snapshot._pod_of: exported_pod before pod)
      on its SAMPLE_TIME_METRIC series;
    - NODE_SAMPLE_TIME_SERIES per node: the newest timestamp of SAMPLE_TIME_METRIC.

    A value out of its metric's range (or NaN) makes the device's steps NaN, and a NaN stays NaN through the
    packing, so the consumers' screening leaves the node out as it does with the raw series. Rules of a group
    run in order: the packed rule reads the two steps before it, not the raw series again.

    ``interval`` (a Prometheus duration) is how often the group is evaluated: the exporter's scrape interval, so
    that the recorded loads lag a scrape at most. Without it Prometheus takes its global evaluation_interval (one
    minute unless configured: longer than the default METRICS_MAX_AGE_SECONDS, every node would be stale).
    """
    node_labels = tuple(node_labels)
    device = ", ".join((*node_labels, *DEVICE_LABELS))
    gpu_util = _screened_avg(device, GPU_UTIL, matchers, 100, 'GPU_I_ID=""')
    gr_active = _screened_avg(device, GR_ENGINE_ACTIVE, matchers, 1)
    util = f"{gpu_util} / 100 or {gr_active}"
    used = _screened_avg(device, FB_USED, matchers, None)
    free = _screened_avg(device, FB_FREE, matchers, None)
    # A total of 0 is filtered out (unknown: build_snapshot's mem None); a NaN total (a value out of range) passes
    # `!= 0` and keeps the ratio NaN. Vector-vector operations are what the rules' evaluation costs: two here.
    memory = f"{used} / ({used} + {free} != 0)"
    # The pods come from SAMPLE_TIME_METRIC's series alone: dcgm-exporter labels every metric of a device with the
    # same pod, and reading one metric instead of four is most of this rule's evaluation time.
    with_pod = f'__name__="{SAMPLE_TIME_METRIC}"' + (f",{matchers}" if matchers else "")
    exported = f'label_join({{{with_pod},exported_pod!=""}}, "gpufleet_pod", "/", "exported_namespace", "exported_pod")'
    plain = f'label_join({{{with_pod},exported_pod="",pod!=""}}, "gpufleet_pod", "/", "namespace", "pod")'
    pods = f"count by ({device}) (group by ({device}, gpufleet_pod) ({exported} or {plain}))"
    packed = (
        f"round(1000 * {UTIL_SERIES}) * {UTIL_SCALE}"
        f" + (round(1000 * {MEMORY_SERIES}) or 0 * {UTIL_SERIES} + {MEMORY_UNKNOWN}) * {MEMORY_SCALE}"
        f" + (clamp_max({pods}, {PODS_MAX}) or 0 * {UTIL_SERIES} + {PODS_UNKNOWN})"
    )
    selector = "{" + matchers + "}" if matchers else ""
    sample_time = f"max by ({', '.join(node_labels)}) (timestamp({SAMPLE_TIME_METRIC}{selector}))"
    return {
        "name": RULE_GROUP,
        **({"interval": interval} if interval else {}),
        "rules": [
            {"record": UTIL_SERIES, "expr": util},
            {"record": MEMORY_SERIES, "expr": memory},
            {"record": PACKED_SERIES, "expr": packed},
            {"record": NODE_SAMPLE_TIME_SERIES, "expr": sample_time},
        ],
    }


def recorded_queries() -> tuple[str, str]:
    """(series query, sample-time query) of a refresh that reads the recorded form (PROMETHEUS_QUERY=recorded):
    the rules pinned the exporter's job and namespace already."""
    return PACKED_SERIES, NODE_SAMPLE_TIME_SERIES


# When the rule group last wrote its last rule, one number. The recorded series change only when the group is
# evaluated (every scrape interval; at thousands of nodes the evaluation alone outlasts a refresh), so a refresh
# asks this first and reads the fleet's series only when the answer moved.
RECORDED_EVALUATION_QUERY = f"max(timestamp({NODE_SAMPLE_TIME_SERIES}))"


def evaluation_of(status: int, content: bytes) -> str:
    """RECORDED_EVALUATION_QUERY's answer as Prometheus wrote it ("" for an empty vector: no recorded series yet)."""
    vector = decode_vector(status, content)
    try:
        return str(vector[0]["value"][1]) if len(vector) == 1 else ""
    except (KeyError, IndexError, TypeError):
        return ""


def decode_packed(labels: Mapping[str, str], value: float) -> list[Sample]:
    """One packed series as the samples build_snapshot folds: the utilisation as GR_ENGINE_ACTIVE (which it reads
    for a whole GPU without GPU_UTIL too) carrying the pod count, and the memory as FB_USED/FB_FREE in permille.
    A value NaN, not a whole number or with a part out of range decodes as a NaN utilisation: screen_samples then
    leaves the node out, as it does for a raw value out of range."""
    util = mem = pods = -1
    if math.isfinite(value) and value >= 0 and value == int(value):
        util, rest = divmod(int(value), UTIL_SCALE)
        mem, pods = divmod(rest, MEMORY_SCALE)
    if not (0 <= util <= 1000 and (0 <= mem <= 1000 or mem == MEMORY_UNKNOWN) and 0 <= pods <= PODS_UNKNOWN):
        return [Sample(GR_ENGINE_ACTIVE, labels, math.nan)]
    samples = [Sample(GR_ENGINE_ACTIVE, labels, util / 1000, pods=None if pods == PODS_UNKNOWN else pods)]
    if mem != MEMORY_UNKNOWN:
        samples += [Sample(FB_USED, labels, float(mem)), Sample(FB_FREE, labels, float(1000 - mem))]
    return samples


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
        query: str = RAW,
        server_name: str = "",
    ):
        """``server_name``: the name Prometheus' certificate is checked against (and sent as SNI) when the URL
        reaches it by another one, as through a port-forward; '' takes the URL's host."""
        if query not in QUERY_FORMS:
            raise MetricsSourceError(f"PROMETHEUS_QUERY must be one of {', '.join(QUERY_FORMS)} (got {query!r})")
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
        self._recorded = query == RECORDED
        self._series_query, self._times_query = (
            recorded_queries() if self._recorded else prometheus_queries(node_labels, matchers)
        )
        self._evaluated = ""  # the rule group's evaluation the last snapshot was read after (recorded form)

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
        """The fleet's snapshot; with the recorded form, None when the rule group was not evaluated since the last
        one (nothing in the answer would differ)."""
        queried_at = self._clock()
        headers = self._headers()
        evaluated = ""
        try:
            async with asyncio.timeout(self._timeout):
                if self._recorded:
                    evaluated = evaluation_of(*await self._query(RECORDED_EVALUATION_QUERY, headers))
                    if evaluated and evaluated == self._evaluated:
                        return None
                series, times = await asyncio.gather(
                    self._query(self._series_query, headers), self._query(self._times_query, headers)
                )
        except TimeoutError:
            raise MetricsSourceError(
                f"Prometheus did not answer both queries within PROMETHEUS_TIMEOUT_SECONDS ({self._timeout:g}s)"
                if not self._recorded
                else f"Prometheus did not answer within PROMETHEUS_TIMEOUT_SECONDS ({self._timeout:g}s)",
                unreachable=True,
            ) from None
        snapshot, self.report = await asyncio.to_thread(self._decode_and_build, series, times, queried_at, version)
        self._evaluated = evaluated
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
            if self._recorded:
                samples.extend(decode_packed(labels, value))
            else:
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
