"""How the user-facing goals' ratios move when each model parameter is off by up to 50 % (docs/simulator.md).

``python -m gpufleet_lab.simulate.sensitivity`` (from the repository root) runs the goals' runs again with one
parameter at a time scaled by 0.5 and 1.5, every other one at its documented value, and writes a table
(``sensitivity.md``, also printed), ``sensitivity.json`` and a plot (``sensitivity.png``) into ``--output``.

- The time-sliced pool's goals (out-of-memory failures and p95 slowdown, ``load`` against ``count``) on the finnlp
  pool alone, 1g.10gb time-sliced x4, the mixed trace: parameters the time-slicing efficiency E (1.5 x 0.76 is above
  1, so the high end is capped at 1.0: no context-switch cost at all), the pods' GPU memory, their utilisation, the
  load curve (how many pods run), the scrape interval, and the extender's ``SHARED_MEM_FREE_MIN``.
- The 8-GPU wait goal (``auto`` against ``spread``) on the llm pool alone, the tp-mix trace: the load curve, the LLM
  pods' durations and the scrape interval.

Each pool runs alone, so that its trace does not move with the other pools' draws: the baseline row is this run's
own, not the lab's figure. Exit 0 when it ran (goals missed or not), 2 for bad input.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet_extender.scoring import Policy

from gpufleet_lab.simulate.fleet import (
    DEFAULT_INVENTORY,
    Fleet,
    FleetError,
    fleet_from_inventory,
    fleet_from_yaml,
)
from gpufleet_lab.simulate.generator import SCENARIO_WORKLOADS, LoadCurve, generate_trace
from gpufleet_lab.simulate.model import ModelSettings, SimulationError, simulate
from gpufleet_lab.simulate.policies import make_policy
from gpufleet_lab.simulate.pools import (
    GOAL_SHARED_OOM_RATIO,
    GOAL_SHARED_SLOWDOWN_RATIO,
    GOAL_TP8_WAIT_RATIO,
    pool_figures,
    ratio_check,
)
from gpufleet_lab.simulate.trace import PodSpec, Schedule, Trace, make_trace

SHARED_POOL, SHARED_RESOURCE, SHARED_REPLICAS = "finnlp", "nvidia.com/mig-1g.10gb", 4
TP_POOL = "llm"
SHARED_MEM_FREE_MIN = 0.35  # docs/simulator.md, fixed before the runs
FACTORS = (0.5, 1.5)


@dataclass(frozen=True, slots=True)
class Case:
    """One run's inputs: the parameter scaled and by how much (``factor`` 1 for the baseline)."""

    parameter: str
    factor: float
    model: ModelSettings
    policy: Policy
    curve: LoadCurve
    pods: Callable[[PodSpec], PodSpec]


def _scaled(schedule: Schedule, factor: float, ceiling: float | None = None) -> Schedule:
    values = tuple(min(ceiling, v * factor) if ceiling is not None else v * factor for v in schedule.values)
    return Schedule(schedule.offsets, values)


def _pool(fleet: Fleet, tenant: str) -> Fleet:
    return dataclasses.replace(fleet, nodes=tuple(n for n in fleet.nodes if n.tenant == tenant))


def _cases(base_model: ModelSettings, base_policy: Policy, shared: bool) -> list[Case]:
    curve = LoadCurve()

    def same(pod: PodSpec) -> PodSpec:
        return pod

    cases = [Case("baseline", 1.0, base_model, base_policy, curve, same)]
    for factor in FACTORS:

        def memory(pod: PodSpec, f: float = factor) -> PodSpec:
            return dataclasses.replace(pod, mem_gb=_scaled(pod.mem_gb, f))

        def util(pod: PodSpec, f: float = factor) -> PodSpec:
            return dataclasses.replace(pod, util=_scaled(pod.util, f, ceiling=1.0))

        def duration(pod: PodSpec, f: float = factor) -> PodSpec:
            return dataclasses.replace(pod, duration=max(1.0, round(pod.duration * f)))

        scrape = dataclasses.replace(base_model, scrape_interval=base_model.scrape_interval * factor)
        level = LoadCurve(curve.base * factor, curve.peak * factor)
        cases += [
            Case("load curve (pods running)", factor, base_model, base_policy, level, same),
            Case("scrape interval", factor, scrape, base_policy, curve, same),
        ]
        if shared:
            efficiency = min(1.0, base_model.timeslice_efficiency * factor)
            free_min = min(0.95, base_policy.shared_mem_free_min * factor)
            cases += [
                Case(
                    "time-slicing efficiency E",
                    factor,
                    dataclasses.replace(base_model, timeslice_efficiency=efficiency),
                    base_policy,
                    curve,
                    same,
                ),
                Case("pod GPU memory", factor, base_model, base_policy, curve, memory),
                Case("pod utilisation", factor, base_model, base_policy, curve, util),
                Case(
                    "SHARED_MEM_FREE_MIN (setting)",
                    factor,
                    base_model,
                    dataclasses.replace(base_policy, shared_mem_free_min=free_min),
                    curve,
                    same,
                ),
            ]
        else:
            cases.append(Case("LLM pod duration", factor, base_model, base_policy, curve, duration))
    return cases


def _trace(fleet: Fleet, scenario: str, case: Case, seed: int, hours: float) -> Trace:
    generated = generate_trace(fleet, seed, hours * 3600, case.curve, scenario, SCENARIO_WORKLOADS.get(scenario))
    return make_trace((case.pods(p) for p in generated.pods), source=generated.source)


def _ratio(value: float | None, reference: float | None) -> float | None:
    """value / reference; None without a figure or when the reference is 0 (nothing to improve on: the goal is met
    vacuously if the value is 0 too, as the run's own check says)."""
    if value is None or reference is None or reference <= 0:
        return None
    return value / reference


def _met(value: float | None, reference: float | None, limit: float) -> bool | None:
    """The run's own rule (``pools.ratio_check``): the same verdict the goal line gives."""
    return ratio_check("", value, reference, limit, "", "").passed


def _clean(value: float | None) -> float | None:
    return None if value is None else round(value, 4)  # float noise of run time / duration


def _shared_row(fleet: Fleet, case: Case, seed: int, hours: float) -> dict[str, Any]:
    trace = _trace(fleet, "mixed", case, seed, hours)
    figures = {
        name: pool_figures(simulate(fleet, trace, make_policy(name, seed), case.policy, case.model))
        for name in ("count", "load")
    }
    load, count = figures["load"], figures["count"]
    oom = (load.oom.get(SHARED_POOL, 0), count.oom.get(SHARED_POOL, 0))
    slow = (_clean(load.p95_slowdown.get(SHARED_POOL)), _clean(count.p95_slowdown.get(SHARED_POOL)))
    wait = (load.wait_p95_by_size.get(SHARED_POOL, {}).get(1), count.wait_p95_by_size.get(SHARED_POOL, {}).get(1))
    return {
        "parameter": case.parameter,
        "factor": case.factor,
        "pods": len(trace.pods),
        "oom": oom,
        "oom_ratio": _ratio(*oom),
        "oom_met": _met(*oom, GOAL_SHARED_OOM_RATIO),
        "p95_slowdown": slow,
        "slowdown_ratio": _ratio(*slow),
        "slowdown_met": _met(*slow, GOAL_SHARED_SLOWDOWN_RATIO),
        "wait_p95": wait,
    }


def _tp_row(fleet: Fleet, case: Case, seed: int, hours: float) -> dict[str, Any]:
    trace = _trace(fleet, "tp-mix", case, seed, hours)
    figures = {
        name: pool_figures(simulate(fleet, trace, make_policy(name, seed), case.policy, case.model))
        for name in ("spread", "auto")
    }
    wait = (
        figures["auto"].wait_p95_by_size.get(TP_POOL, {}).get(8),
        figures["spread"].wait_p95_by_size.get(TP_POOL, {}).get(8),
    )
    ratio = _ratio(*wait)
    return {
        "parameter": case.parameter,
        "factor": case.factor,
        "pods": len(trace.pods),
        "wait8_p95": wait,
        "wait8_ratio": ratio,
        "wait8_met": _met(*wait, GOAL_TP8_WAIT_RATIO),
    }


def _shown_ratio(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}"


def _mark(met: bool | None, ratio: float | None) -> str:
    if met and ratio is None:
        return "met (0 against 0)"
    return {True: "met", False: "NOT MET", None: "-"}[met]


def format_tables(shared: Sequence[dict[str, Any]], tp: Sequence[dict[str, Any]]) -> str:
    lines = [
        f"Time-sliced {SHARED_POOL} pool ({SHARED_RESOURCE} x{SHARED_REPLICAS}), load against count:",
        "",
        "| parameter | x | out-of-memory load / count | ratio (<= 0.1) | p95 extra run time load / count "
        "| ratio (<= 0.7) | wait p95 load / count |",
        "| --- | ---: | ---: | --- | ---: | --- | ---: |",
    ]
    for row in shared:
        slow = row["p95_slowdown"]
        slow_shown = " / ".join("-" if v is None else f"+{v:.1%}" for v in slow)
        wait_shown = " / ".join("-" if v is None else f"{v:.0f} s" for v in row["wait_p95"])
        lines.append(
            f"| {row['parameter']} | {row['factor']:g} | {row['oom'][0]} / {row['oom'][1]} | "
            f"{_shown_ratio(row['oom_ratio'])} {_mark(row['oom_met'], row['oom_ratio'])} | {slow_shown} | "
            f"{_shown_ratio(row['slowdown_ratio'])} {_mark(row['slowdown_met'], row['slowdown_ratio'])} | "
            f"{wait_shown} |"
        )
    lines += [
        "",
        f"{TP_POOL} pool, tp-mix trace, auto against spread:",
        "",
        "| parameter | x | 8-GPU wait p95 auto / spread | ratio (<= 0.5) |",
        "| --- | ---: | ---: | --- |",
    ]
    for row in tp:
        wait_shown = " / ".join("-" if v is None else f"{v:.0f} s" for v in row["wait8_p95"])
        lines.append(
            f"| {row['parameter']} | {row['factor']:g} | {wait_shown} | "
            f"{_shown_ratio(row['wait8_ratio'])} {_mark(row['wait8_met'], row['wait8_ratio'])} |"
        )
    return "\n".join(lines)


def plot(path: Path, shared: Sequence[dict[str, Any]], tp: Sequence[dict[str, Any]]) -> None:
    """One panel per goal: each parameter's ratio at x0.5, x1 and x1.5, the goal's limit dashed.

    Raises ImportError when matplotlib is missing (the ``sim`` extra)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (
        (shared, "oom_ratio", GOAL_SHARED_OOM_RATIO, "out-of-memory failures, load / count"),
        (shared, "slowdown_ratio", GOAL_SHARED_SLOWDOWN_RATIO, "p95 extra run time, load / count"),
        (tp, "wait8_ratio", GOAL_TP8_WAIT_RATIO, "8-GPU wait p95, auto / spread"),
    )
    figure, axes = plt.subplots(1, len(panels), figsize=(18, 4.6))
    for axis, (rows, key, limit, title) in zip(axes, panels, strict=True):
        baseline = next((r[key] for r in rows if r["parameter"] == "baseline"), None)
        for parameter in dict.fromkeys(r["parameter"] for r in rows if r["parameter"] != "baseline"):
            points = sorted(
                [(1.0, baseline)] + [(r["factor"], r[key]) for r in rows if r["parameter"] == parameter],
            )
            xs = [x for x, y in points if y is not None]
            ys = [y for x, y in points if y is not None]
            axis.plot(xs, ys, marker="o", label=parameter)
        axis.axhline(limit, ls="--", c="k", lw=1, label=f"goal <= {limit:g}")
        axis.set_xlabel("parameter x")
        axis.set_title(title, fontsize=10)
        axis.legend(fontsize=7)
    figure.suptitle("Sensitivity: each goal's ratio with one model parameter scaled (docs/simulator.md)", fontsize=12)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(figure)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpufleet_lab.simulate.sensitivity", description=__doc__)
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--inventory", type=Path, default=DEFAULT_INVENTORY, help="default: %(default)s")
    where.add_argument("--fleet", type=Path, help="a YAML fleet file instead (docs/simulator.md)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--hours", type=float, default=4.0)
    parser.add_argument("--output", type=Path, default=Path("build/sensitivity"))
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    try:
        fleet = fleet_from_yaml(args.fleet) if args.fleet else fleet_from_inventory(args.inventory)
    except (FleetError, OSError) as exc:
        print(f"sensitivity: {exc}", file=sys.stderr)
        return 2
    if not any(n.tenant == SHARED_POOL for n in fleet.nodes) or not any(n.tenant == TP_POOL for n in fleet.nodes):
        print(f"sensitivity: the inventory needs a {SHARED_POOL} and a {TP_POOL} pool", file=sys.stderr)
        return 2
    shared_fleet = _pool(fleet, SHARED_POOL).with_sharing({(SHARED_POOL, SHARED_RESOURCE): SHARED_REPLICAS})
    tp_fleet = _pool(fleet, TP_POOL)
    model = ModelSettings(seed=args.seed)
    shared_policy = Policy(
        shared_resources=((SHARED_RESOURCE, SHARED_REPLICAS),), shared_mem_free_min=SHARED_MEM_FREE_MIN
    )
    started = time.monotonic()
    shared_rows, tp_rows = [], []
    runs = [(SHARED_POOL, case, shared_fleet) for case in _cases(model, shared_policy, shared=True)]
    runs += [(TP_POOL, case, tp_fleet) for case in _cases(model, Policy(), shared=False)]
    for pool, case, pool_fleet in runs:
        try:
            if pool == SHARED_POOL:
                shared_rows.append(_shared_row(pool_fleet, case, args.seed, args.hours))
            else:
                tp_rows.append(_tp_row(pool_fleet, case, args.seed, args.hours))
        except SimulationError as exc:  # e.g. a trace too short for any pod of a small pool
            print(f"sensitivity: {pool}, {case.parameter} x{case.factor:g}: {exc}", file=sys.stderr)
            return 2
        if not args.quiet:
            print(f"{pool}: {case.parameter} x{case.factor:g} ({time.monotonic() - started:.0f} s)", file=sys.stderr)
    table = format_tables(shared_rows, tp_rows)
    print(table)
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "sensitivity.md").write_text(table + "\n", encoding="utf-8")
    document = {"seed": args.seed, "hours": args.hours, "shared": shared_rows, "tp": tp_rows}
    (args.output / "sensitivity.json").write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    if not args.no_plot:
        try:
            plot(args.output / "sensitivity.png", shared_rows, tp_rows)
        except ImportError:
            print("plot skipped: matplotlib is not installed (pip install 'gpufleet-lab[plots]')", file=sys.stderr)
    print(f"\n{time.monotonic() - started:.0f} s; {args.output}/sensitivity.md, .json, .png", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
