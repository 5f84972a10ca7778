"""Free capacity over time: whole GPUs and nodes left free, and the largest request still placeable.

What "free" means here:

- a **free GPU** is a physical GPU no pod holds anything on: a whole GPU (``nvidia.com/gpu``) without a pod, or a
  MIG GPU none of whose instances holds a pod (only then can it be repartitioned or handed to another profile).
  With time-slicing (``--replicas`` above 1) a GPU holding one pod is not free, however many slots it has left;
- a **free node** has no pod on any device;
- the **largest placeable request** of a pool is the most free GPUs one node of the pool has: the biggest
  multi-GPU pod (or MIG repartition) that could start now without moving anything. The rest of the pool's free
  GPUs are stranded, scattered over nodes where no large request fits.

With exclusive devices (what the collection deploys) the number of free *whole* GPUs in a pool of unpartitioned
GPUs does not depend on placement at all: N pods on 1-GPU devices leave the same number free wherever they go.
There, what packing changes is where the free GPUs are (free nodes, the largest placeable request); in MIG
pools and with shared devices it also changes how many GPUs are free.

``CapacityProbe`` records the figures at every sample; ``summarise_capacity`` averages them over the trace's
arrival window (up to the last arrival; the drain after it empties every policy's fleet alike);
``strategy_goal_checks`` are the scoring strategies' goals; ``plot_capacity`` draws the two figures.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gpufleet_lab.simulate.metrics import GoalCheck, PolicySummary
from gpufleet_lab.simulate.model import Probe, RunResult
from gpufleet_lab.simulate.state import DeviceState, SimCluster

PROBE_NAME = "capacity"
GOAL_FREE_GPU_RATIO = 2.0  # quiet trace: auto frees at least twice as many whole GPUs as spread


def physical_gpu(device_key: str) -> str:
    """``gpu3/mig1`` -> ``gpu3``; a whole GPU's key is its own."""
    return device_key.split("/", 1)[0]


@dataclass(frozen=True, slots=True)
class PoolCapacity:
    """One pool at one sample."""

    free_gpus: int
    free_nodes: int
    largest_placeable: int  # most free GPUs on one node


class CapacityProbe(Probe):
    """Per sample: ``{pool: PoolCapacity}`` (pool = tenant, or None for shared nodes)."""

    name = PROBE_NAME

    def __init__(self) -> None:
        self._gpus: dict[int, list[tuple[str | None, list[list[DeviceState]]]]] = {}  # per cluster: node GPUs

    def _layout(self, cluster: SimCluster) -> list[tuple[str | None, list[list[DeviceState]]]]:
        layout = self._gpus.get(id(cluster))
        if layout is None:
            layout = []
            for node in cluster.nodes.values():
                gpus: dict[str, list[DeviceState]] = {}
                for device in node.devices:
                    gpus.setdefault(physical_gpu(device.device.key), []).append(device)
                layout.append((node.tenant, list(gpus.values())))
            self._gpus = {id(cluster): layout}  # one run at a time
        return layout

    def sample(self, now: float, cluster: SimCluster) -> dict[str | None, PoolCapacity]:
        pools: dict[str | None, list[int]] = {}
        for tenant, gpus in self._layout(cluster):
            free = sum(1 for devices in gpus if not any(d.pods for d in devices))
            entry = pools.setdefault(tenant, [0, 0, 0])
            entry[0] += free
            entry[1] += free == len(gpus)
            entry[2] = max(entry[2], free)
        return {tenant: PoolCapacity(*figures) for tenant, figures in pools.items()}


@dataclass(frozen=True, slots=True)
class CapacitySummary:
    policy: str
    free_gpus_mean: float  # the whole fleet, time-mean over the arrival window
    free_nodes_mean: float
    free_gpus_by_pool: dict[str, float]  # time-mean per pool
    largest_placeable_mean: dict[str, float]  # per pool
    largest_placeable_min: dict[str, int]
    pack_share: float | None  # auto: share of placements scored in pack mode; None for other policies

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _pool_name(tenant: str | None) -> str:
    return tenant or "shared"


def summarise_capacity(
    result: RunResult, last_arrival: float, by_mode: Mapping[str, int] | None = None
) -> CapacitySummary:
    """Time-means over the samples up to ``last_arrival``; ``by_mode`` is a load policy's placements per mode."""
    timed = zip(result.sample_times, result.probes[PROBE_NAME], strict=True)
    samples = [sample for at, sample in timed if at <= last_arrival] or result.probes[PROBE_NAME][:1]
    largest: dict[str, list[int]] = {}
    free: dict[str, list[int]] = {}
    for sample in samples:
        for tenant, pool in sample.items():
            largest.setdefault(_pool_name(tenant), []).append(pool.largest_placeable)
            free.setdefault(_pool_name(tenant), []).append(pool.free_gpus)
    placements = sum(by_mode.values()) if by_mode else 0
    return CapacitySummary(
        policy=result.policy,
        free_gpus_mean=statistics.fmean(sum(p.free_gpus for p in s.values()) for s in samples),
        free_nodes_mean=statistics.fmean(sum(p.free_nodes for p in s.values()) for s in samples),
        free_gpus_by_pool={pool: statistics.fmean(v) for pool, v in sorted(free.items())},
        largest_placeable_mean={pool: statistics.fmean(v) for pool, v in sorted(largest.items())},
        largest_placeable_min={pool: min(v) for pool, v in sorted(largest.items())},
        pack_share=by_mode.get("pack", 0) / placements if by_mode and placements else None,
    )


# Which trace each goal of the scoring strategies is set for; on other traces the figures are shown but not judged.
QUIET_SCENARIO = "quiet-night"
PEAK_SCENARIO = "peak-hour"


def strategy_goal_checks(
    summaries: Mapping[str, PolicySummary], capacities: Mapping[str, CapacitySummary], scenario: str | None
) -> list[GoalCheck]:
    """The scoring strategies' goals: on a quiet trace auto frees >= 2x spread's whole GPUs; at peak it is no
    worse on hot placements and load CoV (compared at the printed precision, 3 decimals)."""
    goals = (
        f"auto frees >= {GOAL_FREE_GPU_RATIO:g}x spread's whole GPUs ({QUIET_SCENARIO})",
        f"auto hot placements <= spread's ({PEAK_SCENARIO})",
        f"auto load CoV <= spread's ({PEAK_SCENARIO})",
    )
    keys = ("auto-free", "auto-hot", "auto-cov")
    missing = [name for name in ("spread", "auto") if name not in summaries]
    if missing:
        return [
            GoalCheck(goal, None, f"policy {' and '.join(missing)} not run", key)
            for goal, key in zip(goals, keys, strict=True)
        ]
    spread, auto = summaries["spread"], summaries["auto"]
    spread_cap, auto_cap = capacities["spread"], capacities["auto"]
    ratio = auto_cap.free_gpus_mean / spread_cap.free_gpus_mean if spread_cap.free_gpus_mean else float("inf")
    free = (
        f"free GPUs auto {auto_cap.free_gpus_mean:.1f} vs spread {spread_cap.free_gpus_mean:.1f} (x{ratio:.2f}); "
        f"free nodes {auto_cap.free_nodes_mean:.1f} vs {spread_cap.free_nodes_mean:.1f}"
    )
    hot = f"auto {auto.hot_placements} vs spread {spread.hot_placements}"
    cov = f"auto {auto.load_cov:.3f} vs spread {spread.load_cov:.3f}"
    verdicts = (
        (QUIET_SCENARIO, ratio >= GOAL_FREE_GPU_RATIO, free),
        (PEAK_SCENARIO, auto.hot_placements <= spread.hot_placements, hot),
        (PEAK_SCENARIO, round(auto.load_cov, 3) <= round(spread.load_cov, 3), cov),
    )
    checks = []
    for goal, key, (for_scenario, passed, detail) in zip(goals, keys, verdicts, strict=True):
        if scenario != for_scenario:
            checks.append(
                GoalCheck(goal, None, f"{detail} (shown, not judged: the goal is set for {for_scenario})", key)
            )
        else:
            checks.append(GoalCheck(goal, passed, detail, key))
    return checks


def format_capacity(capacities: Sequence[CapacitySummary]) -> str:
    """The free-capacity table: fleet-wide free GPUs and nodes, and per pool the largest placeable request."""
    pools = sorted({pool for c in capacities for pool in c.largest_placeable_mean})
    header = f"{'policy':<17}  {'free GPUs':>9}  {'free nodes':>10}  {'pack share':>10}  " + "  ".join(
        f"{'largest ' + pool:>16}" for pool in pools
    )
    lines = [header, "-" * len(header)]
    for c in capacities:
        share = "-" if c.pack_share is None else f"{c.pack_share:.0%}"
        largest = "  ".join(
            f"{c.largest_placeable_mean[pool]:>10.2f} (>={c.largest_placeable_min[pool]})" for pool in pools
        )
        lines.append(f"{c.policy:<17}  {c.free_gpus_mean:>9.1f}  {c.free_nodes_mean:>10.1f}  {share:>10}  {largest}")
    return "\n".join(lines)


CAPACITY_LEGEND = "\n".join(
    (
        "free GPUs / nodes: physical GPUs / nodes with no pod at all, fleet total, time-mean up to the last arrival",
        "pack share: placements the policy scored in pack mode (auto: how often it packed)",
        "largest <pool>: free GPUs on the pool's best node = the largest request still placeable, mean (minimum)",
    )
)


def plot_capacity(path: Path, results: Sequence[RunResult], last_arrival: float) -> None:
    """Two rows of line plots, one column per pool, one line per policy: free whole GPUs over time, and the
    largest request still placeable (free GPUs on the pool's best node). Raises ImportError without matplotlib."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    pools = sorted({t for r in results for s in r.probes[PROBE_NAME] for t in s}, key=lambda t: t or "")
    figure, axes = plt.subplots(2, len(pools), figsize=(4.6 * len(pools) + 1.0, 6.4), sharex=True, squeeze=False)
    for number, result in enumerate(results):
        style = {"label": result.policy, "linewidth": 1.1, "linestyle": ("-", "--", ":", "-.")[number % 4]}
        hours = [t / 3600 for t in result.sample_times]
        series = result.probes[PROBE_NAME]
        for column, pool in enumerate(pools):
            free = [s[pool].free_gpus if pool in s else 0 for s in series]
            largest = [s[pool].largest_placeable if pool in s else 0 for s in series]
            axes[0][column].step(hours, free, where="post", **style)  # dashes keep equal series visible
            axes[1][column].step(hours, largest, where="post", **style)
    for column, pool in enumerate(pools):
        axes[0][column].set_title(f"pool {_pool_name(pool)}", fontsize=10)
        for row in (0, 1):
            axes[row][column].axvline(last_arrival / 3600, color="grey", linestyle=":", linewidth=0.8)
        axes[1][column].set_xlabel("hours")
    axes[0][0].set_ylabel("whole GPUs with no pod")
    axes[1][0].set_ylabel("largest placeable request\n(free GPUs on the best node)")
    axes[0][-1].legend(fontsize=8, loc="upper right")
    figure.suptitle("Free capacity over time by placement policy (dotted: last arrival)", fontsize=12)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(figure)
