"""The request core without HTTP: decision tables, their warm-up and the answer memo follow the snapshot."""

from __future__ import annotations

import asyncio
import json

from gpufleet_testsupport.exposition import render_exposition
from gpufleet_testsupport.scheduler_requests import make_pod, names_args, node_obj, nodes_args

from gpufleet_extender.cluster import ClusterState
from gpufleet_extender.config import load_settings
from gpufleet_extender.metrics_source import parse_exposition
from gpufleet_extender.service import Extender
from gpufleet_extender.snapshot import build_snapshot

from extender_helpers import body, gpus

NOW = 1_700_000_000.0
GPU_POD = make_pod({"nvidia.com/gpu": "1"})


def snapshot(version: int, fleet: dict):
    samples = parse_exposition(render_exposition(fleet))
    return build_snapshot(samples, ("Hostname",), default_time=NOW, taken_at=NOW, version=version)


def test_warm_builds_the_tables_of_recent_pod_shapes_for_a_new_snapshot():
    current = {"snap": snapshot(1, {"a": gpus(0.1), "b": gpus(0.95)})}
    extender = Extender(load_settings(KUBE_API="off"), snapshot_provider=lambda: current["snap"], clock=lambda: NOW)
    request = body(names_args(GPU_POD, ["a", "b"]))
    assert json.loads(extender.filter(request))["NodeNames"] == ["a"]
    assert json.loads(extender.filter(request))["NodeNames"] == ["a"]  # answered from the memo
    current["snap"] = snapshot(2, {"a": gpus(0.95), "b": gpus(0.1)})
    asyncio.run(extender.warm())
    assert len(extender._tables) == 1
    table = next(iter(extender._tables.values()))
    assert set(table.priority_json) == {"a", "b"}  # prioritize's answers prepared as well
    # The memo entry belonged to the old table: the same bytes now get the new answer.
    assert json.loads(extender.filter(request))["NodeNames"] == ["b"]
    scores = {e["Host"]: e["Score"] for e in json.loads(extender.prioritize(request))}
    assert scores["b"] > scores["a"]


def test_stale_time_alone_changes_verdicts_without_a_new_snapshot():
    clock = {"now": NOW + 10}
    snap = snapshot(1, {"a": gpus(0.1)})
    extender = Extender(
        load_settings(KUBE_API="off", ON_MISSING_METRICS="deny"),
        snapshot_provider=lambda: snap,
        clock=lambda: clock["now"],
    )
    request = body(names_args(GPU_POD, ["a"]))
    assert json.loads(extender.filter(request))["NodeNames"] == ["a"]
    clock["now"] = NOW + 31  # the sample is now older than METRICS_MAX_AGE_SECONDS
    answer = json.loads(extender.filter(request))
    assert answer["NodeNames"] == [] and "31s old" in answer["FailedNodes"]["a"]
    assert not extender.ready()


def test_a_node_without_metrics_refused_its_pool_in_the_nodes_form_is_counted_once():
    cluster = ClusterState("gpufleet.io/tenant", 120)
    cluster.replace("Namespace", [{"metadata": {"name": "team-a", "labels": {"gpufleet.io/tenant": "a"}}}])
    extender = Extender(load_settings(KUBE_API="off"), cluster=cluster, clock=lambda: NOW)
    request = body(nodes_args(GPU_POD, [node_obj("x", {"gpufleet.io/tenant": "b"}), node_obj("y")]))
    answer = json.loads(extender.filter(request))  # used to raise: the pass count went negative
    assert list(answer["FailedAndUnresolvableNodes"]) == ["x"]
    assert [item["metadata"]["name"] for item in answer["Nodes"]["items"]] == ["y"]
    samples = extender.telemetry.decisions.collect()[0].samples
    counted = {s.labels["outcome"]: s.value for s in samples if s.name.endswith("_total")}
    assert counted == {"tenant_mismatch": 1, "missing_metrics_allowed": 1}
