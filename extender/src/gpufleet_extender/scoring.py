"""Filter and score nodes for a pod from a metrics snapshot: pure functions, no I/O, no clock.

The server, the placement simulator and the scoring strategies all call these, so a decision made in one
place is made the same way everywhere. Public API:

- ``Policy.from_settings(settings)`` - thresholds, weights, staleness and the missing-metrics policy;
- ``device_load(device, policy)`` - ``w_util * util + w_mem * mem`` of one device, 0..1;
- ``pick_devices(devices, count, policy, assumed=0)`` - the ``count`` least-loaded devices a pod would get
  after ``assumed`` in-flight pods took the best ones (the device-selection step, reusable on its own);
- ``score_devices(devices, count, policy)`` - the ``spread`` score: ``10 x (1 - mean load)`` rounded and
  clamped to 0..10, a missing device (fewer than ``count``) counting as fully loaded;
- ``pack_score(load, target)`` - the ``pack`` score of a node whose devices of the resource carry ``load``
  (TargetLoadPacking: rising up to the target, falling beyond it);
- ``ModeSelector`` - the ``auto`` strategy's one piece of state: pack or spread per resource, from the fleet's
  mean load, with hysteresis;
- ``evaluate_node(name, metrics, request, policy, now, assumed)`` - the filter verdict and score of one
  node as a ``NodeVerdict``; ``evaluate_nodes`` maps it over many;
- ``tenant_mismatch(node, node_tenant, namespace, namespace_tenant)`` - the tenant-pool rule;
- ``shared_candidates(devices, count, replicas, assumed)`` - for a time-sliced resource (``SHARED_RESOURCES``),
  the devices the NVIDIA device plugin may hand the pod: those with the fewest pods once the in-flight pods took
  theirs (its ``distributed`` allocation; it ignores load and breaks ties arbitrarily);
- ``short_of_memory(device, policy)`` - a shared device with less than ``SHARED_MEM_FREE_MIN`` of its memory
  free (off at 0, the default);
- ``interference_load(metrics, picked, policy, assumed)`` - mean load of the node's devices the pod would not
  hold, which ``spread`` subtracts from an exclusive resource's score times ``INTERFERENCE_WEIGHT``.

Every sum of loads is ``add_loads``: plain left-to-right float addition, the loop GPUScore writes in Go, so that
a decision is the same to the last bit in both and on every Python (the builtin ``sum`` compensates rounding
since 3.12).

A pod that asks for no GPU passes everywhere with ``NEUTRAL_SCORE``, so the extender never changes the
placement of non-GPU pods.

Scoring strategies (``SCORING_STRATEGY``): ``spread`` scores the devices the pod would get, least-loaded
first, so pods go where devices are coolest. ``pack`` scores the node's load of the requested resource the way
Trimaran's TargetLoadPacking scores CPU: the fuller the node the better up to ``PACK_TARGET_UTIL``, worse
beyond it; pods consolidate and whole GPUs and nodes stay free. ``auto`` packs while the fleet is quiet and
spreads while it is busy. The filter is the same in every mode: a node passes only with a device below the
thresholds, so packing never places onto a hot device. Everything here is pure given the mode; the ``auto``
state lives in a ``ModeSelector`` owned by the caller (the service, or a simulator policy).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from gpufleet_extender.pods import WHOLE_GPU_RESOURCE, GpuRequest, ResourceRequest
from gpufleet_extender.settings_contract import default
from gpufleet_extender.snapshot import DeviceMetrics, MetricsSnapshot, NodeMetrics

MIN_SCORE = 0
MAX_SCORE = 10  # kube-scheduler's MaxExtenderPriority
NEUTRAL_SCORE = 5


class Strategy(StrEnum):
    """``SCORING_STRATEGY``: how passing nodes are ranked."""

    SPREAD = "spread"  # least-loaded devices first (score_devices)
    PACK = "pack"  # fullest node under PACK_TARGET_UTIL first (pack_score)
    AUTO = "auto"  # pack while the fleet is quiet, spread while it is busy (ModeSelector)


class Mode(StrEnum):
    """The ranking in force for one resource: a fixed strategy's own, or the one ``auto`` chose."""

    SPREAD = "spread"
    PACK = "pack"


ModeMap = Mapping[str, Mode]  # resource -> mode in force (auto); resources not in it are scored spread


class PolicySettings(Protocol):
    """The settings a Policy is made of (config.Settings has them). A protocol, not config's class: config imports
    this module for the defaults, and scoring stays free of settings handling."""

    @property
    def GPU_UTIL_THRESHOLD(self) -> float: ...
    @property
    def MEM_UTIL_THRESHOLD(self) -> float: ...
    @property
    def WEIGHT_GPU_UTIL(self) -> float: ...
    @property
    def WEIGHT_MEM_UTIL(self) -> float: ...
    @property
    def METRICS_MAX_AGE_SECONDS(self) -> float: ...
    @property
    def ON_MISSING_METRICS(self) -> str: ...
    @property
    def SCORING_STRATEGY(self) -> Strategy: ...
    @property
    def PACK_TARGET_UTIL(self) -> float: ...
    @property
    def AUTO_PACK_BELOW(self) -> float: ...
    @property
    def AUTO_HYSTERESIS(self) -> float: ...
    @property
    def SHARED_RESOURCES(self) -> Mapping[str, int]: ...
    @property
    def INTERFERENCE_WEIGHT(self) -> float: ...
    @property
    def SHARED_MEM_FREE_MIN(self) -> float: ...


_DEFAULT_STRATEGY = Strategy(default("SCORING_STRATEGY"))
_DEFAULT_SHARED: tuple[tuple[str, int], ...] = tuple(sorted(default("SHARED_RESOURCES").items()))


@dataclass(frozen=True, slots=True)
class Policy:
    """What a verdict depends on besides its inputs; the defaults are the settings contract's."""

    gpu_util_threshold: float = default("GPU_UTIL_THRESHOLD")
    mem_util_threshold: float = default("MEM_UTIL_THRESHOLD")
    weight_gpu_util: float = default("WEIGHT_GPU_UTIL")
    weight_mem_util: float = default("WEIGHT_MEM_UTIL")
    max_age_seconds: float = default("METRICS_MAX_AGE_SECONDS")  # 0: samples never go stale
    deny_missing: bool = default("ON_MISSING_METRICS") == "deny"  # ON_MISSING_METRICS=deny
    strategy: Strategy = _DEFAULT_STRATEGY
    pack_target_util: float = default("PACK_TARGET_UTIL")  # PACK_TARGET_UTIL
    auto_pack_below: float = default("AUTO_PACK_BELOW")  # AUTO_PACK_BELOW
    auto_hysteresis: float = default("AUTO_HYSTERESIS")  # AUTO_HYSTERESIS: auto spreads above AUTO_PACK_BELOW + this
    # SHARED_RESOURCES: (resource, time-slicing replicas)
    shared_resources: tuple[tuple[str, int], ...] = _DEFAULT_SHARED
    interference_weight: float = default("INTERFERENCE_WEIGHT")  # INTERFERENCE_WEIGHT: 0 = spread ignores other devices
    shared_mem_free_min: float = default("SHARED_MEM_FREE_MIN")  # SHARED_MEM_FREE_MIN: memory share free (0 = off)

    @classmethod
    def from_settings(cls, settings: PolicySettings) -> Policy:
        return cls(
            gpu_util_threshold=settings.GPU_UTIL_THRESHOLD,
            mem_util_threshold=settings.MEM_UTIL_THRESHOLD,
            weight_gpu_util=settings.WEIGHT_GPU_UTIL,
            weight_mem_util=settings.WEIGHT_MEM_UTIL,
            max_age_seconds=settings.METRICS_MAX_AGE_SECONDS,
            deny_missing=settings.ON_MISSING_METRICS == "deny",
            strategy=settings.SCORING_STRATEGY,
            pack_target_util=settings.PACK_TARGET_UTIL,
            auto_pack_below=settings.AUTO_PACK_BELOW,
            auto_hysteresis=settings.AUTO_HYSTERESIS,
            shared_resources=tuple(sorted(settings.SHARED_RESOURCES.items())),
            interference_weight=settings.INTERFERENCE_WEIGHT,
            shared_mem_free_min=settings.SHARED_MEM_FREE_MIN,
        )

    def replicas_of(self, resource: str) -> int:
        """Time-slicing replicas of ``resource`` (1: exclusive devices)."""
        for name, replicas in self.shared_resources:
            if name == resource:
                return replicas
        return 1

    def mode_for(self, resource: str, modes: ModeMap | None) -> Mode:
        """The mode scoring ``resource``: the fixed strategy's, or auto's choice (spread until it has chosen)."""
        if self.strategy == Strategy.PACK:
            return Mode.PACK
        if self.strategy == Strategy.AUTO and modes:
            return modes.get(resource, Mode.SPREAD)
        return Mode.SPREAD

    @property
    def missing_policy_name(self) -> str:
        return "deny" if self.deny_missing else "allow"


class Outcome(StrEnum):
    """Why a node got its verdict; also the ``outcome`` label of the decisions metric."""

    PASS = "pass"
    NO_GPU_REQUEST = "no_gpu_request"
    OVERLOADED = "overloaded"
    MISSING_ALLOWED = "missing_metrics_allowed"
    MISSING_DENIED = "missing_metrics_denied"
    TENANT_MISMATCH = "tenant_mismatch"


_PASSING_OUTCOMES = frozenset({Outcome.PASS, Outcome.NO_GPU_REQUEST, Outcome.MISSING_ALLOWED})


def outcome_passes(outcome: Outcome) -> bool:
    return outcome in _PASSING_OUTCOMES


@dataclass(frozen=True, slots=True)
class NodeVerdict:
    passed: bool
    score: int
    outcome: Outcome
    reason: str = ""  # why it failed, or the note that metrics were missing and the policy let it pass


NO_GPU_VERDICT = NodeVerdict(True, NEUTRAL_SCORE, Outcome.NO_GPU_REQUEST)


def device_load(device: DeviceMetrics, policy: Policy) -> float:
    mem = device.mem if device.mem is not None else 0.0
    return policy.weight_gpu_util * device.util + policy.weight_mem_util * mem


def add_loads(loads: Iterable[float], start: float = 0.0) -> float:
    """``start + l1 + l2 + ...`` added left to right in plain float arithmetic (GPUScore's loop; never ``sum``, whose
    rounding changed in Python 3.12)."""
    total = start
    for load in loads:
        total += load
    return total


def below_thresholds(device: DeviceMetrics, policy: Policy) -> bool:
    mem_ok = device.mem is None or device.mem < policy.mem_util_threshold
    return device.util < policy.gpu_util_threshold and mem_ok


def short_of_memory(device: DeviceMetrics, policy: Policy) -> bool:
    """A shared device with less than ``SHARED_MEM_FREE_MIN`` of its memory free: one more replica may run out of
    memory (time-slicing isolates no memory). False when the rule is off or the sample has no memory figures."""
    free_min = policy.shared_mem_free_min
    return free_min > 0 and device.mem is not None and 1.0 - device.mem < free_min


def _by_load(devices: Iterable[DeviceMetrics], policy: Policy) -> list[DeviceMetrics]:
    # Inlined device_load: this runs for every node of every snapshot, so it is kept tight.
    w_util, w_mem = policy.weight_gpu_util, policy.weight_mem_util
    keyed = [(w_util * d.util + w_mem * (d.mem or 0.0), d.key, d) for d in devices]
    keyed.sort()
    return [entry[2] for entry in keyed]


def pick_devices(devices: Sequence[DeviceMetrics], count: int, policy: Policy, assumed: int = 0) -> list[DeviceMetrics]:
    """The ``count`` least-loaded devices left after ``assumed`` in-flight pods took the least-loaded ones."""
    return _by_load(devices, policy)[assumed : assumed + count]


def score_devices(devices: Sequence[DeviceMetrics], count: int, policy: Policy) -> int:
    """``10 x (1 - mean load)`` over ``count`` devices; devices short of ``count`` count as fully loaded."""
    if count <= 0:
        return NEUTRAL_SCORE
    total_load = add_loads(device_load(d, policy) for d in devices) + max(0, count - len(devices))
    raw = MAX_SCORE * (1.0 - total_load / count)
    return max(MIN_SCORE, min(MAX_SCORE, round(raw)))


def _device_word(resource: str) -> str:
    return "GPU" if resource == WHOLE_GPU_RESOURCE else "instance"


def _figures(device: DeviceMetrics, policy: Policy) -> str:
    util = f"util {device.util:.2f}"
    if device.util >= policy.gpu_util_threshold:
        util += f" > {policy.gpu_util_threshold:.2f}"
    if device.mem is None:
        return f"{util}, mem n/a"
    mem = f"mem {device.mem:.2f}"
    if device.mem >= policy.mem_util_threshold:
        mem += f" > {policy.mem_util_threshold:.2f}"
    return f"{util}, {mem}"


def _missing(node: str, why: str, policy: Policy) -> NodeVerdict:
    reason = f"{node}: {why} (ON_MISSING_METRICS={policy.missing_policy_name})"
    if policy.deny_missing:
        return NodeVerdict(False, MIN_SCORE, Outcome.MISSING_DENIED, reason)
    return NodeVerdict(True, NEUTRAL_SCORE, Outcome.MISSING_ALLOWED, reason)


def pack_score(load: float, target: float) -> int:
    """TargetLoadPacking's curve on 0..10: ``10 x target`` on an idle node, rising to 10 at ``target``, then
    falling to 0 at full load, so the fullest node still under the target wins and nodes past it are avoided."""
    load = min(1.0, max(0.0, load))
    rising = load <= target
    raw = (1.0 - target) * load / target + target if rising else target * (1.0 - load) / (1.0 - target)
    return max(MIN_SCORE, min(MAX_SCORE, round(MAX_SCORE * raw)))


def _ranked_mean_load(ranked: Sequence[DeviceMetrics], policy: Policy, assumed: int) -> float:
    taken = min(assumed, len(ranked))  # in-flight pods took the least-loaded devices (as in pick_devices)
    return (taken + add_loads(device_load(d, policy) for d in ranked[taken:])) / len(ranked)


def shared_candidates(
    devices: Sequence[DeviceMetrics], count: int, replicas: int, assumed: int = 0
) -> list[DeviceMetrics]:
    """The devices of a time-sliced resource that the device plugin may hand a pod asking for ``count`` replicas.

    The NVIDIA device plugin's ``distributed`` allocation takes replicas of the device with the fewest pods,
    knows nothing of load, and orders equal devices arbitrarily. So the pod gets devices from the lowest pod
    counts, any of those tied at the last count it needs. The ``assumed`` pods bound since the sample took
    their replicas first, by the same rule. Empty when fewer than ``count`` devices have a free replica.
    Devices without a pod count (``pods`` None) count as holding none.
    """
    pods = [d.pods or 0 for d in devices]
    for _ in range(assumed):  # in-flight pods: each on a device with the fewest pods (the first of equals)
        open_slots = [i for i, n in enumerate(pods) if n < replicas]
        if not open_slots:
            break
        pods[min(open_slots, key=lambda i: pods[i])] += 1
    open_devices = sorted((pods[i], i) for i in range(len(devices)) if pods[i] < replicas)
    if count <= 0 or len(open_devices) < count:
        return []
    cutoff = open_devices[count - 1][0]  # the most-used device the pod may still get
    return [devices[i] for n, i in open_devices if n <= cutoff]


def interference_load(
    metrics: NodeMetrics, picked: Iterable[DeviceMetrics], policy: Policy, assumed: Mapping[str, int] | None = None
) -> float:
    """Mean load of the node's devices other than ``picked``, over every resource; the ``assumed`` in-flight pods'
    devices (the least-loaded of their resource, as in ``pick_devices``) count as fully loaded. 0 with no others."""
    picked_keys = {d.key for d in picked}
    total, others = 0.0, 0
    for resource, devices in metrics.devices.items():
        taken = (assumed or {}).get(resource, 0)
        for position, device in enumerate(_by_load(devices, policy)):
            if device.key in picked_keys:
                continue
            total += 1.0 if position < taken else device_load(device, policy)
            others += 1
    return total / others if others else 0.0


def _evaluate_shared(
    node: str, devices: Sequence[DeviceMetrics], want: ResourceRequest, policy: Policy, assumed: int, replicas: int
) -> NodeVerdict | None:
    """A time-sliced resource in ``spread`` mode: judge the node by the devices the pod would share.

    None when the sample says nothing of pods on the node's devices (no pod mapping in dcgm-exporter): the caller
    then judges it the exclusive way. A device without a pod label among ones with it holds no pod.
    """
    if all(d.pods is None for d in devices):
        return None
    candidates = shared_candidates(devices, want.count, replicas, assumed)
    if not candidates:
        return NodeVerdict(
            False, MIN_SCORE, Outcome.OVERLOADED, f"{node}: every {want.resource} replica taken ({replicas} per device)"
        )
    hot = [d for d in candidates if not below_thresholds(d, policy)]
    if hot:  # the plugin may hand the pod any candidate, the hot one included
        return NodeVerdict(
            False,
            MIN_SCORE,
            Outcome.OVERLOADED,
            f"{node}: the device plugin may share a busy {want.resource} {_device_word(want.resource)} "
            f"({hot[0].key}: {_figures(hot[0], policy)}; {hot[0].pods} pod(s), {len(candidates)} equally used)",
        )
    full = [d for d in candidates if short_of_memory(d, policy)]
    if full:  # its pods would share the little memory left: a new one may fail with CUDA out-of-memory
        return NodeVerdict(
            False,
            MIN_SCORE,
            Outcome.OVERLOADED,
            f"{node}: the device plugin may share a {want.resource} {_device_word(want.resource)} short of memory "
            f"({full[0].key}: mem {full[0].mem:.2f}, less than SHARED_MEM_FREE_MIN {policy.shared_mem_free_min:g} "
            f"free; {full[0].pods} pod(s))",
        )
    mean = add_loads(device_load(d, policy) for d in candidates) / len(candidates)
    score = max(MIN_SCORE, min(MAX_SCORE, round(MAX_SCORE * (1.0 - mean))))
    return NodeVerdict(
        True,
        score,
        Outcome.PASS,
        f"{node}: spread: shared {want.resource} x{replicas}, {len(candidates)} "
        f"device(s) it may get, mean load {mean:.2f}, score {score}",
    )


def _evaluate_resource(
    node: str, devices: Sequence[DeviceMetrics], want: ResourceRequest, policy: Policy, assumed: int, mode: Mode
) -> NodeVerdict:
    replicas = policy.replicas_of(want.resource)
    if replicas > 1 and mode is Mode.SPREAD:
        shared = _evaluate_shared(node, devices, want, policy, assumed, replicas)
        if shared is not None:
            return shared
    ranked = _by_load(devices, policy)
    available = ranked[assumed:]
    if not any(below_thresholds(d, policy) for d in available):
        taken = f"; {assumed} taken by pods bound since the last sample" if assumed else ""
        best = f"best: {_figures(available[0], policy)}" if available else f"all {len(ranked)} assumed busy"
        return NodeVerdict(
            False,
            MIN_SCORE,
            Outcome.OVERLOADED,
            f"{node}: no {want.resource} {_device_word(want.resource)} below thresholds ({best}{taken})",
        )
    strategy = f" (SCORING_STRATEGY={policy.strategy})" if policy.strategy == Strategy.AUTO else ""
    if mode is Mode.PACK:
        load = _ranked_mean_load(ranked, policy, assumed)
        score = pack_score(load, policy.pack_target_util)
        reason = (
            f"{node}: pack{strategy}: {want.resource} load {load:.2f}, target {policy.pack_target_util:.2f}, "
            f"score {score}"
        )
        return NodeVerdict(True, score, Outcome.PASS, reason)
    score = score_devices(available[: want.count], want.count, policy)
    return NodeVerdict(True, score, Outcome.PASS, f"{node}: spread{strategy}: {want.resource} score {score}")


def evaluate_node(
    node: str,
    metrics: NodeMetrics | None,
    request: GpuRequest,
    policy: Policy,
    now: float,
    assumed: Mapping[str, int] | None = None,
    modes: ModeMap | None = None,
) -> NodeVerdict:
    """Filter verdict and score of ``node`` for a pod asking for ``request``.

    ``assumed`` counts, per resource, the pods bound to the node that no sample covers yet. ``modes`` is the
    ``auto`` strategy's choice per resource (``ModeSelector.modes``); fixed strategies ignore it.
    A pod asking for several resources passes when every one passes and scores the lowest of them; the
    reason of a passing verdict names the mode and the score.
    """
    if not request:
        return NO_GPU_VERDICT
    if metrics is None:
        return _missing(node, "no GPU metrics for this node", policy)
    age = now - metrics.sample_time
    if policy.max_age_seconds > 0 and age > policy.max_age_seconds:
        return _missing(node, f"GPU metrics are {age:.0f}s old (max {policy.max_age_seconds:g}s)", policy)
    verdict: NodeVerdict | None = None
    for want in request:
        devices = metrics.devices.get(want.resource)
        if not devices:
            part = _missing(node, f"no {want.resource} {_device_word(want.resource)} in the metrics", policy)
        else:
            taken = (assumed or {}).get(want.resource, 0)
            mode = policy.mode_for(want.resource, modes)
            part = _evaluate_resource(node, devices, want, policy, taken, mode)
            if part.passed and mode is Mode.SPREAD and policy.interference_weight > 0:
                part = _with_interference(node, metrics, devices, want, policy, assumed, part)
        if not part.passed:
            return part
        if verdict is None or part.score < verdict.score:
            verdict = part
    assert verdict is not None  # request is not empty: the loop ran at least once
    return verdict


def _with_interference(
    node: str,
    metrics: NodeMetrics,
    devices: Sequence[DeviceMetrics],
    want: ResourceRequest,
    policy: Policy,
    assumed: Mapping[str, int] | None,
    verdict: NodeVerdict,
) -> NodeVerdict:
    """``spread`` on an exclusive resource, less ``INTERFERENCE_WEIGHT`` x the load of the node's other devices:
    a pod next to busy GPUs shares the node's CPUs, PCIe switches, NICs and power with them."""
    if policy.replicas_of(want.resource) > 1:
        return verdict  # shared resources are judged by the devices they share
    taken = (assumed or {}).get(want.resource, 0)
    picked = pick_devices(devices, want.count, policy, taken)
    others = interference_load(metrics, picked, policy, assumed)
    mean = (add_loads(device_load(d, policy) for d in picked) + max(0, want.count - len(picked))) / want.count
    raw = MAX_SCORE * (1.0 - mean - policy.interference_weight * others)
    score = max(MIN_SCORE, min(MAX_SCORE, round(raw)))
    reason = (
        f"{verdict.reason}; other devices' load {others:.2f} x INTERFERENCE_WEIGHT {policy.interference_weight:g}"
        f" -> score {score}"
    )
    return NodeVerdict(True, score, Outcome.PASS, reason)


def evaluate_nodes(
    nodes: Iterable[str],
    snapshot: MetricsSnapshot,
    request: GpuRequest,
    policy: Policy,
    now: float,
    assumed: Mapping[str, Mapping[str, int]] | None = None,
    modes: ModeMap | None = None,
) -> dict[str, NodeVerdict]:
    """``evaluate_node`` for each name (the simulator's entry point)."""
    assumed = assumed or {}
    return {
        name: evaluate_node(name, snapshot.nodes.get(name), request, policy, now, assumed.get(name), modes)
        for name in nodes
    }


# --- DRA claims (GPUClaimScore, k8s/plugins/gpuclaimscore; docs/dra.md) -------------------------------------------
# A DRA claim names no extended resource, and with DynamicMIG the instance it gets does not exist before the
# allocation: the load a claim's node is judged by is the node's devices as dcgm-exporter reports them, whole GPUs
# and MIG instances of every profile together, under GPUScore's rule (thresholds, weights, missing and stale
# metrics, strategy) as if the pod asked for all of them: the node's mean device load. Auto's per-resource modes do
# not name this pool of devices, so auto ranks it by spread; pack packs.
CLAIM_LOAD_RESOURCE = "gpufleet.io/dra-node-devices"
# Score points a claim's node loses per point of load score below MAX_SCORE (0..50): one 3g/4g block of room lost
# to fragmentation (20 points, dra_placement.LOSS_WEIGHT x 4 slices) weighs as much as 0.4 of mean device load.
CLAIM_LOAD_WEIGHT = 5
CLAIM_MAX_SCORE = 100  # kube-scheduler's MaxNodeScore: a claim's score is a plugin score, not an extender's


def claim_load_verdict(
    node: str, metrics: NodeMetrics | None, policy: Policy, now: float, modes: ModeMap | None = None
) -> NodeVerdict:
    """GPUScore's verdict on ``node`` for a DRA claim: ``evaluate_node`` over every device of the node pooled
    (whole GPUs and MIG instances, in the snapshot's resource order) as one request for all of them."""
    if metrics is None:
        return evaluate_node(node, None, (ResourceRequest(CLAIM_LOAD_RESOURCE, 1),), policy, now, None, modes)
    devices = tuple(d for resource_devices in metrics.devices.values() for d in resource_devices)
    pooled = NodeMetrics(metrics.name, metrics.sample_time, {CLAIM_LOAD_RESOURCE: devices})
    request = (ResourceRequest(CLAIM_LOAD_RESOURCE, len(devices)),)
    return evaluate_node(node, pooled, request, policy, now, None, modes)


def claim_score(placement_score: int, load: NodeVerdict) -> int:
    """GPUClaimScore's 0..100 for a node: the placement score (``dra_placement.evaluate_node``: room for large
    profiles the allocator's first fit keeps) less CLAIM_LOAD_WEIGHT per load point below MAX_SCORE; 0 when the
    load verdict fails (every device at or above the thresholds, or metrics missing or stale under
    ON_MISSING_METRICS=deny), so that a hot node loses to any node that passes. Equal loads keep the placement
    order (the same points off every node, above 0)."""
    if not load.passed:
        return 0
    return max(0, min(CLAIM_MAX_SCORE, placement_score - CLAIM_LOAD_WEIGHT * (MAX_SCORE - load.score)))


def fleet_mean_load(snapshot: MetricsSnapshot, policy: Policy, now: float) -> dict[str, float]:
    """Mean ``device_load`` per resource over every device of the snapshot with a fresh sample."""
    totals: dict[str, list[float]] = {}
    for metrics in snapshot.nodes.values():
        if policy.max_age_seconds > 0 and now - metrics.sample_time > policy.max_age_seconds:
            continue  # a stale node says nothing about the fleet now
        for resource, devices in metrics.devices.items():
            entry = totals.setdefault(resource, [0.0, 0])
            entry[0] += add_loads(device_load(d, policy) for d in devices)
            entry[1] += len(devices)
    return {resource: total / count for resource, (total, count) in totals.items() if count}


def next_mode(current: Mode | None, load: float, pack_below: float, hysteresis: float) -> Mode:
    """``auto``'s rule: pack below ``pack_below``, spread above ``pack_below + hysteresis``, else keep ``current``.

    Between the two the mode stays what it was, so a fleet hovering at the boundary does not flap; with no
    mode yet (start-up) the band counts as busy: spread, the safe default.
    """
    if load < pack_below:
        return Mode.PACK
    if load > pack_below + hysteresis or current is None:
        return Mode.SPREAD
    return current


@dataclass(slots=True)
class ModeSelector:
    """The ``auto`` strategy's state: the mode in force per resource, updated from each new snapshot.

    One instance per decision maker (the service; each simulator policy). ``update`` returns the resources
    whose mode changed, for the switch counter.
    """

    pack_below: float
    hysteresis: float
    modes: dict[str, Mode] = field(default_factory=dict)
    fleet_load: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_policy(cls, policy: Policy) -> ModeSelector:
        return cls(policy.auto_pack_below, policy.auto_hysteresis)

    def update(self, fleet_load: Mapping[str, float]) -> dict[str, Mode]:
        self.fleet_load = dict(fleet_load)
        changed = {}
        for resource, load in fleet_load.items():
            previous = self.modes.get(resource)
            mode = next_mode(previous, load, self.pack_below, self.hysteresis)
            if mode is not previous:
                changed[resource] = mode
            self.modes[resource] = mode
        return changed


def tenant_mismatch(node: str, node_tenant: str | None, namespace: str, namespace_tenant: str | None) -> str | None:
    """The reason a GPU pod from ``namespace`` may not use ``node``'s tenant pool, or None when it may.

    Nodes without a tenant label are shared. A labelled node only takes pods from namespaces labelled with
    the same tenant.
    """
    if not node_tenant or node_tenant == namespace_tenant:
        return None
    owner = f"tenant {namespace_tenant}" if namespace_tenant else "no tenant"
    return f"{node}: node is in tenant pool {node_tenant!r}; namespace {namespace!r} belongs to {owner}"
