"""In-flight accounting and tenant labels, fed with a fake watch event stream (the watch loop itself is thin)."""

from __future__ import annotations

import json

from gpufleet_testsupport.exposition import render_exposition
from gpufleet_testsupport.scheduler_requests import make_pod, names_args

from gpufleet_extender.cluster import ClusterState
from gpufleet_extender.config import load_settings
from gpufleet_extender.metrics_source import parse_exposition
from gpufleet_extender.service import Extender
from gpufleet_extender.snapshot import build_snapshot

from extender_helpers import body, gpus

T0 = 1_700_000_000.0


def iso(t: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod_event(kind, name, node=None, gpus_wanted=1, bound_at=None, running_at=None, phase="Pending", namespace="ns"):
    pod = make_pod({"nvidia.com/gpu": str(gpus_wanted)} if gpus_wanted else {"cpu": "1"}, namespace=namespace)
    pod["metadata"].update(name=name, uid=f"uid-{name}")
    status = {"phase": phase, "conditions": []}
    if node:
        pod["spec"]["nodeName"] = node
    if bound_at is not None:
        status["conditions"].append({"type": "PodScheduled", "status": "True", "lastTransitionTime": iso(bound_at)})
    if running_at is not None:
        status["phase"] = "Running"
        status["containerStatuses"] = [{"name": "main", "state": {"running": {"startedAt": iso(running_at)}}}]
    pod["status"] = status
    return kind, pod


def snapshot(sample_time: float, fleet=None):
    fleet = fleet or {"idle": gpus(0.0, 0.05), "busy": gpus(0.5, 0.55)}
    samples = parse_exposition(render_exposition(fleet))
    return build_snapshot(
        samples, ("Hostname",), default_time=sample_time, taken_at=sample_time, version=int(sample_time)
    )


class Clock:
    def __init__(self, now: float):
        self.now = now

    def __call__(self) -> float:
        return self.now


def feed(state: ClusterState, *events):
    for event_type, obj in events:
        state.apply_event("Pod", event_type, obj)


def test_bound_gpu_pod_counts_until_a_sample_after_it_started_running():
    clock = Clock(T0 + 10)
    state = ClusterState("gpufleet.io/tenant", inflight_max_seconds=120, clock=clock)
    feed(state, pod_event("ADDED", "p1"))  # pending, not bound: nothing assumed
    assert state.assumed_load(snapshot(T0), clock.now)[0] == {}
    feed(state, pod_event("MODIFIED", "p1", node="idle", bound_at=T0 + 5))
    assumed, valid_until = state.assumed_load(snapshot(T0), clock.now)
    assert assumed == {"idle": {"nvidia.com/gpu": 1}} and valid_until == T0 + 5 + 120
    # Running since T0+20: a sample at T0+15 does not show its load yet, one at T0+25 does.
    feed(state, pod_event("MODIFIED", "p1", node="idle", bound_at=T0 + 5, running_at=T0 + 20))
    assert state.assumed_load(snapshot(T0 + 15), T0 + 26)[0] == {"idle": {"nvidia.com/gpu": 1}}
    assert state.assumed_load(snapshot(T0 + 25), T0 + 26)[0] == {}


def test_deleted_finished_and_old_pods_stop_counting():
    state = ClusterState("gpufleet.io/tenant", inflight_max_seconds=60, clock=Clock(T0))
    feed(
        state,
        pod_event("ADDED", "a", node="idle", bound_at=T0),
        pod_event("ADDED", "b", node="idle", bound_at=T0, gpus_wanted=2),
        pod_event("ADDED", "c", node="busy", bound_at=T0),
        pod_event("ADDED", "cpu-only", node="busy", bound_at=T0, gpus_wanted=0),
    )
    assert state.assumed_load(snapshot(T0 - 1), T0 + 1)[0] == {
        "idle": {"nvidia.com/gpu": 3},
        "busy": {"nvidia.com/gpu": 1},
    }
    feed(state, pod_event("DELETED", "a", node="idle"), pod_event("MODIFIED", "c", node="busy", phase="Failed"))
    assert state.assumed_load(snapshot(T0 - 1), T0 + 1)[0] == {"idle": {"nvidia.com/gpu": 2}}
    assert state.assumed_load(snapshot(T0 - 1), T0 + 61)[0] == {}  # older than INFLIGHT_MAX_SECONDS


def test_version_changes_only_when_accounting_changes():
    state = ClusterState("gpufleet.io/tenant", 120, clock=Clock(T0))
    feed(state, pod_event("ADDED", "a", node="idle", bound_at=T0))
    version = state.version
    feed(state, pod_event("MODIFIED", "a", node="idle", bound_at=T0))  # a status heartbeat: same record
    assert state.version == version
    feed(state, pod_event("ADDED", "unbound"))
    assert state.version == version


def test_tenant_labels_from_node_and_namespace_events():
    state = ClusterState("gpufleet.io/tenant", 120)
    assert state.namespace_tenant("llm-serving") == (False, None)
    state.replace("Namespace", [{"metadata": {"name": "llm-serving", "labels": {"gpufleet.io/tenant": "llm"}}}])
    state.replace("Node", [{"metadata": {"name": "hk-gpu-01", "labels": {"gpufleet.io/tenant": "llm"}}}])
    state.apply_event("Namespace", "ADDED", {"metadata": {"name": "scratch"}})
    assert state.namespace_tenant("llm-serving") == (True, "llm")
    assert state.namespace_tenant("scratch") == (True, None)
    assert state.namespace_tenant("never-seen") == (False, None)
    assert state.node_tenant("hk-gpu-01") == "llm"
    state.apply_event("Node", "DELETED", {"metadata": {"name": "hk-gpu-01"}})
    assert state.node_tenant("hk-gpu-01") is None


def scores(extender: Extender, pod: dict, names: list[str]) -> dict[str, int]:
    return {e["Host"]: e["Score"] for e in json.loads(extender.prioritize(body(names_args(pod, names))))}


def test_a_burst_spreads_over_nodes_instead_of_piling_on_the_idle_one():
    clock = Clock(T0 + 1)
    state = ClusterState("gpufleet.io/tenant", 120, clock=clock)
    snap = snapshot(T0)
    extender = Extender(load_settings(KUBE_API="off"), cluster=state, snapshot_provider=lambda: snap, clock=clock)
    pod = make_pod({"nvidia.com/gpu": "1"})
    first = scores(extender, pod, ["idle", "busy"])
    assert first["idle"] > first["busy"]
    # kube-scheduler binds two pods to "idle"; no sample shows them yet.
    feed(
        state,
        pod_event("ADDED", "b1", node="idle", bound_at=T0 + 1),
        pod_event("ADDED", "b2", node="idle", bound_at=T0 + 1),
    )
    after = scores(extender, pod, ["idle", "busy"])
    assert after["idle"] == 0 and after["busy"] == first["busy"]
    answer = json.loads(extender.filter(body(names_args(pod, ["idle", "busy"]))))
    assert answer["NodeNames"] == ["busy"]
    assert "2 taken by pods bound since the last sample" in answer["FailedNodes"]["idle"]


def test_tenant_pools_in_names_form_from_the_watch():
    state = ClusterState("gpufleet.io/tenant", 120)
    state.replace("Namespace", [{"metadata": {"name": "img", "labels": {"gpufleet.io/tenant": "imagegen"}}}])
    state.replace(
        "Node",
        [
            {"metadata": {"name": "idle", "labels": {"gpufleet.io/tenant": "llm"}}},
            {"metadata": {"name": "busy"}},
            {"metadata": {"name": "no-metrics", "labels": {"gpufleet.io/tenant": "llm"}}},
        ],
    )
    snap = snapshot(T0)
    extender = Extender(
        load_settings(KUBE_API="off"), cluster=state, snapshot_provider=lambda: snap, clock=lambda: T0 + 1
    )
    gpu_pod = make_pod({"nvidia.com/gpu": "1"}, namespace="img")
    answer = json.loads(extender.filter(body(names_args(gpu_pod, ["idle", "busy", "no-metrics", "unknown"]))))
    assert answer["NodeNames"] == ["busy", "unknown"]  # "unknown": no label, no metrics, policy allow
    assert "tenant pool 'llm'" in answer["FailedAndUnresolvableNodes"]["idle"]
    assert "tenant pool 'llm'" in answer["FailedAndUnresolvableNodes"]["no-metrics"]
    # Pods without GPUs are not the extender's business.
    answer = json.loads(extender.filter(body(names_args(make_pod({"cpu": "1"}, namespace="img"), ["idle", "busy"]))))
    assert answer["NodeNames"] == ["idle", "busy"]
