"""The extender's request handling, bytes in, bytes out, without HTTP: routers and benchmarks call it.

Per request: decode (wire.py), work out the pod's GPU request (pods.py), look each candidate node up in a
decision table, encode. The decision table caches ``scoring.evaluate_node`` per node for one combination of
(metrics snapshot, cluster state, pod request, pod tenant); it is rebuilt when any of them changes or when
time alone would change a verdict (a sample going stale, an assumed pod expiring). This keeps thousands of
nodes well under a millisecond of Python per request while every verdict is still the pure function's.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gpufleet_extender.cluster import ClusterState
from gpufleet_extender.config import Settings
from gpufleet_extender.pods import GpuRequest, pod_gpu_request
from gpufleet_extender.scoring import NO_GPU_VERDICT, NodeVerdict, Outcome, Policy, evaluate_node, tenant_mismatch
from gpufleet_extender.snapshot import EMPTY_SNAPSHOT, MetricsSnapshot
from gpufleet_extender.telemetry import Telemetry
from gpufleet_extender.wire import SchedulingRequest, decode_args, encode_filter_result, encode_priorities

_MAX_TABLES = 64  # distinct (request, tenant) combinations kept per view; a fleet has a handful of shapes
_NO_TENANT = object()


@dataclass(slots=True)
class _View:
    """Everything a verdict depends on besides the node name, and how long it stays true."""

    snapshot: MetricsSnapshot
    cluster_version: int
    assumed: dict[str, dict[str, int]]
    valid_until: float
    tables: dict[tuple, dict[str, NodeVerdict]] = field(default_factory=dict)


class Extender:
    def __init__(
        self,
        settings: Settings,
        telemetry: Telemetry | None = None,
        cluster: ClusterState | None = None,
        snapshot_provider: Callable[[], MetricsSnapshot] = lambda: EMPTY_SNAPSHOT,
        clock: Callable[[], float] = time.time,
        source_error: Callable[[], str | None] = lambda: None,
    ):
        self.settings = settings
        self.source_error = source_error  # the metrics source's last error, for /readyz
        self.policy = Policy.from_settings(settings)
        self.telemetry = telemetry or Telemetry()
        self.cluster = cluster  # None: no Kubernetes API (no in-flight accounting, tenants only from Nodes)
        self._snapshot = snapshot_provider
        self._clock = clock
        self._view: _View | None = None

    # --- the decision tables ------------------------------------------------------------------------------

    def _current_view(self, now: float) -> _View:
        snapshot = self._snapshot()
        cluster_version = self.cluster.version if self.cluster else 0
        view = self._view
        if (
            view is not None
            and view.snapshot.version == snapshot.version
            and view.cluster_version == cluster_version
            and now < view.valid_until
        ):
            return view
        assumed, valid_until = self.cluster.assumed_load(snapshot, now) if self.cluster else ({}, math.inf)
        if self.policy.max_age_seconds > 0 and snapshot.nodes:
            # The first moment a fresh node's samples go stale (stale ones stay stale until a new snapshot).
            fresh_limits = [
                m.sample_time + self.policy.max_age_seconds
                for m in snapshot.nodes.values()
                if m.sample_time + self.policy.max_age_seconds >= now
            ]
            if fresh_limits:
                valid_until = min(valid_until, min(fresh_limits))
        self.telemetry.assumed_pods.set(sum(sum(r.values()) for r in assumed.values()))
        self._view = _View(snapshot, cluster_version, assumed, valid_until)
        return self._view

    def _table(self, view: _View, request: GpuRequest, namespace: str, names_form: bool) -> tuple[dict, Callable]:
        """The verdict cache for this pod shape, and the function that fills a missing entry."""
        namespace_tenant = self._namespace_tenant(namespace) if names_form else _NO_TENANT
        key = (request, namespace_tenant)
        table = view.tables.get(key)
        if table is None:
            if len(view.tables) >= _MAX_TABLES:
                view.tables.clear()
            table = view.tables[key] = {}
        now = self._clock()
        nodes, policy, assumed = view.snapshot.nodes, self.policy, view.assumed

        def fill(name: str) -> NodeVerdict:
            verdict = None
            if namespace_tenant is not _NO_TENANT:
                reason = tenant_mismatch(name, self.cluster.node_tenant(name), namespace, namespace_tenant)
                if reason:
                    verdict = NodeVerdict(False, 0, Outcome.TENANT_MISMATCH, reason)
            if verdict is None:
                verdict = evaluate_node(name, nodes.get(name), request, policy, now, assumed.get(name))
            table[name] = verdict
            return verdict

        return table, fill

    def _namespace_tenant(self, namespace: str) -> object:
        """The namespace's tenant when tenant pools apply to NodeNames requests, else _NO_TENANT."""
        if not (self.settings.TENANT_POOLS and self.cluster and self.cluster.nodes_known):
            return _NO_TENANT
        known, tenant = self.cluster.namespace_tenant(namespace)
        return tenant if known else _NO_TENANT

    def _full_form_tenant_reason(self, request: SchedulingRequest, index: int) -> str | None:
        """Tenant check for the Nodes form: node labels travel with the request."""
        if not (self.settings.TENANT_POOLS and self.cluster):
            return None
        known, tenant = self.cluster.namespace_tenant(request.pod.metadata.namespace)
        if not known:
            return None
        labels = request.nodes.labels[index] or {}
        return tenant_mismatch(
            request.nodes.names[index],
            labels.get(self.settings.TENANT_LABEL),
            request.pod.metadata.namespace,
            tenant,
        )

    def _verdicts(self, request: SchedulingRequest) -> tuple[GpuRequest, list[NodeVerdict]]:
        gpu_request = pod_gpu_request(request.pod)
        names = request.nodes.names
        if not gpu_request:
            return gpu_request, [NO_GPU_VERDICT] * len(names)
        view = self._current_view(self._clock())
        table, fill = self._table(view, gpu_request, request.pod.metadata.namespace, not request.nodes.full)
        get = table.get
        verdicts = [get(name) or fill(name) for name in names]
        if request.nodes.full:
            for index, verdict in enumerate(verdicts):
                reason = self._full_form_tenant_reason(request, index) if verdict.passed else None
                if reason:
                    verdicts[index] = NodeVerdict(False, 0, Outcome.TENANT_MISMATCH, reason)
        return gpu_request, verdicts

    # --- the verbs ---------------------------------------------------------------------------------------

    def filter(self, body: bytes) -> bytes:
        """Answer POST /filter; raises wire.WireError for bodies kube-scheduler would never send."""
        request = decode_args(body)
        _, verdicts = self._verdicts(request)
        passed: list[int] = []
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        outcomes: dict[Outcome, int] = {}
        names = request.nodes.names
        for index, verdict in enumerate(verdicts):
            if verdict.outcome is not Outcome.PASS:
                outcomes[verdict.outcome] = outcomes.get(verdict.outcome, 0) + 1
            if verdict.passed:
                passed.append(index)
            elif verdict.outcome is Outcome.TENANT_MISMATCH:
                # Preempting pods cannot move a node into another tenant's pool.
                unresolvable[names[index]] = verdict.reason
            else:
                failed[names[index]] = verdict.reason
        outcomes[Outcome.PASS] = len(verdicts) - sum(outcomes.values())
        for outcome, count in outcomes.items():
            if count:
                self.telemetry.decisions.labels(outcome.value).inc(count)
        return encode_filter_result(request.nodes, passed, failed, unresolvable)

    def prioritize(self, body: bytes) -> bytes:
        """Answer POST /prioritize: one integer score 0..10 per input node, in input order."""
        request = decode_args(body)
        _, verdicts = self._verdicts(request)
        return encode_priorities(request.nodes.names, [v.score for v in verdicts])

    # --- health ------------------------------------------------------------------------------------------

    def metrics_age(self) -> float:
        return self._snapshot().age(self._clock())

    def ready(self) -> bool:
        """Ready while metrics are fresh, or whenever the policy lets nodes without metrics through."""
        if not self.policy.deny_missing:
            return True
        snapshot = self._snapshot()
        if snapshot.taken_at is None:
            return False
        return self.policy.max_age_seconds == 0 or snapshot.age(self._clock()) <= self.policy.max_age_seconds
