"""Figures per tenant pool, and the goals for shared devices, tensor-parallel pods and interference.

- load CoV per pool: at each sample, the CoV of node load within the pool (when it has load), averaged over
  the samples (a regular grid: time-weighted);
- wait p95 per request size: per pool and number of devices a pod asks for, arrival to start over placed pods;
- mean slowdown: per pool, the mean of ``run time / nominal duration - 1`` over pods that ended (the interference
  model; 0 when it is off);
- hot placements per pool (the model's rule: onto a hot device while a cooler free one existed);
- out-of-memory failures per pool (a pod whose memory did not fit beside its shared device's pods) and the p95 of
  the extra run time (the time-slicing model slows pods that take turns on a device).

``pool_goal_checks`` states the goals of docs/simulator.md in words; ``plot_pools`` draws the four figures with the
goal lines.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from gpufleet_extender.pods import WHOLE_GPU_RESOURCE

from gpufleet_lab.simulate.metrics import GoalCheck, coefficient_of_variation, percentile
from gpufleet_lab.simulate.model import RunResult

if TYPE_CHECKING:
    from matplotlib.axes import Axes

_Group = TypeVar("_Group", str, int)  # a bar group: a pool name or a pod size

GOAL_SHARED_OOM_RATIO = 0.1  # load's out-of-memory failures in a time-sliced pool at most this x count's
GOAL_SHARED_SLOWDOWN_RATIO = 0.7  # load's p95 extra run time of a time-sliced pool's pods at most this x count's
GOAL_TP8_WAIT_RATIO = 0.5  # auto's wait p95 of 8-GPU pods at most this x spread's
GOAL_TP1_WAIT_RATIO = 1.2  # auto's wait p95 of 1-GPU pods at most this x spread's
GOAL_SLOWDOWN_RATIO = 0.8  # spread's mean slowdown (interference term on) at most this x count's
TP_SCENARIO = "tp-mix"


@dataclass(frozen=True, slots=True)
class PoolFigures:
    policy: str
    load_cov: dict[str, float]  # pool -> time-mean CoV of node load
    hot_placements: dict[str, int]
    wait_p95_by_size: dict[str, dict[int, float | None]]  # pool -> devices asked for -> wait p95 (s)
    mean_slowdown: dict[str, float | None]  # pool -> mean extra run time share; None: no pod ended
    p95_slowdown: dict[str, float | None]  # pool -> p95 of the extra run time share; None: no pod ended
    oom: dict[str, int]  # pool -> pods that failed with out-of-memory at start-up (shared devices)

    def to_json(self) -> dict[str, Any]:
        document = asdict(self)
        document["wait_p95_by_size"] = {p: {str(k): v for k, v in s.items()} for p, s in self.wait_p95_by_size.items()}
        return document


def _pool(tenant: str | None) -> str:
    return tenant or "shared"


def pool_figures(result: RunResult) -> PoolFigures:
    members: dict[str, list[int]] = {}
    for index, tenant in enumerate(result.node_tenants):
        members.setdefault(_pool(tenant), []).append(index)
    covs: dict[str, list[float]] = {pool: [] for pool in members}
    for loads in result.node_load:
        for pool, indices in members.items():
            cov = coefficient_of_variation([loads[i] for i in indices])
            if cov is not None:
                covs[pool].append(cov)
    waits: dict[str, dict[int, list[float]]] = {}
    slowdowns: dict[str, list[float]] = {}
    hot: dict[str, int] = dict.fromkeys(members, 0)
    oom: dict[str, int] = dict.fromkeys(members, 0)
    for outcome in result.outcomes:
        pool = _pool(outcome.tenant)
        if outcome.wait is not None:
            waits.setdefault(pool, {}).setdefault(outcome.count, []).append(outcome.wait)
        if outcome.slowdown is not None:
            slowdowns.setdefault(pool, []).append(outcome.slowdown - 1.0)
        hot[pool] = hot.get(pool, 0) + outcome.hot
        oom[pool] = oom.get(pool, 0) + outcome.oom
    return PoolFigures(
        policy=result.policy,
        load_cov={pool: statistics.fmean(values) if values else 0.0 for pool, values in covs.items()},
        hot_placements=hot,
        wait_p95_by_size={
            pool: {size: percentile(values, 0.95) for size, values in sorted(by_size.items())}
            for pool, by_size in waits.items()
        },
        mean_slowdown={pool: statistics.fmean(values) if values else None for pool, values in slowdowns.items()},
        p95_slowdown={pool: percentile(values, 0.95) if values else None for pool, values in slowdowns.items()},
        oom=oom,
    )


def whole_gpu_pools(results: Sequence[RunResult]) -> list[str]:
    """Pools whose pods asked for whole GPUs (the LLM pool on the Hong Kong fleet)."""
    pools = {_pool(o.tenant) for r in results for o in r.outcomes if o.resource == WHOLE_GPU_RESOURCE}
    return sorted(pools)


def ratio_check(
    goal: str, value: float | None, reference: float | None, limit: float, what: str, key: str
) -> GoalCheck:
    if value is None or reference is None:
        return GoalCheck(goal, None, f"{what}: no figure (no pod of that kind placed)", key)
    if reference <= 0:
        passed = value <= 0
        note = " (met vacuously: the reference has none to improve on)" if passed else ""
        return GoalCheck(goal, passed, f"{what}: {value:g} against {reference:g}{note}", key)
    ratio = value / reference
    return GoalCheck(
        goal, ratio <= limit, f"{what}: {value:.3g} against {reference:.3g} (ratio {ratio:.2f}, limit {limit:g})", key
    )


def pool_goal_checks(
    figures: Mapping[str, PoolFigures],
    shared_pools: Sequence[str],
    gpu_pools: Sequence[str],
    scenario: str | None,
    interference: float,
) -> list[GoalCheck]:
    """The goals that apply to this run: out-of-memory failures and p95 slowdown in each time-sliced pool (load and
    count ran), and on the
    tp-mix trace tensor-parallel waiting (auto and spread ran) and interference (alpha above 0, spread and count)."""
    checks: list[GoalCheck] = []
    load, count = figures.get("load"), figures.get("count")
    if shared_pools and load and count:
        for pool in shared_pools:
            checks.append(
                ratio_check(
                    f"in the time-sliced {pool} pool, load's out-of-memory failures are at most "
                    f"{GOAL_SHARED_OOM_RATIO:g}x count's",
                    load.oom.get(pool, 0),
                    count.oom.get(pool, 0),
                    GOAL_SHARED_OOM_RATIO,
                    f"{pool} pods failed with out-of-memory, load against count",
                    "shared-oom",
                )
            )
            checks.append(
                ratio_check(
                    f"in the time-sliced {pool} pool, load's p95 slowdown is at most "
                    f"{GOAL_SHARED_SLOWDOWN_RATIO:g}x count's",
                    load.p95_slowdown.get(pool),
                    count.p95_slowdown.get(pool),
                    GOAL_SHARED_SLOWDOWN_RATIO,
                    f"{pool} p95 extra run time, load against count",
                    "shared-slowdown",
                )
            )
    if scenario != TP_SCENARIO:
        return checks
    auto, spread = figures.get("auto"), figures.get("spread")
    for pool in gpu_pools:
        if auto and spread:
            auto_waits, spread_waits = auto.wait_p95_by_size.get(pool, {}), spread.wait_p95_by_size.get(pool, {})
            checks.append(
                ratio_check(
                    f"in the {pool} pool, auto's wait p95 of 8-GPU pods is at most {GOAL_TP8_WAIT_RATIO:g}x spread's",
                    auto_waits.get(8),
                    spread_waits.get(8),
                    GOAL_TP8_WAIT_RATIO,
                    "8-GPU wait p95 (s), auto against spread",
                    "tp-wait-8",
                )
            )
            checks.append(
                ratio_check(
                    f"in the {pool} pool, auto's wait p95 of 1-GPU pods is at most {GOAL_TP1_WAIT_RATIO:g}x spread's",
                    auto_waits.get(1),
                    spread_waits.get(1),
                    GOAL_TP1_WAIT_RATIO,
                    "1-GPU wait p95 (s), auto against spread",
                    "tp-wait-1",
                )
            )
        if interference > 0 and spread and count:
            checks.append(
                ratio_check(
                    f"with interference, spread's mean slowdown in the {pool} pool is at most "
                    f"{GOAL_SLOWDOWN_RATIO:g}x count's",
                    spread.mean_slowdown.get(pool),
                    count.mean_slowdown.get(pool),
                    GOAL_SLOWDOWN_RATIO,
                    "mean extra run time, spread against count",
                    "interference",
                )
            )
    return checks


def format_pools(figures: Sequence[PoolFigures]) -> str:
    """One line per policy and pool: CoV, hot placements, out-of-memory failures, mean and p95 slowdown, wait p95
    per request size."""
    lines = [
        f"{'policy':<18} {'pool':<10} {'CoV':>6} {'hot':>5} {'OOM':>5} {'slowdown':>9} {'p95':>7}"
        "  wait p95 by devices asked for"
    ]

    def shown(value: float | None, width: int) -> str:
        if value is not None and abs(value) < 5e-4:
            value = 0.0  # float noise of run time / duration
        return f"{'-' if value is None else f'{value:+.1%}':>{width}}"

    for entry in figures:
        for pool in sorted(entry.load_cov):
            waits = entry.wait_p95_by_size.get(pool, {})
            sizes = ", ".join(f"{size}: {'-' if w is None else f'{w:.0f}s'}" for size, w in waits.items())
            lines.append(
                f"{entry.policy:<18} {pool:<10} {entry.load_cov[pool]:>6.3f} {entry.hot_placements.get(pool, 0):>5} "
                f"{entry.oom.get(pool, 0):>5} {shown(entry.mean_slowdown.get(pool), 9)} "
                f"{shown(entry.p95_slowdown.get(pool), 7)}  {sizes}"
            )
    return "\n".join(lines)


def plot_pools(
    path: Path, figures: Sequence[PoolFigures], checks: Sequence[GoalCheck], shared_pools: Sequence[str] = ()
) -> None:
    """Four panels: out-of-memory failures, p95 and mean slowdown per pool, wait p95 per request size; the goal
    limits drawn as dashed lines (a limit is the goal's ratio times the reference policy's figure).

    Raises ImportError when matplotlib is missing (the ``sim`` extra).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    policies = [f.policy for f in figures]
    pools = sorted({p for f in figures for p in f.load_cov})
    figure, axes = plt.subplots(1, 4, figsize=(20, 4.6))
    width = 0.8 / max(1, len(policies))

    def bars(
        axis: Axes,
        values_of: Callable[[PoolFigures, _Group], float | None],
        groups: Sequence[_Group],
        title: str,
        fmt: str | None = None,
    ) -> None:
        for index, entry in enumerate(figures):
            values = [values_of(entry, g) or 0.0 for g in groups]
            axis.bar([i + index * width for i in range(len(groups))], values, width, label=entry.policy)
        axis.set_xticks([i + width * (len(policies) - 1) / 2 for i in range(len(groups))], [str(g) for g in groups])
        axis.set_title(title, fontsize=10)

    by_name = {f.policy: f for f in figures}
    bars(axes[0], lambda f, p: f.oom.get(p, 0), pools, "out-of-memory failures per pool")
    bars(axes[1], lambda f, p: f.p95_slowdown.get(p), pools, "p95 slowdown (extra run time) per pool")
    bars(axes[2], lambda f, p: f.mean_slowdown.get(p), pools, "mean slowdown (extra run time) per pool")
    gpu_pool = next((p for f in figures for p, w in f.wait_p95_by_size.items() if 8 in w), None)
    sizes = sorted({s for f in figures for s in f.wait_p95_by_size.get(gpu_pool, {})}) if gpu_pool else []
    if gpu_pool:
        bars(axes[3], lambda f, s: f.wait_p95_by_size.get(gpu_pool, {}).get(s), sizes, f"wait p95 (s), {gpu_pool}")
        axes[3].set_xlabel("GPUs per pod")
    # Goal lines: count-relative limits on the first three panels, spread-relative ones on the waits.
    goal_text = " ".join(c.goal for c in checks)
    count, spread = by_name.get("count"), by_name.get("spread")
    if count:
        for pool in shared_pools:
            x = pools.index(pool)
            if "out-of-memory" in goal_text:
                limit = GOAL_SHARED_OOM_RATIO * count.oom.get(pool, 0)
                axes[0].hlines(limit, x - 0.1, x + 0.9, ls="--", colors="k", lw=1, label=f"goal ({pool})")
            if "p95 slowdown" in goal_text and (p95 := count.p95_slowdown.get(pool)) is not None:
                limit = GOAL_SHARED_SLOWDOWN_RATIO * p95
                axes[1].hlines(limit, x - 0.1, x + 0.9, ls="--", colors="k", lw=1, label=f"goal ({pool})")
    if (
        count
        and "slowdown" in goal_text
        and gpu_pool in pools
        and (slowdown := count.mean_slowdown.get(gpu_pool)) is not None
    ):
        x = pools.index(gpu_pool)
        limit = GOAL_SLOWDOWN_RATIO * slowdown
        axes[2].hlines(limit, x - 0.1, x + 0.9, ls="--", colors="k", lw=1, label=f"goal ({gpu_pool})")
    if spread and gpu_pool and "8-GPU" in goal_text:
        waits = spread.wait_p95_by_size.get(gpu_pool, {})
        for size, ratio in ((8, GOAL_TP8_WAIT_RATIO), (1, GOAL_TP1_WAIT_RATIO)):
            if size in sizes and (wait := waits.get(size)) is not None:
                x = sizes.index(size)
                axes[3].hlines(ratio * wait, x - 0.1, x + 0.9, ls="--", colors="k", lw=1)
    for axis in axes:
        if axis.get_legend_handles_labels()[0]:
            axis.legend(fontsize=7)
    figure.suptitle("Per pool, by placement policy (dashed: the goal's limit)", fontsize=12)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(figure)
