"""``gpufleet-lab simulate``: compare placement policies on a fleet and a trace (docs/simulator.md).

The extender's main CLI registers this subcommand with ``add_arguments`` and calls ``run``; ``main`` runs it
on its own (``python -m gpufleet_lab.simulate``).

Exit codes: 0 the run completed (goal checks are printed, not enforced unless ``--check``); 1 ``--check`` and a
goal failed; 2 bad input (fleet, trace, settings), with the reason on stderr.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpufleet_extender.config import SettingsError, load_settings
from gpufleet_extender.scoring import Policy

from gpufleet_lab.simulate.capacity import (
    CAPACITY_LEGEND,
    CapacityProbe,
    CapacitySummary,
    format_capacity,
    plot_capacity,
    strategy_goal_checks,
    summarise_capacity,
)
from gpufleet_lab.simulate.fleet import (
    DEFAULT_INVENTORY,
    Fleet,
    FleetError,
    fleet_from_inventory,
    fleet_from_yaml,
    parse_sharing,
)
from gpufleet_lab.simulate.generator import SCENARIO_WORKLOADS, SCENARIOS, generate_trace
from gpufleet_lab.simulate.metrics import PolicySummary, goal_checks, summarise
from gpufleet_lab.simulate.model import (
    TIMESLICE_EFFICIENCY,
    DeviceChoice,
    ModelSettings,
    RunResult,
    SimulationError,
    simulate,
)
from gpufleet_lab.simulate.policies import EXTENDER_POLICIES, POLICIES, STRATEGY_POLICIES, make_policy
from gpufleet_lab.simulate.pools import (
    TP_SCENARIO,
    format_pools,
    plot_pools,
    pool_figures,
    pool_goal_checks,
    whole_gpu_pools,
)
from gpufleet_lab.simulate.report import LEGEND, format_goals, format_table, plot_node_load, write_json
from gpufleet_lab.simulate.trace import Trace, TraceError, load_trace, write_trace
from gpufleet_lab.simulate.verdict import findings

HELP = "compare count-based, random and load-aware placement (spread, pack, auto) on a fleet and a workload trace"


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
    return value


def _policies(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in POLICIES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown policy {unknown or text!r} (known: {', '.join(POLICIES)})")
    return names


def _share(text: str) -> tuple[str, str, int]:
    """``TENANT:RESOURCE=N`` (``finnlp:1g.10gb=4``): time-slice RESOURCE x N in TENANT's pool."""
    pool, _, rest = text.partition(":")
    resource, _, replicas = rest.partition("=")
    if not (pool and resource and replicas.isdigit() and int(replicas) >= 1):
        raise argparse.ArgumentTypeError(f"expected TENANT:RESOURCE=N, e.g. finnlp:1g.10gb=4, got {text!r}")
    return pool, resource, int(replicas)


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be within 0..1, got {text}")
    return value


def _non_negative(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    fleet = parser.add_mutually_exclusive_group()
    fleet.add_argument(
        "--inventory",
        type=Path,
        default=DEFAULT_INVENTORY,
        help="Ansible inventory whose GPU hosts' mig_partition_config make the fleet (default: %(default)s)",
    )
    fleet.add_argument("--fleet", type=Path, help="YAML fleet file instead of an inventory")
    workload = parser.add_mutually_exclusive_group()
    workload.add_argument("--trace", type=Path, help="workload trace (.csv or .jsonl) instead of a generated one")
    workload.add_argument(
        "--scenario", choices=sorted(SCENARIOS), default="mixed", help="generated trace (default: %(default)s)"
    )
    parser.add_argument("--seed", type=int, default=1, help="seed of the generated trace and random-fit (default: 1)")
    parser.add_argument("--hours", type=_positive, default=4.0, help="length of a generated trace (default: 4)")
    parser.add_argument("--write-trace", type=Path, help="also save the trace used (.jsonl or .csv)")
    parser.add_argument(
        "--policies",
        type=_policies,
        help=f"comma-separated, compared in one run, from {','.join(POLICIES)} (default: "
        f"{','.join(STRATEGY_POLICIES)} for the quiet-night and peak-hour scenarios, "
        f"else {','.join(EXTENDER_POLICIES)})",
    )
    parser.add_argument(
        "--config", type=Path, help="extender settings file (thresholds, weights, INFLIGHT_MAX_SECONDS); env wins"
    )
    parser.add_argument(
        "--scrape-interval", type=_positive, default=15.0, help="seconds between metric samples (default: 15)"
    )
    parser.add_argument(
        "--replicas",
        type=int,
        help="pods sharing one device (time-slicing replicas); default: the fleet's, 1 (exclusive) for inventories",
    )
    parser.add_argument(
        "--share",
        type=_share,
        action="append",
        default=[],
        metavar="TENANT:RESOURCE=N",
        help="time-slice a pool's resource N ways (repeatable; adds to the inventory's per-pool sharing)",
    )
    parser.add_argument(
        "--interference",
        type=_non_negative,
        default=0.0,
        metavar="ALPHA",
        help="slowdown model: a pod runs at 1/(1 + ALPHA x load of its node's other devices) (default: 0, off)",
    )
    parser.add_argument(
        "--device-choice",
        type=DeviceChoice,
        choices=list(DeviceChoice),
        default=DeviceChoice.PLUGIN,
        help="devices a pod gets on its node: the deployed NVIDIA device plugin's rule (plugin; distributed is its "
        "earlier name), the same with ties by index (lowest-index), or the least-loaded (default: %(default)s)",
    )
    parser.add_argument(
        "--timeslice-efficiency",
        type=_fraction,
        default=TIMESLICE_EFFICIENCY,
        metavar="E",
        help="time-slicing model: the useful share of a shared device's time while pods take turns on it; a pod runs "
        "at min(1, E / the utilisation its device's pods ask) (default: %(default)s; 0 = off)",
    )
    parser.add_argument(
        "--output", type=Path, default=Path("build/sim"), help="directory for results.json and the plot"
    )
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG")
    parser.add_argument("--check", action="store_true", help="exit 1 when a goal check fails")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")


class _Progress:
    """One line per policy on stderr; redrawn in place on a terminal."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.tty = sys.stderr.isatty()
        self.label = ""
        self.started = 0.0

    def start(self, label: str) -> None:
        self.label, self.started = label, time.monotonic()
        if self.enabled and self.tty:
            sys.stderr.write(f"\rsimulating {label}: 0%")
            sys.stderr.flush()

    def update(self, fraction: float) -> None:
        if self.enabled and self.tty:
            sys.stderr.write(f"\rsimulating {self.label}: {fraction:4.0%}")
            sys.stderr.flush()

    def done(self) -> None:
        if self.enabled:
            end = "\r" if self.tty else ""
            sys.stderr.write(f"{end}simulating {self.label}: done in {time.monotonic() - self.started:.1f}s\n")
            sys.stderr.flush()


def _load_inputs(args: argparse.Namespace) -> tuple[Fleet, Trace, Policy, ModelSettings]:
    settings = load_settings(args.config) if args.config else load_settings()
    fleet = fleet_from_yaml(args.fleet) if args.fleet else fleet_from_inventory(args.inventory)
    if args.replicas is not None:
        fleet = fleet.with_replicas(args.replicas)
    if args.share:
        sharing = {}
        for tenant, resource, replicas in args.share:
            sharing.update(parse_sharing(tenant, {resource: replicas}, "--share"))
        fleet = fleet.with_sharing(sharing)
    hours = args.hours
    trace = (
        load_trace(args.trace)
        if args.trace
        else generate_trace(
            fleet,
            args.seed,
            hours * 3600,
            SCENARIOS[args.scenario],
            args.scenario,
            SCENARIO_WORKLOADS.get(args.scenario),
        )
    )
    model = ModelSettings(
        scrape_interval=args.scrape_interval,
        device_choice=args.device_choice,
        inflight_max_seconds=settings.INFLIGHT_MAX_SECONDS,
        interference=args.interference,
        timeslice_efficiency=args.timeslice_efficiency,
        seed=args.seed,
    )
    policy = Policy.from_settings(settings)
    if not policy.shared_resources and fleet.shared_resources():
        # As deployed: the gpu_extender role renders the pools' sharing into SHARED_RESOURCES.
        policy = dataclasses.replace(policy, shared_resources=tuple(fleet.shared_resources().items()))
    return fleet, trace, policy, model


def _describe(
    fleet: Fleet, trace: Trace, policy: Policy, model: ModelSettings, scenario: str | None = None
) -> dict[str, Any]:
    devices: dict[str, int] = {}
    for node in fleet.nodes:
        for device in node.devices:
            devices[device.resource] = devices.get(device.resource, 0) + 1
    return {
        "fleet": {
            "source": fleet.source,
            "nodes": len(fleet.nodes),
            "tenants": {t: sum(1 for n in fleet.nodes if n.tenant == t) for t in fleet.tenants()},
            "devices": dict(sorted(devices.items())),
            "replicas": fleet.replicas,
            "sharing": {f"{tenant}:{resource}": n for (tenant, resource), n in sorted(fleet.sharing.items())},
        },
        "trace": {
            "source": trace.source,
            "scenario": scenario,  # the generated trace's; None for a trace file
            "pods": len(trace.pods),
            "last_arrival_s": trace.pods[-1].arrival,
        },
        "model": {
            "scrape_interval_s": model.scrape_interval,
            "device_choice": model.device_choice.value,
            "interference_alpha": model.interference,
            "timeslice_efficiency": model.timeslice_efficiency,
            "inflight_max_s": model.inflight_max_seconds,
            "drain_s": model.drain_seconds,
        },
        "extender": {
            "gpu_util_threshold": policy.gpu_util_threshold,
            "mem_util_threshold": policy.mem_util_threshold,
            "weight_gpu_util": policy.weight_gpu_util,
            "weight_mem_util": policy.weight_mem_util,
            "scoring_strategy": policy.strategy.value,  # the `load` policy's; spread/pack/auto force their own
            "pack_target_util": policy.pack_target_util,
            "auto_pack_below": policy.auto_pack_below,
            "auto_hysteresis": policy.auto_hysteresis,
            "shared_resources": dict(policy.shared_resources),
            "interference_weight": policy.interference_weight,
            "shared_mem_free_min": policy.shared_mem_free_min,
        },
    }


def _default_policies(args: argparse.Namespace) -> list[str]:
    if args.policies:
        policies: list[str] = args.policies
        return policies
    if not args.trace and args.scenario in ("quiet-night", "peak-hour"):
        return list(STRATEGY_POLICIES)
    if not args.trace and args.scenario == TP_SCENARIO:
        return ["count", "spread", "auto"]
    return list(EXTENDER_POLICIES)


def run(args: argparse.Namespace) -> int:
    names = _default_policies(args)
    scenario = None if args.trace else args.scenario
    try:
        fleet, trace, policy, model = _load_inputs(args)
        if args.write_trace:
            write_trace(trace, args.write_trace)
        progress = _Progress(not args.quiet)
        results: list[RunResult] = []
        capacities: dict[str, CapacitySummary] = {}
        probe = CapacityProbe()
        for name in names:
            progress.start(name)
            placement = make_policy(name, args.seed)
            result = simulate(fleet, trace, placement, policy, model, probes=(probe,), progress=progress.update)
            results.append(result)
            by_mode = getattr(placement, "placements_by_mode", None)  # load policies only
            capacities[name] = summarise_capacity(result, trace.pods[-1].arrival, by_mode)
            progress.done()
    except (SettingsError, FleetError, TraceError, SimulationError, OSError) as exc:
        print(f"gpufleet-lab simulate: {exc}", file=sys.stderr)
        return 2
    summaries: dict[str, PolicySummary] = {r.policy: summarise(r) for r in results}
    strategies_ran = any(name in STRATEGY_POLICIES for name in names)
    # Each set of goals is shown when its policies ran (both when neither did).
    checks = goal_checks(summaries, fleet.replicas) if "load" in names or not strategies_ran else []
    strategy_checks = strategy_goal_checks(summaries, capacities, scenario) if strategies_ran else []
    figures = {r.policy: pool_figures(r) for r in results}
    shared_pools = sorted({str(tenant) for (tenant, _), n in fleet.sharing.items() if n > 1 and tenant})
    pool_checks = pool_goal_checks(figures, shared_pools, whole_gpu_pools(results), scenario, model.interference)
    description = _describe(fleet, trace, policy, model, scenario)
    fleet_line = ", ".join(f"{t} {n} nodes" for t, n in description["fleet"]["tenants"].items())
    print(f"Fleet: {fleet.source} ({fleet_line}; {fleet.replicas} pod(s) per device)")
    print(f"Trace: {trace.source} ({len(trace.pods)} pods)")
    print(f"Model: scrape every {model.scrape_interval:g}s, device choice {model.device_choice.value}\n")
    print(format_table(list(summaries.values())))
    print(f"\n{LEGEND}\n")
    print(format_capacity(list(capacities.values())))
    print(f"\n{CAPACITY_LEGEND}")
    if checks:
        print(f"\nGoals of the load-aware extender (judged on the mixed trace):\n{format_goals(checks)}")
    if strategy_checks:
        print(f"\nGoals of the scoring strategies (judged on quiet-night, peak-hour):\n{format_goals(strategy_checks)}")
    print(f"\nPer pool:\n{format_pools(list(figures.values()))}")
    if pool_checks:
        print(f"\nGoals for shared devices, tensor-parallel pods and interference:\n{format_goals(pool_checks)}")
    if not fleet.shared_resources():
        print(
            "\nDevices are exclusive (no time-slicing, as the collection deploys): every device with room is idle, so"
            "\nspread scores all fitting nodes alike. pack and auto still choose the node (by its devices' load), which"
            "\ndecides which nodes and MIG GPUs stay free; the count of free whole GPUs in an unpartitioned pool does"
            "\nnot depend on placement. To model shared devices: --replicas 2 --device-choice least-loaded"
            "\n(docs/simulator.md)."
        )
    args.output.mkdir(parents=True, exist_ok=True)
    document = {
        **description,
        "policies": {name: s.to_json() for name, s in summaries.items()},
        "capacity": {name: c.to_json() for name, c in capacities.items()},
        "goals": [c.to_json() for c in (*checks, *strategy_checks, *pool_checks)],
        "pools": {name: f.to_json() for name, f in figures.items()},
    }
    if not args.no_plot:
        plot = args.output / "node_load.png"
        try:
            plot_node_load(plot, results, summaries)
            capacity_plot = args.output / "free_capacity.png"
            plot_capacity(capacity_plot, results, trace.pods[-1].arrival)
            document["plot"] = plot.name
            document["capacity_plot"] = capacity_plot.name
            pools_plot = args.output / "pools.png"
            plot_pools(pools_plot, list(figures.values()), pool_checks, shared_pools)
            document["pools_plot"] = pools_plot.name
            print(f"\nPlots: {plot}, {capacity_plot}, {pools_plot}")
        except ImportError:
            print("\nPlot skipped: matplotlib is not installed (pip install 'gpufleet-lab[plots]')", file=sys.stderr)
    said = findings(document)
    if said:
        print("\nVerdict: " + "\n         ".join(said))
    write_json(args.output / "results.json", document)
    print(f"Results: {args.output / 'results.json'}")
    if args.check and any(c.passed is False for c in (*checks, *strategy_checks, *pool_checks)):
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpufleet-lab simulate", description=HELP)
    add_arguments(parser)
    return run(parser.parse_args(argv))
