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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import msgspec

from gpufleet_extender.pods import GpuRequest, pod_gpu_request
from gpufleet_extender.snapshot import MetricsSnapshot
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
    starts = [s for s in starts if s is not None]
    return BoundPod(node, request, bound_at, min(starts) if starts else None)


class ClusterState:
    """Thread-safe: watch threads write, request handlers read. ``version`` changes with what matters."""

    def __init__(self, tenant_label: str, inflight_max_seconds: float, clock: Callable[[], float] = time.time):
        self._tenant_label = tenant_label
        self._inflight_max = inflight_max_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._pods: dict[str, BoundPod] = {}
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
                record = None if deleted else _bound_pod(obj, self._clock())
                if record is None:
                    self._forget(self._pods, key)
                else:
                    self._remember(self._pods, key, record)
            elif kind in ("Node", "Namespace") and meta.get("name"):
                table = self._node_tenants if kind == "Node" else self._namespace_tenants
                if deleted:
                    self._forget(table, meta["name"])
                else:
                    self._remember(table, meta["name"], (meta.get("labels") or {}).get(self._tenant_label))

    # Bump the version only on real changes: pods' status updates must not empty the decision caches.
    def _remember(self, table: dict[str, Any], key: str, value: Any) -> None:
        if key not in table or table[key] != value:
            table[key] = value
            self.version += 1

    def _forget(self, table: dict[str, Any], key: str) -> None:
        if key in table:
            del table[key]
            self.version += 1

    def replace(self, kind: str, objects: list[Mapping[str, Any]]) -> None:
        """Start over from a fresh list (after a watch restarted), then apply each as ADDED."""
        with self._lock:
            {"Pod": self._pods, "Node": self._node_tenants, "Namespace": self._namespace_tenants}[kind].clear()
            self.version += 1
            if kind == "Namespace":
                self.namespaces_known = True
            elif kind == "Node":
                self.nodes_known = True
        for obj in objects:
            self.apply_event(kind, "ADDED", obj)

    # --- reading -----------------------------------------------------------------------------------------

    def node_tenant(self, node: str) -> str | None:
        return self._node_tenants.get(node)

    def tenant_nodes(self) -> list[str]:
        """Nodes labelled with a tenant (they need a verdict even when they have no metrics)."""
        with self._lock:
            return [name for name, tenant in self._node_tenants.items() if tenant]

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
            pods = list(self._pods.values())
        for pod in pods:
            expires = pod.bound_at + self._inflight_max
            if now >= expires:
                continue
            node_metrics = snapshot.nodes.get(pod.node)
            if (
                pod.running_since is not None
                and node_metrics is not None
                and node_metrics.sample_time > pod.running_since
            ):
                continue  # a sample taken after the pod started shows its load already
            per_resource = assumed.setdefault(pod.node, {})
            for want in pod.request:
                per_resource[want.resource] = per_resource.get(want.resource, 0) + want.count
            valid_until = min(valid_until, expires)
        return assumed, valid_until
