"""What the extender knows of the cluster from watch events: tenant labels and recently bound GPU pods.

In-flight accounting: metrics lag behind bindings, so a burst of pods would all see the same idle node.
Each GPU pod bound to a node counts as assumed load there (it takes the least-loaded devices of its
resource) until the node has a sample newer than the moment its containers started running, or until
``inflight_max_seconds`` passed (a pod stuck pulling its image must not block a node for ever).

Events are the Kubernetes watch's ``{"type": ADDED|MODIFIED|DELETED, "object": <JSON object>}``; the
watch loop (k8s_watch.py) only feeds them to ``apply_event``, so tests feed the same method by hand.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import msgspec

from gpufleet_extender.pods import GpuRequest, pod_gpu_request
from gpufleet_extender.snapshot import MetricsSnapshot, NodeMetrics
from gpufleet_extender.wire import Pod, WireError

_TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


def _parse_time(value: Any) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class BoundPod:
    node: str
    request: GpuRequest
    bound_at: float
    running_since: float | None  # earliest container start; None while not running


def _bound_pod(obj: Mapping[str, Any], seen_at: float) -> BoundPod | None:
    """The accounting record of a pod object, or None when it holds no GPU on a node."""
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    node = spec.get("nodeName")
    if not node or status.get("phase") in _TERMINAL_PHASES:
        return None
    try:
        request = pod_gpu_request(msgspec.convert(obj, Pod))
    except (msgspec.ValidationError, WireError):
        return None
    if not request:
        return None
    bound_at = seen_at
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "True":
            bound_at = _parse_time(condition.get("lastTransitionTime")) or seen_at
    starts = [
        _parse_time(((cs.get("state") or {}).get("running") or {}).get("startedAt"))
        for cs in status.get("containerStatuses") or []
    ]
    started = [s for s in starts if s is not None]
    return BoundPod(node, request, bound_at, min(started) if started else None)


_CHANGES_KEPT = 4096  # per-version records of touched nodes; a reader further behind starts over


class ClusterState:
    """Thread-safe: watch threads write, request handlers read. ``version`` changes with what matters.

    Each version step records the nodes whose verdicts it may change (a pod bound to or gone from a node, a
    node's tenant label), so readers re-evaluate only those: ``changed_nodes_since``.
    """

    def __init__(self, tenant_label: str, inflight_max_seconds: float, clock: Callable[[], float] = time.time):
        self._tenant_label = tenant_label
        self._inflight_max = inflight_max_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._pods: dict[str, BoundPod] = {}
        self._pods_by_node: dict[str, dict[str, BoundPod]] = {}
        self._changes: deque[tuple[int, Collection[str] | None]] = deque(maxlen=_CHANGES_KEPT)
        self._node_tenants: dict[str, str | None] = {}
        self._namespace_tenants: dict[str, str | None] = {}
        self.version = 0
        # Set by the watch once it listed namespaces: only then is "namespace has no tenant" a fact.
        self.namespaces_known = False
        self.nodes_known = False

    # --- feeding ---------------------------------------------------------------------------------------

    def apply_event(self, kind: str, event_type: str, obj: Mapping[str, Any]) -> None:
        """Apply one watch event; ``kind`` is Pod, Node or Namespace."""
        meta = obj.get("metadata") or {}
        deleted = event_type == "DELETED"
        with self._lock:
            if kind == "Pod":
                key = meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}"
                self._set_pod(key, None if deleted else _bound_pod(obj, self._clock()))
            elif kind in ("Node", "Namespace") and meta.get("name"):
                table = self._node_tenants if kind == "Node" else self._namespace_tenants
                # A namespace's tenant picks the decision table, it changes no node's verdict in one.
                touched = (meta["name"],) if kind == "Node" else ()
                if deleted:
                    self._forget(table, meta["name"], touched)
                else:
                    labels = meta.get("labels") or {}
                    self._remember(table, meta["name"], labels.get(self._tenant_label), touched)

    # Bump the version only on real changes: pods' status updates must not empty the decision caches.
    def _remember(self, table: dict[str, Any], key: str, value: Any, touched: Collection[str]) -> None:
        if key not in table or table[key] != value:
            table[key] = value
            self._bump(touched)

    def _forget(self, table: dict[str, Any], key: str, touched: Collection[str]) -> None:
        if key in table:
            del table[key]
            self._bump(touched)

    def _set_pod(self, key: str, record: BoundPod | None) -> None:
        old = self._pods.get(key)
        if old == record:
            return
        if old is not None:
            del self._pods[key]
            on_node = self._pods_by_node[old.node]
            del on_node[key]
            if not on_node:
                del self._pods_by_node[old.node]
        if record is not None:
            self._pods[key] = record
            self._pods_by_node.setdefault(record.node, {})[key] = record
        self._bump({pod.node for pod in (old, record) if pod is not None})

    def _bump(self, touched: Collection[str] | None) -> None:
        """Step the version; ``touched``: the nodes whose verdicts may change (None: any node)."""
        self.version += 1
        self._changes.append((self.version, touched))

    def replace(self, kind: str, objects: list[Mapping[str, Any]]) -> None:
        """Start over from a fresh list (after a watch restarted), then apply each as ADDED."""
        with self._lock:
            if kind == "Pod":
                self._pods.clear()
                self._pods_by_node.clear()
            else:
                (self._node_tenants if kind == "Node" else self._namespace_tenants).clear()
            self._bump(None)
            if kind == "Namespace":
                self.namespaces_known = True
            elif kind == "Node":
                self.nodes_known = True
        for obj in objects:
            self.apply_event(kind, "ADDED", obj)

    def changed_nodes_since(self, version: int) -> tuple[int, set[str] | None]:
        """(current version, nodes touched after ``version``); None instead of a set: start over."""
        with self._lock:
            current = self.version
            if version == current:
                return current, set()
            changes = self._changes
            if version > current or not changes or changes[0][0] > version + 1:
                return current, None  # the records of those steps are gone
            touched: set[str] = set()
            for step, nodes in reversed(changes):
                if step <= version:
                    break
                if nodes is None:
                    return current, None
                touched.update(nodes)
            return current, touched

    # --- reading -----------------------------------------------------------------------------------------

    def node_tenant(self, node: str) -> str | None:
        return self._node_tenants.get(node)

    def namespace_tenant(self, namespace: str) -> tuple[bool, str | None]:
        """(known, tenant): unknown while namespaces were never listed or the namespace is not seen."""
        if not self.namespaces_known or namespace not in self._namespace_tenants:
            return False, None
        return True, self._namespace_tenants[namespace]

    def assumed_load(self, snapshot: MetricsSnapshot, now: float) -> tuple[dict[str, dict[str, int]], float]:
        """Per node and resource, the devices taken by pods no sample covers yet; and until when that holds.

        The second value is the earliest moment an assumed pod expires by age (math.inf when none).
        """
        assumed: dict[str, dict[str, int]] = {}
        valid_until = float("inf")
        with self._lock:
            nodes = list(self._pods_by_node)
        for node in nodes:
            per_resource, expires = self.assumed_on(node, snapshot.nodes.get(node), now)
            if per_resource is not None:
                assumed[node] = per_resource
            valid_until = min(valid_until, expires)
        return assumed, valid_until

    def assumed_on(
        self, node: str, node_metrics: NodeMetrics | None, now: float
    ) -> tuple[dict[str, int] | None, float]:
        """``assumed_load`` of one node (None: nothing assumed) and the moment the first of its pods expires."""
        with self._lock:
            pods = list((self._pods_by_node.get(node) or {}).values())
        return _assumed(pods, node_metrics, now, self._inflight_max)


def _assumed(
    pods: Iterable[BoundPod], node_metrics: NodeMetrics | None, now: float, inflight_max: float
) -> tuple[dict[str, int] | None, float]:
    per_resource: dict[str, int] | None = None
    valid_until = float("inf")
    for pod in pods:
        expires = pod.bound_at + inflight_max
        if now >= expires:
            continue
        if pod.running_since is not None and node_metrics is not None and node_metrics.sample_time > pod.running_since:
            continue  # a sample taken after the pod started shows its load already
        if per_resource is None:
            per_resource = {}
        for want in pod.request:
            per_resource[want.resource] = per_resource.get(want.resource, 0) + want.count
        valid_until = min(valid_until, expires)
    return per_resource, valid_until
