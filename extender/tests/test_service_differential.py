"""The cached, incremental service against a from-scratch evaluation with scoring.py, over random fleets.

Each world is a random fleet, tenant layout and policy; then a random run of what happens to a live
extender: requests of random pod shapes from random namespaces, pods bound, started and deleted, node and
namespace relabelled, metrics refreshed (some nodes changed, others kept), time passing so samples go stale
and assumed pods expire. After every request the answers must be exactly what ``scoring.evaluate_node`` and
``scoring.tenant_mismatch`` give for the inputs of that moment. The reference keeps its own list of bound
pods and computes their assumed load itself, so it shares no cache with the service.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from types import MappingProxyType

import pytest
from gpufleet_testsupport.scheduler_requests import make_pod, names_args, node_obj, nodes_args

from gpufleet_extender.cluster import ClusterState
from gpufleet_extender.config import load_settings
from gpufleet_extender.pods import MIG_RESOURCE_PREFIX, WHOLE_GPU_RESOURCE, GpuRequest, ResourceRequest
from gpufleet_extender.scoring import (
    NEUTRAL_SCORE,
    ModeSelector,
    NodeVerdict,
    Outcome,
    Policy,
    Strategy,
    evaluate_node,
    fleet_mean_load,
    tenant_mismatch,
)
from gpufleet_extender.service import Extender
from gpufleet_extender.snapshot import DeviceMetrics, NodeMetrics, snapshot_of

from extender_helpers import body

T0 = 1_700_000_000
TENANT_LABEL = "gpufleet.io/tenant"
PROFILES = ("1g.10gb", "3g.40gb")
NAMESPACES = {"team-a": "a", "team-b": "b", "shared": None}  # "stranger" is never listed: tenant unknown
INFLIGHT_MAX = 120


def iso(t: int) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class BoundPod:
    uid: str
    node: str
    request: dict[str, int]  # resource -> count
    bound_at: int
    running_since: int | None


class World:
    """One random fleet and the events that happen to it, fed to the service and kept for the reference."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.now = T0
        strategy = rng.choice(list(Strategy))
        self.settings = load_settings(
            KUBE_API="off",
            SCORING_STRATEGY=strategy,
            ON_MISSING_METRICS=rng.choice(["allow", "deny"]),
            METRICS_MAX_AGE_SECONDS=rng.choice([0, 30]),
            INFLIGHT_MAX_SECONDS=INFLIGHT_MAX,
            PACK_TARGET_UTIL=0.6,
            AUTO_PACK_BELOW=rng.choice([0.3, 0.5]),
        )
        self.policy = Policy.from_settings(self.settings)
        self.selector = ModeSelector.from_policy(self.policy) if strategy == Strategy.AUTO else None
        self.modes_version = 0
        self.modes = None
        self.names = [f"node-{i:02d}" for i in range(rng.randint(3, 24))]
        self.node_tenants = {name: rng.choice([None, None, "a", "b"]) for name in self.names}
        self.namespace_tenants = dict(NAMESPACES)
        self.pods: dict[str, BoundPod] = {}
        self.version = 1
        self.snapshot = snapshot_of({n: self.node_metrics(n) for n in self.names if rng.random() < 0.85}, T0, 1)
        self.cluster = ClusterState(TENANT_LABEL, INFLIGHT_MAX, clock=lambda: self.now)
        self.cluster.replace("Namespace", [self.namespace_obj(ns) for ns in self.namespace_tenants])
        self.cluster.replace("Node", [self.node_obj(n) for n in self.names])
        self.cluster.replace("Pod", [])
        self.extender = Extender(
            self.settings, cluster=self.cluster, snapshot_provider=lambda: self.snapshot, clock=lambda: self.now
        )
        self.last_request: tuple | None = None

    # --- the world's objects -----------------------------------------------------------------------------

    def node_metrics(self, name: str) -> NodeMetrics:
        rng = self.rng
        devices: dict[str, list[DeviceMetrics]] = {}
        for gpu in range(rng.randint(1, 4)):
            if rng.random() < 0.5:
                resource, key = WHOLE_GPU_RESOURCE, str(gpu)
                devices.setdefault(resource, []).append(self.device(key))
            else:
                for instance in range(rng.randint(1, 3)):
                    resource = MIG_RESOURCE_PREFIX + rng.choice(PROFILES)
                    devices.setdefault(resource, []).append(self.device(f"{gpu}/{instance}"))
        sample_time = self.now - rng.choice([0, 1, 5, 20, 29, 31, 60])
        by_resource = {res: tuple(sorted(devs, key=lambda d: d.key)) for res, devs in devices.items()}
        return NodeMetrics(name, sample_time, MappingProxyType(by_resource))

    def device(self, key: str) -> DeviceMetrics:
        rng = self.rng
        util = rng.choice([0.0, 0.1, 0.35, 0.5, 0.79, 0.8, 0.95, rng.random()])
        return DeviceMetrics(key, util, None if rng.random() < 0.2 else rng.random())

    def namespace_obj(self, namespace: str) -> dict:
        tenant = self.namespace_tenants[namespace]
        return {"metadata": {"name": namespace, "labels": {TENANT_LABEL: tenant} if tenant else {}}}

    def node_obj(self, name: str) -> dict:
        tenant = self.node_tenants[name]
        return node_obj(name, {TENANT_LABEL: tenant} if tenant else {})

    def pod_obj(self, pod: BoundPod) -> dict:
        obj = make_pod({res: str(count) for res, count in pod.request.items()})
        obj["metadata"].update(name=pod.uid, uid=pod.uid)
        obj["spec"]["nodeName"] = pod.node
        status = {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}]}
        status["conditions"][0]["lastTransitionTime"] = iso(pod.bound_at)
        if pod.running_since is not None:
            status["phase"] = "Running"
            status["containerStatuses"] = [
                {"name": "main", "state": {"running": {"startedAt": iso(pod.running_since)}}}
            ]
        obj["status"] = status
        return obj

    def random_request(self) -> dict[str, int]:
        rng = self.rng
        request = {}
        if rng.random() < 0.6:
            request[WHOLE_GPU_RESOURCE] = rng.randint(1, 3)
        if rng.random() < 0.4 or not request:
            request[MIG_RESOURCE_PREFIX + rng.choice(PROFILES)] = rng.randint(1, 2)
        return request if rng.random() < 0.95 else {}

    # --- what happens --------------------------------------------------------------------------------------

    def bind(self) -> None:
        uid = f"pod-{len(self.pods)}-{self.rng.randrange(10**6)}"
        pod = BoundPod(uid, self.rng.choice(self.names), self.random_request() or {WHOLE_GPU_RESOURCE: 1}, 0, None)
        pod.bound_at = self.now - self.rng.choice([0, 0, 3, 50, 119])
        if self.rng.random() < 0.3:
            pod.running_since = pod.bound_at + self.rng.choice([0, 2])
        self.pods[uid] = pod
        self.cluster.apply_event("Pod", "ADDED", self.pod_obj(pod))

    def start_or_delete(self) -> None:
        if not self.pods:
            return
        pod = self.pods[self.rng.choice(list(self.pods))]
        if self.rng.random() < 0.5:
            del self.pods[pod.uid]
            self.cluster.apply_event("Pod", "DELETED", self.pod_obj(pod))
        else:
            pod.running_since = self.now - self.rng.choice([0, 4])
            self.cluster.apply_event("Pod", "MODIFIED", self.pod_obj(pod))

    def relabel(self) -> None:
        if self.rng.random() < 0.7:
            name = self.rng.choice(self.names)
            self.node_tenants[name] = self.rng.choice([None, "a", "b"])
            self.cluster.apply_event("Node", "MODIFIED", self.node_obj(name))
        else:
            namespace = self.rng.choice(list(NAMESPACES))
            self.namespace_tenants[namespace] = self.rng.choice([None, "a", "b"])
            self.cluster.apply_event("Namespace", "MODIFIED", self.namespace_obj(namespace))

    def refresh(self) -> None:
        """A new snapshot: some nodes resampled, some gone or new, the others keep their objects."""
        rng = self.rng
        nodes = dict(self.snapshot.nodes)
        for name in self.names:
            roll = rng.random()
            if roll < 0.3:
                nodes[name] = self.node_metrics(name)
            elif roll < 0.35:
                nodes.pop(name, None)
        if rng.random() < 0.1:  # a source that rebuilds every object, changed or not
            nodes = {name: replace(metrics) for name, metrics in nodes.items()}
        self.version += 1
        self.snapshot = snapshot_of(nodes, self.now, self.version)

    def poll_unchanged(self) -> None:
        self.snapshot = replace(self.snapshot, taken_at=self.now)  # what the refresher does for an unchanged file

    def tick(self) -> None:
        self.now += self.rng.choice([0, 1, 2, 9, 15, 31, 61])

    # --- the reference -------------------------------------------------------------------------------------

    def assumed(self, node: str) -> dict[str, int] | None:
        metrics = self.snapshot.nodes.get(node)
        per_resource: dict[str, int] = {}
        for pod in self.pods.values():
            if pod.node != node or self.now >= pod.bound_at + INFLIGHT_MAX:
                continue
            if pod.running_since is not None and metrics is not None and metrics.sample_time > pod.running_since:
                continue
            for resource, count in pod.request.items():
                per_resource[resource] = per_resource.get(resource, 0) + count
        return per_resource or None

    def reference_modes(self):
        if self.selector is not None and self.snapshot.version != self.modes_version:
            self.modes_version = self.snapshot.version
            self.selector.update(fleet_mean_load(self.snapshot, self.policy, self.now))
            self.modes = dict(self.selector.modes)
        return self.modes

    def verdict(self, name: str, request: GpuRequest, namespace: str, by_pool: bool) -> NodeVerdict:
        if by_pool and namespace in self.namespace_tenants:
            reason = tenant_mismatch(name, self.node_tenants.get(name), namespace, self.namespace_tenants[namespace])
            if reason:
                return NodeVerdict(False, 0, Outcome.TENANT_MISMATCH, reason)
        metrics = self.snapshot.nodes.get(name)
        return evaluate_node(name, metrics, request, self.policy, self.now, self.assumed(name), self.modes)

    def check_request(self) -> None:
        rng = self.rng
        wanted = self.random_request()
        namespace = rng.choice([*NAMESPACES, "stranger"])
        candidates = rng.sample(self.names, rng.randint(1, len(self.names)))
        full = rng.random() < 0.2
        pod = make_pod({res: str(count) for res, count in wanted.items()} or None, namespace=namespace)
        labels: dict[str, str | None] = {}
        if full:
            # Labels travel with the request; kube-scheduler's may lag behind the watch.
            labels = {n: self.node_tenants[n] if rng.random() < 0.8 else rng.choice(["a", "b"]) for n in candidates}
            objects = [node_obj(n, {TENANT_LABEL: labels[n]} if labels[n] else {}) for n in candidates]
            request_body = body(nodes_args(pod, objects))
        else:
            candidates.append("not-a-node")  # names the extender never heard of get the missing-metrics verdict
            request_body = body(names_args(pod, candidates))
        self.last_request = (request_body, wanted, namespace, candidates, full, labels)
        self.check(*self.last_request)

    def check_same_request(self) -> None:
        """The previous request again after whatever happened since, as kube-scheduler sends a workload's pods
        one after another with one candidate list: answers remembered from before must be checked, not trusted."""
        if self.last_request is None:
            self.check_request()
        else:
            self.check(*self.last_request)

    def check(
        self,
        request_body: bytes,
        wanted: dict[str, int],
        namespace: str,
        candidates: list[str],
        full: bool,
        labels: dict[str, str | None],
    ) -> None:
        filtered = json.loads(self.extender.filter(request_body))
        scores = {e["Host"]: e["Score"] for e in json.loads(self.extender.prioritize(request_body))}
        self.reference_modes()
        request: GpuRequest = tuple(ResourceRequest(res, count) for res, count in sorted(wanted.items()))

        passed, failed, unresolvable, expected_scores = [], {}, {}, {}
        for name in candidates:
            if not request:
                passed.append(name)
                expected_scores[name] = NEUTRAL_SCORE
                continue
            verdict = self.verdict(name, request, namespace, by_pool=not full)
            expected_scores[name] = verdict.score
            if full and verdict.passed and namespace in self.namespace_tenants:
                reason = tenant_mismatch(name, labels[name], namespace, self.namespace_tenants[namespace])
                if reason:
                    verdict = NodeVerdict(False, 0, Outcome.TENANT_MISMATCH, reason)
            if verdict.passed:
                passed.append(name)
            elif verdict.outcome is Outcome.TENANT_MISMATCH:
                unresolvable[name] = verdict.reason
            else:
                failed[name] = verdict.reason

        got_passed = (
            [item["metadata"]["name"] for item in filtered["Nodes"]["items"]] if full else filtered["NodeNames"]
        )
        context = f"at t+{self.now - T0}s, {namespace}, {wanted}, {self.settings.SCORING_STRATEGY}"
        assert got_passed == passed, context
        assert set(filtered["FailedNodes"]) == set(failed), context
        assert filtered["FailedAndUnresolvableNodes"] == unresolvable, context
        for name, reason in failed.items():
            if "GPU metrics are" not in reason:  # a stale sample's age is the one figure told at first sight
                assert filtered["FailedNodes"][name] == reason, context
        assert scores == expected_scores, context


ACTIONS = (
    (World.check_request, 4),
    (World.check_same_request, 4),
    (World.bind, 4),
    (World.start_or_delete, 2),
    (World.relabel, 1),
    (World.refresh, 2),
    (World.poll_unchanged, 1),
    (World.tick, 3),
)


@pytest.mark.parametrize("seed", range(40))
def test_cached_service_decides_as_scoring_does_from_scratch_under_churn(seed):
    rng = random.Random(seed)
    world = World(rng)
    actions = [action for action, weight in ACTIONS for _ in range(weight)]
    world.check_request()
    for _ in range(150):
        rng.choice(actions)(world)
        if rng.random() < 0.3:
            world.check_same_request()  # often two in a row: answers from the memo too
    world.check_request()
