"""METRICS_SOURCE=push folds each device as its samples arrive: the snapshot it makes must be the pull form's.

The property: after any sequence of writes (new series, updates, samples out of order, stale markers, a node's
series all going, series expiring, values out of range, NaN, infinities, samples from the future, pods sharing a
device, whole GPUs beside MIG instances), the store holds per series its newest sample (a model of the rules says
which), every fetch's snapshot holds, node by node, what screen_samples, build_snapshot and drop_future_nodes make of
the samples the store holds at that moment, and a store fed the same writes and folded once reports the same
findings as screen_samples over those samples.
"""

from __future__ import annotations

import asyncio
import math
import struct
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet_extender.metrics_source import FetchReport, drop_future_nodes, screen_samples
from gpufleet_extender.remote_write import PushSource, SampleStore, series_field, stale_nan
from gpufleet_extender.snapshot import Sample, build_snapshot

NODE_LABELS = ("Hostname", "hostname")
JOB, NAMESPACE = "dcgm-exporter", "gpufleet-node-agents"
BASE_MS = 1_796_000_000_000
NOW = BASE_MS / 1000 + 10.0  # samples up to 20 s after BASE_MS: some from beyond the allowed clock skew
SKEW = 5.0
METRICS = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE")
# A MIG instance's profile is the exporter's for that instance (one per GPU_I_ID here); "9" has none.
PROFILES = {"": None, "1": "1g.10gb", "2": "2g.20gb", "9": None}
STALE = "stale"


def labels_of(spec: tuple[Any, ...]) -> dict[str, str]:
    """A series' labels as a Prometheus scrape of dcgm-exporter gives them."""
    node, gpu, instance, metric, pod, container, by_uuid, node_label, job = spec
    labels = {"__name__": metric, node_label: node, "job": job, "namespace": NAMESPACE, "instance": "10.0.0.1:9400"}
    labels["UUID"] = f"GPU-{node}-{gpu}"
    if not by_uuid:
        labels["gpu"] = gpu
    if instance:
        labels["GPU_I_ID"] = instance
        if PROFILES[instance]:
            labels["GPU_I_PROFILE"] = PROFILES[instance]
    if pod is not None:
        labels["exported_pod"], labels["exported_namespace"] = pod, "team-a"
    if container:
        labels["container"] = container  # a label the decision does not read: a second series of the device
    return labels


# A small fleet, so that series meet on one device: pods sharing it, a label the decision does not read, the node
# named by either label.
_specs = st.tuples(
    st.sampled_from(["node-a", "node-b"]),
    st.sampled_from(["0", "0", "1"]),
    st.sampled_from(list(PROFILES)),
    st.sampled_from([*METRICS, "up"]),
    st.sampled_from([None, None, "", "p1", "p2"]),
    st.sampled_from(["", "", "sidecar"]),
    st.sampled_from([False, False, True]),
    st.sampled_from(["Hostname", "Hostname", "hostname"]),
    st.sampled_from([JOB, JOB, JOB, "tenant-exporter"]),
)
_fine = st.one_of(
    st.floats(min_value=0.0, max_value=1.0),
    st.sampled_from([0.0, 1.0, 55.0, 100.0, 1e6, math.inf]),  # in range for some metrics or all (+inf: framebuffer)
)
_bad = st.sampled_from([-0.5, 1.5, 150.0, math.nan, -math.inf, STALE])  # some out of range for some metrics
_stamps = st.integers(BASE_MS - 20_000, BASE_MS + 20_000)


def _ops(values: st.SearchStrategy[float | str]) -> st.SearchStrategy[list[tuple[Any, ...]]]:
    write = st.lists(st.tuples(_specs, st.lists(st.tuples(values, _stamps), min_size=1, max_size=2)), max_size=16)
    return st.lists(
        st.one_of(
            st.tuples(st.just("write"), write),
            st.tuples(st.just("fetch")),
            st.tuples(st.just("node gone"), st.sampled_from(["node-a", "node-b"])),
            st.tuples(st.just("expire"), _stamps),
        ),
        max_size=12,
    )


# Half the runs without values out of range (a node with one is left out whole, which would hide the rest).
_runs = st.one_of(_ops(_fine), _ops(st.one_of(_fine, _fine, _bad)))


def marked(value: float | str) -> float:
    return stale_nan() if value == STALE else float(value)


def body(series: list[tuple[dict[str, str], list[tuple[float, int]]]]) -> bytes:
    return b"".join(series_field(labels, samples) for labels, samples in series)


KEPT = ("Hostname", "hostname", "gpu", "UUID", "GPU_I_ID", "GPU_I_PROFILE", "pod", "namespace", "exported_pod")
KEPT += ("exported_namespace",)


class Model:
    """What the store must hold: per series (its whole label set) the newest sample, none after a stale marker, none
    once expired; older samples ignored (a stale marker or an expiry keeps the series' newest timestamp)."""

    def __init__(self) -> None:
        self.stamps: dict[frozenset[tuple[str, str]], int] = {}
        self.values: dict[frozenset[tuple[str, str]], float] = {}

    def write(self, series: list[tuple[dict[str, str], list[tuple[float, int]]]]) -> None:
        for labels, samples in series:
            if labels["__name__"] not in METRICS or labels["job"] != JOB:
                continue
            key = frozenset(labels.items())
            for value, stamp in samples:
                if stamp < self.stamps.get(key, -1):
                    continue
                self.stamps[key] = stamp
                if math.isnan(value) and struct.pack("<d", value) == struct.pack("<d", stale_nan()):
                    self.values.pop(key, None)
                else:
                    self.values[key] = value

    def expire(self, before: int) -> None:
        self.values = {key: value for key, value in self.values.items() if self.stamps[key] >= before}

    def samples(self) -> list[tuple[Any, ...]]:
        return sorted(
            (dict(key)["__name__"], tuple(sorted((k, v) for k, v in key if k in KEPT)), repr(value), self.stamps[key])
            for key, value in self.values.items()
        )


def held(store: SampleStore) -> list[tuple[Any, ...]]:
    return sorted(
        (s.name, tuple(sorted(s.labels.items())), repr(s.value), round(s.timestamp * 1000)) for s in store.samples()
    )


def reference(samples: list[Sample]) -> tuple[dict[str, Any], FetchReport]:
    """The pull form on the store's samples (a device's several series of one metric fold into their highest value
    in both)."""
    report = FetchReport()
    screened = screen_samples(samples, NODE_LABELS, report)
    built = build_snapshot(screened, NODE_LABELS, default_time=NOW, taken_at=NOW, version=1)
    return dict(drop_future_nodes(built, NOW, SKEW, report).nodes), report


def fetch(source: PushSource, held: Any) -> Any:
    fresh = asyncio.run(source.fetch(1))
    return held if fresh is None else fresh


@settings(max_examples=800, deadline=None)
@given(_runs)
def test_every_fetch_holds_what_the_pull_form_makes_of_the_stores_samples(ops):
    store = SampleStore(NODE_LABELS, JOB, NAMESPACE)
    source = PushSource(store, NODE_LABELS, clock=lambda: NOW, max_skew=SKEW, await_fleet=False)
    bodies: list[bytes] = []
    written: set[tuple[Any, ...]] = set()
    snapshot = None
    model = Model()
    for op in [*ops, ("fetch",)]:
        if op[0] == "write":
            series = [(labels_of(spec), [(marked(v), t) for v, t in samples]) for spec, samples in op[1]]
            written.update(spec for spec, _ in op[1])
            bodies.append(body(series))
            store.write(bodies[-1])
            model.write(series)
        elif op[0] == "node gone":  # Prometheus marks every series of a target that went away stale
            gone = [(labels_of(spec), [(stale_nan(), BASE_MS + 30_000)]) for spec in written if spec[0] == op[1]]
            bodies.append(body(gone))
            store.write(bodies[-1])
            model.write(gone)
        elif op[0] == "expire":  # the series last written before op[1] are dropped
            store.expire(op[1] + 300_000)
            model.expire(op[1])
            bodies.append(b"")
        else:
            assert held(store) == model.samples()
            snapshot = fetch(source, snapshot)
            want, _ = reference(store.samples())
            assert dict(snapshot.nodes) == want
            assert snapshot.newest_sample == max((n.sample_time for n in want.values()), default=None)

    # The findings: a store fed the same writes (expiring where the first did) and folded once reports on every node.
    again = SampleStore(NODE_LABELS, JOB, NAMESPACE)
    for op, data in zip([o for o in ops if o[0] != "fetch"], bodies, strict=True):
        if op[0] == "expire":
            again.expire(op[1] + 300_000)
        else:
            again.write(data)
    once = PushSource(again, NODE_LABELS, clock=lambda: NOW, max_skew=SKEW, await_fleet=False)
    folded = asyncio.run(once.fetch(1))
    want, report = reference(again.samples())
    assert dict(folded.nodes) == want == dict(snapshot.nodes)
    assert once.report is not None and once.report.faults == report.faults


def _node(name: str, stamp: int, gr: float = 0.5, used: float = 100.0) -> list[tuple[dict[str, str], list]]:
    series = []
    for gpu in ("0", "1"):
        for instance in ("1", "2"):
            for metric, value in (("DCGM_FI_PROF_GR_ENGINE_ACTIVE", gr), ("DCGM_FI_DEV_FB_USED", used)):
                spec = (name, gpu, instance, metric, None, "", False, "Hostname", JOB)
                series.append((labels_of(spec), [(value, stamp)]))
            spec = (name, gpu, instance, "DCGM_FI_DEV_FB_FREE", None, "", False, "Hostname", JOB)
            series.append((labels_of(spec), [(900.0, stamp)]))
    return series


def test_a_fetch_remakes_only_the_nodes_with_new_samples_and_keeps_the_others_objects():
    store = SampleStore(NODE_LABELS, JOB, NAMESPACE)
    source = PushSource(store, NODE_LABELS, clock=lambda: NOW, max_skew=SKEW, await_fleet=False)
    store.write(body(_node("node-a", BASE_MS) + _node("node-b", BASE_MS)))
    first = asyncio.run(source.fetch(1))
    assert asyncio.run(source.fetch(2)) is None  # nothing new: nothing folded
    store.write(body(_node("node-a", BASE_MS + 1_000, gr=0.9)))
    second = asyncio.run(source.fetch(3))
    assert second.nodes["node-b"] is first.nodes["node-b"]
    assert [d.util for d in second.nodes["node-a"].devices["nvidia.com/mig-1g.10gb"]] == [0.9, 0.9]
    assert second.nodes["node-a"].sample_time == BASE_MS / 1000 + 1
    # The same values a scrape later: a node equal to its last object keeps it (the decision tables' verdicts).
    store.write(body(_node("node-b", BASE_MS)))
    assert asyncio.run(source.fetch(4)).nodes["node-b"] is first.nodes["node-b"]


def test_half_a_scrape_reaches_the_next_fetch():
    # Prometheus' shards send a node's series in several requests: what has come is decided on at the next fetch.
    store = SampleStore(NODE_LABELS, JOB, NAMESPACE)
    source = PushSource(store, NODE_LABELS, clock=lambda: NOW, max_skew=SKEW, await_fleet=False)
    store.write(body(_node("node-a", BASE_MS)))
    asyncio.run(source.fetch(1))
    later = _node("node-a", BASE_MS + 15_000, gr=0.8)
    store.write(body(later[:3]))  # gpu 0, instance 1's three series
    devices = asyncio.run(source.fetch(2)).nodes["node-a"].devices["nvidia.com/mig-1g.10gb"]
    assert [d.util for d in devices] == [0.8, 0.5]


def _fold_once(series: list[tuple[dict[str, str], list[tuple[float, int]]]]) -> dict[str, Any]:
    store = SampleStore(NODE_LABELS, JOB, NAMESPACE)
    store.write(body(series))
    snapshot = asyncio.run(PushSource(store, NODE_LABELS, clock=lambda: NOW, await_fleet=False).fetch(1))
    assert dict(snapshot.nodes) == reference(store.samples())[0]
    return dict(snapshot.nodes)


def test_series_of_one_metric_on_one_device_fold_into_their_highest_value():
    # Two pods sharing a MIG instance: dcgm-exporter writes the device's series once per pod.
    series = []
    for pod, gr in (("p1", 0.7), ("p2", 0.3)):
        for metric, value in (("DCGM_FI_PROF_GR_ENGINE_ACTIVE", gr), ("DCGM_FI_DEV_FB_USED", 10.0 * gr)):
            spec = ("node-a", "0", "1", metric, pod, "", False, "Hostname", JOB)
            series.append((labels_of(spec), [(value, BASE_MS)]))
    series.append((labels_of(("node-a", "0", "1", METRICS[3], "p1", "", False, "Hostname", JOB)), [(93.0, BASE_MS)]))
    (device,) = _fold_once(series)["node-a"].devices["nvidia.com/mig-1g.10gb"]
    assert (device.util, device.mem, device.pods) == (0.7, 0.07, 2)


def test_an_infinite_framebuffer_counts_as_no_framebuffer_reading_as_in_the_pull_form():
    series = [
        (labels_of(("node-a", "0", "", metric, None, "", False, "Hostname", JOB)), [(value, BASE_MS)])
        for metric, value in (("DCGM_FI_DEV_GPU_UTIL", 40.0), ("DCGM_FI_DEV_FB_USED", math.inf), (METRICS[3], 5.0))
    ]
    (device,) = _fold_once(series)["node-a"].devices["nvidia.com/gpu"]
    assert (device.util, device.mem) == (0.4, None)


def test_series_gone_for_good_are_forgotten_and_come_back_as_new():
    # Churning labels (pods come and go): series without a sample leave the store's caches at an expiry.
    store = SampleStore(NODE_LABELS, JOB, NAMESPACE)
    store.max_forgotten = 0
    source = PushSource(store, NODE_LABELS, clock=lambda: NOW, max_skew=SKEW, await_fleet=False)
    store.write(body(_node("node-a", BASE_MS) + _node("node-b", BASE_MS) + _node("node-c", BASE_MS)))
    gone = _node("node-a", 0) + _node("node-c", 0)
    store.write(body([(labels, [(stale_nan(), BASE_MS + 1)]) for labels, _ in gone]))
    store.expire(BASE_MS)  # nothing old enough; the stale series, more than the live ones, are forgotten
    assert len(store._records) == store.series == len(_node("node-b", 0))
    assert set(asyncio.run(source.fetch(1)).nodes) == {"node-b"}
    store.write(body(_node("node-a", BASE_MS + 2, gr=0.25)))
    snapshot = asyncio.run(source.fetch(2))
    assert dict(snapshot.nodes) == reference(store.samples())[0]
    assert [d.util for d in snapshot.nodes["node-a"].devices["nvidia.com/mig-2g.20gb"]] == [0.25, 0.25]
