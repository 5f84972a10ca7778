"""The event-driven model: pods arrive, wait, get placed by a policy, run and leave; metrics are scraped.

Events at the same moment run in this order: pods ending (their devices free up), the scrape, arrivals.

- Scrape (every ``scrape_interval`` seconds, from 0, until no pod is left to arrive, wait or run): the
  extender's snapshot becomes the devices' true load at that moment; it sees nothing newer until the next
  scrape (the lag). The fleet's load is recorded on the same grid for the statistics.
- Arrival: the pod is placed at once if its policy picks a node, else it joins the waiting queue.
- Waiting pods are retried, oldest first, after every pod end and every scrape (what kube-scheduler's
  requeue on cluster events and periodic flush do); a pod shape that failed in a round is not retried
  again in that round. Pods still waiting ``drain_seconds`` after the last arrival count as never placed.

Devices on the chosen node: the scheduler picks only the node; the kubelet asks the device plugin for a preferred
allocation and the plugin picks the devices, knowing nothing of load. ``plugin`` (default) is the rule of the
NVIDIA device plugin the gpu_device_plugin role deploys (v0.17.1): ``getPreferredAllocation`` in
``internal/rm/nvml_manager.go`` sends every request but one for unreplicated whole GPUs to ``distributedAlloc`` in
``internal/rm/allocate.go``, which takes, one at a time, a device with the fewest replicas already allocated, equal
devices in no fixed order (a Go map's order and an unstable sort; drawn here with a seeded generator). MIG devices
are never aligned, so exclusive MIG instances are a free one in no fixed order too. Unreplicated whole GPUs go to
its NVLink-aligned allocation, which the model does not have: the first free ones. ``lowest-index`` breaks the
ties by device index instead (the earlier ``plugin`` model, kept so older figures stay reproducible);
``least-loaded`` gives the least-loaded free devices, which is what the extender's ``spread`` score assumes
(``scoring.pick_devices``) and what no deployed plugin does. ``distributed`` is the earlier name of ``plugin``.

Interference (``ModelSettings.interference``, alpha above 0): a pod runs at ``1 / (1 + alpha x L)`` of its
nominal speed, ``L`` being the memory-weighted load of its node's other devices, re-read at every scrape; its
end moves accordingly and its slowdown (run time over nominal duration) is recorded when it ends.

Time-slicing (``ModelSettings.timeslice_efficiency`` E, on for fleets that share a device): on a device two or more
pods take turns on, only E of the time does useful work, shared in proportion to what each pod asks for (its
utilisation); a pod on a device whose pods ask for U in all runs at ``min(1, E / U)``, re-read at every scrape.
Memory: a pod whose start-up memory does not fit beside what its device's pods hold fails with out-of-memory
(``PodOutcome.oom``) and holds nothing.
"""

from __future__ import annotations

import heapq
import itertools
import random
from array import array
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum
from typing import Any

from gpufleet_extender.pods import WHOLE_GPU_RESOURCE
from gpufleet_extender.scoring import Policy, below_thresholds, tenant_mismatch

from gpufleet_lab.simulate.errors import SimulationError as SimulationError  # re-exported: its old home
from gpufleet_lab.simulate.fleet import Fleet
from gpufleet_lab.simulate.policies import PlacementPolicy, SchedulerView
from gpufleet_lab.simulate.state import DeviceState, NodeState, Running, SimCluster
from gpufleet_lab.simulate.trace import PodSpec, Trace


class DeviceChoice(StrEnum):
    PLUGIN = "plugin"  # the deployed NVIDIA device plugin's rule (distributedAlloc), ties drawn
    LOWEST_INDEX = "lowest-index"  # the same with ties by index (the earlier model)
    LEAST_LOADED = "least-loaded"  # what the extender's spread score assumes; no deployed plugin does it
    DISTRIBUTED = "distributed"  # the earlier name of plugin


# NVIDIA's measurement of time-slicing against MIG under heavy load, 0.76 against 1.00 requests/s per GPU
# (docs/simulator.md, "What the fleet gains").
TIMESLICE_EFFICIENCY = 0.76


@dataclass(frozen=True, slots=True)
class ModelSettings:
    scrape_interval: float = 15.0
    device_choice: DeviceChoice = DeviceChoice.PLUGIN
    inflight_max_seconds: float = 120.0  # the extender's INFLIGHT_MAX_SECONDS
    drain_seconds: float = 3600.0
    interference: float = 0.0  # alpha of the slowdown model; 0 = pods run at nominal speed
    # Time-slicing: the share of a shared device's time that does useful work while two or more pods take turns on it
    # (context switches cost the rest); 0 = no time-slicing slowdown.
    timeslice_efficiency: float = TIMESLICE_EFFICIENCY
    seed: int = 1  # of the distributed device choice's tie-break


class _Event(IntEnum):  # the order of events at the same moment
    END = 0
    SCRAPE = 1
    ARRIVAL = 2


@dataclass(slots=True)
class PodOutcome:
    name: str
    tenant: str | None
    arrival: float
    start: float | None = None  # None: never placed
    node: str | None = None
    devices: tuple[str, ...] = ()
    hot: bool = False  # placed on a device above a threshold while a cooler fitting device existed
    held: bool = False  # fitted somewhere by count, but the policy (the extender's filter) passed no node
    # Hot, though the last sample showed the node with enough cool devices with room: the node was a sound choice
    # by what the extender could know; the device plugin's choice, or a burst since the sample, made it hot.
    hot_on_cool_node: bool = False
    resource: str = ""
    count: int = 1
    slowdown: float | None = None  # run time / nominal duration, once the pod ended (interference model)
    # Started on a device whose pods already held too much of its memory for this one: CUDA out-of-memory at
    # start-up (time-slicing isolates no memory). The pod fails and holds nothing.
    oom: bool = False

    @property
    def wait(self) -> float | None:
        return None if self.start is None else self.start - self.arrival


@dataclass(slots=True)
class RunResult:
    """What one policy did with the trace, plus the load recorded on the scrape grid."""

    policy: str
    node_names: list[str]
    node_tenants: list[str | None]
    outcomes: list[PodOutcome] = field(default_factory=list)
    sample_times: list[float] = field(default_factory=list)
    node_load: list[list[float]] = field(default_factory=list)  # per sample, per node (node_names order)
    device_load: array[Any] = field(default_factory=lambda: array("d"))  # every device at every sample
    probes: dict[str, list[Any]] = field(default_factory=dict)  # extra series from Probe objects, by name


class Probe:
    """An extra series recorded at each sample (the free whole GPUs, largest placeable request...)."""

    name = "probe"

    def sample(self, now: float, cluster: SimCluster) -> object:
        raise NotImplementedError


def choose_devices(
    node: NodeState, pod: PodSpec, now: float, how: DeviceChoice, rng: random.Random | None = None
) -> list[DeviceState]:
    free = node.free_devices(pod.resource)
    if how is DeviceChoice.LEAST_LOADED:
        free.sort(key=lambda d: (d.load(now), len(d.pods), d.position))
    elif how in (DeviceChoice.PLUGIN, DeviceChoice.DISTRIBUTED) and not (
        pod.resource == WHOLE_GPU_RESOURCE and node.replicas_of.get(pod.resource, 1) == 1
    ):
        # distributedAlloc: fewest allocated replicas first; equal devices in no fixed order.
        draw = rng or random.Random(0)
        ties = {id(d): draw.random() for d in free}
        free.sort(key=lambda d: (len(d.pods), ties[id(d)]))
    else:
        free.sort(key=lambda d: (len(d.pods), d.position))
    return free[: pod.count]


def timeslice_speed(device: DeviceState, now: float, efficiency: float) -> float:
    """Nominal seconds per second of a pod on ``device``: 1 alone, ``min(1, E / U)`` among others asking ``U``."""
    if efficiency <= 0 or len(device.pods) < 2:
        return 1.0
    demand = device.demand(now)
    return min(1.0, efficiency / demand) if demand > 0 else 1.0


def runs_out_of_memory(pod: PodSpec, chosen: list[DeviceState], now: float) -> bool:
    """The pod's memory at start-up does not fit beside what the pods already on one of its devices hold."""
    need = pod.mem_gb.at(0.0)
    return any(d.memory_gb(now) + need > d.device.memory_gb + 1e-9 for d in chosen)


def is_hot_placement(pod: PodSpec, chosen: list[DeviceState], pool: list[NodeState], now: float) -> bool:
    """A chosen device is at/above a threshold (true load, before the pod) while a free one below existed."""
    if not any(d.is_hot(now) for d in chosen):
        return False
    taken = {id(d) for d in chosen}
    return any(id(d) not in taken and not d.is_hot(now) for node in pool for d in node.free_devices(pod.resource))


class Simulation:
    """One run of one policy over one trace. ``run()`` returns the RunResult."""

    def __init__(
        self,
        fleet: Fleet,
        trace: Trace,
        policy: PlacementPolicy,
        extender_policy: Policy,
        settings: ModelSettings = ModelSettings(),
        probes: tuple[Probe, ...] = (),
        progress: Callable[[float], None] | None = None,
    ):
        if not trace.pods:
            raise SimulationError("the trace has no pods")
        self.fleet = fleet
        self.trace = trace
        self.policy = policy
        self.extender_policy = extender_policy
        self.settings = settings
        self.probes = probes
        self.progress = progress
        self.cluster = SimCluster(fleet, extender_policy)
        self._pools: dict[tuple[str, str | None], list[NodeState]] = {}
        self._recent: list[Running] = []  # bound since the last scrape: the in-flight pods
        self._events: list[Any] = []
        self._order = itertools.count()
        self._waiting: list[tuple[PodSpec, PodOutcome]] = []
        self._device_rng = random.Random(f"devices/{settings.seed}")
        # Pods change speed (and their end moves) with their neighbours' load, or their device's other replicas'.
        self._timeslicing = settings.timeslice_efficiency > 0 and bool(fleet.shared_resources())
        self._retiming = settings.interference > 0 or self._timeslicing
        nodes = list(self.cluster.nodes.values())
        self.result = RunResult(policy.name, [n.name for n in nodes], [n.tenant for n in nodes])
        self.result.probes = {p.name: [] for p in probes}
        self._check_every_pod_has_a_home()

    # --- pools -----------------------------------------------------------------------------------------

    def tenant_of(self, pod: PodSpec) -> str | None:
        return pod.tenant or self.fleet.namespace_tenants.get(pod.namespace)

    def pool(self, pod: PodSpec) -> list[NodeState]:
        """Nodes the pod's namespace may use, by the extender's tenant rule (scoring.tenant_mismatch)."""
        tenant = self.tenant_of(pod)
        key = (pod.namespace, tenant)
        nodes = self._pools.get(key)
        if nodes is None:
            nodes = self._pools[key] = [
                n
                for n in self.cluster.nodes.values()
                if tenant_mismatch(n.name, n.tenant, pod.namespace, tenant) is None
            ]
        return nodes

    def _check_every_pod_has_a_home(self) -> None:
        homeless = [
            p
            for p in self.trace.pods
            if not any(len(n.by_resource.get(p.resource, ())) >= p.count for n in self.pool(p))
        ]
        if homeless:
            shown = "; ".join(f"{p.name}: {self._why_homeless(p)}" for p in homeless[:3])
            more = f"; and {len(homeless) - 3} more" if len(homeless) > 3 else ""
            raise SimulationError(f"{len(homeless)} pod(s) of the trace can never run on this fleet: {shown}{more}")

    def _why_homeless(self, pod: PodSpec) -> str:
        """Why no node can ever hold ``pod``: a resource no node has (a typo), a namespace of no tenant, a pool
        without the resource, or a count above any node's."""
        nodes = self.cluster.nodes.values()
        fleet_resources = sorted({r for n in nodes for r in n.by_resource})
        if pod.resource not in fleet_resources:
            return f"resource {pod.resource} is on no node of this fleet (it has {', '.join(fleet_resources)})"
        tenant = self.tenant_of(pod)
        pool = self.pool(pod)
        if tenant is None and not pool:
            known = ", ".join(sorted(self.fleet.namespace_tenants)) or "none"
            return (
                f"namespace {pod.namespace!r} belongs to no tenant (the fleet's namespaces: {known}) and no node is "
                "shared"
            )
        owner = f"tenant {tenant}'s pool" if tenant else "the shared nodes"
        most = max((len(n.by_resource.get(pod.resource, ())) for n in pool), default=0)
        if most == 0:
            have = sorted({r for n in pool for r in n.by_resource})
            return f"no node of {owner} has {pod.resource} (it has {', '.join(have) or 'no nodes'})"
        return f"needs {pod.count}x {pod.resource}; a node of {owner} has at most {most}"

    # --- events ----------------------------------------------------------------------------------------

    def _push(self, when: float, kind: _Event, payload: object = None) -> None:
        heapq.heappush(self._events, (when, kind, next(self._order), payload))

    def run(self) -> RunResult:
        pods = self.trace.pods
        for pod in pods:
            self._push(pod.arrival, _Event.ARRIVAL, pod)
        last_arrival = pods[-1].arrival
        horizon = last_arrival + self.settings.drain_seconds
        self._push(0.0, _Event.SCRAPE)
        arrivals_left = len(pods)
        report_every = max(1, len(pods) // 50)
        while self._events:
            now, kind, _, payload = heapq.heappop(self._events)
            if now > horizon:
                break
            if kind is _Event.END:
                if payload.number not in self.cluster.running or payload.end != now:
                    continue  # the pod's end moved (interference) and another event stands for it
                self.cluster.finish(payload)
                self._retime_sharers(now, payload.devices, payload)
                if payload.outcome is not None and payload.spec.duration > 0:
                    payload.outcome.slowdown = (now - payload.start) / payload.spec.duration
                self._retry_waiting(now)
            elif kind is _Event.SCRAPE:
                if self._retiming:
                    self._retime(now)
                self.cluster.scrape(now)
                self._recent.clear()  # the snapshot now shows every pod bound so far
                self._sample(now)
                self._retry_waiting(now)
                if arrivals_left or self._waiting or self.cluster.running:
                    self._push(now + self.settings.scrape_interval, _Event.SCRAPE)
            else:
                arrivals_left -= 1
                outcome = PodOutcome(payload.name, self.tenant_of(payload), payload.arrival)
                self.result.outcomes.append(outcome)
                if not self._place(payload, outcome, now):
                    self._waiting.append((payload, outcome))
                if self.progress and arrivals_left % report_every == 0:
                    self.progress(1.0 - arrivals_left / len(pods))
        return self.result

    # --- placing ---------------------------------------------------------------------------------------

    def _assumed(self, now: float) -> dict[str, dict[str, int]]:
        if not self.policy.inflight:
            return {}
        assumed: dict[str, dict[str, int]] = {}
        for pod in self._recent:
            if pod.end <= now or now - pod.start >= self.settings.inflight_max_seconds:
                continue  # deleted pods leave the extender's accounting; old ones expire
            per_resource = assumed.setdefault(pod.node, {})
            per_resource[pod.spec.resource] = per_resource.get(pod.spec.resource, 0) + pod.spec.count
        return assumed

    def _place(self, pod: PodSpec, outcome: PodOutcome, now: float) -> bool:
        pool = self.pool(pod)
        fitting = [n for n in pool if n.fits(pod)]
        if not fitting:
            return False
        view = SchedulerView(now, self.cluster.snapshot, self._assumed(now), self.extender_policy)
        decision = self.policy.choose(pod, fitting, view)
        if decision.node is None:
            outcome.held = True
            return False
        node = self.cluster.nodes[decision.node]
        devices = choose_devices(node, pod, now, self.settings.device_choice, self._device_rng)
        outcome.start, outcome.node = now, node.name
        outcome.resource, outcome.count = pod.resource, pod.count
        outcome.devices = tuple(d.device.key for d in devices)
        if runs_out_of_memory(pod, devices, now):
            outcome.oom = True  # the container fails at start-up; its replica is free again at once
            return True
        outcome.hot = is_hot_placement(pod, devices, pool, now)
        outcome.hot_on_cool_node = outcome.hot and self._sampled_cool_with_room(node, pod)
        running = self.cluster.bind(pod, node, devices, now)
        running.outcome = outcome
        if self._retiming:
            running.rated_at = now
            running.rate = self._rate(node, running, now)
            running.end = now + pod.duration / running.rate
            self._retime_sharers(now, devices, running)
        self._recent.append(running)
        self._push(running.end, _Event.END, running)
        return True

    def _sampled_cool_with_room(self, node: NodeState, pod: PodSpec) -> bool:
        """Whether the last sample showed ``pod.count`` devices with room on ``node`` below the thresholds.

        A hot placement onto such a node is the device choice's or the lag's doing, not the node choice's.
        """
        metrics = self.cluster.snapshot.nodes.get(node.name)
        if metrics is None:
            return True  # nothing sampled yet
        sampled = {d.key: d for d in metrics.devices.get(pod.resource, ())}
        cool = [
            d
            for d in node.free_devices(pod.resource)
            if d.device.key in sampled and below_thresholds(sampled[d.device.key], self.extender_policy)
        ]
        return len(cool) >= pod.count

    def _rate(self, node: NodeState, pod: Running, now: float) -> float:
        """Nominal seconds per second: ``1 / (1 + alpha x load of the node's other devices)``, times the slowest of
        its devices' time-slicing speeds."""
        rate = 1.0
        if self.settings.interference > 0:
            rate = 1.0 / (1.0 + self.settings.interference * node.others_load(now, pod.devices))
        if self._timeslicing:
            rate *= min(timeslice_speed(d, now, self.settings.timeslice_efficiency) for d in pod.devices)
        return rate

    def _retime(self, now: float, pods: Iterable[Running] | None = None) -> None:
        """Every running pod's (or ``pods``') speed follows its neighbours' load and its device's other replicas; a
        changed speed moves its end."""
        for pod in list(self.cluster.running.values()) if pods is None else pods:
            pod.done += (now - pod.rated_at) * pod.rate
            pod.rated_at = now
            rate = self._rate(self.cluster.nodes[pod.node], pod, now)
            if rate != pod.rate:
                pod.rate = rate
                end = now + max(0.0, pod.spec.duration - pod.done) / rate
                if end != pod.end:
                    pod.end = end
                    self._push(end, _Event.END, pod)

    def _retime_sharers(self, now: float, devices: Iterable[DeviceState], pod: Running) -> None:
        """A pod came to or left ``devices``: the replicas taking turns there change speed now, not at the scrape."""
        if self._timeslicing:
            self._retime(now, {id(p): p for d in devices for p in d.pods if p is not pod}.values())

    def _retry_waiting(self, now: float) -> None:
        if not self._waiting:
            return
        failed_shapes: set[tuple[Any, ...]] = set()
        still_waiting = []
        for pod, outcome in self._waiting:
            shape = (pod.namespace, pod.tenant, pod.resource, pod.count)
            if shape in failed_shapes or not self._place(pod, outcome, now):
                failed_shapes.add(shape)
                still_waiting.append((pod, outcome))
        self._waiting = still_waiting

    # --- recording -------------------------------------------------------------------------------------

    def _sample(self, now: float) -> None:
        result = self.result
        result.sample_times.append(now)
        result.node_load.append([n.load(now) for n in self.cluster.nodes.values()])
        result.device_load.extend(d.load(now) for n in self.cluster.nodes.values() for d in n.devices)
        for probe in self.probes:
            result.probes[probe.name].append(probe.sample(now, self.cluster))


def simulate(
    fleet: Fleet,
    trace: Trace,
    policy: PlacementPolicy,
    extender_policy: Policy,
    settings: ModelSettings = ModelSettings(),
    probes: tuple[Probe, ...] = (),
    progress: Callable[[float], None] | None = None,
) -> RunResult:
    return Simulation(fleet, trace, policy, extender_policy, settings, probes, progress).run()
