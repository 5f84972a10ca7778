"""The simulator's verdict in words: what a run's figures say, and which goals it met and why not.

Works on the ``results.json`` document a run writes (``cli.run``), so a report can be worded again from the file
(``make lab``'s closing block does). Each goal that is not met gets the model's reason in one line and a link to the
section of docs/simulator.md that explains it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

DOCS = "docs/simulator.md"
# Sections of docs/simulator.md (GitHub's anchors); the docs test checks that each exists.
GOALS_SECTION = "goals-and-what-the-model-says-about-them"
STRATEGIES_SECTION = "scoring-strategies-spread-pack-and-auto"
SHARED_SECTION = "shared-devices-interference-and-tensor-parallel-pods"
RELAYOUT_SECTION = "mig-re-layout-on-a-day-trace"
GAINS_SECTION = "what-the-fleet-gains"
SENSITIVITY_SECTION = "sensitivity"

# Why each goal can be missed, as the model shows it (docs/simulator.md says it at length), and where.
_WHY_NOT_MET: dict[str, tuple[str, str]] = {
    "load-hot": (
        "with shared devices the pod gets the device the device plugin picks, not the one the extender judged, and "
        "bursts that begin after the last scrape are invisible",
        GOALS_SECTION,
    ),
    "load-cov": (
        "the extender scores the devices a pod would get, never the node's load, so it cannot pull node load "
        "together: node spread stays where counting puts it",
        GOALS_SECTION,
    ),
    "auto-free": (
        "spread already leaves most GPUs free at night; twice that is more than the fleet has. Packing frees whole "
        "nodes instead",
        STRATEGIES_SECTION,
    ),
    "auto-hot": (
        "auto's mode follows mean device load, which a busy MIG pool of bursty pods keeps low",
        STRATEGIES_SECTION,
    ),
    "auto-cov": ("auto keeps packing while mean device load sits inside its hysteresis band", STRATEGIES_SECTION),
    "shared-oom": (
        "a device can fill after the last scrape (in-flight pods count, their memory does not), and a node is "
        "judged by the share of memory free, not by what the new pod needs",
        GAINS_SECTION,
    ),
    "shared-slowdown": (
        "the plugin shares the devices with the fewest pods, whatever the node, so counting already spreads pods "
        "over devices; load-awareness only moves them off devices whose pods ask for more",
        GAINS_SECTION,
    ),
    "shared-hot": (
        "the device plugin hands out the device with the fewest pods, so shared devices rarely get hot under any "
        "policy",
        SHARED_SECTION,
    ),
    "shared-cov": (
        "the filter holds pods back from nodes where the plugin might hand out a busy device, and the score ranks "
        "nodes by the few devices the pod may get, not by node load: both spread node load less evenly than counting",
        SHARED_SECTION,
    ),
    "tp-wait-8": ("spread fills every node a little and leaves no node with 8 free GPUs", SHARED_SECTION),
    "tp-wait-1": ("packing makes small pods wait for room on the nodes it fills", SHARED_SECTION),
    "interference": (
        "4- and 8-GPU pods fill their nodes and leave the interference term nothing to choose; for 1- and 2-GPU pods "
        "the node with the quietest neighbours is the one counting picks too",
        SHARED_SECTION,
    ),
    "relayout-disturbed": (
        "a pod held an instance the advice destroyed: the advisor's first rule (allocated instances stay) failed",
        RELAYOUT_SECTION,
    ),
    "relayout-minimum": (
        "a re-layout destroyed more instances than any placement of its target must while keeping the held ones",
        RELAYOUT_SECTION,
    ),
    "relayout-pending": (
        "pods wait for the next re-layout (up to T minutes), and a GPU changes shape only around the instances pods "
        "still hold",
        RELAYOUT_SECTION,
    ),
    "relayout-gpus": (
        "a re-layout reshapes only free instances: held ones pin each GPU's shape, and new pods wait up to T minutes "
        "for the next re-layout, so the pool needs headroom static sizing does not",
        RELAYOUT_SECTION,
    ),
}


def _ratio(a: float, b: float) -> str:
    return f"x{a / b:.2f}" if b else "n/a"


def _at(section: str) -> str:
    return f"({DOCS}#{section})"


def _shared_pools(document: Mapping[str, Any]) -> list[tuple[str, str, int]]:
    """(pool, resource, replicas) of every pool the run time-sliced."""
    shared = []
    for key, replicas in (document.get("fleet", {}).get("sharing") or {}).items():
        pool, _, resource = key.partition(":")
        if replicas > 1:
            shared.append((pool, resource.removeprefix("nvidia.com/mig-"), replicas))
    return sorted(shared)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"+{max(0.0, value):.1%}"


def gains(document: Mapping[str, Any]) -> list[str]:
    """What the fleet gains on this run, in figures a user feels, each with the docs section that defines them:
    out-of-memory failures avoided and slowdown cut on shared devices, wait cut for 8-GPU pods, whole nodes kept
    free, GPUs saved by re-layout. Empty when the run shows no gain."""
    if document.get("kind") == "mig-relayout":
        return _relayout_gains(document)
    pools: Mapping[str, Mapping[str, Any]] = document.get("pools", {})
    lines: list[str] = []
    load, count = pools.get("load"), pools.get("count")
    for pool, resource, replicas in _shared_pools(document) if load and count else []:
        assert load is not None and count is not None
        oom_load, oom_count = load["oom"].get(pool, 0), count["oom"].get(pool, 0)
        p95_load, p95_count = load["p95_slowdown"].get(pool), count["p95_slowdown"].get(pool)
        if oom_load < oom_count or (p95_load is not None and p95_count is not None and p95_load < p95_count):
            lines.append(
                f"{pool}, {resource} time-sliced x{replicas}: {oom_load} pod(s) failed with out-of-memory with "
                f"load-aware placement against {oom_count} with counting; p95 slowdown {_pct(p95_load)} against "
                f"{_pct(p95_count)} ({_ratio(p95_load or 0.0, p95_count or 0.0)}), mean "
                f"{_pct(load['mean_slowdown'].get(pool))} against {_pct(count['mean_slowdown'].get(pool))} "
                + _at(GAINS_SECTION)
            )
    auto, spread = pools.get("auto"), pools.get("spread")
    if auto and spread:
        for pool, waits in sorted(spread["wait_p95_by_size"].items()):
            packed, spread_wait = auto["wait_p95_by_size"].get(pool, {}).get("8"), waits.get("8")
            if packed is not None and spread_wait is not None and packed < spread_wait:
                lines.append(
                    f"{pool}: 8-GPU pods wait {packed:.0f} s at p95 when auto packs the pool against "
                    f"{spread_wait:.0f} s when it spreads " + _at(SHARED_SECTION)
                )
    capacity: Mapping[str, Mapping[str, Any]] = document.get("capacity", {})
    spread_cap, auto_cap = capacity.get("spread"), capacity.get("auto")
    quiet = document.get("trace", {}).get("scenario") == "quiet-night"
    if quiet and spread_cap and auto_cap and auto_cap["free_nodes_mean"] > spread_cap["free_nodes_mean"]:
        lines.append(
            f"On a quiet night packing (auto) keeps {auto_cap['free_nodes_mean']:.1f} whole nodes free against "
            f"{spread_cap['free_nodes_mean']:.1f} spreading "
            f"({_ratio(auto_cap['free_nodes_mean'], spread_cap['free_nodes_mean'])}), room for a large job or a "
            "MIG repartition " + _at(STRATEGIES_SECTION)
        )
    return lines


def limits(document: Mapping[str, Any]) -> list[str]:
    """Where load-awareness does not help on this run, and why (or what it costs), with the figures."""
    if document.get("kind") == "mig-relayout":
        return []
    policies: Mapping[str, Mapping[str, Any]] = document.get("policies", {})
    pools: Mapping[str, Mapping[str, Any]] = document.get("pools", {})
    lines: list[str] = []
    load, count = policies.get("load"), policies.get("count")
    shared = _shared_pools(document)
    if load and count and not shared and document.get("fleet", {}).get("replicas", 1) == 1:
        lines.append(
            "With exclusive devices (as deployed) the load-aware extender places like counting GPUs "
            f"(load vs count: hot placements {load['hot_placements']} vs {count['hot_placements']}, node-load CoV "
            f"{load['load_cov']:.3f} vs {count['load_cov']:.3f}, {load['held']} pod(s) held back): every device "
            "with room is idle, so every fitting node scores the same " + _at(GOALS_SECTION)
        )
    load_pools, count_pools = pools.get("load"), pools.get("count")
    if load and load_pools and count_pools:
        for pool, _, _ in shared:
            wait_load = load_pools["wait_p95_by_size"].get(pool, {}).get("1")
            wait_count = count_pools["wait_p95_by_size"].get(pool, {}).get("1")
            lines.append(
                f"What it costs in {pool}: {load['held']} pod(s) waited for a node on which every device the plugin "
                f"may hand out was cool with memory free; wait p95 {wait_load or 0:.0f} s against "
                f"{wait_count or 0:.0f} s counting " + _at(GAINS_SECTION)
            )
    spread, counted = pools.get("spread"), pools.get("count")
    if spread and counted and document.get("model", {}).get("interference_alpha", 0) > 0:
        for pool, value in sorted(spread["mean_slowdown"].items()):
            reference = counted["mean_slowdown"].get(pool)
            if value is None or reference is None or pool not in spread["wait_p95_by_size"]:
                continue
            if "8" in spread["wait_p95_by_size"][pool] or "4" in spread["wait_p95_by_size"][pool]:
                lines.append(
                    f"Interference in {pool}: mean slowdown {_pct(value)} with the interference term against "
                    f"{_pct(reference)} counting; 4- and 8-GPU pods fill their nodes and leave it nothing to choose "
                    + _at(SHARED_SECTION)
                )
    capacity: Mapping[str, Mapping[str, Any]] = document.get("capacity", {})
    spread_cap, auto_cap = capacity.get("spread"), capacity.get("auto")
    quiet = document.get("trace", {}).get("scenario") == "quiet-night"
    if quiet and spread_cap and auto_cap:
        lines.append(
            f"Packing frees whole GPUs only a little ({auto_cap['free_gpus_mean']:.1f} vs "
            f"{spread_cap['free_gpus_mean']:.1f}, {_ratio(auto_cap['free_gpus_mean'], spread_cap['free_gpus_mean'])}): "
            "spreading already leaves most GPUs free at night " + _at(STRATEGIES_SECTION)
        )
    return lines


def findings(document: Mapping[str, Any]) -> list[str]:
    """The run in words: its gains first, then where load-awareness does not help and why."""
    if document.get("kind") == "mig-relayout":
        return relayout_findings(document)
    return gains(document) + limits(document)


def _relayout_gains(document: Mapping[str, Any]) -> list[str]:
    """GPUs saved and pending pod-minutes cut by re-laying the MIG pools out every T minutes, pools summed."""
    pools = document.get("pools", {})
    static, relayout = pools.get("static", {}), pools.get("relayout", {})
    lines = []
    pending = sum(r["pending_pod_minutes"] for r in relayout.values())
    pending_static = sum(s.get("pending_pod_minutes", 0) for s in static.values())
    if relayout and pending < pending_static:
        every = document.get("parameters", {}).get("every_minutes")
        lines.append(
            f"MIG pools re-laid out every {every:g} min: {pending:,.0f} pending pod-minutes against "
            f"{pending_static:,.0f} with static layouts " + _at(RELAYOUT_SECTION)
        )
    needed = document.get("gpus_needed") or {}
    after, before = needed.get("relayout", {}), needed.get("static", {})
    if after and all(v is not None for v in (*after.values(), *before.values())):
        total, total_static = sum(after.values()), sum(before.values())
        if total < total_static:
            lines.append(
                f"GPUs needed for no wait above {document['parameters']['wait_bound_minutes']:g} min: {total} with "
                f"re-layout against {total_static} static ({_ratio(total, total_static)}) " + _at(RELAYOUT_SECTION)
            )
    return lines


def relayout_findings(document: Mapping[str, Any]) -> list[str]:
    """The MIG re-layout run (simulate/relayout.py): pending pod-minutes and re-layout work, per tenant pool."""
    pools = document.get("pools", {})
    static, relayout = pools.get("static", {}), pools.get("relayout", {})
    every = document.get("parameters", {}).get("every_minutes")
    lines = []
    for tenant in sorted(relayout):
        s, r = static.get(tenant, {}), relayout[tenant]
        lines.append(
            f"{tenant}: pending pod-minutes {r['pending_pod_minutes']:,.0f} with a re-layout every {every:g} min vs "
            f"{s.get('pending_pod_minutes', 0):,.0f} static (wait p95 {r['wait_p95_s']:.0f} s vs "
            f"{s.get('wait_p95_s', 0):.0f} s); {r['relayouts']} re-layouts destroyed {r['destroyed']} free "
            f"instances and created {r['created']}, {r['disturbed']} running pod(s) disturbed."
        )
    needed = document.get("gpus_needed") or {}
    if needed:
        limit = document.get("parameters", {}).get("search_limit_gpus")

        def shown(n: int | None) -> str:
            return str(n) if n is not None else f"more than {limit}"

        lines.append(
            "GPUs needed for no wait above "
            f"{document['parameters']['wait_bound_minutes']:g} min, re-layout vs static: "
            + ", ".join(
                f"{t} {shown(needed['relayout'].get(t))} vs {shown(needed['static'].get(t))}"
                for t in sorted(needed.get("relayout", {}))
            )
            + "."
        )
    return lines


def goal_lines(document: Mapping[str, Any]) -> list[str]:
    """`met` / `NOT MET` (with the reason and a docs link) per judged goal; goals not judged on this trace are left
    out."""
    lines = []
    for goal in document.get("goals", []):
        if goal["passed"] is None:
            continue
        if goal["passed"]:
            lines.append(f"met      {goal['goal']}: {goal['detail']}")
            continue
        lines.append(f"NOT MET  {goal['goal']}: {goal['detail']}")
        lines.append(f"         why: {why_not_met(goal.get('key', ''))}")
    return lines


def why_not_met(key: str) -> str:
    """The model's reason a goal is missed, and the docs section that shows it."""
    why, section = _WHY_NOT_MET.get(key, ("see the goals' section", GOALS_SECTION))
    return f"{why} ({DOCS}#{section})"


def goals_missed(document: Mapping[str, Any]) -> int:
    return sum(1 for goal in document.get("goals", []) if goal["passed"] is False)
