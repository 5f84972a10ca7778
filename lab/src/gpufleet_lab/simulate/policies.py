"""Placement policies: which node a pod goes to, among the nodes of its pool that fit it by count.

Every policy gets the same candidates - the tenant's nodes with enough free devices, which is what
kube-scheduler's own filters leave - and returns a node name, or None to leave the pod waiting.

- ``count``: the best a count-only scheduler does: the node least allocated in the pod's GPU resource
  once the pod is on it (NodeResourcesFit's LeastAllocated with the GPU resource in its scoring), ties by name.
- ``random-fit``: any fitting node, seeded.
- ``load`` / ``load-no-inflight``: the extender: ``scoring.evaluate_nodes`` filters and scores the candidates
  from the last metrics sample, with in-flight accounting (pods bound since that sample count as assumed
  load) on or off. kube-scheduler adds the extender's score x weight x 10 to its plugins' scores; with the
  kube_scheduler role's weight 3 one extender point outweighs NodeResourcesFit's whole range, so the node is
  the highest extender score, ties by least allocated (the ``count`` rule), then by name. ``load`` scores with
  the settings' ``SCORING_STRATEGY`` (spread unless ``--config`` says otherwise): what a deployment would do.
- ``spread`` / ``pack`` / ``auto``: ``load`` with that scoring strategy forced. ``auto`` keeps its
  own ``scoring.ModeSelector``, moved on by each new snapshot as the service's is, and counts its placements
  per mode in ``placements_by_mode``.

kube-scheduler breaks exact ties at random; the simulator takes the first name so runs can be checked by hand.
A new policy is a class with ``name``, ``inflight`` and ``choose``, registered in ``POLICIES``.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from gpufleet_extender.scoring import (
    ModeMap,
    ModeSelector,
    NodeVerdict,
    Policy,
    Strategy,
    evaluate_nodes,
    fleet_mean_load,
)
from gpufleet_extender.snapshot import MetricsSnapshot

from gpufleet_lab.simulate.state import NodeState
from gpufleet_lab.simulate.trace import PodSpec


@dataclass(frozen=True, slots=True)
class SchedulerView:
    """What a policy may look at when it decides: the lagged metrics, never the true load."""

    now: float
    snapshot: MetricsSnapshot
    assumed: Mapping[str, Mapping[str, int]]  # empty unless the policy uses in-flight accounting
    extender_policy: Policy


@dataclass(slots=True)
class Decision:
    node: str | None
    verdicts: Mapping[str, NodeVerdict] = field(default_factory=dict)  # the extender's, for load policies


class PlacementPolicy(Protocol):
    name: str
    inflight: bool  # whether the run computes assumed load for it

    def choose(self, pod: PodSpec, fitting: Sequence[NodeState], view: SchedulerView) -> Decision: ...


def least_allocated_key(pod: PodSpec) -> Callable[[NodeState], tuple[float, str]]:
    return lambda node: (node.allocated_share_after(pod), node.name)


class CountPolicy:
    name = "count"
    inflight = False

    def choose(self, pod: PodSpec, fitting: Sequence[NodeState], view: SchedulerView) -> Decision:
        if not fitting:
            return Decision(None)
        return Decision(min(fitting, key=least_allocated_key(pod)).name)


class RandomFitPolicy:
    name = "random-fit"
    inflight = False

    def __init__(self, seed: int):
        self._rng = random.Random(f"random-fit/{seed}")

    def choose(self, pod: PodSpec, fitting: Sequence[NodeState], view: SchedulerView) -> Decision:
        if not fitting:
            return Decision(None)
        return Decision(self._rng.choice(sorted(fitting, key=lambda n: n.name)).name)


class LoadPolicy:
    """The extender's filter and prioritize, through the same functions the server calls.

    ``strategy`` forces a scoring strategy; None keeps the settings' ``SCORING_STRATEGY``.
    """

    def __init__(self, inflight: bool, strategy: Strategy | None = None, name: str | None = None):
        self.inflight = inflight
        self.strategy = strategy
        self.name = name or ("load" if inflight else "load-no-inflight")
        self.placements_by_mode: dict[str, int] = {}  # spread/pack: how many placements each mode scored
        self._policy: tuple[Policy, Policy] | None = None  # (settings' policy, the one used)
        self._selector: ModeSelector | None = None
        self._modes_version: int | None = None

    @property
    def modes(self) -> ModeMap | None:
        """``auto``'s mode per resource after the last decision; None for the fixed strategies."""
        return dict(self._selector.modes) if self._selector is not None else None

    def _extender_policy(self, settings_policy: Policy) -> Policy:
        if self._policy is None or self._policy[0] is not settings_policy:
            used = settings_policy
            if self.strategy is not None:
                used = dataclasses.replace(settings_policy, strategy=self.strategy)
            self._policy = (settings_policy, used)
            self._selector = ModeSelector.from_policy(used) if used.strategy == Strategy.AUTO else None
        return self._policy[1]

    def _modes(self, policy: Policy, view: SchedulerView) -> ModeMap | None:
        """Auto's modes: like the service, the selector moves once per new snapshot."""
        if self._selector is None:
            return None
        if view.snapshot.version != self._modes_version:
            self._selector.update(fleet_mean_load(view.snapshot, policy, view.now))
            self._modes_version = view.snapshot.version
        return self._selector.modes

    def choose(self, pod: PodSpec, fitting: Sequence[NodeState], view: SchedulerView) -> Decision:
        if not fitting:
            return Decision(None)
        policy = self._extender_policy(view.extender_policy)
        modes = self._modes(policy, view)
        verdicts = evaluate_nodes(
            [n.name for n in fitting], view.snapshot, pod.request, policy, view.now, view.assumed, modes
        )
        passed = [n for n in fitting if verdicts[n.name].passed]
        if not passed:
            return Decision(None, verdicts)
        by_allocation = least_allocated_key(pod)
        best = min(passed, key=lambda n: (-verdicts[n.name].score, *by_allocation(n)))
        mode = policy.mode_for(pod.resource, modes).value
        self.placements_by_mode[mode] = self.placements_by_mode.get(mode, 0) + 1
        return Decision(best.name, verdicts)


# name -> factory(seed); the order is the order of the report's columns.
POLICIES: dict[str, Callable[[int], PlacementPolicy]] = {
    "count": lambda seed: CountPolicy(),
    "random-fit": RandomFitPolicy,
    "load": lambda seed: LoadPolicy(inflight=True),
    "load-no-inflight": lambda seed: LoadPolicy(inflight=False),
    "spread": lambda seed: LoadPolicy(inflight=True, strategy=Strategy.SPREAD, name="spread"),
    "pack": lambda seed: LoadPolicy(inflight=True, strategy=Strategy.PACK, name="pack"),
    "auto": lambda seed: LoadPolicy(inflight=True, strategy=Strategy.AUTO, name="auto"),
}
EXTENDER_POLICIES = ("count", "random-fit", "load", "load-no-inflight")  # the mixed trace's default comparison
STRATEGY_POLICIES = ("spread", "pack", "auto")  # the quiet-night and peak-hour traces' default


def make_policy(name: str, seed: int) -> PlacementPolicy:
    try:
        return POLICIES[name](seed)
    except KeyError:
        raise ValueError(f"unknown policy {name!r} (known: {', '.join(POLICIES)})") from None
