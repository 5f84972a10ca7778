"""Pure planning: (current GPU state, target, NVML catalog) -> Plan. No NVML calls here.

Placement (placement.py, where the placement rules live) is an exact search over the placements NVML reports as
possible for each profile id, constrained by the memory slices (placements may not overlap) and the compute slices
(their sum may not exceed the GPU's). It is not greedy: some layouts only fit when a profile is placed away from
slot 0 (e.g. 1g.10gb + 4g.40gb: 4g.40gb can only start at 0, so the 1g.10gb must go elsewhere).

Minimal disruption: among the existing instances whose profile is still wanted, keep the largest set (busy ones
first) that still leaves room for the instances to create; destroy only the rest, create the missing ones at explicit
placements.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

from .exceptions import BusyInstanceError, SpecError
from .names import parse_profile_name
from .nvml import ProfileInfo  # re-exported: the catalog is made of what NVML reports
from .placement import Catalog, Slot, describe_counts, search_placement, totals_problem
from .spec import GpuTarget

# Catalog, Slot, describe_counts and search_placement live in placement.py; re-exported for the planner's callers.
__all__ = [
    "Catalog",
    "GpuPlan",
    "GpuState",
    "Instance",
    "ProfileInfo",
    "Slot",
    "describe_counts",
    "plan_gpu",
    "search_placement",
    "validate_target",
]


@dataclass(frozen=True)
class Instance:
    """An existing GPU instance (with its compute instances collapsed: we manage one full-size CI per GI)."""

    gi_id: int
    profile: str
    start: int
    size: int
    pids: tuple[int, ...] = ()
    complete: bool = True  # has its full-size compute instance
    uuid: str | None = None  # MIG device UUID, when it has a CI
    compute_instance_ids: tuple[int, ...] = (0,)  # destroyed before the GPU instance itself


@dataclass
class GpuState:
    """What the planner needs to know about one GPU (read through the NVML interface)."""

    index: int
    uuid: str
    name: str
    mig_current: bool
    mig_pending: bool
    instances: list[Instance] = field(default_factory=list)
    gpu_pids: tuple[int, ...] = ()  # processes on the GPU outside any MIG instance


@dataclass
class GpuPlan:
    index: int
    uuid: str
    name: str
    mig_before: bool
    mig_after: bool
    set_mode: bool  # MIG mode must be (re)set
    before: list[Slot]
    after: list[Slot]
    destroy: list[Instance]
    create: list[Slot]
    gpu_pids: tuple[int, ...] = ()  # processes on the GPU outside any instance (they block a mode change)

    @property
    def changed(self) -> bool:
        return self.set_mode or bool(self.destroy) or bool(self.create)

    @property
    def disruptive(self) -> bool:
        """Whether applying takes GPUs away from running work: an instance destroyed, or MIG switched (a reset).

        Creating instances in free slices is not disruptive.
        """
        return bool(self.destroy) or self.mig_before != self.mig_after

    def actions(self) -> list[dict[str, Any]]:
        """Instance actions in execution order: all destroys, then creates by start."""
        return [{"op": "destroy", "profile": i.profile, "start": i.start} for i in self.destroy] + [
            {"op": "create", "profile": s.profile, "start": s.start} for s in self.create
        ]


def validate_target(target_counts: dict[str, int], catalog: Catalog, where: str) -> list[Slot]:
    """Check a requested layout against the GPU's catalog; return one valid placement or raise SpecError.

    The message says which constraint failed: unknown profile, a profile's maximum, compute slices, memory slices,
    or (all totals fitting) the placement geometry.
    """
    partial = sorted(n for n in target_counts if n not in catalog.by_name and _is_partial_compute(n))
    if partial:
        raise SpecError(
            f"{where}: {', '.join(partial)}: compute-instance profiles smaller than their GPU instance are not "
            "supported (nvidia_mig creates one compute instance spanning each GPU instance); use the "
            "<G>g.<GB>gb form"
        )
    unknown = sorted(n for n in target_counts if n not in catalog.by_name)
    if unknown:
        raise SpecError(
            f"{where}: unknown MIG profile(s) {', '.join(unknown)} for this GPU; valid profiles: "
            f"{', '.join(catalog.names())}"
        )
    problem = totals_problem(target_counts, catalog)
    if problem:
        raise SpecError(f"{where}: {problem}")
    layout = search_placement(target_counts, catalog)
    if layout is None:
        options = "; ".join(
            f"{n} at {'/'.join(str(s) for s, _size in catalog.by_name[n].placements)}" for n in sorted(target_counts)
        )
        raise SpecError(
            f"{where}: no valid placement for {describe_counts(target_counts)} (totals fit, but the possible "
            f"placements overlap: {options})"
        )
    return layout


def _is_partial_compute(name: str) -> bool:
    try:
        return parse_profile_name(name).partial_compute
    except ValueError:
        return False


def choose_kept(current: list[Instance], wanted: dict[str, int], catalog: Catalog) -> tuple[list[Instance], list[Slot]]:
    """Largest set of existing instances to keep (busy ones first), and the slots to create around them.

    Candidates are complete instances of a wanted profile. Subsets are tried from most busy kept, then most kept;
    the first one that leaves a valid placement for the rest wins. A GPU holds at most 7 instances, so this is at most
    128 placement searches of a few dozen nodes each.
    """
    candidates = [i for i in current if i.complete and i.profile in wanted]
    most_busy = sum(1 for i in candidates if i.pids)
    best: tuple[tuple[int, int], list[Instance], list[Slot]] | None = None
    for size in range(len(candidates), -1, -1):
        if best is not None and best[0][1] > size and best[0][0] == most_busy:
            # A larger kept set with every busy candidate was found: smaller sets cannot beat it. Without every busy
            # one, a smaller set may still keep more busy instances (busy first), so the search goes on.
            break
        for subset in combinations(candidates, size):
            kept_counts = Counter(i.profile for i in subset)
            if any(kept_counts[n] > wanted[n] for n in kept_counts):
                continue
            busy = sum(1 for i in subset if i.pids)
            score = (busy, size)
            if best is not None and score <= best[0]:
                continue
            remaining = {n: wanted[n] - kept_counts.get(n, 0) for n in wanted}
            remaining = {n: c for n, c in remaining.items() if c}
            fixed = [Slot(i.profile, i.start, i.size) for i in subset]
            created = search_placement(remaining, catalog, fixed)
            if created is not None:
                best = (score, list(subset), created)
    if best is None:  # cannot happen once validate_target passed (keeping nothing is a full placement)
        raise SpecError("no valid placement")
    return best[1], best[2]


def plan_gpu(state: GpuState, target: GpuTarget, catalog: Catalog, force: bool) -> GpuPlan:
    """Plan one GPU. Raises SpecError (impossible layout) or BusyInstanceError (busy instance, no force)."""
    where = f"GPU {state.index} ({state.name})"
    before = sorted((Slot(i.profile, i.start, i.size) for i in state.instances), key=lambda s: s.start)
    mig_before = state.mig_current
    # A pending change in the other direction must be overridden, so compare the pending mode too.
    set_mode = state.mig_current != target.mig_enabled or state.mig_pending != target.mig_enabled
    if target.mig_enabled:
        validate_target(target.counts, catalog, f"config[{target.entry}]: {where}")  # the entry to fix, and the GPU
        if state.mig_current:
            kept, create = choose_kept(state.instances, target.counts, catalog)
        else:
            # MIG off now: nothing exists yet; any instance NVML still lists will vanish with the mode change.
            kept, create = [], search_placement(target.counts, catalog) or []
        kept_ids = {i.gi_id for i in kept}
        destroy = [i for i in state.instances if i.gi_id not in kept_ids] if state.mig_current else []
        after = sorted([Slot(i.profile, i.start, i.size) for i in kept] + create, key=lambda s: s.start)
    else:
        destroy = list(state.instances) if state.mig_current else []
        create, after = [], []
    destroy.sort(key=lambda i: i.start)
    plan = GpuPlan(
        state.index,
        state.uuid,
        state.name,
        mig_before,
        target.mig_enabled,
        set_mode,
        before,
        after,
        destroy,
        create,
        state.gpu_pids,
    )
    if not force:
        check_not_busy(plan)
    return plan


BUSY_HINT = "; stop them or set force=true"


def busy_problems(plan: GpuPlan) -> list[str]:
    """What in the plan would disturb running processes: busy instances to destroy, a mode change under processes."""
    problems = [
        f"GPU {plan.index}: instance {i.profile} at slice {i.start} (GPU instance {i.gi_id}"
        f"{', ' + i.uuid if i.uuid else ''}) has running processes (PIDs {', '.join(map(str, i.pids))})"
        for i in plan.destroy
        if i.pids
    ]
    if plan.set_mode and plan.gpu_pids:
        problems.append(
            f"GPU {plan.index}: MIG mode must change but processes run on the GPU "
            f"(PIDs {', '.join(map(str, plan.gpu_pids))})"
        )
    return problems


def check_not_busy(plan: GpuPlan) -> None:
    """Refuse (before any write) to destroy busy instances or to switch the mode of a GPU with processes."""
    problems = busy_problems(plan)
    if problems:
        raise BusyInstanceError("; ".join(problems) + BUSY_HINT)
