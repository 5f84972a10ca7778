"""DynamicMIG under DRA on the day trace, three ways (docs/dra.md): DynamicMIG placed as the stock kube-scheduler
does (first fit on the node its default scoring prefers), DynamicMIG with GPUScore's claim scoring
(GPUClaimScore), and the device plugin path with the advisor's periodic re-layout (relayout.py's model); the
device plugin with the inventory's static layout beside them, as the baseline of docs/dra.md's fleet-size table.

The DynamicMIG pools have no layout: a pod's claim takes the device the allocator's first fit gives on the node
chosen (``mig_utils.dra_placement``, the rules GPUClaimScore follows), and frees it when the pod ends; pods that
find no node wait, and are retried in arrival order whenever a device is freed, as the scheduler retries
unschedulable pods. The stock scheduler's choice among feasible nodes is its default scoring's for equal pods:
the node with the fewest running pods (LeastAllocated), then the lowest name. GPUClaimScore's: the highest
``evaluate_node`` score, then the same. The model has no GPU load: every node's load is the same, and
``scoring.claim_score`` takes the same points off every node for an equal load, so its order is the placement
score's.

Counted per run: pending pod-minutes, wait p95, fragmentation failures (a pod that found no node on arrival while
the pool's free memory slices would hold it) and, by bisection, the GPUs each way needs so that no pod waits
longer than the bound.

Run it: ``python -m gpufleet_lab.simulate.dra`` (from the repository root; ``--help`` for the flags);
``--pools imagegen`` is docs/dra.md's fleet-size table.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufleet_lab.mig_utils import dra_placement
from gpufleet_lab.simulate.metrics import fewest_that_serves, percentile
from gpufleet_lab.simulate.relayout import (
    DEFAULT_EVERY_MINUTES,
    DEFAULT_WAIT_BOUND_MINUTES,
    DRAIN_SECONDS,
    MINUTE,
    Layout,
    Pod,
    RelayoutError,
    day_trace,
    gpus_needed,
    inventory_pools,
    run_pool,
)

GPUS_PER_NODE = 8
POLICIES = ("first-fit", "gpuscore")
MODES = ("static", *POLICIES, "relayout")


@dataclass
class DraRun:
    tenant: str
    mode: str
    gpus: int
    waits: list[float] = field(default_factory=list)  # seconds, every pod (never placed: until the horizon)
    never: int = 0
    fragmentation: int = 0

    @property
    def pending_pod_minutes(self) -> float:
        return sum(self.waits) / MINUTE

    @property
    def max_wait(self) -> float:
        return max(self.waits, default=0.0)

    def summary(self) -> dict[str, Any]:
        return {
            "tenant": self.tenant,
            "mode": self.mode,
            "gpus": self.gpus,
            "pods": len(self.waits),
            "never_placed": self.never,
            "pending_pod_minutes": round(self.pending_pod_minutes, 1),
            "wait_p95_s": round(percentile(self.waits, 0.95) or 0.0, 1),
            "fragmentation_failures": self.fragmentation,
        }


class DraPool:
    """One tenant's DynamicMIG pool of ``gpus`` GPUs (nodes of ``per_node``, the last one may hold fewer) over
    the trace."""

    def __init__(self, tenant: str, gpus: int, pods: Sequence[Pod], policy: str, per_node: int = GPUS_PER_NODE):
        if policy not in POLICIES:
            raise RelayoutError(f"DynamicMIG policy must be one of {', '.join(POLICIES)}, not {policy!r}")
        self.tenant, self.policy = tenant, policy
        sizes = [per_node] * (gpus // per_node) + ([gpus % per_node] if gpus % per_node else [])
        self.nodes: list[list[set[int]]] = [[set() for _ in range(n)] for n in sizes]
        self.running = [0] * len(self.nodes)
        self.pods = [p for p in pods if p.tenant == tenant]
        self.kinds = {p.profile: dra_placement.kind(p.profile) for p in self.pods}
        self.run = DraRun(tenant, policy, gpus)

    def _place(self, pod: Pod) -> tuple[int, int, int] | None:
        """(node, GPU, start) the scheduler and the allocator give the pod, or None."""
        want = self.kinds[pod.profile]
        best: tuple[tuple[int, int, int], tuple[int, int, int]] | None = None
        for n, gpus in enumerate(self.nodes):
            verdict = dra_placement.evaluate_node(gpus, want)
            if verdict is None:
                continue
            score = verdict.score if self.policy == "gpuscore" else 0
            key = (score, -self.running[n], -n)
            if best is None or key > best[0]:
                best = (key, (n, verdict.gpu, verdict.start))
        return None if best is None else best[1]

    def simulate(self) -> DraRun:
        if not self.pods:
            return self.run
        horizon = self.pods[-1].arrival + DRAIN_SECONDS
        ends: list[tuple[float, int, int, int, int, int]] = []  # (end, pod, node, gpu, start, size)
        waiting: list[Pod] = []
        start: dict[int, float] = {}
        arrivals = sorted(self.pods, key=lambda p: (p.arrival, p.number))
        index = 0

        def try_start(pod: Pod, now: float) -> bool:
            where = self._place(pod)
            if where is None:
                return False
            n, g, s = where
            size = self.kinds[pod.profile].size
            self.nodes[n][g] |= set(range(s, s + size))
            self.running[n] += 1
            start[pod.number] = now
            heapq.heappush(ends, (now + pod.duration, pod.number, n, g, s, size))
            return True

        while index < len(arrivals) or ends:
            now = min(ends[0][0] if ends else math.inf, arrivals[index].arrival if index < len(arrivals) else math.inf)
            if now > horizon:
                break
            freed = False
            while ends and ends[0][0] == now:
                _, _, n, g, s, size = heapq.heappop(ends)
                self.nodes[n][g] -= set(range(s, s + size))
                self.running[n] -= 1
                freed = True
            if freed and waiting:
                waiting = [pod for pod in waiting if not try_start(pod, now)]
            while index < len(arrivals) and arrivals[index].arrival == now:
                pod = arrivals[index]
                index += 1
                if not try_start(pod, now):
                    free = dra_placement.free_slices(gpu for node in self.nodes for gpu in node)
                    if free >= self.kinds[pod.profile].size:
                        self.run.fragmentation += 1
                    waiting.append(pod)
        self.run.never = len(waiting)
        waits = {p.number: start[p.number] - p.arrival for p in self.pods if p.number in start}
        waits.update({p.number: horizon - p.arrival for p in waiting})
        self.run.waits = [waits[p.number] for p in self.pods]
        return self.run


def dra_gpus_needed(tenant: str, pods: Sequence[Pod], policy: str, bound_seconds: float, limit: int) -> int | None:
    """The fewest GPUs with which no pod waits longer than the bound (bisection over 1..limit); None: not even
    ``limit``."""

    def serves(gpus: int) -> bool:
        run = DraPool(tenant, gpus, pods, policy).simulate()
        return run.never == 0 and run.max_wait <= bound_seconds

    return fewest_that_serves(limit, serves)


def compare(
    pools: Mapping[str, Sequence[Layout]],
    pods: Sequence[Pod],
    every: float = DEFAULT_EVERY_MINUTES,
    bound_minutes: float = DEFAULT_WAIT_BOUND_MINUTES,
    search: bool = True,
) -> dict[str, Any]:
    """The three ways on each MIG pool of the inventory (same GPUs, same trace)."""
    runs: dict[str, dict[str, dict[str, Any]]] = {mode: {} for mode in MODES}
    needed: dict[str, dict[str, int | None]] = {mode: {} for mode in MODES}
    bound = bound_minutes * MINUTE
    for tenant, layouts in pools.items():
        gpus = len(layouts)
        for policy in POLICIES:
            runs[policy][tenant] = DraPool(tenant, gpus, pods, policy).simulate().summary()
        for mode, interval in (("static", None), ("relayout", every)):
            runs[mode][tenant] = {
                **run_pool(tenant, layouts, pods, interval).summary(),
                "fragmentation_failures": None,  # fixed instances: a pod waits for its profile, not for placements
            }
        if search:
            limit = 4 * gpus
            for policy in POLICIES:
                needed[policy][tenant] = dra_gpus_needed(tenant, pods, policy, bound, limit)
            for mode, interval in (("static", None), ("relayout", every)):
                needed[mode][tenant], _ = gpus_needed(tenant, layouts, pods, interval, bound, limit)
    return {
        "kind": "dra-dynamic-mig",
        "parameters": {"every_minutes": every, "wait_bound_minutes": bound_minutes, "pods": len(pods)},
        "pools": runs,
        "gpus_needed": needed if search else {},
    }


def table(result: Mapping[str, Any]) -> str:
    """The three-way table, one line per pool and way."""
    lines = [
        f"{'pool':<10} {'way':<28} {'GPUs':>5} {'pending pod-min':>16} {'wait p95 s':>11} {'frag. failures':>15}"
        f" {'GPUs needed':>12}"
    ]
    names = {
        "static": "device plugin, static layout",
        "first-fit": "DynamicMIG, first fit",
        "gpuscore": "DynamicMIG + GPUClaimScore",
        "relayout": "device plugin + re-layout",
    }
    for tenant in result["pools"]["relayout"]:
        for mode in MODES:
            run = result["pools"][mode][tenant]
            frag = run["fragmentation_failures"]
            need = result["gpus_needed"].get(mode, {}).get(tenant, "-") if result["gpus_needed"] else "-"
            shown_frag = "-" if frag is None else frag
            shown_need = "> limit" if need is None else need
            lines.append(
                f"{tenant:<10} {names[mode]:<28} {run['gpus']:>5} {run['pending_pod_minutes']:>16,.1f}"
                f" {run['wait_p95_s']:>11,.1f} {shown_frag:>15} {shown_need:>12}"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None, out: Callable[[str], None] = print) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpufleet_lab.simulate.dra", description=__doc__.split("\n")[0])
    parser.add_argument("--inventory", default="inventories/hongkong")
    parser.add_argument("--every", type=float, default=DEFAULT_EVERY_MINUTES, help="re-layout every T minutes")
    parser.add_argument("--wait-bound", type=float, default=DEFAULT_WAIT_BOUND_MINUTES, help="minutes, for the search")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--no-search", action="store_true", help="skip the GPUs-needed search")
    parser.add_argument(
        "--pools", default="", help="comma-separated MIG pools (tenants) to compare; default: every MIG pool"
    )
    parser.add_argument("--output", type=Path, default=None, help="also write the result as JSON here")
    args = parser.parse_args(argv)
    try:
        pools = inventory_pools(args.inventory)
        if args.pools:
            wanted = [name.strip() for name in args.pools.split(",") if name.strip()]
            unknown = [name for name in wanted if name not in pools]
            if unknown:
                raise RelayoutError(f"--pools: no MIG pool {', '.join(unknown)} (the inventory's: {', '.join(pools)})")
            pools = {name: pools[name] for name in wanted}
        pods = day_trace(hours=args.hours, seed=args.seed)
        result = compare(pools, pods, args.every, args.wait_bound, search=not args.no_search)
    except RelayoutError as exc:
        print(f"dra: {exc}", file=sys.stderr)
        return 2
    if args.output:
        args.output.write_text(json.dumps(result, indent=2) + "\n")
    out(table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
