"""Static MIG layouts against a re-layout every T minutes, on a day whose demand changes shape (docs/simulator.md,
"MIG re-layout on a day trace").

Each MIG pool is modelled at the level of instances: a GPU holds instances (profile, start), a pod holds one free
instance of its profile from start to end (the first free one in node and GPU order, as the device plugin hands
out the first free device), and pods that find none wait in a first-in first-out queue per profile. ``static``
keeps the inventory's layout all day. ``relayout`` asks the collection's advisor (``mig_utils.advisor.advise``,
the code of the ``mig_layout_advice`` module) every ``every`` minutes for new layouts, with demand = the pods
waiting + the pods that arrived in the last ``every`` minutes (the recent rate: the free instances the next
interval will want), and applies the advice as ``playbooks/mig-rebalance.yml`` would: only free instances go.

Counted per run: running pods disturbed (a pod on an instance the advice destroys; the advisor keeps allocated
instances, so this must stay 0), instances destroyed per re-layout against the brute-force minimum for each GPU's
target while keeping the busy ones (``mig_utils.placement.minimum_destroyed_keeping``, the exhaustive reference
``make bench-mig`` checks the planner against), pending pod-minutes and
wait p95 per tenant. ``gpus_needed`` searches the smallest pool that serves the trace with no pod waiting longer than
a bound.

Run it: ``python -m gpufleet_lab.simulate.relayout`` (from the repository root; ``--help`` for the flags).
"""

from __future__ import annotations

import argparse
import bisect
import functools
import heapq
import json
import math
import random
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from gpufleet_lab.mig_utils.advisor import AdviceError, CurrentInstance, GpuNow, advise
from gpufleet_lab.mig_utils.exceptions import MigError
from gpufleet_lab.mig_utils.layout import product_or_default
from gpufleet_lab.mig_utils.names import mig_resource
from gpufleet_lab.mig_utils.placement import minimum_destroyed_keeping
from gpufleet_lab.mig_utils.planner import Catalog, validate_target
from gpufleet_lab.mig_utils.profile_tables import H100_80GB, ProductTable
from gpufleet_lab.simulate.errors import SimulationError
from gpufleet_lab.simulate.fleet import DEFAULT_INVENTORY, Fleet, FleetError, fleet_from_inventory
from gpufleet_lab.simulate.metrics import fewest_that_serves, percentile

H100 = Catalog.from_table(H100_80GB)
HOUR = 3600.0
MINUTE = 60.0
# Fixed before the first run (docs/simulator.md): re-layout every 10 minutes, a pod may wait at most 20.
DEFAULT_EVERY_MINUTES = 10.0
DEFAULT_WAIT_BOUND_MINUTES = 20.0
DRAIN_SECONDS = HOUR  # after the last arrival; a pod still waiting then counts as never placed

Layout = list[tuple[str, int]]  # one GPU: (profile, start) of each instance


class RelayoutError(SimulationError):
    """Bad input for the re-layout simulation; the message is meant for a person."""


# --- the day trace -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stream:
    """Pods of one profile for one tenant: the number running follows a day curve between ``trough`` (at
    ``peak_hour`` + 12 h) and ``peak`` (at ``peak_hour``), each pod running ``min_minutes``-``max_minutes``."""

    tenant: str
    name: str
    profile: str
    peak: float
    trough: float
    peak_hour: float
    min_minutes: float
    max_minutes: float

    def running_at(self, seconds: float) -> float:
        phase = 2 * math.pi * (seconds / HOUR - self.peak_hour) / 24.0
        return self.trough + (self.peak - self.trough) * (1 + math.cos(phase)) / 2

    @property
    def mean_seconds(self) -> float:
        return (self.min_minutes + self.max_minutes) / 2 * MINUTE


# The Hong Kong MIG pools' day (docs/simulator.md lists it with the reasons). Figures are pods running at once.
DAY_STREAMS: tuple[Stream, ...] = (
    Stream("imagegen", "sdxl", "3g.40gb", peak=36, trough=4, peak_hour=14, min_minutes=10, max_minutes=30),
    Stream("imagegen", "previews", "1g.10gb", peak=60, trough=8, peak_hour=2, min_minutes=5, max_minutes=20),
    Stream("imagegen", "upscale", "2g.20gb", peak=30, trough=30, peak_hour=14, min_minutes=10, max_minutes=30),
    Stream("finnlp", "batch", "1g.10gb", peak=150, trough=20, peak_hour=2, min_minutes=10, max_minutes=40),
    Stream("finnlp", "interactive", "1g.10gb", peak=40, trough=5, peak_hour=14, min_minutes=2, max_minutes=10),
)

# Any fleet's MIG pools get that day by the shape of their layout, scaled by their size: a pool laid out with
# several instance sizes gets the mixed pool's streams (imagegen's 48 GPUs: its largest, smallest and middle
# profile), a pool of one size the single-size pool's (finnlp's 32 GPUs). On Hong Kong's inventory that is
# DAY_STREAMS exactly.
MIXED_POOL = ("imagegen", 48, {"sdxl": "largest", "previews": "smallest", "upscale": "middle"})
SINGLE_SIZE_POOL = ("finnlp", 32, {"batch": "smallest", "interactive": "smallest"})


@dataclass(frozen=True)
class MigPool:
    """One tenant's MIG GPUs: their layouts, and the product whose profiles they are."""

    layouts: list[Layout]
    table: ProductTable

    @functools.cached_property
    def catalog(self) -> Catalog:
        return Catalog.from_table(self.table)


def pool_streams(pools: Mapping[str, MigPool]) -> tuple[Stream, ...]:
    """The day's streams for each pool, by its layout's shape (MIXED_POOL, SINGLE_SIZE_POOL) and size."""
    streams: list[Stream] = []
    for tenant, pool in sorted(pools.items()):
        sizes = {row.name: (row.slice_count, row.memory_mib) for row in pool.table.profiles}
        profiles = sorted({profile for layout in pool.layouts for profile, _ in layout}, key=lambda p: sizes[p])
        model, gpus, roles = MIXED_POOL if len({sizes[p] for p in profiles}) > 1 else SINGLE_SIZE_POOL
        chosen = {
            "largest": profiles[-1],
            "smallest": profiles[0],
            "middle": profiles[len(profiles) // 2] if len(profiles) > 2 else None,
        }
        factor = len(pool.layouts) / gpus
        for stream in DAY_STREAMS:
            profile = chosen[roles[stream.name]] if stream.tenant == model else None
            if profile is not None:
                streams.append(
                    replace(
                        stream, tenant=tenant, profile=profile, peak=stream.peak * factor, trough=stream.trough * factor
                    )
                )
    return tuple(streams)


@dataclass(frozen=True)
class Pod:
    number: int
    tenant: str
    stream: str
    profile: str
    arrival: float
    duration: float


def day_trace(
    streams: Sequence[Stream] = DAY_STREAMS, hours: float = 24.0, seed: int = 1, scale: float = 1.0
) -> list[Pod]:
    """Poisson arrivals whose rate is running/mean duration (thinning), sorted by arrival; same seed, same trace."""
    pods: list[tuple[float, str, str, str, float]] = []
    end = hours * HOUR
    for stream in streams:
        rng = random.Random(f"{seed}/{stream.tenant}/{stream.name}")
        top = max(stream.peak, stream.trough) * scale / stream.mean_seconds
        t = 0.0
        while top > 0:
            t += rng.expovariate(top)
            if t >= end:
                break
            if rng.random() * top <= stream.running_at(t) * scale / stream.mean_seconds:
                minutes = rng.uniform(stream.min_minutes, stream.max_minutes)
                pods.append((t, stream.tenant, stream.name, stream.profile, round(minutes * MINUTE)))
    pods.sort()
    return [Pod(i, tenant, name, profile, round(t, 1), d) for i, (t, tenant, name, profile, d) in enumerate(pods)]


# --- the pools -------------------------------------------------------------------------------------------------


def inventory_fleet(inventory: str | Path = DEFAULT_INVENTORY) -> Fleet:
    """The inventory as the placement simulator reads it (``fleet.fleet_from_inventory``, the one inventory reader:
    hosts, tenant pools, each host's ``gpufleet_gpu_product`` and layout, the pools' sharing)."""
    try:
        return fleet_from_inventory(inventory)
    except FleetError as exc:
        raise RelayoutError(str(exc)) from None


def inventory_pools(inventory: str | Path = DEFAULT_INVENTORY) -> dict[str, list[Layout]]:
    """Tenant -> per-GPU layouts of the inventory's MIG pools (``pools_from_fleet``)."""
    return pools_from_fleet(inventory_fleet(inventory))


def pools_from_fleet(fleet: Fleet) -> dict[str, list[Layout]]:
    """Tenant -> per-GPU layouts of the fleet's MIG pools (``mig_pools``)."""
    return {tenant: pool.layouts for tenant, pool in mig_pools(fleet).items()}


def mig_pools(fleet: Fleet) -> dict[str, MigPool]:
    """Tenant -> its MIG pool: the per-GPU layouts (exact placements, as nvidia_mig places them on an empty GPU) of
    every tenant node whose GPUs are all MIG-enabled, in the node's own product's profiles. A pool whose nodes are
    of two products is refused: one pool, one catalog."""
    pools: dict[str, MigPool] = {}
    for node in fleet.nodes:
        mig_gpus = [gpu for gpu in node.gpus if gpu is not None]
        if not node.tenant or not node.gpus or len(mig_gpus) != len(node.gpus):
            continue  # shared nodes, whole GPUs: not a MIG pool
        try:
            table = product_or_default(node.product)
        except MigError as exc:
            raise RelayoutError(f"{node.name}: gpufleet_gpu_product: {exc.message}") from None
        pool = pools.setdefault(node.tenant, MigPool([], table))
        if pool.table.product != table.product:
            raise RelayoutError(
                f"{node.name}: gpufleet_gpu_product {table.product}: pool {node.tenant} has "
                f"{pool.table.product} nodes too; the re-layout model takes one product per pool"
            )
        catalog = pool.catalog
        try:
            pool.layouts.extend(
                [(slot.profile, slot.start) for slot in validate_target(dict(gpu), catalog, node.name)]
                for gpu in mig_gpus
            )
        except MigError as exc:
            raise RelayoutError(f"{node.name}: mig_partition_config: {exc.message}") from None
    if not pools:
        raise RelayoutError("the inventory has no MIG pool (no tenant node with every GPU MIG-enabled)")
    return pools


def time_sliced(fleet: Fleet, pools: Mapping[str, Sequence[Layout]]) -> dict[str, dict[str, int]]:
    """Tenant -> {profile: replicas} of the pools' MIG profiles the fleet time-slices (the pool's ``sharing``). The
    model holds one pod per instance, so these pools are simulated as if exclusive; the run says so."""
    shared: dict[str, dict[str, int]] = {}
    for tenant, layouts in sorted(pools.items()):
        for profile in sorted({profile for layout in layouts for profile, _ in layout}):
            replicas = fleet.replicas_for(tenant, mig_resource(profile))
            if replicas > 1:
                shared.setdefault(tenant, {})[profile] = replicas
    return shared


def scaled_down(layouts: Sequence[Layout], scale: float) -> list[Layout]:
    """``scale`` of the pool's GPUs (at least one), spread evenly over it so that they keep its mix of layouts."""
    count = max(1, round(len(layouts) * scale))
    return [list(layouts[i * len(layouts) // count]) for i in range(count)]


def scaled_pool(layouts: Sequence[Layout], gpus: int) -> list[Layout]:
    """``gpus`` GPUs laid out like the inventory's pool, GPU k as its GPU k modulo the pool's size."""
    return [list(layouts[k % len(layouts)]) for k in range(gpus)]


# --- the brute-force reference ---------------------------------------------------------------------------------


MinimumDestroyed = Callable[[Layout, dict[str, int], set[tuple[str, int]], Catalog], "int | None"]


# --- the model -------------------------------------------------------------------------------------------------


@dataclass
class _Instance:
    profile: str
    start: int
    pod: Pod | None = None


@dataclass
class RelayoutRecord:
    at: float
    demand: dict[str, int]
    destroyed: int
    minimum: int | None  # brute-force minimum summed over the changed GPUs (None: reference not available)
    created: int
    gpus_changed: int
    disturbed: int
    exact: bool


@dataclass
class PoolRun:
    tenant: str
    mode: str  # static | relayout
    gpus: int
    waits: list[float] = field(default_factory=list)  # seconds, every pod (never placed: until the horizon)
    never: int = 0
    disturbed: int = 0
    relayouts: list[RelayoutRecord] = field(default_factory=list)
    advisor_calls: int = 0
    advisor_seconds: float = 0.0

    @property
    def pods(self) -> int:
        return len(self.waits)

    @property
    def pending_pod_minutes(self) -> float:
        return sum(self.waits) / MINUTE

    def wait_p95(self) -> float:
        return percentile(self.waits, 0.95) or 0.0

    @property
    def max_wait(self) -> float:
        return max(self.waits, default=0.0)

    @property
    def destroyed(self) -> int:
        return sum(r.destroyed for r in self.relayouts)

    @property
    def created(self) -> int:
        return sum(r.created for r in self.relayouts)

    @property
    def above_minimum(self) -> int | None:
        """Instances destroyed beyond the brute-force minimum, over every re-layout (None: not checked)."""
        if any(r.minimum is None for r in self.relayouts):
            return None
        return sum(r.destroyed - (r.minimum or 0) for r in self.relayouts)

    def summary(self) -> dict[str, Any]:
        return {
            "tenant": self.tenant,
            "mode": self.mode,
            "gpus": self.gpus,
            "pods": self.pods,
            "never_placed": self.never,
            "pending_pod_minutes": round(self.pending_pod_minutes, 1),
            "wait_p95_s": round(self.wait_p95(), 1),
            "max_wait_s": round(self.max_wait, 1),
            "disturbed": self.disturbed,
            "relayouts": len(self.relayouts),
            "destroyed": self.destroyed,
            "destroyed_above_minimum": self.above_minimum,
            "created": self.created,
            "advisor_calls": self.advisor_calls,
            "advisor_seconds": round(self.advisor_seconds, 2),
        }


class PoolModel:
    """One tenant's MIG pool over the trace (``every`` None: the layout stays static)."""

    def __init__(
        self,
        tenant: str,
        layouts: Sequence[Layout],
        pods: Sequence[Pod],
        every: float | None = None,
        minimum_destroyed: MinimumDestroyed | None = None,
        allowed: Sequence[str] | None = None,
        max_states: int = 200,
        catalog: Catalog = H100,
    ):
        self.tenant = tenant
        self.catalog = catalog
        self.gpus = [[_Instance(p, s) for p, s in sorted(layout, key=lambda i: i[1])] for layout in layouts]
        self.pods = [p for p in pods if p.tenant == tenant]
        self.every = every
        self.minimum_destroyed = minimum_destroyed
        # New instances only of the profiles the pool's inventory layout has (the rebalance's allowed profiles).
        self.allowed = sorted(allowed or {i.profile for gpu in self.gpus for i in gpu})
        self.max_states = max_states
        self.waiting: dict[str, list[Pod]] = {}
        self.start: dict[int, float] = {}
        self.run = PoolRun(tenant, "static" if every is None else "relayout", len(self.gpus))

    def simulate(self) -> PoolRun:
        if not self.pods:
            return self.run
        horizon = self.pods[-1].arrival + DRAIN_SECONDS
        ends: list[tuple[float, int, int, int]] = []  # (end, pod number, gpu, slot index) of running pods
        arrivals = sorted(self.pods, key=lambda p: (p.arrival, p.number))
        next_arrival = 0
        tick = self.every * MINUTE if self.every else math.inf
        next_tick = tick
        now = 0.0
        while next_arrival < len(arrivals) or ends or any(self.waiting.values()):
            now = min(
                ends[0][0] if ends else math.inf,
                next_tick,
                arrivals[next_arrival].arrival if next_arrival < len(arrivals) else math.inf,
            )
            if now > horizon or now == math.inf:
                break
            # At one moment: ends (instances free up), then the re-layout, then arrivals.
            freed = set()
            while ends and ends[0][0] == now:
                _, _, g, i = heapq.heappop(ends)
                instance = self.gpus[g][i]
                instance.pod = None
                freed.add(instance.profile)
            for profile in freed:
                self._serve(profile, now, ends)
            if now == next_tick:
                self._relayout(now, ends)
                next_tick += tick
            while next_arrival < len(arrivals) and arrivals[next_arrival].arrival == now:
                pod = arrivals[next_arrival]
                next_arrival += 1
                self.waiting.setdefault(pod.profile, []).append(pod)
                self._serve(pod.profile, now, ends)
        still = [p for queue in self.waiting.values() for p in queue]
        self.run.never = len(still)
        waits = {p.number: self.start[p.number] - p.arrival for p in self.pods if p.number in self.start}
        waits.update({p.number: horizon - p.arrival for p in still})
        self.run.waits = [waits[p.number] for p in self.pods]
        return self.run

    def _serve(self, profile: str, now: float, ends: list[tuple[float, int, int, int]]) -> None:
        """The oldest waiting pods of ``profile`` take its free instances, first free in GPU and start order."""
        queue = self.waiting.get(profile)
        if not queue:
            return
        for g, gpu in enumerate(self.gpus):
            for i, instance in enumerate(gpu):
                if instance.profile == profile and instance.pod is None:
                    pod = queue.pop(0)
                    instance.pod = pod
                    self.start[pod.number] = now
                    heapq.heappush(ends, (now + pod.duration, pod.number, g, i))
                    if not queue:
                        return

    def _demand(self, now: float) -> dict[str, int]:
        """Pods waiting + pods that arrived in the last interval (the rate the next interval will likely see)."""
        demand = {p: len(q) for p, q in self.waiting.items() if q}
        window = now - (self.every or 0) * MINUTE
        arrivals = [p.arrival for p in self.pods]
        for pod in self.pods[bisect.bisect_right(arrivals, window) : bisect.bisect_right(arrivals, now)]:
            demand[pod.profile] = demand.get(pod.profile, 0) + 1
        return {p: n for p, n in sorted(demand.items()) if p in self.allowed}

    def _relayout(self, now: float, ends: list[tuple[float, int, int, int]]) -> None:
        demand = self._demand(now)
        free: dict[str, int] = {}
        for gpu in self.gpus:
            for instance in gpu:
                if instance.pod is None:
                    free[instance.profile] = free.get(instance.profile, 0) + 1
        # The free instances already serve all of it: the advisor would change nothing, so do not ask it.
        if all(free.get(p, 0) >= n for p, n in demand.items()):
            return
        now_gpus = [
            GpuNow(
                f"{self.tenant}-{g // 8:02d}",
                g % 8,
                self.catalog,
                True,
                [CurrentInstance(i.profile, i.start, allocated=i.pod is not None) for i in gpu],
            )
            for g, gpu in enumerate(self.gpus)
        ]
        started = time.perf_counter()
        try:
            advice = advise(now_gpus, demand, allowed=self.allowed, max_states=self.max_states)
        except AdviceError as exc:
            raise RelayoutError(f"{self.tenant} at {now / HOUR:.2f} h: the advisor refused: {exc.message}") from None
        self.run.advisor_seconds += time.perf_counter() - started
        self.run.advisor_calls += 1
        if not any(g.changed for g in advice.gpus):
            return
        record = RelayoutRecord(now, demand, 0, 0 if self.minimum_destroyed else None, 0, 0, 0, advice.exact)
        for g, gpu_advice in enumerate(advice.gpus):
            if not gpu_advice.changed:
                continue
            gpu = self.gpus[g]
            gone = {(d.profile, d.start) for d in gpu_advice.destroy}
            # A pod on a destroyed instance would be killed: counted, and the pod is lost with it.
            for instance in gpu:
                if (instance.profile, instance.start) in gone and instance.pod is not None:
                    record.disturbed += 1
            if self.minimum_destroyed is not None and record.minimum is not None:
                busy = {(i.profile, i.start) for i in gpu if i.pod is not None}
                least = self.minimum_destroyed(
                    [(i.profile, i.start) for i in gpu], gpu_advice.counts(), busy, self.catalog
                )
                # None: no placement keeps the busy instances, yet the advice did: the reference disagrees.
                record.minimum += least if least is not None else -1
            kept = {(i.profile, i.start): i for i in gpu if (i.profile, i.start) not in gone}
            self.gpus[g] = [kept.get((s.profile, s.start)) or _Instance(s.profile, s.start) for s in gpu_advice.after]
            record.destroyed += len(gpu_advice.destroy)
            record.created += len(gpu_advice.create)
            record.gpus_changed += 1
        self.run.disturbed += record.disturbed
        self.run.relayouts.append(record)
        # Slot indices of running pods moved with the new layouts: rebuild the end queue from the instances.
        ends.clear()
        for g, gpu in enumerate(self.gpus):
            for i, instance in enumerate(gpu):
                if instance.pod is not None:
                    ends.append((self.start[instance.pod.number] + instance.pod.duration, instance.pod.number, g, i))
        heapq.heapify(ends)
        for profile in demand:
            self._serve(profile, now, ends)


def run_pool(
    tenant: str,
    layouts: Sequence[Layout],
    pods: Sequence[Pod],
    every: float | None,
    minimum_destroyed: MinimumDestroyed | None = None,
    allowed: Sequence[str] | None = None,
    catalog: Catalog = H100,
) -> PoolRun:
    return PoolModel(tenant, layouts, pods, every, minimum_destroyed, allowed, catalog=catalog).simulate()


def gpus_needed(
    tenant: str,
    layouts: Sequence[Layout],
    pods: Sequence[Pod],
    every: float | None,
    bound_seconds: float,
    limit: int,
    minimum_destroyed: MinimumDestroyed | None = None,
    allowed: Sequence[str] | None = None,
    catalog: Catalog = H100,
) -> tuple[int | None, list[PoolRun]]:
    """The fewest GPUs (laid out like the inventory's pool) with which no pod waits longer than the bound, by
    bisection over 1..``limit`` (assumes more GPUs never make the longest wait longer); None: not even ``limit``.
    Also every run made, so that the disturbed count covers them."""
    runs: list[PoolRun] = []

    def serves(gpus: int) -> bool:
        run = run_pool(tenant, scaled_pool(layouts, gpus), pods, every, minimum_destroyed, allowed, catalog)
        runs.append(run)
        return run.never == 0 and run.max_wait <= bound_seconds

    return fewest_that_serves(limit, serves), runs


# --- the comparison and its goals -------------------------------------------------------------------------------

PENDING_RATIO = 0.5
GPUS_RATIO = 0.75


@dataclass
class Comparison:
    parameters: dict[str, Any]
    runs: dict[str, dict[str, PoolRun]]  # mode -> tenant -> run on the inventory's pool
    needed: dict[str, dict[str, int | None]] = field(default_factory=dict)  # mode -> tenant -> GPUs
    search_disturbed: int = 0
    search_above_minimum: int | None = 0
    seconds: float = 0.0
    pods: int = 0

    def total(self, mode: str, what: Callable[[PoolRun], float]) -> float:
        return sum(what(run) for run in self.runs[mode].values())

    def goals(self) -> list[dict[str, Any]]:
        """The re-layout's goals, in the simulator's goal shape (verdict.goal_lines words them)."""
        relayout = self.runs["relayout"].values()
        disturbed = sum(r.disturbed for r in relayout) + self.search_disturbed
        above = [r.above_minimum for r in relayout] + [self.search_above_minimum]
        destroyed = sum(r.destroyed for r in relayout)
        changes = sum(len(r.relayouts) for r in relayout)
        static_pm = self.total("static", lambda r: r.pending_pod_minutes)
        relayout_pm = self.total("relayout", lambda r: r.pending_pod_minutes)
        goals: list[dict[str, Any]] = [
            {
                "key": "relayout-disturbed",
                "goal": "re-layout disturbs no running pod",
                "passed": disturbed == 0,
                "detail": f"{disturbed} disturbed over {changes} re-layouts"
                + (" and the fleet-size search" if self.needed else ""),
            },
            {
                "key": "relayout-minimum",
                "goal": "each re-layout destroys the brute-force minimum for its target",
                "passed": None if None in above else sum(a or 0 for a in above) == 0,
                "detail": "brute-force reference not available (run from the repository root)"
                if None in above
                else f"{destroyed} destroyed, {sum(a or 0 for a in above)} above the minimum",
            },
            {
                "key": "relayout-pending",
                "goal": f"re-layout's pending pod-minutes <= {PENDING_RATIO} x static's",
                "passed": relayout_pm <= PENDING_RATIO * static_pm,
                "detail": f"{relayout_pm:,.0f} vs {static_pm:,.0f} ({_ratio(relayout_pm, static_pm)})",
            },
        ]
        if self.needed:
            static_n, relayout_n = self.needed["static"], self.needed["relayout"]
            limit = self.parameters["search_limit_gpus"]
            r = sum(n or 0 for n in relayout_n.values())
            s = sum(n or 0 for n in static_n.values())
            per_pool = ", ".join(f"{t} {_gpus(relayout_n[t], limit)} vs {_gpus(static_n[t], limit)}" for t in static_n)
            if None in relayout_n.values():
                passed, detail = False, f"re-layout cannot serve a pool within the search's limit ({per_pool})"
            elif None in static_n.values():
                # Static needs more than the limit somewhere: re-layout's total is below the ratio if it is below
                # the ratio of the smallest total static could have.
                s_low = sum(n if n is not None else limit + 1 for n in static_n.values())
                passed = r <= GPUS_RATIO * s_low
                detail = f"{r} vs more than {s_low - 1} GPUs ({per_pool})"
            else:
                passed = r <= GPUS_RATIO * s
                detail = f"{r} vs {s} GPUs ({_ratio(r, s)}; {per_pool})"
            goals.append(
                {
                    "key": "relayout-gpus",
                    "goal": f"re-layout needs <= {GPUS_RATIO} x static's GPUs for no wait above "
                    f"{self.parameters['wait_bound_minutes']:g} min",
                    "passed": passed,
                    "detail": detail,
                }
            )
        return goals

    def document(self) -> dict[str, Any]:
        return {
            "kind": "mig-relayout",
            "trace": {"pods": self.pods},
            "parameters": self.parameters,
            "pools": {mode: {t: r.summary() for t, r in runs.items()} for mode, runs in self.runs.items()},
            "relayouts": {t: [asdict(r) for r in run.relayouts] for t, run in self.runs["relayout"].items()},
            "gpus_needed": self.needed,
            "goals": self.goals(),
            "seconds": round(self.seconds, 1),
        }


def _gpus(needed: int | None, limit: int) -> str:
    return str(needed) if needed is not None else f"> {limit}"


def _ratio(a: float, b: float) -> str:
    return f"x{a / b:.2f}" if b else "n/a"


def compare(
    pools: Mapping[str, Sequence[Layout]],
    pods: Sequence[Pod],
    every: float = DEFAULT_EVERY_MINUTES,
    bound_minutes: float = DEFAULT_WAIT_BOUND_MINUTES,
    search: bool = True,
    search_limit: int | None = None,
    parameters: Mapping[str, Any] | None = None,
    progress: Callable[[str], None] | None = None,
    allowed: Mapping[str, Sequence[str]] | None = None,
    minimum_destroyed: MinimumDestroyed | None = minimum_destroyed_keeping,
    catalogs: Mapping[str, Catalog] | None = None,
) -> Comparison:
    """Static against re-layout on each pool; ``allowed``: tenant -> profiles a re-layout may create (default: those
    of the pool's layout); ``minimum_destroyed``: the reference each re-layout's destroys are checked against (None:
    not checked); ``catalogs``: tenant -> its GPUs' MIG catalog (default: H100 80GB's)."""
    catalogs = catalogs or {}
    started = time.perf_counter()
    tenants = sorted({p.tenant for p in pods} & set(pools))
    limit = search_limit or 4 * max(len(pools[t]) for t in tenants)
    params = {
        **(parameters or {}),
        "every_minutes": every,
        "wait_bound_minutes": bound_minutes,
        "search_limit_gpus": limit,
        "pool_gpus": {t: len(pools[t]) for t in tenants},
    }
    result = Comparison(params, {"static": {}, "relayout": {}}, pods=sum(1 for p in pods if p.tenant in tenants))
    for tenant in tenants:
        for mode, interval in (("static", None), ("relayout", every)):
            if progress:
                progress(f"{tenant}: {mode} on the inventory's {len(pools[tenant])} GPUs")
            result.runs[mode][tenant] = run_pool(
                tenant,
                pools[tenant],
                pods,
                interval,
                minimum_destroyed,
                (allowed or {}).get(tenant),
                catalogs.get(tenant, H100),
            )
    if search:
        result.needed = {"static": {}, "relayout": {}}
        for tenant in tenants:
            for mode, interval in (("static", None), ("relayout", every)):
                if progress:
                    progress(f"{tenant}: GPUs needed, {mode}")
                needed, runs = gpus_needed(
                    tenant,
                    pools[tenant],
                    pods,
                    interval,
                    bound_minutes * MINUTE,
                    limit,
                    minimum_destroyed,
                    (allowed or {}).get(tenant),
                    catalogs.get(tenant, H100),
                )
                result.needed[mode][tenant] = needed
                result.search_disturbed += sum(r.disturbed for r in runs)
                above = [r.above_minimum for r in runs]
                result.search_above_minimum = (
                    None
                    if None in above or result.search_above_minimum is None
                    else result.search_above_minimum + sum(a or 0 for a in above)
                )
    result.seconds = time.perf_counter() - started
    return result


def format_report(comparison: Comparison) -> list[str]:
    p = comparison.parameters
    lines = [
        f"Day trace: {p.get('hours', 24):g} h, seed {p.get('seed', 1)}, scale {p.get('scale', 1):g}; re-layout every "
        f"{p['every_minutes']:g} min; wait bound {p['wait_bound_minutes']:g} min",
        f"{'tenant':10} {'mode':9} {'GPUs':>4} {'pods':>6} {'never':>5} {'pending pod-min':>15} {'wait p95':>9} "
        f"{'max wait':>9} {'disturbed':>9} {'re-layouts':>10} {'destroyed (min)':>15} {'created':>7}",
    ]
    shared = p.get("time_sliced_as_exclusive") or {}
    if shared:
        pools = "; ".join(
            f"{tenant} " + ", ".join(f"{profile} x{replicas}" for profile, replicas in profiles.items())
            for tenant, profiles in shared.items()
        )
        # The model holds one pod per instance: say which pools that understates, before the figures.
        lines.insert(1, f"Time-sliced in the inventory, simulated with one pod per instance: {pools}")
    for mode, runs in comparison.runs.items():
        for tenant, run in runs.items():
            above = run.above_minimum
            minimum = "-" if above is None else str(run.destroyed - above)
            lines.append(
                f"{tenant:10} {mode:9} {run.gpus:4} {run.pods:6} {run.never:5} {run.pending_pod_minutes:15,.0f} "
                f"{run.wait_p95():8.0f}s {run.max_wait:8.0f}s {run.disturbed:9} {len(run.relayouts):10} "
                f"{f'{run.destroyed} ({minimum})':>15} {run.created:7}"
            )
    if comparison.needed:
        lines.append(f"GPUs needed so that no pod waits longer than {p['wait_bound_minutes']:g} min:")
        for mode, per_tenant in comparison.needed.items():
            shown = ", ".join(
                f"{t} {n if n is not None else '> ' + str(p['search_limit_gpus'])}" for t, n in per_tenant.items()
            )
            lines.append(f"  {mode:9} {shown}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gpufleet_lab.simulate.relayout",
        description="static MIG layouts against a re-layout every T minutes on the day trace (docs/simulator.md)",
    )
    parser.add_argument("--inventory", default=str(DEFAULT_INVENTORY))
    parser.add_argument("--every", type=float, default=DEFAULT_EVERY_MINUTES, help="re-layout every T minutes")
    parser.add_argument("--wait-bound", type=float, default=DEFAULT_WAIT_BOUND_MINUTES, help="minutes, for the search")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--scale", type=float, default=1.0, help="pods and pool sizes x this (the lab's is 0.25)")
    parser.add_argument("--no-search", action="store_true", help="skip the GPUs-needed search")
    parser.add_argument("--output", type=Path, default=Path("build/sim-relayout"))
    parser.add_argument("--check", action="store_true", help="exit 1 when a goal is not met")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    if not (args.every > 0 and args.wait_bound > 0 and args.hours > 0 and 0 < args.scale <= 1):
        print("relayout: --every, --wait-bound and --hours must be above 0, --scale in (0, 1]", file=sys.stderr)
        return 2
    try:
        fleet = inventory_fleet(args.inventory)
        found = mig_pools(fleet)
        streams = pool_streams(found)
        pools = {t: scaled_down(pool.layouts, args.scale) for t, pool in found.items()}
        shared = time_sliced(fleet, pools)
        pods = day_trace(streams, hours=args.hours, seed=args.seed, scale=args.scale)
        comparison = compare(
            pools,
            pods,
            args.every,
            args.wait_bound,
            search=not args.no_search,
            catalogs={t: pool.catalog for t, pool in found.items()},
            # What the pool's layout has, all of it: a scaled-down pool may hold only some of its profiles.
            allowed={
                t: sorted({profile for layout in pool.layouts for profile, _ in layout}) for t, pool in found.items()
            },
            parameters={
                "hours": args.hours,
                "seed": args.seed,
                "scale": args.scale,
                "inventory": args.inventory,
                "streams": [asdict(s) for s in streams],
                "time_sliced_as_exclusive": shared,
            },
            progress=None if args.quiet else lambda text: print(f"relayout: {text}", file=sys.stderr),
        )
    except RelayoutError as exc:
        print(f"relayout: {exc}", file=sys.stderr)
        return 2
    from gpufleet_lab.simulate.verdict import goal_lines

    document = comparison.document()
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "results.json").write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    for line in format_report(comparison) + ["Goals:"] + [f"  {g}" for g in goal_lines(document)]:
        print(line)
    print(f"({comparison.seconds:.1f} s; results in {args.output / 'results.json'})")
    return 1 if args.check and any(g["passed"] is False for g in document["goals"]) else 0


if __name__ == "__main__":
    sys.exit(main())
