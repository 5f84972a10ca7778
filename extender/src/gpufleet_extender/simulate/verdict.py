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
        "spread already leaves most GPUs free at night (the first free device is taken on each node); twice that is "
        "more than the fleet has. Packing frees whole nodes instead",
        STRATEGIES_SECTION,
    ),
    "auto-hot": (
        "auto's mode follows mean device load, which a busy MIG pool of bursty pods keeps low",
        STRATEGIES_SECTION,
    ),
    "auto-cov": ("auto keeps packing while mean device load sits inside its hysteresis band", STRATEGIES_SECTION),
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


def findings(document: Mapping[str, Any]) -> list[str]:
    """One or two sentences on what the run shows, with its figures."""
    if document.get("kind") == "mig-relayout":
        return relayout_findings(document)
    policies: Mapping[str, Mapping[str, Any]] = document.get("policies", {})
    capacity: Mapping[str, Mapping[str, Any]] = document.get("capacity", {})
    replicas = document.get("fleet", {}).get("replicas", 1)
    lines: list[str] = []
    load, count = policies.get("load"), policies.get("count")
    if load and count:
        figures = (
            f"hot placements {load['hot_placements']} vs {count['hot_placements']}, "
            f"node-load CoV {load['load_cov']:.3f} vs {count['load_cov']:.3f}, {load['held']} pod(s) held back"
        )
        # Time-slicing: fleet-wide (--replicas) or per pool (the inventory's sharing, --share TENANT:RESOURCE=N).
        sharing = document.get("fleet", {}).get("sharing") or {}
        shared = f"{replicas} pods per device" if replicas > 1 else ", ".join(f"{k} x{n}" for k, n in sharing.items())
        if not shared:
            lines.append(
                "With exclusive devices (as deployed) the load-aware extender places like counting GPUs "
                f"(load vs count: {figures}): every device with room is idle, so every fitting node scores the same."
            )
        elif load["hot_placements"] < count["hot_placements"]:
            lines.append(
                f"With {shared} time-sliced the extender keeps pods off hot devices (load vs count: {figures})."
            )
        else:
            lines.append(
                f"With {shared} time-sliced the extender does no better than counting (load vs count: {figures})."
            )
    spread, auto = capacity.get("spread"), capacity.get("auto")
    if spread and auto:
        lines.append(
            "Packing (auto vs spread) leaves "
            f"{auto['free_nodes_mean']:.1f} vs {spread['free_nodes_mean']:.1f} whole nodes free "
            f"({_ratio(auto['free_nodes_mean'], spread['free_nodes_mean'])}) and "
            f"{auto['free_gpus_mean']:.1f} vs {spread['free_gpus_mean']:.1f} whole GPUs "
            f"({_ratio(auto['free_gpus_mean'], spread['free_gpus_mean'])}): "
            "it moves free capacity onto fewer nodes more than it frees GPUs."
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
