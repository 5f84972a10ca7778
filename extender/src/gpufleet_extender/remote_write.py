"""Prometheus remote write (protocol 1.0) into the extender: METRICS_SOURCE=push.

Prometheus sends the dcgm series it scrapes, as it scrapes them, to a receiver on a listener of its own
(REMOTE_WRITE_ADDRESS, apart from the port kube-scheduler calls): POST, ``Content-Encoding: snappy``,
``Content-Type: application/x-protobuf``, the body a snappy *block* of ``prometheus.WriteRequest``. The receiver keeps
the newest sample of every series the decision reads (``SampleStore``), grouped by node and device; each refresh
(``PushSource``) folds again the devices that got a sample since the last one and makes their nodes again, by the
pull form's rules (``screen_samples``, ``build_snapshot``, ``drop_future_nodes``: ``fold_device``, ``node_metrics``
say where and how they are followed), so both forms decide alike on the same samples, and an interval costs the
devices it changed rather than a build of the whole fleet.

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
from operator import attrgetter
from pathlib import Path
from types import MappingProxyType
from typing import Any

import cramjam
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from gpufleet_extender.metrics_source import (
    _VALID_RANGE,
    DECISION_LABELS,
    DEFAULT_MAX_CLOCK_SKEW,
    FetchReport,
    MetricsSourceError,
    drop_future_nodes,
    screen_samples,
)
from gpufleet_extender.pods import MIG_RESOURCE_PREFIX, WHOLE_GPU_RESOURCE
from gpufleet_extender.settings_contract import RECEIVER_MAX_SERIES
from gpufleet_extender.snapshot import (
    DCGM_METRICS,
    EMPTY_SNAPSHOT,
    DeviceMetrics,
    MetricsSnapshot,
    NodeMetrics,
    Sample,
    _clamp01,
    _pod_of,
    keep_unchanged,
    node_name_of,
    snapshot_of,
)

log = logging.getLogger(__name__)

OVER_LIMIT_LOG_EVERY = 10.0  # seconds: a store that is full says so in one line at most this often
WRITE_PATH = "/api/v1/write"  # Prometheus' own receiver's path; the roles point remote_write's url at it
MAX_DECODED_BYTES = 8 * 1024 * 1024  # a WriteRequest of 10,000 samples with dcgm-exporter's labels is ~4 MiB
MAX_BODY_BYTES = MAX_DECODED_BYTES  # a snappy block of a WriteRequest is several times smaller than the message
# Series a sender stopped writing without a stale marker (a restarted Prometheus sends none) leave the store after
# this long: Prometheus' lookback, after which an instant query (the pull form) no longer returns them either.
SERIES_LOOKBACK_SECONDS = 300.0
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

# A series the store holds: a list, updated in place (the same object the label cache and its node hold): its node's
# name, the hash of its labels, the metric's name, the labels the decision reads, the newest sample (value, timestamp
# in ms), what the fold reads of its labels (the metric's index in DCGM_METRICS, the device as (gpu, GPU_I_ID), the
# MIG profile, the pod: snapshot._pod_of), and the _Device it is folded into while it holds a sample (else None).
_NODE, _IDENT, _NAME, _LABELS, _VALUE, _STAMP, _METRIC, _DEVICE, _PROFILE, _POD, _HOME = range(11)
_IGNORED: list[Any] = []  # a series the decision does not read (another metric, job or namespace, no node label)
_NO_NAME: list[Any] = []  # a series without __name__: the whole write is malformed


@dataclass
class WriteResult:
    accepted: int = 0
    out_of_order: int = 0
    removed: int = 0  # series a stale marker removed
    ignored: int = 0  # samples of series the decision does not read
    over_limit: int = 0  # samples of new series not kept: the store holds max_series already


_unpack_double = struct.Struct("<d").unpack_from
_unpack_bits = struct.Struct("<Q").unpack_from
_pack_double = struct.Struct("<d").pack


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


def _six_byte_varint(tail: bytes) -> int:
    """The value of a varint of exactly six bytes (a timestamp in ms of this century), or -1 when ``tail`` is not
    one: the bytes read as one little-endian word, continuation bits checked and dropped."""
    word = int.from_bytes(tail, "little")
    if word & 0x808080808080 != 0x008080808080:
        return -1
    return (
        word & 0x7F
        | word >> 1 & 0x3F80
        | word >> 2 & 0x1FC000
        | word >> 3 & 0xFE00000
        | word >> 4 & 0x7F0000000
        | word >> 5 & 0x3F800000000
    )


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
    """node -> device -> series -> the newest sample, fed by remote writes (``write``: decode, then apply, each device
    a sample changed queued) and read by ``PushSource`` (``fold``: the queued devices folded, their nodes made again).

    ``write`` runs in the receiver's worker thread and ``fold`` in the refresh's: a lock keeps them apart.
    """

    def __init__(self, node_labels: tuple[str, ...], job: str = "", namespace: str = "") -> None:
        self._node_labels = node_labels
        self._pinned = tuple((label, value) for label, value in (("job", job), ("namespace", namespace)) if value)
        self._kept = tuple(dict.fromkeys((*node_labels, *DECISION_LABELS)))
        self._wanted = frozenset(DCGM_METRICS)
        self._nodes: dict[str, _Node] = {}  # the nodes with a series holding a sample
        self._records: dict[int, list[Any]] = {}  # hash of a series' labels -> the series, with a sample or not
        self._live = 0  # series holding a sample
        self._by_labels: dict[int, list[Any]] = {}  # hash of a series' labels bytes -> the series (or a verdict)
        self._shared: dict[tuple[str, ...], dict[str, str]] = {}  # a device's decision labels, one object
        self._dirty: list[_Device] = []  # devices with a sample not folded yet (``fold``)
        self._lock = threading.Lock()
        self.first_sample = threading.Event()  # set once a sample is kept: until then the store knows no node
        self.max_cached = 4_000_000  # label caches beyond this are dropped and rebuilt (churning labels)
        self.max_forgotten = 100_000  # series without a sample kept beyond the live ones before they are forgotten
        # The series held at most: a sender whose relabelling lets through what it should not (a label that changes
        # every scrape) cannot grow the extender's memory without bound. New series beyond it are not kept.
        self.max_series = RECEIVER_MAX_SERIES

    @property
    def series(self) -> int:
        return self._live

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
        held = self._records.get(ident)  # one series for one set of labels, however its bytes were framed
        if held is not None:
            return held
        # Interned: every series of a node, a GPU or a metric holds the same string, not a copy of its own.
        node, name = sys.intern(node), sys.intern(name)
        kept = {label: sys.intern(labels[label]) for label in self._kept if label in labels}
        # The series of one device share one labels object: less memory, and build_snapshot reads it once.
        kept = self._shared.setdefault(tuple(chain.from_iterable(kept.items())), kept)
        gpu = sys.intern(labels.get("gpu") or labels.get("UUID") or "")
        instance = sys.intern(labels.get("GPU_I_ID", ""))
        profile = sys.intern(labels.get("GPU_I_PROFILE", "")) if instance else ""
        series = self._records[ident] = [
            node,
            ident,
            name,
            kept,
            math.nan,
            -1,
            DCGM_METRICS.index(name),
            (gpu, instance),
            profile,
            _pod_of(labels),
            None,
        ]
        return series

    def decode(self, data: bytes) -> list[tuple[list[Any], float, int]]:
        """The samples of a decoded WriteRequest as (series, value, timestamp ms), in order, without changing
        anything (raises Refused). Known series from the label cache; new ones decoded by the protobuf runtime."""
        updates: list[tuple[list[Any], float, int]] = []
        append = updates.append
        cache = self._by_labels
        stamps: dict[bytes, int] = {}  # a request holds a few scrapes' timestamps, each read once
        unpack_double = _unpack_double
        startswith = data.startswith
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
                # The usual framing: the labels, then one sample {0x09 value, 0x10 timestamp of 6 varint bytes}, or
                # {0x10 timestamp} alone for a value of 0 (proto3 leaves a field at its default out: an idle device).
                cut = end - 18
                value: float | None = None
                if cut >= pos and startswith(b"\x12\x10\x09", cut) and data[cut + 11] == 0x10:
                    value = unpack_double(data, cut + 3)[0]
                elif end - 9 >= pos and startswith(b"\x12\x07\x10", end - 9):
                    cut, value = end - 9, 0.0
                if value is not None:
                    tail = data[end - 6 : end]
                    stamp = stamps.get(tail)
                    if stamp is None:
                        stamp = stamps[tail] = _six_byte_varint(tail)
                    if stamp >= 0:
                        region = data[pos:cut]
                        key = hash(region)
                        series = cache.get(key)
                        if series is None:
                            series = self._learn(region, key)
                        if series is not None:
                            if series is _NO_NAME:
                                raise Refused(MALFORMED, "a series without __name__")
                            append((series, value, stamp))
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
        """The decoded samples into their series, in order; each device a sample changed is queued for the fold."""
        accepted = out_of_order = removed = ignored = over_limit = 0
        dirty = self._dirty
        for series, value, stamp in updates:
            if series is _IGNORED:
                ignored += 1
                continue
            if stamp < series[_STAMP]:
                out_of_order += 1
                continue
            device = series[_HOME]
            if (
                device is None
                and self._live >= self.max_series
                and (value == value or _unpack_bits(_pack_double(value))[0] != STALE_NAN_BITS)
            ):
                over_limit += 1  # a new series (or one a stale marker ended) while the store is full
                continue
            series[_STAMP] = stamp
            if value != value and _unpack_bits(_pack_double(value))[0] == STALE_NAN_BITS:
                if device is not None:
                    self._detach(series)
                    removed += 1
                continue
            series[_VALUE] = value
            if device is None:
                device = self._attach(series)
            if not device.dirty:
                device.dirty = True
                dirty.append(device)
            accepted += 1
        return WriteResult(accepted, out_of_order, removed, ignored, over_limit)

    def _attach(self, series: list[Any]) -> _Device:
        """A series that had no sample (new, or removed by a stale marker or the lookback) into its node and device."""
        name = series[_NODE]
        node = self._nodes.get(name)
        if node is None:
            node = self._nodes[name] = _Node(name)
        device = node.devices.get(series[_DEVICE])
        if device is None:
            gpu, instance = series[_DEVICE]
            device = node.devices[series[_DEVICE]] = _Device(node, gpu, instance, series[_PROFILE])
        device.series.append(series)
        series[_HOME] = device
        self._live += 1
        return device

    def _detach(self, series: list[Any]) -> None:
        """A series out of its node and device (a stale marker, the lookback); its device is folded again (and left
        out of the node by the fold once it has no series)."""
        device: _Device = series[_HOME]
        series[_HOME] = None
        device.series.remove(series)
        self._live -= 1
        if not device.dirty:
            device.dirty = True
            self._dirty.append(device)

    def fold(self) -> tuple[dict[str, NodeMetrics | None], list[Sample]]:
        """Fold the devices changed since the last fold and make their nodes again: {node: NodeMetrics, or None for a
        node left out of the snapshot or gone from the store}, and the samples of those nodes that screen_samples
        would report on (a value out of range, a duplicate series), for the report. Invariant: after a fold, every
        node's NodeMetrics equals what screen_samples and build_snapshot make of the store's samples of it."""
        with self._lock, _gc_paused():  # hundreds of thousands of objects: the GC would walk the store again and again
            dirty, self._dirty = self._dirty, []
            touched: dict[str, _Node] = {}
            for device in dirty:
                device.dirty = False
                node = device.node
                touched[node.name] = node
                if device.series:
                    fold_device(device)
                elif node.devices.get((device.gpu, device.instance)) is device:
                    del node.devices[device.gpu, device.instance]
            rebuilt: dict[str, NodeMetrics | None] = {}
            findings: list[Sample] = []
            for name, node in touched.items():
                if not node.devices:
                    if self._nodes.get(name) is node:
                        del self._nodes[name]
                    rebuilt[name] = None
                    continue
                rebuilt[name], flagged = node_metrics(node)
                if flagged:
                    findings += samples_of(node)
            return rebuilt, findings

    def samples(self) -> list[Sample]:
        """Every sample the store holds, as the pull form's samples (the tests' reference)."""
        with self._lock:
            return [sample for node in self._nodes.values() for sample in samples_of(node)]

    def expire(self, now_ms: int) -> int:
        """Drop series not written for SERIES_LOOKBACK_SECONDS (their devices are folded again); how many."""
        oldest = now_ms - int(SERIES_LOOKBACK_SECONDS * 1000)
        dropped = 0
        with self._lock:
            for node in self._nodes.values():
                for device in node.devices.values():
                    for series in [s for s in device.series if s[_STAMP] < oldest]:
                        self._detach(series)
                        dropped += 1
            if len(self._records) - self._live > max(self._live, self.max_forgotten):
                self._forget()
        return dropped

    def _forget(self) -> None:
        """Forget the series without a sample (churning labels: pods come and go), here and in the label cache."""
        self._records = {ident: s for ident, s in self._records.items() if s[_HOME] is not None}
        self._by_labels = {key: s for key, s in self._by_labels.items() if not s or s[_HOME] is not None}

    def empty(self) -> bool:
        return not self._nodes

    def node_count(self) -> int:
        return len(self._nodes)


# --- the fold: a node's devices as build_snapshot makes them, device by device -------------------------------------

# The range of each metric of DCGM_METRICS, by index (the pull form's screening table, metrics_source).
_LOW = tuple(_VALID_RANGE[name][0] for name in DCGM_METRICS)
_HIGH = tuple(_VALID_RANGE[name][1] for name in DCGM_METRICS)
_by_key = attrgetter("key")


class _Device:
    """A device of a node (a whole GPU or a MIG instance: ``gpu`` or ``UUID``, and ``GPU_I_ID``), the series of it
    that hold a sample, and what the decision reads of them: ``fold_device`` sets the rest whenever one of its
    series changed (``dirty`` until then)."""

    __slots__ = (
        "bad",
        "dirty",
        "duplicates",
        "gpu",
        "instance",
        "key",
        "metrics",
        "newest",
        "node",
        "resource",
        "series",
    )

    def __init__(self, node: _Node, gpu: str, instance: str, profile: str) -> None:
        self.node = node
        self.gpu, self.instance = gpu, instance
        self.key = f"{gpu}/{instance}" if instance else gpu  # DeviceMetrics.key, as build_snapshot writes it
        # A MIG instance's resource (none without a profile); a whole GPU's is nvidia.com/gpu unless it is split.
        self.resource = (MIG_RESOURCE_PREFIX + profile if profile else None) if instance else WHOLE_GPU_RESOURCE
        self.series: list[list[Any]] = []
        self.dirty = False
        self.metrics: DeviceMetrics | None = None  # the device as a snapshot holds it; None: no utilisation
        self.newest: int | None = None  # the newest timestamp (ms) of its finite samples; None: none is finite
        self.bad = 0  # samples out of their metric's range or NaN: the node counts as without metrics
        self.duplicates = 0  # series beyond the first of a metric (pods sharing the device, two exporters)


class _Node:
    """A node's devices with a series holding a sample, in the order first seen."""

    __slots__ = ("devices", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self.devices: dict[tuple[str, str], _Device] = {}


def fold_device(device: _Device) -> None:
    """The device's figures from its series' samples, as screen_samples and build_snapshot read them: each value
    checked against its metric's range (``bad``), only finite values folded, per metric the highest of its series
    (as build_snapshot: the series of one metric on one device are pods sharing it, on which dcgm-exporter writes
    the device's one value, or exporters the pull form's ``max by`` folds into their maximum),
    the pods of its series (None when none has a pod label), its newest finite sample's timestamp. ``metrics`` is
    None when the device has no utilisation (a MIG instance without GR_ENGINE_ACTIVE, a whole GPU without either).
    Runs for every device with a new sample, hundreds of thousands per interval: kept tight."""
    best: list[float | None] = [None, None, None, None]
    counts = [0, 0, 0, 0]
    low, high, finite = _LOW, _HIGH, math.isfinite
    newest: int | None = None
    pods: set[str] | None = None
    bad = 0
    for series in device.series:
        metric, value = series[_METRIC], series[_VALUE]
        counts[metric] += 1
        if not (low[metric] <= value <= high[metric]):  # NaN too
            bad += 1
        if not finite(value):  # build_snapshot reads no NaN or infinity (+inf framebuffer passes the screening)
            continue
        held = best[metric]
        if held is None or value > held:
            best[metric] = value
        pod = series[_POD]
        if pod is not None:
            if pods is None:
                pods = set()
            if pod:
                pods.add(pod)
        stamp = series[_STAMP]
        if newest is None or stamp > newest:
            newest = stamp
    device.bad, device.newest = bad, newest
    device.duplicates = len(device.series) - (len(counts) - counts.count(0))  # series less the metrics they have
    util_percent, gr_active, used, free = best
    util = gr_active if device.instance or util_percent is None else util_percent / 100.0
    if util is None:
        device.metrics = None
        return
    if not 0.0 < util <= 1.0:  # _clamp01 only where it changes something: it costs a call per device
        util = _clamp01(util)
    mem = None
    if used is not None and free is not None and used + free > 0:
        mem = used / (used + free)
        if not 0.0 < mem <= 1.0:
            mem = _clamp01(mem)
    device.metrics = DeviceMetrics(device.key, util, mem, len(pods) if pods is not None else None)


def node_metrics(node: _Node) -> tuple[NodeMetrics | None, bool]:
    """The node as build_snapshot makes it from its screened samples, out of its devices' folds, and whether
    screen_samples would report on it (a value out of range, a duplicate series). Left out (None) when any of its
    samples is out of range or no device has a utilisation and a resource; a GPU with MIG instances (with a finite
    sample) is no ``nvidia.com/gpu``; the sample time is the newest finite sample's; resources in the order of their
    first device, each resource's devices sorted by key."""
    resources: dict[str, list[DeviceMetrics]] = {}
    whole: list[tuple[str, DeviceMetrics]] = []  # whole GPUs (gpu, metrics): nvidia.com/gpu unless split
    split: set[str] = set()
    newest, bad, duplicates = -1, 0, 0
    for device in node.devices.values():
        bad += device.bad
        duplicates += device.duplicates
        stamp = device.newest
        if stamp is None:  # no finite sample: no metrics either
            continue
        if stamp > newest:
            newest = stamp
        metrics = device.metrics
        if device.instance:
            split.add(device.gpu)
        elif metrics is not None:
            whole.append((device.gpu, metrics))
        resource = device.resource
        if metrics is None or resource is None:
            continue
        held = resources.get(resource)
        if held is None:
            resources[resource] = [metrics]
        else:
            held.append(metrics)
    if whole and split:
        gpus = [metrics for gpu, metrics in whole if gpu not in split]
        if gpus:
            resources[WHOLE_GPU_RESOURCE] = gpus
        else:
            del resources[WHOLE_GPU_RESOURCE]
    if bad or not resources:
        return None, bool(bad or duplicates)
    devices = {resource: tuple(sorted(held, key=_by_key)) for resource, held in resources.items()}
    return NodeMetrics(node.name, newest / 1000.0, MappingProxyType(devices)), bool(duplicates)


def samples_of(node: _Node) -> list[Sample]:
    """The node's series as the pull form's samples (timestamps in seconds)."""
    return [
        Sample(s[_NAME], s[_LABELS], s[_VALUE], s[_STAMP] / 1000.0)
        for device in node.devices.values()
        for s in device.series
    ]


# --- the snapshot ----------------------------------------------------------------------------------------------------


class PushSource:
    """MetricsSource of METRICS_SOURCE=push: each fetch folds the devices with a sample since the last one and makes
    their nodes again (``SampleStore.fold``), keeps the others' objects, so the decision tables keep their verdicts
    for them, and leaves out the nodes dated in the future (drop_future_nodes) as the pull form does. What it
    finds wrong (screen_samples' findings) is over the nodes it made again. ``start`` opens the receiver's listener,
    ``aclose`` closes it."""

    name = "push"
    deadline = 60.0  # generous: a fold of every device of a large fleet takes about a second on a small machine

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
        rebuilt, findings = await asyncio.to_thread(self.store.fold)
        if not rebuilt and self._previous is not EMPTY_SNAPSHOT:
            return None
        snapshot, self.report = self._snapshot(rebuilt, findings, version)
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

    def _snapshot(
        self, rebuilt: Mapping[str, NodeMetrics | None], findings: list[Sample], version: int
    ) -> tuple[MetricsSnapshot, FetchReport]:
        """The last snapshot with the nodes the fold made again (a node equal to its last object keeps that object,
        so the decision tables keep their verdicts for it), then the pull form's report and future-dated nodes."""
        report = FetchReport()
        if findings or self.store.empty():
            screen_samples(findings, self._node_labels, report)
        made = {name: metrics for name, metrics in rebuilt.items() if metrics is not None}
        for name in rebuilt.keys() - made.keys():
            self._base.pop(name, None)
        self._base.update(keep_unchanged(made, self._previous))
        now = self._clock()
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
        self._over_limit_logged = -OVER_LIMIT_LOG_EVERY  # when the last over-limit line was written

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
        if result.over_limit and time.monotonic() - self._over_limit_logged >= OVER_LIMIT_LOG_EVERY:
            self._over_limit_logged = time.monotonic()
            log.warning(
                "remote write: %d samples of new series not kept: the receiver holds %d series, its most (check "
                "Prometheus' write_relabel_configs: only the dcgm series a decision reads, with the labels it reads)",
                result.over_limit,
                self.store.max_series,
            )
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
