"""Figures of a run (the report's table) and the load-aware extender's goal checks.

- waiting time: arrival to start, over the pods that were placed (p50, p95, nearest rank);
- hot placements: pods placed onto a device at or above a threshold while a free device below existed in the
  pod's pool (judged on the true load at that moment, with the extender's own threshold rule);
- load CoV: at each sample, the coefficient of variation (population standard deviation / mean) of node load
  within each tenant pool, averaged over the pools that have any load, weighted by their node count; then
  averaged over the samples, which sit on a regular grid, so the mean is time-weighted. Pools are compared
  within themselves because no policy may move a pod to another tenant's nodes; an idle pool has nothing
  to balance and does not count;
- device load: ``scoring.device_load`` of every device at every sample (p95 and max).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from gpufleet_lab.simulate.model import RunResult

GOAL_COV_RATIO = 0.5  # load's CoV at most half of count's


def percentile(values: Sequence[float], fraction: float) -> float | None:
    """Nearest-rank percentile; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


def fewest_that_serves(limit: int, serves: Callable[[int], bool]) -> int | None:
    """The fewest of 1..``limit`` (GPUs, say) for which ``serves`` holds, by bisection: ``serves`` must be monotone
    (more never serves worse). None when not even ``limit`` serves; 0 is taken to serve nothing."""
    if not serves(limit):
        return None
    low, high = 0, limit  # low fails, high serves
    while high - low > 1:
        middle = (low + high) // 2
        if serves(middle):
            high = middle
        else:
            low = middle
    return high


def coefficient_of_variation(values: Sequence[float]) -> float | None:
    """Population standard deviation / mean; None when the mean is 0 (nothing to balance)."""
    mean = statistics.fmean(values) if values else 0.0
    if mean <= 0:
        return None
    return statistics.pstdev(values) / mean


def pooled_cov(loads: Sequence[float], tenants: Sequence[str | None]) -> float | None:
    """CoV of ``loads`` within each tenant pool that has load, averaged weighted by pool size; None if none has."""
    pools: dict[str | None, list[float]] = {}
    for load, tenant in zip(loads, tenants, strict=True):
        pools.setdefault(tenant, []).append(load)
    weighted = [(cov, len(p)) for p in pools.values() if (cov := coefficient_of_variation(p)) is not None]
    total = sum(size for _, size in weighted)
    return sum(cov * size for cov, size in weighted) / total if total else None


@dataclass(frozen=True, slots=True)
class PolicySummary:
    policy: str
    pods: int
    placed: int
    never_placed: int
    wait_p50_s: float | None
    wait_p95_s: float | None
    hot_placements: int
    hot_on_cool_node: int  # of which the last sample showed the node with enough cool devices with room
    held: int
    load_cov: float
    mean_node_load: float
    device_load_p95: float | None
    device_load_max: float | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def summarise(result: RunResult) -> PolicySummary:
    waits = [o.wait for o in result.outcomes if o.wait is not None]
    covs = [c for loads in result.node_load if (c := pooled_cov(loads, result.node_tenants)) is not None]
    node_means = [statistics.fmean(loads) for loads in result.node_load if loads]
    return PolicySummary(
        policy=result.policy,
        pods=len(result.outcomes),
        placed=len(waits),
        never_placed=len(result.outcomes) - len(waits),
        wait_p50_s=percentile(waits, 0.50),
        wait_p95_s=percentile(waits, 0.95),
        hot_placements=sum(o.hot for o in result.outcomes),
        hot_on_cool_node=sum(o.hot_on_cool_node for o in result.outcomes),
        held=sum(o.held for o in result.outcomes),
        load_cov=statistics.fmean(covs) if covs else 0.0,
        mean_node_load=statistics.fmean(node_means) if node_means else 0.0,
        device_load_p95=percentile(result.device_load, 0.95),
        device_load_max=max(result.device_load) if result.device_load else None,
    )


@dataclass(frozen=True, slots=True)
class GoalCheck:
    goal: str
    passed: bool | None  # None: not checked (a policy it needs was not run, or another trace is its subject)
    detail: str
    key: str = ""  # which goal, for the verdict's words (simulate/verdict.py)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# The mixed trace's first goals, shown but no longer judged: on exclusive devices (as deployed) a free device is idle,
# so "zero hot placements" holds for every policy and node-load CoV is what counting gives; neither is what a user
# feels (docs/simulator.md, "What the fleet gains").
RETIRED = " (shown, not judged: retired, it holds or fails by construction on exclusive devices)"


def goal_checks(summaries: dict[str, PolicySummary], replicas: int) -> list[GoalCheck]:
    """The mixed trace's hot-placement and load-CoV figures of ``load`` against ``count``, as retired goals (never
    judged: ``passed`` is None)."""
    load, count = summaries.get("load"), summaries.get("count")
    if load is None:
        return [GoalCheck("load makes zero hot placements", None, "policy 'load' not run", "load-hot")]
    detail = f"load: {load.hot_placements} hot placement(s) of {load.placed} placed"
    if load.hot_placements:
        detail += f" ({load.hot_on_cool_node} on nodes the last sample showed with cool room: device choice or lag)"
    if count:
        detail += f"; count: {count.hot_placements}"
    checks = [GoalCheck("load makes zero hot placements", None, detail + RETIRED, "load-hot")]
    if count is not None:
        ratio = f"{load.load_cov / count.load_cov:.2f}" if count.load_cov > 0 else "n/a"
        checks.append(
            GoalCheck(
                f"load CoV <= {GOAL_COV_RATIO} x count's",
                None,
                f"load {load.load_cov:.3f} vs count {count.load_cov:.3f} (ratio {ratio})" + RETIRED,
                "load-cov",
            )
        )
    return checks
