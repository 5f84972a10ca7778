"""dcgm-exporter series -> an immutable per-node snapshot of device load (pure, no I/O).

Whole GPUs are the series without a MIG instance label, keyed by ``gpu`` (or ``UUID``); their utilisation is
``DCGM_FI_DEV_GPU_UTIL`` (percent). MIG instances carry ``GPU_I_PROFILE``/``GPU_I_ID``; DCGM does not report
GPU_UTIL per instance, so their utilisation is ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` (a ratio). Memory
utilisation is ``FB_USED / (FB_USED + FB_FREE)`` where both are present. A GPU split into MIG instances is
not a whole GPU the device plugin can hand out, so it is left out of ``nvidia.com/gpu``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NamedTuple

from gpufleet_extender.pods import MIG_RESOURCE_PREFIX, WHOLE_GPU_RESOURCE

GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
GR_ENGINE_ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
FB_USED = "DCGM_FI_DEV_FB_USED"
FB_FREE = "DCGM_FI_DEV_FB_FREE"
DCGM_METRICS = (GPU_UTIL, GR_ENGINE_ACTIVE, FB_USED, FB_FREE)


class Sample(NamedTuple):
    """One series value: metric name, labels, value, and its timestamp (unix seconds) when known. A named tuple:
    immutable, and built in a fifth of a frozen dataclass' time (a refresh builds one per series of the fleet)."""

    name: str
    labels: Mapping[str, str]
    value: float
    timestamp: float | None = None


@dataclass(frozen=True, slots=True)
class DeviceMetrics:
    """Load of one device: ``util`` and ``mem`` in 0..1 (``mem`` None when FB metrics are missing)."""

    key: str
    util: float
    mem: float | None
    pods: int | None = None  # pods holding the device at the sample (time-slicing); None: the source does not say


@dataclass(frozen=True, slots=True)
class NodeMetrics:
    name: str
    sample_time: float  # newest sample of the node, unix seconds
    devices: Mapping[str, tuple[DeviceMetrics, ...]]  # extended resource name -> devices


@dataclass(frozen=True, slots=True)
class MetricsSnapshot:
    nodes: Mapping[str, NodeMetrics] = field(default_factory=dict)
    taken_at: float | None = None  # when the source last answered; None: never
    version: int = 0
    newest_sample: float | None = None  # the most recent sample_time of any node

    def age(self, now: float) -> float:
        """Age of the newest sample: how old the freshest thing the extender knows is (inf: nothing)."""
        newest = self.newest_sample
        return math.inf if newest is None else max(0.0, now - newest)


EMPTY_SNAPSHOT = MetricsSnapshot()


@dataclass(slots=True)
class _DeviceAccumulator:
    gpu: str
    profile: str
    util_percent: float | None = None
    gr_active: float | None = None
    fb_used: float | None = None
    fb_free: float | None = None
    pods: set[str] | None = None  # pods dcgm-exporter maps to the device; None: no series carried a pod label


def _pod_of(labels: Mapping[str, str]) -> str | None:
    """The pod a dcgm-exporter series is attributed to ("" for none); None when the series has no pod label.

    Prometheus renames the exporter's ``pod`` to ``exported_pod`` when its own target label ``pod`` (the
    exporter's pod) clashes, so that one wins.
    """
    for name, namespace in (("exported_pod", "exported_namespace"), ("pod", "namespace")):
        if name in labels:
            pod = labels[name]
            return f"{labels.get(namespace, '')}/{pod}" if pod else ""
    return None


def _clamp01(value: float) -> float:
    return min(1.0, max(0.0, value))


# A NodeMetrics as plain tuples: (name, sample_time, ((resource, ((key, util, mem), ...)), ...)). Rows pickle
# and compare at C speed, so a snapshot built in a worker process crosses over in small, cheap pieces.
NodeRow = tuple[str, float, tuple[tuple[str, tuple[tuple[str, float, float | None, int | None], ...]], ...]]


def node_row(metrics: NodeMetrics) -> NodeRow:
    devices = tuple((res, tuple((d.key, d.util, d.mem, d.pods) for d in devs)) for res, devs in metrics.devices.items())
    return metrics.name, metrics.sample_time, devices


def node_from_row(row: NodeRow) -> NodeMetrics:
    name, sample_time, devices = row
    return NodeMetrics(
        name, sample_time, MappingProxyType({res: tuple(DeviceMetrics(*d) for d in devs) for res, devs in devices})
    )


def snapshot_of(nodes: Mapping[str, NodeMetrics], taken_at: float | None, version: int) -> MetricsSnapshot:
    return MetricsSnapshot(
        nodes=MappingProxyType(dict(nodes)),
        taken_at=taken_at,
        version=version,
        newest_sample=max((m.sample_time for m in nodes.values()), default=None),
    )


def keep_unchanged(nodes: Mapping[str, NodeMetrics], previous: MetricsSnapshot) -> dict[str, NodeMetrics]:
    """``nodes`` with the previous snapshot's object for every node whose metrics are equal.

    The decision tables tell changed nodes by identity: a node that kept its object keeps its verdicts.
    """
    old = previous.nodes
    return {name: kept if (kept := old.get(name)) == metrics else metrics for name, metrics in nodes.items()}


def node_name_of(labels: Mapping[str, str], node_labels: Iterable[str]) -> str | None:
    for label in node_labels:
        name = labels.get(label)
        if name:
            return name
    return None


def build_snapshot(
    samples: Iterable[Sample],
    node_labels: Iterable[str],
    default_time: float,
    taken_at: float,
    version: int,
    node_sample_times: Mapping[str, float] | None = None,
) -> MetricsSnapshot:
    """Fold dcgm-exporter samples into a MetricsSnapshot.

    ``default_time`` dates samples that carry no timestamp (file mtime, query time); ``node_sample_times``
    overrides the per-node sample time (Prometheus reports it separately).
    """
    node_labels = tuple(node_labels)
    devices: dict[tuple[str, str, str], _DeviceAccumulator] = {}
    sample_times: dict[str, float] = {}
    # The series of one device often share one labels object (the push store's series): what the labels say is
    # read once per object. The memo holds the object, so that its id is not reused by another while the fold runs.
    read: dict[int, tuple[Mapping[str, str], _DeviceAccumulator | None, str | None, str]] = {}
    for sample in samples:
        if sample.name not in DCGM_METRICS or not math.isfinite(sample.value):
            continue
        labels = sample.labels
        known = read.get(id(labels))
        if known is not None and known[0] is labels:
            _, acc, pod, node = known
            if acc is None:
                continue
        else:
            found = node_name_of(labels, node_labels)
            if found is None:
                read[id(labels)] = (labels, None, None, "")
                continue
            node = found
            gpu = labels.get("gpu") or labels.get("UUID") or ""
            instance = labels.get("GPU_I_ID", "")
            profile = labels.get("GPU_I_PROFILE", "") if instance else ""
            acc = devices.get((node, gpu, instance))
            if acc is None:
                acc = devices[(node, gpu, instance)] = _DeviceAccumulator(gpu, profile)
            pod = _pod_of(labels)
            read[id(labels)] = (labels, acc, pod, node)
        if pod is not None:  # time-slicing: one series per pod sharing the device (dcgm-exporter's pod mapping)
            if acc.pods is None:
                acc.pods = set()
            if pod:
                acc.pods.add(pod)
        # Several series of one metric on one device (pods sharing it, on which dcgm-exporter writes the device's
        # one value; or two exporters' series, which the pull form's query folds with max): the highest counts.
        value = sample.value
        if sample.name == GPU_UTIL:
            if acc.util_percent is None or value > acc.util_percent:
                acc.util_percent = value
        elif sample.name == GR_ENGINE_ACTIVE:
            if acc.gr_active is None or value > acc.gr_active:
                acc.gr_active = value
        elif sample.name == FB_USED:
            if acc.fb_used is None or value > acc.fb_used:
                acc.fb_used = value
        elif acc.fb_free is None or value > acc.fb_free:
            acc.fb_free = value
        stamp = sample.timestamp if sample.timestamp is not None else default_time
        held = sample_times.get(node)
        if held is None or stamp > held:  # max(held, stamp), without the call
            sample_times[node] = stamp

    split_gpus = {(node, acc.gpu) for (node, _, instance), acc in devices.items() if instance}
    per_node: dict[str, dict[str, list[DeviceMetrics]]] = {}
    for (node, gpu, instance), acc in devices.items():
        if instance:
            resource = MIG_RESOURCE_PREFIX + acc.profile if acc.profile else None
            util = acc.gr_active
            key = f"{gpu}/{instance}"
        else:
            resource = None if (node, gpu) in split_gpus else WHOLE_GPU_RESOURCE
            util = acc.util_percent / 100.0 if acc.util_percent is not None else acc.gr_active
            key = gpu
        if resource is None or util is None:
            continue
        mem = None
        if acc.fb_used is not None and acc.fb_free is not None and acc.fb_used + acc.fb_free > 0:
            mem = _clamp01(acc.fb_used / (acc.fb_used + acc.fb_free))
        pods = len(acc.pods) if acc.pods is not None else None
        per_node.setdefault(node, {}).setdefault(resource, []).append(DeviceMetrics(key, _clamp01(util), mem, pods))

    times = dict(sample_times)
    if node_sample_times:
        times.update(node_sample_times)
    nodes = {
        node: NodeMetrics(
            name=node,
            sample_time=times.get(node, default_time),
            devices=MappingProxyType({res: tuple(sorted(devs, key=lambda d: d.key)) for res, devs in by_res.items()}),
        )
        for node, by_res in per_node.items()
    }
    return snapshot_of(nodes, taken_at, version)
