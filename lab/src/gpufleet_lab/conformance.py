"""Decision vectors: what ``scoring.py`` decides on random inputs, written for the Go ``GPUScore`` plugin to match.

``scoring.py`` is the one specification of a placement decision. The scheduler-framework plugin in
``k8s/gpuscore`` is a second implementation of it, so ``go test ./gpuscore/`` checks every vector of
``k8s/gpuscore/testdata/vectors.json``, and ``tests/test_conformance.py`` regenerates the file from this module
and compares it byte for byte: a change on either side that the other does not follow fails a test.

Sections of the file (names of settings are the plugin's argument names, see ``ARG_NAMES``):

- ``args``: argument sets, whether the extender's ``Settings`` accept them and every problem in the plugin's words
  (``plugin_args.check_plugin_args``; the plugin must list the same);
- ``decisions``: a policy, a snapshot, a pod request, in-flight pods, ``auto`` modes and tenant pools ->
  the verdict, outcome, reason and score of every node (as ``Extender._table``'s ``verdict_of``);
- ``auto``: a sequence of snapshots -> the fleet's mean load and ``ModeSelector``'s modes after each;
- ``prometheus``: Prometheus query results (dcgm series, per-node sample times) -> the snapshot built from them;
- ``requests``: pod containers' resources -> the GPU request;
- ``claims``: a policy, a snapshot, ``auto`` modes and a placement score per node -> the load verdict of a DRA
  claim (``claim_load_verdict``) and GPUClaimScore's score (``claim_score``).

Random but seeded, so the output is a pure function of this code: ``python -m gpufleet_lab.conformance
PATH`` writes it. Sums of loads are ``scoring.add_loads`` (left to right, as the Go loop), never the builtin ``sum``
(compensated since Python 3.12): any Python 3.11+ writes the same file.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypedDict

import msgspec
from gpufleet_extender.config import MappingOnlySettings, Settings, SettingsError
from gpufleet_extender.metrics_source import PrometheusSource
from gpufleet_extender.plugin_args import ARG_NAMES as ARG_NAMES  # re-exported: the names the vectors use
from gpufleet_extender.plugin_args import SETTING_NAMES, UNSET_WHEN_EMPTY, check_plugin_args
from gpufleet_extender.pods import ResourceRequest, pod_gpu_request
from gpufleet_extender.scoring import (
    Mode,
    ModeSelector,
    NodeVerdict,
    Outcome,
    Policy,
    claim_load_verdict,
    claim_score,
    evaluate_node,
    fleet_mean_load,
    tenant_mismatch,
)
from gpufleet_extender.snapshot import DCGM_METRICS, DeviceMetrics, MetricsSnapshot, NodeMetrics
from gpufleet_extender.wire import Pod
from pydantic import ValidationError

SEED = 19
FORMAT_VERSION = 1


GPU = "nvidia.com/gpu"
MIGS = ("nvidia.com/mig-1g.10gb", "nvidia.com/mig-2g.20gb", "nvidia.com/mig-3g.40gb")
RESOURCES = (GPU, *MIGS)


class _Tenants(TypedDict):
    """A case's tenant pools: the pod's namespace, that namespace's tenant, each labelled node's tenant."""

    namespace: str
    namespaceTenant: str | None
    nodeTenants: dict[str, str]


def settings_of(args: dict[str, Any]) -> Settings:
    """The extender's Settings for plugin ``args``; SettingsError when the extender would refuse them."""
    unknown = sorted(set(args) - set(SETTING_NAMES))
    if unknown:
        raise SettingsError(f"unknown arguments {unknown}")
    try:
        settings = {SETTING_NAMES[name]: value for name, value in args.items()}
        return MappingOnlySettings(
            **{name: value for name, value in settings.items() if not (value == "" and name in UNSET_WHEN_EMPTY)}
        )
    except ValidationError as exc:
        raise SettingsError(str(exc)) from None


# --- random inputs -------------------------------------------------------------------------------------------


def _fraction(rng: random.Random, specials: tuple[float, ...] = ()) -> float:
    """A load in 0..1: mostly two decimals (ties between devices), sometimes a threshold exactly or full noise."""
    roll = rng.random()
    if specials and roll < 0.15:
        return rng.choice(specials)
    if roll < 0.25:
        return rng.random()
    return round(rng.random(), 2)


def _random_args(rng: random.Random, shared_focus: bool = False) -> dict[str, Any]:
    """Valid plugin arguments for a decision (only the ones that change verdicts or scores). ``shared_focus``:
    time-sliced resources and the interference term, on fresh samples, so most verdicts go through them."""
    if shared_focus:
        return {
            "scoringStrategy": "spread",
            "metricsMaxAgeSeconds": 0,
            "gpuUtilThreshold": rng.choice([0.8, 1.0, 1.0]),  # few hot devices: more scores than refusals
            "memUtilThreshold": 1.0,
            "sharedResources": {res: rng.choice([1, 2, 4, 4, 7]) for res in RESOURCES if rng.random() < 0.6},
            "interferenceWeight": rng.choice([0.0, 0.5, 1.0, round(rng.uniform(0, 3), 2)]),
            "sharedMemFreeMin": rng.choice([0.0, 0.2, 0.35, 0.35, 0.5, round(rng.uniform(0, 0.9), 2)]),
        }
    args: dict[str, Any] = {}
    strategy = rng.choice(["spread", "spread", "pack", "auto"])
    if rng.random() < 0.5:
        args["gpuUtilThreshold"] = rng.choice([0.8, 0.5, 0.9, 1.0, round(rng.uniform(0.3, 1.0), 2)])
    if rng.random() < 0.4:
        args["memUtilThreshold"] = rng.choice([0.9, 0.6, 1.0, round(rng.uniform(0.3, 1.0), 2)])
    if rng.random() < 0.4:
        w = rng.choice([0.5, 0.6, 1.0, 0.0, 0.35, 0.7])
        args["weightGPUUtil"], args["weightMemUtil"] = w, round(1.0 - w, 10)
    if rng.random() < 0.3:
        args["metricsMaxAgeSeconds"] = rng.choice([0, 10, 30.0, 2.5, 120])
    if rng.random() < 0.35:
        args["onMissingMetrics"] = "deny"
    args["scoringStrategy"] = strategy
    if strategy != "spread":
        threshold = args.get("gpuUtilThreshold", 0.8)
        args["packTargetUtil"] = rng.choice([round(threshold * f, 2) for f in (0.25, 0.5, 0.75, 0.9)])
        if args["packTargetUtil"] <= 0:
            args["packTargetUtil"] = 0.1
    if strategy == "auto" and rng.random() < 0.5:
        args["autoPackBelow"] = rng.choice([0.2, 0.4, 0.5])
        args["autoHysteresis"] = rng.choice([0.0, 0.1, 0.25])
    if rng.random() < 0.4:  # time-sliced resources; replicas 1 is a shared resource judged as exclusive
        shared = rng.sample(RESOURCES, rng.choice([1, 1, 2]))
        args["sharedResources"] = {res: rng.choice([1, 2, 2, 4, 4, 7]) for res in shared}
        if rng.random() < 0.5:
            args["sharedMemFreeMin"] = rng.choice([0.0, 0.35, 0.5, round(rng.uniform(0, 0.9), 2)])
    if rng.random() < 0.4:
        args["interferenceWeight"] = rng.choice([0.0, 0.5, 1.0, 2.5, 10.0, round(rng.uniform(0, 3), 2)])
    return args


def _random_pods(rng: random.Random, replicas: int, with_pods: bool) -> int | None:
    """Pods on a device: up to its replicas (all taken, too), None now and then (no pod label on its series)."""
    if not with_pods or rng.random() < 0.08:
        return None
    return rng.choice([0, replicas, rng.randint(0, replicas), rng.randint(0, replicas)])


def _random_devices(rng: random.Random, resource: str, policy: Policy, count: int) -> tuple[DeviceMetrics, ...]:
    specials = (0.0, 1.0, policy.gpu_util_threshold, policy.mem_util_threshold, policy.pack_target_util)
    replicas = policy.replicas_of(resource)
    with_pods = rng.random() < (0.9 if replicas > 1 else 0.2)  # a source without dcgm-exporter's pod mapping
    devices = []
    for index in range(count):
        key = str(index) if resource == GPU else f"{index // 3}/{index % 3 + 1}"
        mem = None if rng.random() < 0.1 else _fraction(rng, specials)
        devices.append(DeviceMetrics(key, _fraction(rng, specials), mem, _random_pods(rng, replicas, with_pods)))
    # build_snapshot keeps each resource's devices sorted by key
    return tuple(sorted(devices, key=lambda d: d.key))


def _random_snapshot(rng: random.Random, policy: Policy, now: float, size: int, prefix: str = "gpu") -> MetricsSnapshot:
    fleet = rng.sample(RESOURCES, rng.choice([1, 1, 2]))  # a fleet exposes a few resources on most nodes
    nodes = {}
    for index in range(size):
        name = f"{prefix}-{index:02d}"
        resources = fleet if rng.random() < 0.85 else rng.sample(RESOURCES, rng.choice([1, 2]))
        devices = {res: _random_devices(rng, res, policy, rng.choice([0, 1, 2, 3, 4, 4, 7, 8])) for res in resources}
        fresh = rng.uniform(0, 20)
        age = rng.choice([0.0, 1.5, 5.0, fresh, fresh, fresh, fresh, 29.0, 30.0, 31.0, 300.0, rng.uniform(0, 60)])
        nodes[name] = NodeMetrics(name, now - age, {res: devs for res, devs in devices.items()})
    return MetricsSnapshot(nodes=nodes)


def _random_request(rng: random.Random, resources: tuple[str, ...]) -> tuple[tuple[str, int], ...]:
    roll = rng.random()
    if roll < 0.05:
        return ()
    picked = rng.sample(resources, min(len(resources), 2 if roll > 0.85 else 1))
    return tuple(sorted((res, rng.choice([1, 1, 1, 2, 3, 4, 8])) for res in picked))


# --- sections ------------------------------------------------------------------------------------------------


def _encode_nodes(snapshot: MetricsSnapshot) -> list[dict[str, Any]]:
    return [
        {
            "name": metrics.name,
            "sampleTime": metrics.sample_time,
            "devices": {res: [[d.key, d.util, d.mem, d.pods] for d in devs] for res, devs in metrics.devices.items()},
            "resources": list(metrics.devices),  # the dict's order, which sort_keys loses: sums follow it
        }
        for metrics in snapshot.nodes.values()
    ]


def _encode_verdict(verdict: NodeVerdict) -> list[Any]:
    return [verdict.passed, verdict.score, verdict.outcome.value, verdict.reason]


def _decisions(rng: random.Random, count: int, shared_focus: bool = False) -> Iterator[dict[str, Any]]:
    for _ in range(count):
        args = _random_args(rng, shared_focus)
        policy = Policy.from_settings(settings_of(args))
        now = round(rng.uniform(1_700_000_000, 1_800_000_000), rng.choice([0, 3]))
        snapshot = _random_snapshot(rng, policy, now, rng.randint(1, 8))
        names = [*snapshot.nodes, *(f"bare-{i}" for i in range(rng.choice([0, 0, 1, 2])))]
        present = sorted({res for m in snapshot.nodes.values() for res in m.devices})
        if rng.random() < 0.15:  # a resource no node reports
            present = sorted({*present, rng.choice(RESOURCES)})
        request = _random_request(rng, tuple(present))
        assumed = {}
        for name in names:
            per = {res: rng.choice([1, 1, 2, 5, 9]) for res in present if rng.random() < 0.5}
            if per and rng.random() < 0.3:
                assumed[name] = per
        modes = None
        if policy.strategy == "auto" and rng.random() < 0.8:
            modes = {res: rng.choice([Mode.PACK, Mode.SPREAD]) for res in present if rng.random() < 0.7}
        tenants: _Tenants | None = None
        if rng.random() < 0.3:
            pools = ["a", "b"]
            tenants = {
                "namespace": rng.choice(["team-a", "default"]),
                "namespaceTenant": rng.choice([None, *pools]),
                "nodeTenants": {name: rng.choice(pools) for name in names if rng.random() < 0.5},
            }
        want = tuple(ResourceRequest(res, count) for res, count in request)
        expect = {}
        for name in names:
            if tenants is not None:
                reason = tenant_mismatch(
                    name, tenants["nodeTenants"].get(name), tenants["namespace"], tenants["namespaceTenant"]
                )
                if reason:
                    expect[name] = _encode_verdict(NodeVerdict(False, 0, Outcome.TENANT_MISMATCH, reason))
                    continue
            verdict = evaluate_node(name, snapshot.nodes.get(name), want, policy, now, assumed.get(name), modes)
            expect[name] = _encode_verdict(verdict)
        yield {
            "args": args,
            "now": now,
            "nodes": _encode_nodes(snapshot),
            "candidates": names,
            "request": [list(r) for r in request],
            "assumed": assumed,
            "modes": None if modes is None else {res: mode.value for res, mode in modes.items()},
            "tenants": tenants,
            "expect": expect,
        }


def _auto(rng: random.Random, count: int) -> Iterator[dict[str, Any]]:
    for _ in range(count):
        args = {"scoringStrategy": "auto", "packTargetUtil": 0.5}
        if rng.random() < 0.5:
            args["autoPackBelow"], args["autoHysteresis"] = rng.choice([(0.3, 0.1), (0.5, 0.0), (0.45, 0.2)])
        if rng.random() < 0.3:
            args["metricsMaxAgeSeconds"] = 0
        policy = Policy.from_settings(settings_of(args))
        selector = ModeSelector.from_policy(policy)
        now = 1_750_000_000.0
        steps = []
        for _ in range(rng.randint(2, 6)):
            now += 5
            snapshot = _random_snapshot(rng, policy, now, rng.randint(1, 6), prefix="auto")
            load = fleet_mean_load(snapshot, policy, now)
            changed = selector.update(load)
            steps.append(
                {
                    "now": now,
                    "nodes": _encode_nodes(snapshot),
                    "fleetLoad": load,
                    "modes": {res: mode.value for res, mode in selector.modes.items()},
                    "changed": {res: mode.value for res, mode in changed.items()},
                }
            )
        yield {"args": args, "steps": steps}


def _prometheus_value(rng: random.Random, metric: str) -> str:
    if rng.random() < 0.02:  # a broken exporter: the extender distrusts the whole node
        return rng.choice(["NaN", "+Inf", "-Inf", "-1", "120" if metric == "DCGM_FI_DEV_GPU_UTIL" else "-0.5"])
    if metric == "DCGM_FI_DEV_GPU_UTIL":
        return str(rng.choice([0, 100, rng.randint(0, 100)]))
    if metric == "DCGM_FI_PROF_GR_ENGINE_ACTIVE":
        return repr(rng.choice([0.0, 1.0, rng.random(), round(rng.random(), 3)]))
    return str(rng.choice([0, rng.randint(0, 81559), 81559]))  # FB used/free, MiB


def _pod_labels(rng: random.Random) -> list[dict[str, str]]:
    """The pod labels of one device's series: none (no pod mapping), or one series per pod holding it (time-slicing),
    under dcgm-exporter's names or the exported_ ones Prometheus gives them when its own pod label clashes."""
    roll = rng.random()
    if roll < 0.6:
        return [{}]
    if roll < 0.7:
        return [{"pod": "", "namespace": ""}]  # mapped, but no pod holds the device
    pod, namespace = rng.choice([("pod", "namespace"), ("exported_pod", "exported_namespace")])
    holders = [{pod: f"clf-{i}", namespace: rng.choice(["finnlp", "default"])} for i in range(rng.randint(1, 4))]
    if pod == "exported_pod" and rng.random() < 0.5:
        holders = [{**h, "pod": "dcgm-exporter-x", "namespace": "gpu-operator"} for h in holders]
    return holders


def _prometheus(rng: random.Random, count: int) -> Iterator[dict[str, Any]]:
    node_labels = ("Hostname", "hostname")
    profiles = {"1g.10gb": 7, "2g.20gb": 3, "3g.40gb": 2}
    for case in range(count):
        queried_at = 1_760_000_000.0 + case
        series: list[dict[str, Any]] = []
        nodes = [f"dgx-{i}" for i in range(rng.randint(1, 4))]
        for node in nodes:
            host = {rng.choice(["Hostname", "hostname", "Hostname"]): node}
            if rng.random() < 0.1:
                host = {"Hostname": node, "hostname": f"other-{node}"}  # the first configured label wins
            for gpu in range(rng.randint(1, 3)):
                ident = {"gpu": str(gpu), "UUID": f"GPU-{node}-{gpu}"} if rng.random() < 0.9 else {"UUID": f"U{gpu}"}
                if rng.random() < 0.5:
                    profile = rng.choice(list(profiles))
                    devices = [{"GPU_I_ID": str(i + 1), "GPU_I_PROFILE": profile} for i in range(profiles[profile])]
                    if rng.random() < 0.1:
                        devices[0]["GPU_I_PROFILE"] = ""  # an instance without profile: not a resource
                else:
                    devices = [{}]
                for device in devices:
                    holders = _pod_labels(rng)
                    for metric in DCGM_METRICS:
                        for holder in holders:
                            if rng.random() < 0.85:
                                labels = {"__name__": metric, **host, **ident, **device, **holder, "job": "dcgm"}
                                value = [queried_at, _prometheus_value(rng, metric)]
                                series.append({"metric": labels, "value": value})
        if rng.random() < 0.1:
            series.append({"metric": {"__name__": "DCGM_FI_DEV_GPU_UTIL", "gpu": "0"}, "value": [queried_at, "5"]})
        rng.shuffle(series)
        # Sample times a little old, or ahead of the clock (some clock is wrong) by less or more than the skew allowed.
        ages = [1, 7.5, 1, -3, -60]
        times = [
            {"metric": {rng.choice(node_labels): node}, "value": [queried_at, repr(queried_at - rng.choice(ages))]}
            for node in nodes
            if rng.random() < 0.7
        ]
        max_skew = rng.choice([5.0, 5.0, 0.0, 2.0])
        yield _prometheus_case(node_labels, series, times, queried_at, max_skew)


def _prometheus_case(
    node_labels: tuple[str, ...],
    series: list[dict[str, Any]],
    times: list[dict[str, Any]],
    queried_at: float,
    max_skew: float,
) -> dict[str, Any]:
    """A case of the prometheus section: the answer, and the snapshot PrometheusSource builds of it a
    quarter of a second after the query."""
    now = queried_at + 0.25

    def clock() -> float:
        return now

    source = PrometheusSource("http://127.0.0.1:9", node_labels, 1.0, clock=clock, max_skew=max_skew)
    try:
        snapshot, _ = source._build(series, times, queried_at, 1)
    finally:
        asyncio.run(source.aclose())
    return {
        "nodeNameLabels": list(node_labels),
        "queriedAt": queried_at,
        "now": now,
        "maxClockSkewSeconds": max_skew,
        "series": series,
        "times": times,
        "expect": {"nodes": _encode_nodes(snapshot), "newestSample": snapshot.newest_sample},
    }


def _requests(rng: random.Random, count: int) -> Iterator[dict[str, Any]]:
    names = (*RESOURCES, "cpu", "example.com/fpga")

    def container() -> dict[str, Any]:
        resources: dict[str, Any] = {}
        for kind in ("limits", "requests"):
            if rng.random() < 0.6:
                resources[kind] = {name: str(rng.choice([0, 1, 2, 3])) for name in rng.sample(names, 2)}
                if "cpu" in resources[kind]:
                    resources[kind]["cpu"] = "500m"
        return {"name": f"c{rng.randint(0, 99)}", "resources": resources}

    for _ in range(count):
        spec: dict[str, Any] = {"containers": [container() for _ in range(rng.randint(1, 3))]}
        if rng.random() < 0.4:
            spec["initContainers"] = [container() for _ in range(rng.randint(1, 2))]
        request = pod_gpu_request(msgspec.convert({"spec": spec}, Pod))
        yield {"spec": spec, "expect": [[r.resource, r.count] for r in request]}


def _claims(rng: random.Random, count: int) -> Iterator[dict[str, Any]]:
    for _ in range(count):
        args = _random_args(rng)
        policy = Policy.from_settings(settings_of(args))
        now = round(rng.uniform(1_700_000_000, 1_800_000_000), rng.choice([0, 3]))
        snapshot = _random_snapshot(rng, policy, now, rng.randint(1, 4))
        # dcgm-exporter's keys are unique on a node (gpu, gpu/instance); the random ones repeat across profiles.
        nodes = {
            name: NodeMetrics(
                name,
                metrics.sample_time,
                {
                    res: tuple(DeviceMetrics(f"{r}:{d.key}", d.util, d.mem, d.pods) for d in devices)
                    for r, (res, devices) in enumerate(metrics.devices.items())
                },
            )
            for name, metrics in snapshot.nodes.items()
        }
        snapshot = MetricsSnapshot(nodes=nodes)
        names = [*snapshot.nodes, *(f"bare-{i}" for i in range(rng.choice([0, 1])))]
        modes = None
        if policy.strategy == "auto" and rng.random() < 0.8:
            modes = {res: rng.choice([Mode.PACK, Mode.SPREAD]) for res in RESOURCES if rng.random() < 0.7}
        placements = {name: rng.choice([0, 12, 32, 72, 92, 99, 100, rng.randint(0, 100)]) for name in names}
        expect = {}
        for name in names:
            verdict = claim_load_verdict(name, snapshot.nodes.get(name), policy, now, modes)
            expect[name] = [*_encode_verdict(verdict), claim_score(placements[name], verdict)]
        yield {
            "args": args,
            "now": now,
            "nodes": _encode_nodes(snapshot),
            "candidates": names,
            "modes": None if modes is None else {res: mode.value for res, mode in modes.items()},
            "placements": placements,
            "expect": expect,
        }


def _args_cases(rng: random.Random, count: int) -> Iterator[dict[str, Any]]:
    fixed: list[dict[str, Any]] = [
        {},
        {"prometheusURL": "http://prometheus.monitoring.svc:9090", "weightGPUUtil": 0.7, "weightMemUtil": 0.3},
        {"weightGPUUtil": 0.7},
        {"weightGPUUtil": 0.6, "weightMemUtil": 0.4000001},
        {"weightGPUUtil": 0.6, "weightMemUtil": 0.41},
        {"prometheusURL": "prometheus:9090"},
        {"scoringStrategy": "pack", "packTargetUtil": 0.8},
        {"scoringStrategy": "spread", "packTargetUtil": 0.8, "gpuUtilThreshold": 0.5},
        {"scoringStrategy": "auto", "autoPackBelow": 0.9, "autoHysteresis": 0.1},
        {"scoringStrategy": "binpack"},
        {"onMissingMetrics": "ignore"},
        {"nodeNameLabels": []},
        {"nodeNameLabels": ["node"]},
        {"gpuUtilThreshold": 0},
        {"memUtilThreshold": 1.0},
        {"metricsRefreshSeconds": 0},
        {"metricsRefreshSeconds": 3600},
        {"metricsRefreshSeconds": 3601},
        {"metricsMaxAgeSeconds": -1},
        {"metricsMaxClockSkewSeconds": -0.5},
        {"metricsMaxClockSkewSeconds": 0},
        {"prometheusTimeoutSeconds": 60.5},
        {"inflightMaxSeconds": 0},
        {"autoHysteresis": 1.0},
        {"packTargetUtil": 0},
        {"tenantPools": False, "tenantLabel": "example.com/pool"},
        {"threshold": 0.8},
        {"sharedResources": {"nvidia.com/mig-1g.10gb": 4}},
        {"sharedResources": {"nvidia.com/gpu": 1, "nvidia.com/mig-3g.40gb": 64}},
        {"sharedResources": {}},
        {"sharedResources": {"nvidia.com/mig-1g.10gb": 0}},
        {"sharedResources": {"nvidia.com/mig-1g.10gb": 65}},
        {"sharedResources": {"example.com/fpga": 2}},
        {"sharedResources": {"mig-1g.10gb": 2}},
        {"sharedResources": {"nvidia.com/gpus": 2}},
        {"sharedResources": ["nvidia.com/gpu"]},
        {"interferenceWeight": 0},
        {"interferenceWeight": 10},
        {"interferenceWeight": 10.01},
        {"interferenceWeight": -0.1},
        {"interferenceWeight": 0.5, "scoringStrategy": "pack", "packTargetUtil": 0.5},
        # Every problem at once: JSON types as Go decodes them, fields, and each rule between fields.
        {"gpuUtilThreshold": "0.8", "tenantPools": "yes", "nodeNameLabels": "Hostname", "threshold": 1},
        {"sharedResources": {"nvidia.com/gpu": 1.5}, "interferenceWeight": True, "exporterJob": 3},
        {"nodeNameLabels": None, "gpuUtilThreshold": None, "sharedResources": None},
        {
            "weightGPUUtil": 0.9,
            "scoringStrategy": "auto",
            "packTargetUtil": 0.85,
            "autoPackBelow": 0.7,
            "autoHysteresis": 0.5,
        },
        {"weightGPUUtil": 1.5, "scoringStrategy": "pack", "packTargetUtil": 0.9, "gpuUtilThreshold": 0.5},
        {"weightGPUUtil": 0.6, "weightMemUtil": 0.3, "onMissingMetrics": "ignore", "metricsRefreshSeconds": 1e7},
        {"sharedResources": {"example.com/fpga": 2, "nvidia.com/mig-1g.10gb": 65}},
        {"prometheusURL": 'prometheus:9090\n"x"', "scoringStrategy": "Spread"},
        # The metrics path: a CA pins an https certificate only; a token goes over http too (a lab's opt-out).
        {
            "prometheusURL": "https://prometheus.monitoring.svc:9090",
            "prometheusCAFile": "/etc/gpufleet/prometheus-ca/ca.crt",
            "prometheusTokenFile": "/etc/gpufleet/prometheus-token/token",
        },
        {"prometheusCAFile": "/etc/gpufleet/prometheus-ca/ca.crt"},
        {"prometheusURL": "http://prometheus:9090/", "prometheusCAFile": "ca.crt", "prometheusTokenFile": "token"},
        {"prometheusURL": "http://prometheus:9090", "prometheusTokenFile": "/etc/gpufleet/prometheus-token/token"},
        {"prometheusURL": "prometheus:9090", "prometheusCAFile": "/ca.crt"},
        {"prometheusCAFile": "", "prometheusTokenFile": ""},
        {"prometheusCAFile": None, "prometheusTokenFile": None},
        {"prometheusCAFile": 3, "prometheusTokenFile": ["/token"], "prometheusURL": "https://p:9090"},
        # Removed: what replaced it, whatever the value.
        {"prometheusQuery": "recorded"},
        {"prometheusQuery": "raw", "gpuUtilThreshold": 1.5},
        {"prometheusQuery": 1},
        {"sharedMemFreeMin": 1.0},
        {"sharedMemFreeMin": -0.01, "sharedResources": {"nvidia.com/mig-1g.10gb": 4}},
        {"sharedMemFreeMin": "0.35"},
        {"sharedMemFreeMin": 0.35, "sharedResources": {"nvidia.com/mig-1g.10gb": 4}},
    ]
    yield from ({"args": args} for args in fixed)
    ranges = {
        "gpuUtilThreshold": (-0.1, 1.1),
        "memUtilThreshold": (-0.1, 1.1),
        "weightGPUUtil": (-0.1, 1.1),
        "packTargetUtil": (-0.1, 1.1),
        "autoPackBelow": (-0.1, 1.1),
        "autoHysteresis": (-0.1, 1.1),
        "metricsMaxAgeSeconds": (-5, 100),
        "inflightMaxSeconds": (-5, 300),
        "interferenceWeight": (-1, 11),
        "sharedMemFreeMin": (-0.1, 1.1),
    }
    for _ in range(count):
        args: dict[str, Any] = {"scoringStrategy": rng.choice(["spread", "pack", "auto"])}
        for name in rng.sample(list(ranges), rng.randint(1, 4)):
            low, high = ranges[name]
            args[name] = round(rng.uniform(low, high), 2)
        if "weightGPUUtil" in args:
            args["weightMemUtil"] = round(1 - args["weightGPUUtil"], 2)
        yield {"args": args}


def _with_validity(cases: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Each case with every problem the plugin must report (``plugin_args.check_plugin_args``, its strict JSON
    types included) and whether there is none."""
    for case in cases:
        errors = check_plugin_args(case["args"])
        try:
            settings_of(case["args"])
        except SettingsError:
            if not errors:
                raise AssertionError(f"the extender refuses {case['args']}, check_plugin_args found nothing") from None
        case["valid"] = not errors
        case["errors"] = errors
        yield case


def build(seed: int = SEED) -> dict[str, list[dict[str, Any]]]:
    rng = random.Random(seed)
    return {
        "args": list(_with_validity(_args_cases(rng, 60))),
        "decisions": [*_decisions(rng, 250), *_decisions(rng, 45, shared_focus=True)],
        "auto": list(_auto(rng, 15)),
        "prometheus": list(_prometheus(rng, 14)),
        "requests": list(_requests(rng, 60)),
        "claims": list(_claims(rng, 45)),
    }


def render(vectors: dict[str, list[dict[str, Any]]]) -> str:
    """One case per line: small diffs when the specification changes, still plain JSON."""
    dump = json.dumps  # floats as repr: the shortest text that reads back to the same double, in Go too
    parts = ['{"version":' + str(FORMAT_VERSION)]
    for section, cases in vectors.items():
        lines = ",\n".join(dump(case, sort_keys=True, separators=(",", ":")) for case in cases)
        parts.append(f'"{section}":[\n{lines}\n]')
    return ",\n".join(parts) + "}\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m gpufleet_lab.conformance OUTPUT.json", file=sys.stderr)
        return 2
    Path(argv[0]).write_text(render(build()), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
