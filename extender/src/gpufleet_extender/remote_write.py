"""Prometheus remote write (protocol 1.0) into the extender: METRICS_SOURCE=push.

Prometheus sends the dcgm series it scrapes, as it scrapes them, to a receiver on a listener of its own
(REMOTE_WRITE_ADDRESS, apart from the port kube-scheduler calls): POST, ``Content-Encoding: snappy``,
``Content-Type: application/x-protobuf``, the body a snappy *block* of ``prometheus.WriteRequest``. The receiver keeps
the newest sample of every series the decision reads (``SampleStore``); ``PushSource`` folds the nodes that changed
into a MetricsSnapshot with the pull form's own screening (``screen_samples``, ``build_snapshot``,
``drop_future_nodes``), so both forms decide alike on the same samples.

Answers (the same statuses and reasons as the GPUScore plugin's receiver): 204 written; 401 without the bearer
token of REMOTE_WRITE_TOKEN_FILE (``unauthenticated``); 415 another content type or encoding (``unsupported_media``);
413 a body over MAX_BODY_BYTES or a snappy block that says it decodes to more than MAX_DECODED_BYTES, checked before
decoding (``too_large``); 400 a body that is not snappy, not a WriteRequest, or holds a series without ``__name__``
(``malformed``). A refused write changes nothing: a request is decoded whole before any of it is applied. Each
refusal is counted (``gpufleet_extender_remote_write_refused_total{reason}``) and logged in one line.

Per sample: a sample older than the one held is ignored and counted (out of order); Prometheus' stale marker (the
NaN 0x7ff0000000000002) removes the series; series of other metrics, other scrape jobs or namespaces (EXPORTER_JOB,
EXPORTER_NAMESPACE, pinned as the pull form pins them) or without a node label are skipped.

Decoding: the WriteRequest's messages are built at run time from a descriptor (``write_request_classes``, no
generated code); the hot path reads the request's outer framing itself and recognises a series it has seen by the
bytes of its labels (a keyed 64-bit hash of them), so a known series costs a hash and the decoding of its one
sample. The hash is Python's own (SipHash, keyed at random per process, so a sender cannot aim at a collision);
that two of a million series collide is a chance of about one in 3 x 10^7 per process, and the store keeps only the
hash, not a copy of every series' labels (hundreds of megabytes at 5,000 nodes). A series seen for the first time,
or framed otherwise (several samples, fields in another order), is decoded by the protobuf runtime.
``bench_remote_write.py`` measures both.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hmac
import logging
import math
import socket
import struct
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Any

import cramjam
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from gpufleet_extender.metrics_source import (
    DECISION_LABELS,
    DEFAULT_MAX_CLOCK_SKEW,
    FetchReport,
    MetricsSourceError,
    drop_future_nodes,
    screen_samples,
)
from gpufleet_extender.snapshot import (
    DCGM_METRICS,
    EMPTY_SNAPSHOT,
    MetricsSnapshot,
    NodeMetrics,
    Sample,
    build_snapshot,
    keep_unchanged,
    node_name_of,
    snapshot_of,
)

log = logging.getLogger(__name__)

WRITE_PATH = "/api/v1/write"  # Prometheus' own receiver's path; the roles point remote_write's url at it
MAX_DECODED_BYTES = 8 * 1024 * 1024  # a WriteRequest of 10,000 samples with dcgm-exporter's labels is ~4 MiB
MAX_BODY_BYTES = MAX_DECODED_BYTES  # a snappy block of a WriteRequest is several times smaller than the message
# Series a sender stopped writing without a stale marker (a restarted Prometheus sends none) leave the store after
# this long: Prometheus' lookback, after which an instant query (the pull form) no longer returns them either.
SERIES_LOOKBACK_SECONDS = 300.0
# A node with samples of two scrapes at once (some of its series not written yet) is rebuilt after this long anyway.
SETTLE_SECONDS = 5.0
# A receiver just started waits this long at most for its first pushed sample (about one scrape interval and
# Prometheus' send deadline), then until no new node has come for this long, before its first snapshot: as GPUScore.
FIRST_SAMPLE_WAIT_SECONDS = 30.0
FIRST_SAMPLE_SETTLE_SECONDS = 2.0
STALE_NAN_BITS = 0x7FF0000000000002

# Refusal reasons: the ``reason`` label of gpufleet_extender_remote_write_refused_total, the same in GPUScore.
MALFORMED = "malformed"
TOO_LARGE = "too_large"
UNAUTHENTICATED = "unauthenticated"
UNSUPPORTED_MEDIA = "unsupported_media"
METHOD = "method"
INTERNAL = "internal"  # a bug of the receiver's: answered 500, logged with its traceback
REFUSAL_REASONS = (MALFORMED, TOO_LARGE, UNAUTHENTICATED, UNSUPPORTED_MEDIA, METHOD, INTERNAL)
_STATUS = {MALFORMED: 400, TOO_LARGE: 413, UNAUTHENTICATED: 401, UNSUPPORTED_MEDIA: 415, METHOD: 405, INTERNAL: 500}


class Refused(Exception):
    """A write refused as a whole: ``reason`` (one of REFUSAL_REASONS) and a line for the log and the sender."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason
        self.status = _STATUS[reason]


# --- the messages ------------------------------------------------------------------------------------------------


def write_request_classes() -> tuple[type[Any], type[Any]]:
    """(WriteRequest, TimeSeries) of prometheus/prompb's remote.proto and types.proto, 1.0: built from a descriptor
    at run time. Only the fields 1.0 defines for samples; metadata (3) and anything newer are unknown fields,
    skipped by the parser."""
    file = descriptor_pb2.FileDescriptorProto(name="gpufleet_prompb.proto", package="prometheus", syntax="proto3")
    f = descriptor_pb2.FieldDescriptorProto
    optional, repeated = f.LABEL_OPTIONAL, f.LABEL_REPEATED

    def message(name: str, *fields: tuple[str, int, int, int, str]) -> None:
        msg = file.message_type.add(name=name)
        for field_name, number, label, kind, type_name in fields:
            added = msg.field.add(name=field_name, number=number, label=label, type=kind)
            if type_name:
                added.type_name = type_name

    message("Label", ("name", 1, optional, f.TYPE_STRING, ""), ("value", 2, optional, f.TYPE_STRING, ""))
    message("Sample", ("value", 1, optional, f.TYPE_DOUBLE, ""), ("timestamp", 2, optional, f.TYPE_INT64, ""))
    message(
        "TimeSeries",
        ("labels", 1, repeated, f.TYPE_MESSAGE, ".prometheus.Label"),
        ("samples", 2, repeated, f.TYPE_MESSAGE, ".prometheus.Sample"),
    )
    message("WriteRequest", ("timeseries", 1, repeated, f.TYPE_MESSAGE, ".prometheus.TimeSeries"))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return (
        message_factory.GetMessageClass(pool.FindMessageTypeByName("prometheus.WriteRequest")),
        message_factory.GetMessageClass(pool.FindMessageTypeByName("prometheus.TimeSeries")),
    )


WriteRequest, TimeSeries = write_request_classes()


def series_field(labels: Mapping[str, str], samples: Iterable[tuple[float, int]]) -> bytes:
    """One series as a WriteRequest's ``timeseries`` field (tag, length, TimeSeries): labels sorted by name, as
    Prometheus sorts them, then (value, timestamp ms) samples. WriteRequests are such fields end to end."""
    ts = TimeSeries()
    for name in sorted(labels):
        ts.labels.add(name=name, value=labels[name])
    for value, stamp in samples:
        ts.samples.add(value=value, timestamp=stamp)
    body: bytes = ts.SerializeToString()
    length, head = len(body), bytearray(b"\x0a")
    while length >= 0x80:
        head.append(length & 0x7F | 0x80)
        length >>= 7
    head.append(length)
    return bytes(head) + body


def write_request_body(fields: Iterable[bytes]) -> bytes:
    """A request body from series_field's fields: the WriteRequest, snappy-compressed (block format)."""
    return bytes(cramjam.snappy.compress_raw(b"".join(fields)))


def encode_write_request(series: Iterable[tuple[Mapping[str, str], Iterable[tuple[float, int]]]]) -> bytes:
    """A request body of (labels, [(value, timestamp ms), ...]) per series, as Prometheus sends it: the tests' and
    the benchmark's sender."""
    return write_request_body(series_field(labels, samples) for labels, samples in series)


def stale_nan() -> float:
    """Prometheus' staleness marker, the NaN a series gets when its target or the series itself is gone."""
    value: float = struct.unpack("<d", STALE_NAN_BITS.to_bytes(8, "little"))[0]
    return value


# --- the store -----------------------------------------------------------------------------------------------------

# A series the store holds: a list, updated in place (the same object the label cache and the node's dict hold).
_NODE, _IDENT, _NAME, _LABELS, _VALUE, _STAMP, _LIVE = range(7)
_IGNORED: list[Any] = []  # a series the decision does not read (another metric, job or namespace, no node label)
_NO_NAME: list[Any] = []  # a series without __name__: the whole write is malformed


@dataclass
class WriteResult:
    accepted: int = 0
    out_of_order: int = 0
    removed: int = 0  # series a stale marker removed
    ignored: int = 0  # samples of series the decision does not read


_unpack_double = struct.Struct("<d").unpack_from
_unpack_bits = struct.Struct("<Q").unpack_from


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise Refused(MALFORMED, "not a WriteRequest: a varint runs past the end")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise Refused(MALFORMED, "not a WriteRequest: a varint longer than 10 bytes")


def _skip_field(data: bytes, pos: int, wire: int) -> int:
    """Past an unknown field's value of wire type ``wire`` at ``pos``."""
    if wire == 0:
        return _varint(data, pos)[1]
    if wire == 1:
        end = pos + 8
    elif wire == 5:
        end = pos + 4
    elif wire == 2:
        length, pos = _varint(data, pos)
        end = pos + length
    else:
        raise Refused(MALFORMED, f"not a WriteRequest: wire type {wire}")
    if end > len(data):
        raise Refused(MALFORMED, "not a WriteRequest: a field runs past the end")
    return end


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """The cyclic GC off while a build makes its hundreds of thousands of objects (none of them in a cycle): it
    would walk the store and the last snapshot again and again, a third of the build's time at thousands of nodes.
    Only one build runs at a time; the GC is on again after it, as it was."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class SampleStore:
    """node -> series -> the newest sample, fed by remote writes (``write``) and read by ``PushSource``.

    ``write`` runs in the receiver's worker thread and ``take_changed`` in the refresh's: a lock keeps them apart.
    """

    def __init__(self, node_labels: tuple[str, ...], job: str = "", namespace: str = "") -> None:
        self._node_labels = node_labels
        self._pinned = tuple((label, value) for label, value in (("job", job), ("namespace", namespace)) if value)
        self._kept = tuple(dict.fromkeys((*node_labels, *DECISION_LABELS)))
        self._wanted = frozenset(DCGM_METRICS)
        self._nodes: dict[str, dict[int, list[Any]]] = {}
        self._by_labels: dict[int, list[Any]] = {}  # hash of a series' labels bytes -> the series (or a verdict)
        self._shared: dict[tuple[str, ...], dict[str, str]] = {}  # a device's decision labels, one object
        self._changed: dict[str, float] = {}  # node -> when its first sample not yet in a snapshot came (monotonic)
        self._lock = threading.Lock()
        self.first_sample = threading.Event()  # set once a sample is kept: until then the store knows no node
        self.max_cached = 4_000_000  # label caches beyond this are dropped and rebuilt (churning labels)

    @property
    def series(self) -> int:
        return sum(len(per_node) for per_node in self._nodes.values())

    # The verdict on a series from its labels (cached by the hash of their bytes).
    def _series_of(self, labels: Mapping[str, str]) -> list[Any]:
        name = labels.get("__name__", "")
        if not name:
            return _NO_NAME
        if name not in self._wanted or any(labels.get(label, "") != value for label, value in self._pinned):
            return _IGNORED
        node = node_name_of(labels, self._node_labels)
        if node is None:
            return _IGNORED
        ident = hash(tuple(sorted(labels.items())))
        held = self._nodes.get(node, {}).get(ident)
        if held is not None:
            return held
        # Interned: every series of a node, a GPU or a metric holds the same string, not a copy of its own.
        node, name = sys.intern(node), sys.intern(name)
        kept = {label: sys.intern(labels[label]) for label in self._kept if label in labels}
        # The series of one device share one labels object: less memory, and build_snapshot reads it once.
        kept = self._shared.setdefault(tuple(chain.from_iterable(kept.items())), kept)
        return [node, ident, name, kept, math.nan, -1, False]

    def decode(self, data: bytes) -> list[tuple[list[Any], float, int]]:
        """The samples of a decoded WriteRequest as (series, value, timestamp ms), in order, without changing
        anything (raises Refused). Known series from the label cache; new ones decoded by the protobuf runtime."""
        updates: list[tuple[list[Any], float, int]] = []
        append = updates.append
        cache = self._by_labels
        unpack_double = _unpack_double
        startswith, from_bytes = data.startswith, int.from_bytes
        pos, end_of_data = 0, len(data)
        while pos < end_of_data:
            tag = data[pos]
            if tag == 0x0A:  # timeseries, length-delimited
                pos += 1
                length = data[pos] if pos < end_of_data else 0x80
                if length < 0x80:
                    pos += 1
                elif pos + 1 < end_of_data and data[pos + 1] < 0x80:  # a series of 128 bytes to 16 KiB: the usual
                    length = length & 0x7F | data[pos + 1] << 7
                    pos += 2
                else:
                    length, pos = _varint(data, pos)
                end = pos + length
                if end > end_of_data:
                    raise Refused(MALFORMED, "not a WriteRequest: a series runs past the end")
                # The usual framing: the labels, then one sample {0x09 value, 0x10 timestamp of 6 varint bytes}:
                # the timestamp's bytes read as one little-endian word, continuation bits checked and dropped.
                cut = end - 18
                if cut >= pos and startswith(b"\x12\x10\x09", cut) and data[cut + 11] == 0x10:
                    word = from_bytes(data[end - 6 : end], "little")
                    if word & 0x808080808080 == 0x008080808080:
                        region = data[pos:cut]
                        key = hash(region)
                        series = cache.get(key)
                        if series is None:
                            series = self._learn(region, key)
                        if series is not None:
                            if series is _NO_NAME:
                                raise Refused(MALFORMED, "a series without __name__")
                            stamp = (
                                word & 0x7F
                                | word >> 1 & 0x3F80
                                | word >> 2 & 0x1FC000
                                | word >> 3 & 0xFE00000
                                | word >> 4 & 0x7F0000000
                                | word >> 5 & 0x3F800000000
                            )
                            append((series, unpack_double(data, cut + 3)[0], stamp))
                            pos = end
                            continue
                self._decode_series(data[pos:end], append)
                pos = end
                continue
            key_tag, pos = _varint(data, pos)
            if key_tag >> 3 == 0:
                raise Refused(MALFORMED, "not a WriteRequest: field number 0")
            pos = _skip_field(data, pos, key_tag & 7)  # metadata (3) and fields of later versions
        return updates

    def _learn(self, region: bytes, key: int) -> list[Any] | None:
        """The series whose labels are the bytes ``region``, cached; None when the region is not labels alone (then
        the caller decodes the whole series)."""
        try:
            ts = TimeSeries.FromString(region)
        except Exception:  # the protobuf runtime's DecodeError, or a string that is not UTF-8
            return None
        if len(ts.samples):
            return None
        if len(self._by_labels) >= self.max_cached:
            self._by_labels.clear()
            self._shared.clear()
        series = self._series_of({label.name: label.value for label in ts.labels})
        self._by_labels[key] = series
        return series

    def _decode_series(self, raw: bytes, append: Callable[[tuple[list[Any], float, int]], None]) -> None:
        try:
            ts = TimeSeries.FromString(raw)
        except Exception as exc:
            raise Refused(MALFORMED, f"not a WriteRequest: {exc}") from None
        series = self._series_of({label.name: label.value for label in ts.labels})
        if series is _NO_NAME:
            raise Refused(MALFORMED, "a series without __name__")
        for sample in ts.samples:
            append((series, sample.value, sample.timestamp))

    def write(self, data: bytes) -> WriteResult:
        """Decode a WriteRequest (``data``, snappy already undone) and apply it whole, or refuse it whole."""
        with self._lock:
            updates = self.decode(data)
            result = self._apply(updates)
        if result.accepted:
            self.first_sample.set()
        return result

    def _apply(self, updates: list[tuple[list[Any], float, int]]) -> WriteResult:
        result = WriteResult()
        nodes, changed = self._nodes, self._changed
        now = time.monotonic()
        for series, value, stamp in updates:
            if series is _IGNORED:
                result.ignored += 1
                continue
            if stamp < series[_STAMP]:
                result.out_of_order += 1
                continue
            series[_STAMP] = stamp
            if value != value and _unpack_bits(struct.pack("<d", value))[0] == STALE_NAN_BITS:
                if series[_LIVE]:
                    series[_LIVE] = False
                    del nodes[series[_NODE]][series[_IDENT]]
                    changed.setdefault(series[_NODE], now)
                    result.removed += 1
                continue
            series[_VALUE] = value
            if not series[_LIVE]:
                series[_LIVE] = True
                nodes.setdefault(series[_NODE], {})[series[_IDENT]] = series
            node = series[_NODE]
            if node not in changed:
                changed[node] = now
            result.accepted += 1
        return result

    def take_changed(self, settle: float = 0.0) -> tuple[dict[str, list[Sample]], set[str]]:
        """The samples of the nodes changed since they were last taken, and those nodes (nodes without samples left
        are among them, absent from the first). A node is taken once every series of it holds a sample of the same
        scrape (one timestamp: Prometheus stamps a target's scrape once), or ``settle`` seconds after its first
        change: Prometheus' shards deliver a node's scrape in several requests, and a node rebuilt for each would cost
        its build several times per interval."""
        now = time.monotonic()
        with self._lock, _gc_paused():  # a Sample per series: the GC would walk the store again and again
            taken: set[str] = set()
            out: dict[str, list[Sample]] = {}
            for node, since in self._changed.items():
                per_node = self._nodes.get(node)
                if not per_node:
                    self._nodes.pop(node, None)
                    taken.add(node)
                    continue
                if now - since < settle:
                    stamps = [s[_STAMP] for s in per_node.values()]
                    if min(stamps) != max(stamps):
                        continue  # the rest of this scrape is on its way
                taken.add(node)
                out[node] = [Sample(s[_NAME], s[_LABELS], s[_VALUE], s[_STAMP] / 1000.0) for s in per_node.values()]
            for node in taken:
                del self._changed[node]
            return out, taken

    def expire(self, now_ms: int) -> int:
        """Drop series not written for SERIES_LOOKBACK_SECONDS (their nodes count as changed); how many."""
        oldest = now_ms - int(SERIES_LOOKBACK_SECONDS * 1000)
        dropped = 0
        with self._lock:
            for node, per_node in list(self._nodes.items()):
                old = [ident for ident, s in per_node.items() if s[_STAMP] < oldest]
                for ident in old:
                    per_node.pop(ident)[_LIVE] = False
                if old:
                    dropped += len(old)
                    self._changed.setdefault(node, time.monotonic())
        return dropped

    def empty(self) -> bool:
        return not self._nodes

    def node_count(self) -> int:
        return len(self._nodes)


# --- the snapshot ----------------------------------------------------------------------------------------------------


class PushSource:
    """MetricsSource of METRICS_SOURCE=push: each fetch rebuilds the nodes whose samples changed since the last one
    (screen_samples, build_snapshot, drop_future_nodes: the pull form's rules) and keeps the others' objects, so the
    decision tables keep their verdicts for them. ``start`` opens the receiver's listener, ``aclose`` closes it."""

    name = "push"
    deadline = 60.0  # a rebuild of every node of a large fleet takes seconds on a small machine

    def __init__(
        self,
        store: SampleStore,
        node_labels: tuple[str, ...],
        clock: Callable[[], float] = time.time,
        max_skew: float = DEFAULT_MAX_CLOCK_SKEW,
        listener: Callable[[], Awaitable[Callable[[], Awaitable[None]]]] | None = None,
        await_fleet: bool = True,
    ) -> None:
        self.store = store
        self._node_labels = node_labels
        self._clock = clock
        self._max_skew = max_skew
        self._listener = listener
        self._stop: Callable[[], Awaitable[None]] | None = None
        self._base: dict[str, NodeMetrics] = {}  # every node built, dated in the future or not
        self._previous = EMPTY_SNAPSHOT
        self._awaited = not await_fleet  # False: the first fetch waits for the fleet (_await_first_samples)
        self._swept = clock()
        self.report: FetchReport | None = None

    async def start(self) -> None:
        if self._listener is not None and self._stop is None:
            self._stop = await self._listener()

    async def aclose(self) -> None:
        if self._stop is not None:
            stop, self._stop = self._stop, None
            await stop()

    async def fetch(self, version: int) -> MetricsSnapshot | None:
        if not self._awaited:  # the first snapshot: once the receiver has the fleet
            self._awaited = True
            await self._await_first_samples()
        now = self._clock()
        if now - self._swept >= SERIES_LOOKBACK_SECONDS / 10:
            self._swept = now
            await asyncio.to_thread(self.store.expire, int(now * 1000))
        samples, changed = await asyncio.to_thread(self.store.take_changed, SETTLE_SECONDS)
        if not changed and self._previous is not EMPTY_SNAPSHOT:
            return None
        snapshot, self.report = await asyncio.to_thread(self._build, samples, changed, version)
        self._previous = snapshot
        return snapshot

    async def _await_first_samples(self) -> None:
        """A receiver just started knows no node: the first snapshot waits (``/readyz``: loading) for the first pushed
        sample and the rest of that scrape, FIRST_SAMPLE_WAIT_SECONDS at most, as GPUScore's first pod does."""
        log.info("waiting for the first pushed samples (%.0f s at most)", FIRST_SAMPLE_WAIT_SECONDS)
        began = time.monotonic()
        if await asyncio.to_thread(self.store.first_sample.wait, FIRST_SAMPLE_WAIT_SECONDS):
            # Then until no new node has come for the settle time: the rest of the scrape, which Prometheus sends in
            # several requests (slowly when it catches up on what it could not send): a node not heard of yet would
            # be decided on as a node without metrics.
            nodes, steady = self.store.node_count(), time.monotonic()
            while time.monotonic() - steady < FIRST_SAMPLE_SETTLE_SECONDS:
                if time.monotonic() - began >= FIRST_SAMPLE_WAIT_SECONDS:
                    break
                await asyncio.sleep(min(0.25, FIRST_SAMPLE_SETTLE_SECONDS / 4 + 0.001))
                if (count := self.store.node_count()) != nodes:
                    nodes, steady = count, time.monotonic()
            log.info("pushed samples received (%d nodes)", nodes)
        else:
            log.warning(
                "no pushed sample in %.0f s: deciding without metrics (ON_MISSING_METRICS decides) until Prometheus "
                "sends; check its remote_write entries for this receiver",
                FIRST_SAMPLE_WAIT_SECONDS,
            )

    def _build(
        self, by_node: Mapping[str, list[Sample]], changed: set[str], version: int
    ) -> tuple[MetricsSnapshot, FetchReport]:
        with _gc_paused():
            return self._build_nodes(by_node, changed, version)

    def _build_nodes(
        self, by_node: Mapping[str, list[Sample]], changed: set[str], version: int
    ) -> tuple[MetricsSnapshot, FetchReport]:
        report = FetchReport()
        samples = [sample for per_node in by_node.values() for sample in per_node]
        if samples or self.store.empty():
            samples = screen_samples(samples, self._node_labels, report)
        now = self._clock()
        fresh = build_snapshot(samples, self._node_labels, default_time=now, taken_at=now, version=version)
        for node in changed:
            self._base.pop(node, None)
        self._base.update(keep_unchanged(fresh.nodes, self._previous))
        snapshot = snapshot_of(self._base, taken_at=now, version=version)
        return drop_future_nodes(snapshot, now, self._max_skew, report), report


# --- the receiver ----------------------------------------------------------------------------------------------------


class TokenFile:
    """The bearer token senders must present, read again whenever the file changes (a rotated Secret)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._seen: tuple[int, int, int] | None = None
        self._expected: bytes | None = None
        self._problem: str | None = None

    def expected(self) -> bytes | None:
        """The Authorization header a sender must send, or None while the file cannot give one (logged once)."""
        try:
            stat = self.path.stat()
            seen = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
            if seen != self._seen:
                token = self.path.read_bytes().strip()
                self._seen = seen
                self._expected = b"Bearer " + token if token else None
                self._report(None if token else f"REMOTE_WRITE_TOKEN_FILE {self.path} is empty")
        except OSError as exc:
            self._seen, self._expected = None, None
            self._report(f"cannot read REMOTE_WRITE_TOKEN_FILE {self.path}: {exc.strerror or exc}")
        return self._expected

    def _report(self, problem: str | None) -> None:
        if problem and problem != self._problem:
            log.error("%s: every remote write is refused until it holds a token", problem)
        elif problem is None and self._problem is not None:
            log.info("REMOTE_WRITE_TOKEN_FILE %s holds a token again", self.path)
        self._problem = problem


def snappy_decoded_length(body: bytes) -> int:
    """The length a snappy block says it decodes to (its leading varint, at most 5 bytes); raises Refused."""
    result = 0
    for i in range(min(5, len(body))):
        byte = body[i]
        result |= (byte & 0x7F) << (7 * i)
        if byte < 0x80:
            return result
    raise Refused(MALFORMED, "not a snappy block: no length header")


def _media_problem(headers: Mapping[bytes, bytes]) -> str | None:
    content_type = headers.get(b"content-type", b"").decode("latin-1")
    media, _, params = content_type.partition(";")
    proto = dict(
        (key.strip().lower(), value.strip()) for key, _, value in (p.partition("=") for p in params.split(";") if p)
    ).get("proto")
    if media.strip().lower() != "application/x-protobuf" or proto not in (None, "prometheus.WriteRequest"):
        return f"Content-Type {content_type or '(none)'}, expected application/x-protobuf (remote write 1.0)"
    encoding = headers.get(b"content-encoding", b"").decode("latin-1")
    if encoding.strip().lower() != "snappy":
        return f"Content-Encoding {encoding or '(none)'}, expected snappy"
    return None


Receive = Callable[[], Awaitable[dict[str, Any]]]


class Receiver:
    """The remote-write endpoint as a plain ASGI app (POST WRITE_PATH): checks, then decodes and applies in one
    worker thread, so that the event loop, which also answers kube-scheduler, is never held by a large write."""

    def __init__(
        self,
        store: SampleStore,
        token: TokenFile,
        on_refused: Callable[[str], None] = lambda reason: None,
        on_written: Callable[[WriteResult], None] = lambda result: None,
    ) -> None:
        self.store = store
        self.token = token
        self._on_refused = on_refused
        self._on_written = on_written
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="remote-write")

    async def __call__(
        self, scope: dict[str, Any], receive: Callable[[], Awaitable[dict[str, Any]]], send: Any
    ) -> None:
        if scope["type"] != "http":
            return
        status, body = 204, b""
        try:
            status = await self._handle(scope, receive)
        except Refused as exc:
            client = scope.get("client")
            log.warning(
                "remote write from %s refused (%s, HTTP %d): %s",
                client[0] if client else "?",
                exc.reason,
                exc.status,
                exc,
            )
            self._on_refused(exc.reason)
            status, body = exc.status, (str(exc) + "\n").encode()
        except Exception:  # a bug: logged here with its traceback, never sent to the sender
            log.exception("remote write failed")
            self._on_refused(INTERNAL)
            status, body = 500, b"internal error\n"
        headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def _handle(self, scope: dict[str, Any], receive: Receive) -> int:
        if scope["path"] != WRITE_PATH:
            return 404
        headers = dict(scope["headers"])
        expected = self.token.expected()
        given = headers.get(b"authorization", b"")
        if expected is None or not hmac.compare_digest(given, expected):
            raise Refused(UNAUTHENTICATED, "no bearer token" if not given else "wrong bearer token")
        if scope["method"] != "POST":
            raise Refused(METHOD, f"method {scope['method']}, not POST")
        problem = _media_problem(headers)
        if problem:
            raise Refused(UNSUPPORTED_MEDIA, problem)
        declared = headers.get(b"content-length", b"0")
        if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
            raise Refused(TOO_LARGE, f"body of {int(declared)} bytes, over {MAX_BODY_BYTES}")
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return 499
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                raise Refused(TOO_LARGE, f"body over {MAX_BODY_BYTES} bytes")
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        result = await asyncio.get_running_loop().run_in_executor(self._worker, self.process, b"".join(chunks))
        self._on_written(result)
        return 204

    def process(self, body: bytes) -> WriteResult:
        """A request body (snappy) into the store, whole or not at all (raises Refused)."""
        decoded = snappy_decoded_length(body)
        if decoded > MAX_DECODED_BYTES:
            raise Refused(TOO_LARGE, f"decodes to {decoded} bytes, over {MAX_DECODED_BYTES}")
        try:
            data = bytes(cramjam.snappy.decompress_raw(body))
        except Exception as exc:  # cramjam.DecompressionError
            raise Refused(MALFORMED, f"not a snappy block: {exc}") from None
        if len(data) != decoded:
            raise Refused(MALFORMED, "not a snappy block: its length header is wrong")
        return self.store.write(data)

    def close(self) -> None:
        self._worker.shutdown(wait=False, cancel_futures=True)


def listen(
    app: Receiver, address: str, cert_file: Path | None = None, key_file: Path | None = None
) -> Callable[[], Awaitable[Callable[[], Awaitable[None]]]]:
    """The receiver's listener, bound now (raises MetricsSourceError when it cannot listen or the TLS pair is
    unusable: the app is refused before it starts), served from the returned starter on: a uvicorn server in the
    running event loop, beside the scheduler's. The starter returns the coroutine function that stops it."""
    import ssl

    import uvicorn

    from gpufleet_extender.config import host_port

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:  # the scheduler's server owns the process' signals
            yield

    host, port = host_port(address)
    try:
        sock = socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
    except OSError as exc:
        raise MetricsSourceError(f"cannot listen on REMOTE_WRITE_ADDRESS {address}: {exc.strerror}") from None
    tls = {"ssl_certfile": str(cert_file), "ssl_keyfile": str(key_file)} if cert_file and key_file else {}
    # No log_config or log_level: the process' logging is the scheduler server's, not to be configured twice.
    config = uvicorn.Config(
        app,
        interface="asgi3",
        lifespan="off",
        access_log=False,
        log_config=None,
        log_level=None,
        **tls,  # type: ignore[arg-type]
    )
    try:
        config.load()
    except (OSError, ssl.SSLError) as exc:
        sock.close()
        raise MetricsSourceError(
            f"cannot use REMOTE_WRITE_CERT_FILE/KEY_FILE ({cert_file}, {key_file}): {exc}"
        ) from None

    async def start() -> Callable[[], Awaitable[None]]:
        server = Server(config)
        task = asyncio.create_task(server.serve(sockets=[sock]), name="remote-write-receiver")
        log.info("remote-write receiver on %s://%s%s", "https" if tls else "http", address, WRITE_PATH)

        async def stop() -> None:
            server.should_exit = True
            with contextlib.suppress(asyncio.CancelledError):
                await task
            sock.close()
            app.close()

        return stop

    return start
