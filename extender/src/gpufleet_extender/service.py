"""The extender's request handling, bytes in, bytes out, without HTTP: routers and benchmarks call it.

Per request: decode (wire.py), work out the pod's GPU request (pods.py), look each candidate node up in a
decision table, encode. A decision table caches ``scoring.evaluate_node`` per node for one pod shape
(request, tenant); its entries are computed the first time a node is asked about. What changes a verdict
drops only the entries of the nodes it touched, in every table: a new sample of a node, a pod bound to or
gone from it, its tenant label, one of its assumed pods expiring, its sample going stale. So a request costs
O(candidates) however the cluster churns, and every verdict is still the pure function's for the inputs of
that moment. Tables are kept per pod shape in least-recently-used order.
"""

from __future__ import annotations

import asyncio
import enum
import heapq
import logging
import math
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from itertools import compress, islice
from operator import attrgetter, not_
from typing import Any, Final, TypeVar

from gpufleet_extender.cluster import ClusterState
from gpufleet_extender.config import FilterReasons, Settings
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
from gpufleet_extender.snapshot import EMPTY_SNAPSHOT, MetricsSnapshot, NodeMetrics
from gpufleet_extender.telemetry import Telemetry
from gpufleet_extender.wire import (
    HostPriority,
    SchedulingRequest,
    decode_args,
    encode,
    encode_filter_pieces,
    encode_filter_result,
)

MAX_SHAPES = 128  # decision tables kept, least recently used dropped first
WARM_SHAPES = 8  # tables filled in the background after a new snapshot; others fill on demand
_WARM_CHUNK = 64  # nodes evaluated between two yields to the event loop while warming
_EPOCHS_KEPT = 64  # a table's recent drops kept for checking remembered answers; older answers are recomputed


class _NoTenant(enum.Enum):
    """The type of _NO_TENANT: tenant pools do not apply (a namespace's tenant itself may be None)."""

    NO_TENANT = enum.auto()


_NO_TENANT: Final = _NoTenant.NO_TENANT
# FILTER_REASONS=generic: what a failing node's reason says, by outcome. The pod's tenant reads these in its
# FailedScheduling event; the detailed reasons (node, load, pool) go to the log.
GENERIC_REASONS = {
    Outcome.OVERLOADED: "GPU devices of the requested kind are loaded above the thresholds",
    Outcome.MISSING_DENIED: "no fresh GPU metrics for this node (ON_MISSING_METRICS=deny)",
    Outcome.TENANT_MISMATCH: "node is not in this namespace's tenant pool",
}
DETAILS_LOGGED = 20  # failing nodes named in the log line of a pod no node passed

log = logging.getLogger(__name__)
_outcome_of = attrgetter("outcome")
_reason_of = attrgetter("reason")


def _generic_reason_of(verdict: NodeVerdict) -> str:
    return GENERIC_REASONS[verdict.outcome]


_V = TypeVar("_V")


class _ByName(dict[str, _V]):
    """name -> value, computing (and keeping) the value of a name seen for the first time."""

    def __init__(self, compute: Callable[[str], _V], limit: Callable[[], int]):
        super().__init__()
        self._compute = compute
        self._limit = limit  # junk names in bad requests must not grow the table without end

    def __missing__(self, name: str) -> _V:
        value = self._compute(name)
        if len(self) < self._limit():
            self[name] = value
        return value


class DecisionTable:
    """The verdicts of one pod shape, node by node, laid out for the verbs' one-pass loops.

    ``codes`` maps a node to FAILED, PASSED, or MISSING_PASSED (passed without usable metrics, as
    ON_MISSING_METRICS=allow lets it): truthy exactly when the node passes, so the filter splits the
    candidates with C-level map/compress/count. The ``*_json`` mappings hold each node's piece of an answer
    already encoded, so an answer is joined from bytes rather than encoded anew. Every mapping fills itself
    on first access.
    """

    FAILED, PASSED, MISSING_PASSED = 0, 1, 2

    def __init__(
        self,
        verdict_of: Callable[[str], NodeVerdict],
        limit: Callable[[], int],
        reason_of: Callable[[NodeVerdict], str],
    ):
        self._reason_of = reason_of
        self.verdicts = _ByName(verdict_of, limit)
        self.codes = _ByName(self._code, limit)
        self.priority_json = _ByName(self._priority_json, limit)
        self.name_json = _ByName(encode, limit)  # '"node"', a passing node's item in NodeNames
        self.failure_json = _ByName(self._failure_json, limit)  # '"node":"reason"', a failing node's entry
        self._mappings = (self.verdicts, self.codes, self.priority_json, self.name_json, self.failure_json)
        self.epoch = 0  # steps whenever entries are dropped: answers remembered before are checked again
        # The names dropped by each of the last epochs (None: all of them), newest last.
        self._dropped: deque[frozenset[str] | None] = deque(maxlen=_EPOCHS_KEPT)

    def verdict(self, name: str) -> NodeVerdict:
        return self.verdicts[name]

    def _code(self, name: str) -> int:
        verdict = self.verdicts[name]
        if verdict.outcome is Outcome.PASS:
            return self.PASSED
        return self.MISSING_PASSED if verdict.passed else self.FAILED

    def _priority_json(self, name: str) -> bytes:
        return encode(HostPriority(name, self.verdict(name).score))

    def _failure_json(self, name: str) -> bytes:
        return encode(name) + b":" + encode(self._reason_of(self.verdict(name)))

    def forget(self, names: Collection[str] | None) -> None:
        """Drop the entries of ``names`` (None: all), to be computed again when next asked about."""
        held = len(self.verdicts)
        if names is None or len(names) * 4 > held:  # most of the table: starting over is cheaper
            if any(self._mappings):
                for mapping in self._mappings:
                    mapping.clear()
                self.epoch += 1
                self._dropped.append(None)
            return
        dropped = False
        for mapping in self._mappings:
            for name in names:
                if mapping.pop(name, None) is not None:
                    dropped = True
        if dropped:
            self.epoch += 1
            self._dropped.append(frozenset(names))

    def dropped_since(self, epoch: int) -> set[str] | None:
        """The names whose entries were dropped after ``epoch``; None when that is not known (or all were)."""
        behind = self.epoch - epoch
        if behind > len(self._dropped):
            return None
        names: set[str] = set()
        for dropped in islice(reversed(self._dropped), behind):
            if dropped is None:
                return None
            names |= dropped
        return names


# What a filter answer said of each candidate: its code when it passed, (outcome, encoded entry) when it failed.
AnswerBasis = dict[str, int | tuple[Outcome, bytes]]


class _AnswerMemo:
    """The last few answers to NodeNames requests, keyed by the candidate list's JSON text.

    kube-scheduler sends pods of one workload in a row with the same candidate list; answering those from
    the list's bytes skips decoding and looking up thousands of names. Entries belong to one DecisionTable
    in one epoch. Once entries of that table were dropped (a pod bound, a node's new sample), an answer kept
    with its basis is checked against the dropped nodes only and still used when none of them changed what
    it says; others are computed again.
    """

    def __init__(self, size: int = 16):
        self._size = size
        self._entries: OrderedDict[
            tuple[str, int, bytes], tuple[DecisionTable, int, bytes, dict[Outcome, int], AnswerBasis | None]
        ] = OrderedDict()

    def get(self, verb: str, table: DecisionTable, names_json: bytes) -> tuple[bytes, dict[Outcome, int]] | None:
        key = (verb, id(table), names_json)
        entry = self._entries.get(key)
        if entry is None or entry[0] is not table:
            return None
        kept, epoch, answer, outcomes, basis = entry
        if epoch != table.epoch:
            if basis is None or not _still_true(table, epoch, basis):
                return None
            self._entries[key] = (kept, table.epoch, answer, outcomes, basis)
        return answer, outcomes

    def put(
        self,
        verb: str,
        table: DecisionTable,
        names_json: bytes,
        answer: bytes,
        outcomes: dict[Outcome, int],
        basis: AnswerBasis | None = None,
    ) -> None:
        self._entries[(verb, id(table), names_json)] = (table, table.epoch, answer, outcomes, basis)
        while len(self._entries) > self._size:
            self._entries.popitem(last=False)


def _still_true(table: DecisionTable, epoch: int, basis: AnswerBasis) -> bool:
    """Whether a filter answer given at ``epoch`` says the same of every candidate whose entry was dropped since."""
    dropped = table.dropped_since(epoch)
    if dropped is None:
        return False
    for name in dropped:
        said = basis.get(name)
        if said is None:
            continue  # not one of this answer's candidates
        code = table.codes[name]
        now_says = code if code else (table.verdicts[name].outcome, table.failure_json[name])
        if now_says != said:
            return False
    return True


BLIND_WARN_EVERY_SECONDS = 60.0  # a lasting blindness is logged again this often
STALE_NODES_NAMED = 5  # how many stale nodes /readyz and the log name (the count is always whole)


@dataclass(frozen=True, slots=True)
class StaleNodes:
    """Nodes whose newest GPU sample is older than METRICS_MAX_AGE_SECONDS while other nodes' are not: decisions use
    no metrics there (ON_MISSING_METRICS decides), though the extender as a whole is not blind. Typical causes: one
    exporter or scrape shard behind, or refreshes so slow that the oldest shard's samples age out before they land."""

    count: int
    of: int  # nodes in the snapshot
    oldest_age: float  # seconds
    named: tuple[str, ...]  # the first STALE_NODES_NAMED, by name
    max_age: float

    def describe(self) -> str:
        more = f" and {self.count - len(self.named)} more" if self.count > len(self.named) else ""
        return (
            f"samples older than METRICS_MAX_AGE_SECONDS {self.max_age:g} (the oldest {self.oldest_age:.0f}s) on "
            f"{', '.join(self.named)}{more}"
        )


NO_STALE_NODES = StaleNodes(0, 0, 0.0, (), 0.0)


class BlindnessLog:
    """Logs at WARNING each change of ``Extender.blind_reason()`` and every BLIND_WARN_EVERY_SECONDS while decisions
    stay blind: an error logged once when the source broke is not enough when the data ages out minutes later."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._blind = False
        self._warned = -math.inf
        self._stale = 0
        self._stale_warned = -math.inf

    def observe(self, reason: str | None, missing_policy: str, stale: StaleNodes | None = None) -> None:
        """``reason``: Extender.blind_reason(); ``stale``: Extender.stale_nodes() (blind there, not elsewhere)."""
        now = self._clock()
        if reason is not None and (not self._blind or now - self._warned >= BLIND_WARN_EVERY_SECONDS):
            log.warning("decisions use no GPU metrics (ON_MISSING_METRICS=%s): %s", missing_policy, reason)
            self._warned = now
        elif reason is None and self._blind:
            log.warning("decisions use GPU metrics again")
        self._blind = reason is not None
        if reason is not None:  # the line above speaks for every node
            self._stale = 0
            return
        count = stale.count if stale is not None else 0
        if count and (count != self._stale or now - self._stale_warned >= BLIND_WARN_EVERY_SECONDS):
            assert stale is not None
            log.warning(
                "decisions use no GPU metrics for %d of %d nodes (ON_MISSING_METRICS=%s): %s",
                count,
                stale.of,
                missing_policy,
                stale.describe(),
            )
            self._stale_warned = now
        elif not count and self._stale:
            log.warning("every node's GPU metrics are within METRICS_MAX_AGE_SECONDS again")
        self._stale = count


class Extender:
    """Answers kube-scheduler's verbs from the current snapshot, cluster state and settings.

    ``snapshot_provider`` returns the refresher's current snapshot; ``cluster`` is None without a Kubernetes
    API. ``filter``/``prioritize`` take the raw body and return the raw answer, raising WireError for bad input.
    Not thread-safe: call it from one thread (the event loop); ``cluster`` may be fed from others.
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
        loading: Callable[[], bool] = lambda: False,
    ):
        self.settings = settings
        self.source_error = source_error  # the metrics source's last error, for /readyz
        self.source_warnings = source_warnings  # what the last refresh found wrong in the data, for /readyz
        self.loading = loading  # True until the metrics source answered (or failed) for the first time
        self.policy = Policy.from_settings(settings)
        self._generic_reasons = settings.FILTER_REASONS is FilterReasons.GENERIC
        self._reason_of = _generic_reason_of if self._generic_reasons else _reason_of
        self.telemetry = telemetry or Telemetry()
        self.cluster = cluster  # None: no Kubernetes API (no in-flight accounting, tenants only from Nodes)
        self._snapshot = snapshot_provider
        self._clock = clock
        self._memo = _AnswerMemo()
        self.telemetry.scoring_strategy.labels(self.policy.strategy.value).set(1)
        self.telemetry.assumed_pods.set_function(self.assumed_pods)
        # SCORING_STRATEGY=auto's state (pack or spread per resource), moved on by each new snapshot.
        self.mode_selector = ModeSelector.from_policy(self.policy) if self.policy.strategy == Strategy.AUTO else None
        self._modes: ModeMap | None = None
        # What the tables' entries were computed from; _sync brings them up to date before each use.
        self._tables: OrderedDict[tuple[Any, ...], DecisionTable] = OrderedDict()
        self._seen_snapshot: MetricsSnapshot = EMPTY_SNAPSHOT
        self._seen_cluster = -1
        self._now = 0.0  # the moment of the request being answered
        # Per node: (metrics, assumed load), shared by every table; and when a node's entries expire by time.
        self._inputs: dict[str, tuple[NodeMetrics | None, dict[str, int] | None]] = {}
        self._deadlines: list[tuple[float, str]] = []  # heap of (moment, node)

    # --- keeping the tables true ---------------------------------------------------------------------------

    def _sync(self, now: float) -> None:
        """Drop the entries that a new snapshot, the cluster's changes or time alone made untrue."""
        self._now = now
        touched: set[str] | None
        touched = set()
        snapshot = self._snapshot()
        seen = self._seen_snapshot
        if snapshot.version != seen.version:
            self._seen_snapshot = snapshot
            if self._set_modes(snapshot, now):
                touched = None
            else:
                # Only nodes whose inputs were read can have entries that depend on metrics, and sources keep
                # the NodeMetrics of unchanged nodes: identity over those tells what changed, without a pass
                # over the whole fleet on the request path.
                nodes = snapshot.nodes
                touched.update(name for name, (metrics, _) in self._inputs.items() if nodes.get(name) is not metrics)
        elif snapshot is not seen:
            self._seen_snapshot = snapshot  # the same data, polled again
        if self.cluster is not None and self.cluster.version != self._seen_cluster:
            self._seen_cluster, changed = self.cluster.changed_nodes_since(self._seen_cluster)
            touched = None if touched is None or changed is None else touched | changed
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now and touched is not None:
            touched.add(heapq.heappop(deadlines)[1])
        if touched is None:
            self._inputs.clear()
            deadlines.clear()
        elif touched:
            for name in touched:
                self._inputs.pop(name, None)
        else:
            return
        for table in self._tables.values():
            table.forget(touched)

    def _set_modes(self, snapshot: MetricsSnapshot, now: float) -> bool:
        """Move auto's modes on with a new snapshot (never per request); True when they changed."""
        selector = self.mode_selector
        if selector is None:
            return False
        changed = selector.update(fleet_mean_load(snapshot, self.policy, now))
        self.telemetry.show_modes(selector.modes, selector.fleet_load, changed)
        modes = dict(selector.modes)
        if modes == self._modes:
            return False
        self._modes = modes
        return True

    def _node_inputs(self, name: str) -> tuple[NodeMetrics | None, dict[str, int] | None]:
        """A node's metrics and assumed load, noting when time alone will change its verdicts."""
        inputs = self._inputs.get(name)
        if inputs is not None:
            return inputs
        now = self._now
        metrics = self._seen_snapshot.nodes.get(name)
        assumed, expires = self.cluster.assumed_on(name, metrics, now) if self.cluster else (None, math.inf)
        max_age = self.policy.max_age_seconds
        if metrics is not None and max_age > 0 and now - metrics.sample_time <= max_age:
            # Possibly stale from this moment on (evaluated again then; the age is compared with >).
            expires = min(expires, metrics.sample_time + max_age)
        if len(self._inputs) >= self._entry_limit():
            # Junk names by the thousand: start over rather than keep verdicts whose inputs are not tracked.
            self._inputs.clear()
            self._deadlines.clear()
            for table in self._tables.values():
                table.forget(None)
        if expires != math.inf:
            heapq.heappush(self._deadlines, (expires, name))
        self._inputs[name] = (metrics, assumed)
        return metrics, assumed

    def _entry_limit(self) -> int:
        return 2 * len(self._seen_snapshot.nodes) + 1024

    def _table(self, request: GpuRequest, namespace_tenant: str | _NoTenant | None, namespace: str) -> DecisionTable:
        key = (request, namespace_tenant, namespace if namespace_tenant is not _NO_TENANT else "")
        table = self._tables.get(key)
        if table is not None:
            self._tables.move_to_end(key)
            return table
        policy, cluster = self.policy, self.cluster

        def verdict_of(name: str) -> NodeVerdict:
            if namespace_tenant is not _NO_TENANT:
                assert cluster is not None  # _namespace_tenant gives a tenant only when there is a cluster
                reason = tenant_mismatch(name, cluster.node_tenant(name), namespace, namespace_tenant)
                if reason:
                    return NodeVerdict(False, 0, Outcome.TENANT_MISMATCH, reason)
            metrics, assumed = self._node_inputs(name)
            return evaluate_node(name, metrics, request, policy, self._now, assumed, self._modes)

        table = self._tables[key] = DecisionTable(verdict_of, self._entry_limit, self._reason_of)
        if len(self._tables) > MAX_SHAPES:
            self._tables.popitem(last=False)
        return table

    async def warm(self) -> None:
        """Fill the tables of the most recent pod shapes for the current snapshot, yielding as it goes.

        Run as a task on the event loop right after a new snapshot: requests keep being answered between
        chunks, and those arriving later find their nodes evaluated.
        """
        self._sync(self._clock())
        version = self._seen_snapshot.version
        names = list(self._seen_snapshot.nodes)
        for table in list(self._tables.values())[-WARM_SHAPES:]:
            for start in range(0, len(names), _WARM_CHUNK):
                await asyncio.sleep(0)
                self._sync(self._clock())
                if self._seen_snapshot.version != version:
                    return  # a newer snapshot came in: its own warm-up takes over
                for name in names[start : start + _WARM_CHUNK]:
                    table.codes[name]  # computed on first access
                    table.priority_json[name]

    def assumed_pods(self) -> float:
        """In-flight pods counted as load now (the inflight_assumed_pods gauge, computed when scraped)."""
        if self.cluster is None:
            return 0.0
        assumed, _ = self.cluster.assumed_load(self._snapshot(), self._clock())
        return float(sum(sum(per_resource.values()) for per_resource in assumed.values()))

    def _namespace_tenant(self, request: SchedulingRequest) -> str | _NoTenant | None:
        """The pod namespace's tenant when tenant pools apply to NodeNames requests, else _NO_TENANT."""
        if request.nodes.full or not (self.settings.TENANT_POOLS and self.cluster and self.cluster.nodes_known):
            return _NO_TENANT
        known, tenant = self.cluster.namespace_tenant(request.pod.metadata.namespace)
        return tenant if known else _NO_TENANT

    def _decide(self, request: SchedulingRequest) -> tuple[GpuRequest, DecisionTable | None]:
        gpu_request = pod_gpu_request(request.pod)
        if not gpu_request:
            return gpu_request, None
        self._sync(self._clock())
        return gpu_request, self._table(gpu_request, self._namespace_tenant(request), request.pod.metadata.namespace)

    def _full_form_tenant_failures(self, request: SchedulingRequest, passed: Iterable[int]) -> dict[int, str]:
        """Tenant check for the Nodes form, where node labels travel with the request."""
        if not (self.settings.TENANT_POOLS and self.cluster):
            return {}
        namespace = request.pod.metadata.namespace
        known, tenant = self.cluster.namespace_tenant(namespace)
        if not known:
            return {}
        node_labels = request.nodes.labels
        assert node_labels is not None  # the Nodes form carries each node's labels
        failures = {}
        for index in passed:
            labels = node_labels[index] or {}
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
        memo = self._memo.get("filter", table, names_json) if names_json is not None and table is not None else None
        if memo is not None:
            answer, outcomes = memo
        elif names_json is not None and table is not None:
            answer, outcomes, basis = self._filter_names(request, table)
            self._memo.put("filter", table, names_json, answer, outcomes, basis)
        else:
            answer, outcomes = self._filter(request, table)
        for outcome, count in outcomes.items():
            if count:
                self.telemetry.decisions.labels(outcome.value).inc(count)
        return answer

    def _filter(self, request: SchedulingRequest, table: DecisionTable | None) -> tuple[bytes, dict[Outcome, int]]:
        if table is not None and not request.nodes.full:
            names_answer, names_outcomes, _ = self._filter_names(request, table)
            return names_answer, names_outcomes
        names = request.nodes.names
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        outcomes: dict[Outcome, int] = {}
        passed: list[int] | None = None  # None: every candidate passed
        if table is None:
            outcomes[Outcome.NO_GPU_REQUEST] = len(names)
        else:
            codes = list(map(table.codes.__getitem__, names))
            missing_passed = codes.count(DecisionTable.MISSING_PASSED)
            if missing_passed:
                outcomes[Outcome.MISSING_ALLOWED] = missing_passed
            if codes.count(DecisionTable.FAILED):
                passed = list(compress(range(len(names)), codes))
                # C-level passes over the failing nodes: with tenant pools, half a fleet can fail here.
                failing = list(compress(names, map(not_, codes)))
                verdicts = list(map(table.verdicts.__getitem__, failing))
                failing_outcomes = list(map(_outcome_of, verdicts))
                outcomes.update(Counter(failing_outcomes))
                if self._generic_reasons:
                    self._log_details(request, len(passed), failing, verdicts)
                    reasons = list(zip(failing, map(GENERIC_REASONS.__getitem__, failing_outcomes), strict=True))
                else:
                    reasons = list(zip(failing, map(_reason_of, verdicts), strict=True))
                # Preempting pods cannot move a node into another tenant's pool.
                refused_by_pool = list(map(Outcome.TENANT_MISMATCH.__eq__, failing_outcomes))
                unresolvable = dict(compress(reasons, refused_by_pool))
                failed = dict(compress(reasons, map(not_, refused_by_pool)))
            if request.nodes.full:
                candidates = range(len(names)) if passed is None else passed
                tenant_failures = self._full_form_tenant_failures(request, candidates)
                if tenant_failures:
                    passed = [i for i in candidates if i not in tenant_failures]
                    outcomes[Outcome.TENANT_MISMATCH] = outcomes.get(Outcome.TENANT_MISMATCH, 0) + len(tenant_failures)
                    if self._generic_reasons:
                        generic = GENERIC_REASONS[Outcome.TENANT_MISMATCH]
                        tenant_failures = dict.fromkeys(tenant_failures, generic)
                    unresolvable.update((names[i], reason) for i, reason in tenant_failures.items())
                    # A node let through without metrics and then refused its pool counts once, as a mismatch.
                    refused_missing = sum(codes[i] == DecisionTable.MISSING_PASSED for i in tenant_failures)
                    if refused_missing:
                        outcomes[Outcome.MISSING_ALLOWED] -= refused_missing
        # Nodes that passed because they asked for no GPU or lacked metrics are counted under their outcome.
        passed_count = len(names) if passed is None else len(passed)
        outcomes[Outcome.PASS] = passed_count - sum(
            count for outcome, count in outcomes.items() if outcome_passes(outcome)
        )
        return encode_filter_result(request.nodes, passed, failed, unresolvable), outcomes

    def _filter_names(
        self, request: SchedulingRequest, table: DecisionTable
    ) -> tuple[bytes, dict[Outcome, int], AnswerBasis]:
        """The NodeNames form, the one kube-scheduler sends with nodeCacheCapable: the answer is joined from the
        table's encoded pieces (the same bytes _filter's encoder writes), with C-level passes over the names.
        Also returns what the answer says of each candidate, for the memo to check it later."""
        names = request.nodes.names
        codes = list(map(table.codes.__getitem__, names))
        basis: AnswerBasis = dict(zip(names, codes, strict=True))
        outcomes: dict[Outcome, int] = {}
        missing_passed = codes.count(DecisionTable.MISSING_PASSED)
        if missing_passed:
            outcomes[Outcome.MISSING_ALLOWED] = missing_passed
        failed_count = codes.count(DecisionTable.FAILED)
        if not failed_count:
            outcomes[Outcome.PASS] = len(names) - missing_passed
            return encode_filter_result(request.nodes, None, {}, {}), outcomes, basis
        failing = list(compress(names, map(not_, codes)))
        verdicts = list(map(table.verdicts.__getitem__, failing))
        failing_outcomes = list(map(_outcome_of, verdicts))
        outcomes.update(Counter(failing_outcomes))
        outcomes[Outcome.PASS] = len(names) - failed_count - missing_passed
        if self._generic_reasons:
            self._log_details(request, len(names) - failed_count, failing, verdicts)
        # Preempting pods cannot move a node into another tenant's pool.
        refused_by_pool = list(map(Outcome.TENANT_MISMATCH.__eq__, failing_outcomes))
        entries = list(map(table.failure_json.__getitem__, failing))
        basis.update(zip(failing, zip(failing_outcomes, entries, strict=True), strict=True))
        answer = encode_filter_pieces(
            b",".join(compress(map(table.name_json.__getitem__, names), codes)),
            b",".join(compress(entries, map(not_, refused_by_pool))),
            b",".join(compress(entries, refused_by_pool)),
        )
        return answer, outcomes, basis

    def _log_details(
        self, request: SchedulingRequest, passed: int, failing: list[str], verdicts: list[NodeVerdict]
    ) -> None:
        """The detailed reasons generic answers leave out: when no node passed (the pod waits, an operator asks
        why) at INFO, limited to DETAILS_LOGGED nodes; every refusal at DEBUG."""
        level = logging.INFO if passed == 0 else logging.DEBUG
        if not log.isEnabledFor(level):
            return
        meta = request.pod.metadata
        shown = verdicts if level == logging.DEBUG else verdicts[:DETAILS_LOGGED]
        more = len(verdicts) - len(shown)
        log.log(
            level,
            "filter %s/%s: %d passed, %d refused: %s%s",
            meta.namespace,
            meta.name,
            passed,
            len(failing),
            "; ".join(verdict.reason for verdict in shown),
            f"; and {more} more" if more else "",
        )

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

    def blind_reason(self) -> str | None:
        """Why decisions use no GPU metrics now (None while they use some): nothing loaded yet, or the newest sample
        older than METRICS_MAX_AGE_SECONDS. Meanwhile ON_MISSING_METRICS decides for every node: allow places like a
        scheduler without the extender, deny places no GPU pod."""
        snapshot = self._snapshot()
        if not snapshot.nodes:
            reason = "no GPU metrics loaded"
        else:
            age, max_age = snapshot.age(self._clock()), self.policy.max_age_seconds
            if max_age == 0 or age <= max_age:
                return None
            reason = f"the newest GPU sample is {age:.0f}s old (METRICS_MAX_AGE_SECONDS {max_age:g})"
        error = self.source_error()
        return f"{reason}; last refresh: {error}" if error else reason

    def stale_nodes(self) -> StaleNodes:
        """The nodes decisions hold no usable metrics for while others are fresh (NO_STALE_NODES when none, or when
        the whole snapshot is stale: that is blind_reason's case)."""
        snapshot, max_age = self._snapshot(), self.policy.max_age_seconds
        if max_age == 0 or not snapshot.nodes:
            return NO_STALE_NODES
        now = self._clock()
        if snapshot.age(now) > max_age:
            return NO_STALE_NODES
        limit = now - max_age
        stale = sorted(name for name, node in snapshot.nodes.items() if node.sample_time < limit)
        if not stale:
            return NO_STALE_NODES
        oldest = min(snapshot.nodes[name].sample_time for name in stale)
        return StaleNodes(len(stale), len(snapshot.nodes), now - oldest, tuple(stale[:STALE_NODES_NAMED]), max_age)

    def ready(self) -> bool:
        """Ready once the first snapshot is in, while its newest sample is fresh or the policy lets nodes without
        metrics through."""
        if self.loading():
            return False
        if not self.policy.deny_missing:
            return True
        age = self.metrics_age()
        return age != math.inf and (self.policy.max_age_seconds == 0 or age <= self.policy.max_age_seconds)
