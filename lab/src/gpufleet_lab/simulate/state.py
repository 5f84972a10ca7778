"""The simulated cluster at one moment: which pods hold which devices, and the load that puts on them.

A device's true load is the sum over the pods it holds of the utilisation and memory each drives at its age,
clamped to 1 (memory as a share of the device's GB). The extender never sees this directly: it sees the
snapshot taken at the last scrape, built with the extender's own ``snapshot`` types.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from gpufleet_extender.scoring import Policy, below_thresholds, device_load
from gpufleet_extender.snapshot import DeviceMetrics, MetricsSnapshot, NodeMetrics

from gpufleet_lab.simulate.fleet import Device, Fleet, Node
from gpufleet_lab.simulate.trace import PodSpec


@dataclass(slots=True, eq=False)
class Running:
    """A pod bound to ``node``, holding ``devices`` from ``start`` to ``end``."""

    spec: PodSpec
    node: str
    devices: tuple[DeviceState, ...]
    start: float
    end: float
    number: int = 0  # order of binding, set by SimCluster.bind
    # Interference (ModelSettings.interference above 0): the pod runs at ``rate`` nominal seconds per second since
    # ``rated_at``, with ``done`` nominal seconds of its duration behind it; ``end`` moves when the rate does.
    rate: float = 1.0
    rated_at: float = 0.0
    done: float = 0.0
    outcome: object = None  # the model's PodOutcome, to record the slowdown when the pod ends


class DeviceState:
    """One device and the pods sharing it (at most the fleet's ``replicas``).

    Loads are piecewise constant, so the device keeps its last figures until a pod comes or goes or a pod's
    schedule reaches its next step (``_valid_until``): most samples cost a comparison.
    """

    __slots__ = (
        "_hot",
        "_load",
        "_metrics",
        "_valid_from",
        "_valid_until",
        "device",
        "node",
        "pods",
        "policy",
        "position",
    )

    def __init__(self, node: str, position: int, device: Device, policy: Policy):
        self.node = node
        self.position = position  # index on the node: the device plugin's order
        self.device = device
        self.policy = policy
        self.pods: list[Running] = []
        self._invalidate()

    def _invalidate(self) -> None:
        self._valid_from = math.inf
        self._valid_until = -math.inf

    def _refresh(self, now: float) -> None:
        util = mem_gb = 0.0
        until = math.inf
        for pod in self.pods:
            age = now - pod.start
            pod_util, util_next = pod.spec.util.at_until(age)
            pod_mem, mem_next = pod.spec.mem_gb.at_until(age)
            util += pod_util
            mem_gb += pod_mem
            until = min(until, pod.start + util_next, pod.start + mem_next)
        self._metrics = DeviceMetrics(
            self.device.key, min(1.0, util), min(1.0, mem_gb / self.device.memory_gb), pods=len(self.pods)
        )
        self._load = device_load(self._metrics, self.policy)
        self._hot = not below_thresholds(self._metrics, self.policy)
        self._valid_from, self._valid_until = now, until

    def metrics(self, now: float) -> DeviceMetrics:
        """True util and memory share at ``now``, each clamped to 0..1."""
        if not self._valid_from <= now < self._valid_until:
            self._refresh(now)
        return self._metrics

    def load(self, now: float) -> float:
        """``scoring.device_load`` of the true metrics."""
        if not self._valid_from <= now < self._valid_until:
            self._refresh(now)
        return self._load

    def is_hot(self, now: float) -> bool:
        """At or above a threshold, by the extender's own rule (``scoring.below_thresholds``)."""
        if not self._valid_from <= now < self._valid_until:
            self._refresh(now)
        return self._hot

    def demand(self, now: float) -> float:
        """Utilisation its pods ask for at ``now``, summed and not clamped (above 1, they take turns)."""
        return sum(pod.spec.util.at(now - pod.start) for pod in self.pods)

    def memory_gb(self, now: float) -> float:
        """GB its pods hold at ``now``, not clamped: above the device's GB, the newest pod ran out of memory."""
        return sum(pod.spec.mem_gb.at(now - pod.start) for pod in self.pods)

    def attach(self, pod: Running) -> None:
        self.pods.append(pod)
        self._invalidate()

    def detach(self, pod: Running) -> None:
        self.pods.remove(pod)
        self._invalidate()


class NodeState:
    def __init__(self, node: Node, replicas: int | Mapping[str, int], policy: Policy):
        self.node = node
        self.name = node.name
        self.tenant = node.tenant
        self.devices = [DeviceState(node.name, i, d, policy) for i, d in enumerate(node.devices)]
        self.by_resource: dict[str, list[DeviceState]] = {}
        for state in self.devices:
            self.by_resource.setdefault(state.device.resource, []).append(state)
        # Pods per device of each resource (time-slicing replicas; 1 = exclusive).
        self.replicas_of: dict[str, int] = {
            res: replicas if isinstance(replicas, int) else replicas.get(res, 1) for res in self.by_resource
        }
        self._free = {res: len(devs) for res, devs in self.by_resource.items()}  # devices with a free slot
        self._used = dict.fromkeys(self.by_resource, 0)  # slots in use
        self.total_memory_gb = sum(d.memory_gb for d in node.devices) or 1.0

    def free_devices(self, resource: str) -> list[DeviceState]:
        """Devices of ``resource`` with a free slot, in device order."""
        replicas = self.replicas_of.get(resource, 1)
        return [d for d in self.by_resource.get(resource, ()) if len(d.pods) < replicas]

    def fits(self, pod: PodSpec) -> bool:
        """Enough distinct devices with a free slot (the count check kube-scheduler's NodeResourcesFit makes)."""
        return self._free.get(pod.resource, 0) >= pod.count

    def allocated_share_after(self, pod: PodSpec) -> float:
        """Share of the node's ``pod.resource`` slots in use once ``pod`` is bound (LeastAllocated's measure)."""
        capacity = len(self.by_resource.get(pod.resource, ())) * self.replicas_of.get(pod.resource, 1)
        return (self._used.get(pod.resource, 0) + pod.count) / capacity if capacity else 1.0

    def attach(self, device: DeviceState, pod: Running) -> None:
        device.attach(pod)
        self._used[device.device.resource] += 1
        if len(device.pods) == self.replicas_of[device.device.resource]:
            self._free[device.device.resource] -= 1

    def detach(self, device: DeviceState, pod: Running) -> None:
        if len(device.pods) == self.replicas_of[device.device.resource]:
            self._free[device.device.resource] += 1
        device.detach(pod)
        self._used[device.device.resource] -= 1

    def load(self, now: float) -> float:
        """Device load averaged over the node, each device weighted by its memory (a 3g.40gb counts 4 x 1g.10gb)."""
        return sum(d.load(now) * d.device.memory_gb for d in self.devices) / self.total_memory_gb

    def others_load(self, now: float, held: Iterable[DeviceState]) -> float:
        """Memory-weighted mean load of the node's devices not in ``held`` (what interferes with their pod)."""
        held_ids = {id(d) for d in held}
        total = weight = 0.0
        for device in self.devices:
            if id(device) not in held_ids:
                total += device.load(now) * device.device.memory_gb
                weight += device.device.memory_gb
        return total / weight if weight else 0.0

    def metrics(self, now: float) -> NodeMetrics:
        return NodeMetrics(
            name=self.name,
            sample_time=now,
            devices=MappingProxyType(
                {res: tuple(d.metrics(now) for d in devs) for res, devs in sorted(self.by_resource.items())}
            ),
        )


class SimCluster:
    """Every node's state, the pods running, and the extender's view (the last scrape)."""

    def __init__(self, fleet: Fleet, policy: Policy):
        self.fleet = fleet
        self.policy = policy
        self.nodes = {
            n.name: NodeState(n, {d.resource: fleet.replicas_for(n.tenant, d.resource) for d in n.devices}, policy)
            for n in fleet.nodes
        }
        self.running: dict[int, Running] = {}  # binding number -> pod (dict: ordered, cheap removal)
        self._bindings = 0
        self.snapshot = MetricsSnapshot()  # nothing scraped yet
        self.last_scrape: float | None = None

    def scrape(self, now: float) -> MetricsSnapshot:
        """Sample every device now; the extender sees this until the next scrape."""
        self.snapshot = MetricsSnapshot(
            nodes=MappingProxyType({name: state.metrics(now) for name, state in self.nodes.items()}),
            taken_at=now,
            version=self.snapshot.version + 1,
        )
        self.last_scrape = now
        return self.snapshot

    def bind(self, spec: PodSpec, node: NodeState, devices: Iterable[DeviceState], now: float) -> Running:
        pod = Running(spec, node.name, tuple(devices), now, now + spec.duration)
        for device in pod.devices:
            node.attach(device, pod)
        self._bindings += 1
        pod.number = self._bindings
        self.running[pod.number] = pod
        return pod

    def finish(self, pod: Running) -> None:
        node = self.nodes[pod.node]
        for device in pod.devices:
            node.detach(device, pod)
        del self.running[pod.number]
