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
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import not_

from gpufleet_extender.cluster import ClusterState
from gpufleet_extender.config import Settings
from gpufleet_extender.pods import GpuRequest, pod_gpu_request
from gpufleet_extender.scoring import (
    NEUTRAL_SCORE,
    ModeMap,
    ModeSelector,
    NodeVerdict,
    Outcome,
    Policy,
    Strategy,
    evaluate_node,
    fleet_mean_load,
    outcome_passes,
    tenant_mismatch,
)
from gpufleet_extender.snapshot import EMPTY_SNAPSHOT, MetricsSnapshot
from gpufleet_extender.telemetry import Telemetry
from gpufleet_extender.wire import HostPriority, SchedulingRequest, decode_args, encode, encode_filter_result

_MAX_TABLES = 64  # distinct (request, tenant) combinations kept per view; a fleet has a handful of shapes
_NO_TENANT = object()


class _ByName(dict):
    """name -> value, computing (and keeping) the value of a name seen for the first time."""

    def __init__(self, compute: Callable[[str], object], limit: int):
        super().__init__()
        self._compute = compute
        self._limit = limit  # junk names in bad requests must not grow the table without end

    def __missing__(self, name: str) -> object:
        value = self._compute(name)
        if len(self) < self._limit:
            self[name] = value
        return value


class DecisionTable:
    """The verdict of every node for one pod shape, laid out for the verbs' one-pass loops.

    ``codes`` maps each node of the snapshot to PASSED or FAILED; a node absent from the snapshot gets
    ``absent_code`` (ABSENT_PASSED or FAILED, per ON_MISSING_METRICS). The codes are truthy exactly when
    the node passes, so the filter splits the candidates with C-level map/compress/count.
    """

    FAILED, PASSED, ABSENT_PASSED = 0, 1, 2

    def __init__(self, verdicts: dict[str, NodeVerdict], verdict_of: Callable[[str], NodeVerdict]):
        self.verdict_of = verdict_of
        # Fresh copies of the names, allocated together: lookups then stay in a few cache lines.
        self.codes = {name.encode().decode(): self.PASSED if v.passed else self.FAILED for name, v in verdicts.items()}
        self.absent_verdict = verdict_of("")  # the policy's verdict for a node without metrics
        self.absent_code = self.ABSENT_PASSED if self.absent_verdict.passed else self.FAILED
        self.priority_json = _ByName(self._priority_json, limit=2 * len(verdicts) + 1024)
        self._verdicts = verdicts

    def verdict(self, name: str) -> NodeVerdict:
        found = self._verdicts.get(name)
        return found if found is not None else self.verdict_of(name)

    def _priority_json(self, name: str) -> bytes:
        return encode(HostPriority(name, self.verdict(name).score))


class _AnswerMemo:
    """The last few answers to NodeNames requests, keyed by the candidate list's JSON text.

    kube-scheduler sends pods of one workload in a row with the same candidate list; answering those from
    the list's bytes skips decoding and looking up thousands of names. Entries belong to one DecisionTable
    and are ignored once the table is replaced.
    """

    def __init__(self, size: int = 16):
        self._size = size
        self._entries: OrderedDict[tuple[str, int, bytes], tuple[DecisionTable, bytes, dict[Outcome, int]]] = (
            OrderedDict()
        )

    def get(self, verb: str, table: DecisionTable, names_json: bytes) -> tuple[bytes, dict[Outcome, int]] | None:
        entry = self._entries.get((verb, id(table), names_json))
        if entry is None or entry[0] is not table:
            return None
        return entry[1], entry[2]

    def put(self, verb: str, table: DecisionTable, names_json: bytes, answer: bytes, outcomes: dict) -> None:
        self._entries[(verb, id(table), names_json)] = (table, answer, outcomes)
        while len(self._entries) > self._size:
            self._entries.popitem(last=False)


@dataclass(slots=True)
class _View:
    """Everything a verdict depends on besides the node name, and how long it stays true."""

    snapshot: MetricsSnapshot
    cluster_version: int
    assumed: dict[str, dict[str, int]]
    valid_until: float
    modes: ModeMap | None = None  # SCORING_STRATEGY=auto: the mode per resource for this snapshot
    tables: dict[tuple, DecisionTable] = field(default_factory=dict)


class Extender:
    """Answers kube-scheduler's verbs from the current snapshot, cluster state and settings.

    ``snapshot_provider`` returns the refresher's current snapshot; ``cluster`` is None without a Kubernetes
    API. ``filter``/``prioritize`` take the raw body and return the raw answer, raising WireError for bad input.
    """

    def __init__(
        self,
        settings: Settings,
        telemetry: Telemetry | None = None,
        cluster: ClusterState | None = None,
        snapshot_provider: Callable[[], MetricsSnapshot] = lambda: EMPTY_SNAPSHOT,
        clock: Callable[[], float] = time.time,
        source_error: Callable[[], str | None] = lambda: None,
        source_warnings: Callable[[], list[str]] = list,
    ):
        self.settings = settings
        self.source_error = source_error  # the metrics source's last error, for /readyz
        self.source_warnings = source_warnings  # what the last refresh found wrong in the data, for /readyz
        self.policy = Policy.from_settings(settings)
        self.telemetry = telemetry or Telemetry()
        self.cluster = cluster  # None: no Kubernetes API (no in-flight accounting, tenants only from Nodes)
        self._snapshot = snapshot_provider
        self._clock = clock
        self._view: _View | None = None
        self._recent_keys: dict[tuple, None] = {}  # pod shapes seen lately, warmed on each new snapshot
        self._memo = _AnswerMemo()
        self.telemetry.scoring_strategy.labels(self.policy.strategy.value).set(1)
        # SCORING_STRATEGY=auto's state (pack or spread per resource), moved on by each new snapshot.
        self.mode_selector = ModeSelector.from_policy(self.policy) if self.policy.strategy == Strategy.AUTO else None
        self._modes_version: int | None = None
        self._modes: ModeMap | None = None

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
            limits = [m.sample_time + self.policy.max_age_seconds for m in snapshot.nodes.values()]
            fresh_limits = [limit for limit in limits if limit >= now]
            if fresh_limits:
                valid_until = min(valid_until, min(fresh_limits))
        self.telemetry.assumed_pods.set(sum(sum(r.values()) for r in assumed.values()))
        self._view = _View(snapshot, cluster_version, assumed, valid_until, self._modes_for(snapshot, now))
        return self._view

    def _modes_for(self, snapshot: MetricsSnapshot, now: float) -> ModeMap | None:
        """Auto's modes for ``snapshot``: the selector moves once per new snapshot, never per request."""
        selector = self.mode_selector
        if selector is None:
            return None
        if snapshot.version != self._modes_version:
            changed = selector.update(fleet_mean_load(snapshot, self.policy, now))
            self._modes_version, self._modes = snapshot.version, dict(selector.modes)
            self.telemetry.show_modes(selector.modes, selector.fleet_load, changed)
        return self._modes

    def _table(self, view: _View, request: GpuRequest, namespace_tenant: object, namespace: str) -> DecisionTable:
        key = (request, namespace_tenant, namespace if namespace_tenant is not _NO_TENANT else "")
        table = view.tables.get(key)
        if table is not None:
            return table
        now = self._clock()
        nodes, policy, assumed = view.snapshot.nodes, self.policy, view.assumed

        def verdict_of(name: str) -> NodeVerdict:
            if namespace_tenant is not _NO_TENANT:
                reason = tenant_mismatch(name, self.cluster.node_tenant(name), namespace, namespace_tenant)
                if reason:
                    return NodeVerdict(False, 0, Outcome.TENANT_MISMATCH, reason)
            return evaluate_node(name, nodes.get(name), request, policy, now, assumed.get(name), view.modes)

        names = list(nodes)
        if namespace_tenant is not _NO_TENANT:
            # A pool node without metrics must still be refused to other tenants.
            names += [name for name in self.cluster.tenant_nodes() if name not in nodes]
        table = DecisionTable({name: verdict_of(name) for name in names}, verdict_of)
        if len(view.tables) >= _MAX_TABLES:
            view.tables.clear()
        view.tables[key] = table
        self._recent_keys[key] = None
        while len(self._recent_keys) > _MAX_TABLES:
            del self._recent_keys[next(iter(self._recent_keys))]
        return table

    def warm(self) -> None:
        """Build the tables of recently seen pod shapes for the current snapshot (run off the request path)."""
        view = self._current_view(self._clock())
        for request, namespace_tenant, namespace in list(self._recent_keys):
            table = self._table(view, request, namespace_tenant, namespace)
            for name in list(table.codes):  # prioritize's per-node JSON too
                table.priority_json[name]  # filled on first access

    def _namespace_tenant(self, request: SchedulingRequest) -> object:
        """The pod namespace's tenant when tenant pools apply to NodeNames requests, else _NO_TENANT."""
        if request.nodes.full or not (self.settings.TENANT_POOLS and self.cluster and self.cluster.nodes_known):
            return _NO_TENANT
        known, tenant = self.cluster.namespace_tenant(request.pod.metadata.namespace)
        return tenant if known else _NO_TENANT

    def _decide(self, request: SchedulingRequest) -> tuple[GpuRequest, DecisionTable | None]:
        gpu_request = pod_gpu_request(request.pod)
        if not gpu_request:
            return gpu_request, None
        view = self._current_view(self._clock())
        return gpu_request, self._table(
            view, gpu_request, self._namespace_tenant(request), request.pod.metadata.namespace
        )

    def _full_form_tenant_failures(self, request: SchedulingRequest, passed: Iterable[int]) -> dict[int, str]:
        """Tenant check for the Nodes form, where node labels travel with the request."""
        if not (self.settings.TENANT_POOLS and self.cluster):
            return {}
        namespace = request.pod.metadata.namespace
        known, tenant = self.cluster.namespace_tenant(namespace)
        if not known:
            return {}
        failures = {}
        for index in passed:
            labels = request.nodes.labels[index] or {}
            reason = tenant_mismatch(
                request.nodes.names[index], labels.get(self.settings.TENANT_LABEL), namespace, tenant
            )
            if reason:
                failures[index] = reason
        return failures

    # --- the verbs ---------------------------------------------------------------------------------------

    def filter(self, body: bytes) -> bytes:
        """Answer POST /filter; raises wire.WireError for bodies kube-scheduler would never send."""
        request = decode_args(body)
        _, table = self._decide(request)
        names_json = request.nodes.names_json if table is not None else None
        memo = self._memo.get("filter", table, names_json) if names_json is not None else None
        if memo is not None:
            answer, outcomes = memo
        else:
            answer, outcomes = self._filter(request, table)
            if names_json is not None:
                self._memo.put("filter", table, names_json, answer, outcomes)
        for outcome, count in outcomes.items():
            if count:
                self.telemetry.decisions.labels(outcome.value).inc(count)
        return answer

    def _filter(self, request: SchedulingRequest, table: DecisionTable | None) -> tuple[bytes, dict[Outcome, int]]:
        names = request.nodes.names
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        outcomes: dict[Outcome, int] = {}
        passed: list[int] | None = None  # None: every candidate passed
        if table is None:
            outcomes[Outcome.NO_GPU_REQUEST] = len(names)
        else:
            codes = list(map(table.codes.get, names, repeat(table.absent_code)))
            absent_passed = codes.count(DecisionTable.ABSENT_PASSED)
            if absent_passed:
                outcomes[table.absent_verdict.outcome] = absent_passed
            if codes.count(DecisionTable.FAILED):
                passed = list(compress(range(len(names)), codes))
                for name in compress(names, map(not_, codes)):
                    verdict = table.verdict(name)
                    outcomes[verdict.outcome] = outcomes.get(verdict.outcome, 0) + 1
                    # Preempting pods cannot move a node into another tenant's pool.
                    target = unresolvable if verdict.outcome is Outcome.TENANT_MISMATCH else failed
                    target[name] = verdict.reason
            if request.nodes.full:
                candidates = range(len(names)) if passed is None else passed
                tenant_failures = self._full_form_tenant_failures(request, candidates)
                if tenant_failures:
                    passed = [i for i in candidates if i not in tenant_failures]
                    outcomes[Outcome.TENANT_MISMATCH] = outcomes.get(Outcome.TENANT_MISMATCH, 0) + len(tenant_failures)
                    unresolvable.update((names[i], reason) for i, reason in tenant_failures.items())
        # Nodes that passed because they asked for no GPU or lacked metrics are counted under their outcome.
        passed_count = len(names) if passed is None else len(passed)
        outcomes[Outcome.PASS] = passed_count - sum(
            count for outcome, count in outcomes.items() if outcome_passes(outcome)
        )
        return encode_filter_result(request.nodes, passed, failed, unresolvable), outcomes

    def prioritize(self, body: bytes) -> bytes:
        """Answer POST /prioritize: one integer score 0..10 per input node, in input order."""
        request = decode_args(body)
        _, table = self._decide(request)
        if table is None:
            return encode([HostPriority(name, NEUTRAL_SCORE) for name in request.nodes.names])
        names_json = request.nodes.names_json
        if names_json is not None:
            memo = self._memo.get("prioritize", table, names_json)
            if memo is not None:
                return memo[0]
        answer = b"[" + b",".join(map(table.priority_json.__getitem__, request.nodes.names)) + b"]"
        if names_json is not None:
            self._memo.put("prioritize", table, names_json, answer, {})
        return answer

    # --- health ------------------------------------------------------------------------------------------

    def metrics_age(self) -> float:
        return self._snapshot().age(self._clock())

    def ready(self) -> bool:
        """Ready while the newest sample is fresh, or whenever the policy lets nodes without metrics through."""
        if not self.policy.deny_missing:
            return True
        age = self.metrics_age()
        return age != math.inf and (self.policy.max_age_seconds == 0 or age <= self.policy.max_age_seconds)
