"""Demand-driven MIG layouts: which per-GPU layouts a pool should have so that its free instances serve what its
tenants ask for, without touching any instance a pod holds. Pure: no NVML, no Kubernetes calls here.

Input: every MIG-enabled GPU of the pool with its instances (profile, placement, allocated or not), the demand
(instances wanted per profile for pods that have none yet), the profiles the pool allows, and a minimum number of
instances per profile the pool must always have. Output: one target layout per GPU (exact placements) and what it
costs (instances destroyed and created).

Objective, in this order:
1. every allocated instance is kept where it is (a hard constraint: they are fixed slots of every candidate);
2. the per-profile minimums are met (a hard constraint; AdviceError when no layout can);
3. the most demand is served, counted in compute slices (a 3g.40gb pod served weighs 3, a 1g.10gb pod 1), where a
   profile's demand is served by the pool's free instances of that profile, up to the demand;
4. the fewest instances change (destroyed + created), among the layouts that serve that much.

Search: each GPU's candidates are all valid layouts that contain its allocated instances, keep or destroy each
free instance, and create only allowed profiles that have demand or a minimum (creating anything else can only
cost). A candidate matters through its free-instance counts per demanded profile, capped at the demand (more is
never better), so per GPU only the cheapest candidate per count vector is kept, and of those only the ones no other
candidate beats on every count at no more cost (Pareto front). A dynamic programme over the GPUs then keeps, for
each pool-wide capped count vector, the cheapest way to reach it: exact, since served demand and minimums only depend
on that vector and the cost adds up per GPU.

Bound: the number of pool-wide vectors is at most the product of (cap + 1) over the demanded profiles. Above
`max_states` (default 200) the programme keeps only the `max_states` best partial vectors after each GPU (fewest
minimum shortfall, then most demand served, then least cost): a beam search, no longer exact. The advice then says
`exact: false` and reports an upper bound on the demand any layout could serve (each profile's demand capped by the
sum over GPUs of the most free instances of it a GPU could offer), so the gap is visible; a last pass then gives each
GPU in turn its cheapest candidate that keeps the pool's served demand (fewer changes, never less served). The number
of changes is then not proven minimal; allocated instances and minimums hold either way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .exceptions import MigError
from .names import MIG_RESOURCE_PREFIX, parse_profile_name
from .placement import Catalog, Slot, mask, placement_size, walk_subsets
from .pod_requests import QuantityError, pod_devices_from_object

DEFAULT_MAX_STATES = 200


class AdviceError(MigError):
    """The advice cannot be computed: bad demand or pool input, or minimums no layout can meet."""


@dataclass(frozen=True)
class CurrentInstance:
    """An instance on a GPU now. Allocated ones (held by a pod, or running a process) are never destroyed."""

    profile: str
    start: int
    allocated: bool = False
    uuid: str | None = None


@dataclass
class GpuNow:
    """One GPU of the pool as it is now."""

    node: str
    index: int
    catalog: Catalog
    mig_enabled: bool = True
    instances: list[CurrentInstance] = field(default_factory=list)


@dataclass
class GpuAdvice:
    node: str
    index: int
    before: list[Slot]
    after: list[Slot]
    destroy: list[CurrentInstance]
    create: list[Slot]
    allocated: list[CurrentInstance]

    @property
    def changed(self) -> bool:
        return bool(self.destroy or self.create)

    def counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for slot in self.after:
            counts[slot.profile] = counts.get(slot.profile, 0) + 1
        return dict(sorted(counts.items()))

    def as_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "changed": self.changed,
            "before": [s.as_dict() for s in self.before],
            "after": [s.as_dict() for s in self.after],
            "mig_devices": self.counts(),
            "destroy": [{"profile": i.profile, "start": i.start, "uuid": i.uuid} for i in self.destroy],
            "create": [s.as_dict() for s in self.create],
            "allocated": [{"profile": i.profile, "start": i.start, "uuid": i.uuid} for i in self.allocated],
        }


@dataclass
class Advice:
    gpus: list[GpuAdvice]
    demand: dict[str, int]
    served: dict[str, int]
    free_after: dict[str, int]  # free instances per demanded profile after the change (uncapped)
    served_slices: int
    demand_slices: int
    upper_bound_slices: int  # no layout serves more (equal to served_slices when exact)
    exact: bool
    states: int  # largest number of pool-wide count vectors the programme held

    @property
    def destroyed(self) -> int:
        return sum(len(g.destroy) for g in self.gpus)

    @property
    def created(self) -> int:
        return sum(len(g.create) for g in self.gpus)

    def nodes(self) -> list[dict[str, Any]]:
        """Per node: what changes, and the nvidia_mig config that applies it (every MIG GPU, changed or not)."""
        by_node: dict[str, list[GpuAdvice]] = {}
        for gpu in self.gpus:
            by_node.setdefault(gpu.node, []).append(gpu)
        result = []
        for node, gpus in sorted(by_node.items()):
            gpus.sort(key=lambda g: g.index)
            result.append(
                {
                    "name": node,
                    "changed": any(g.changed for g in gpus),
                    "destroyed": sum(len(g.destroy) for g in gpus),
                    "created": sum(len(g.create) for g in gpus),
                    "gpus": [g.as_dict() for g in gpus],
                    "config": [{"devices": [g.index], "mig_enabled": True, "mig_devices": g.counts()} for g in gpus],
                }
            )
        return result


def _canonical(name: object, what: str) -> str:
    try:
        return parse_profile_name(str(name)).canonical
    except ValueError as exc:
        raise AdviceError(f"{what}: {str(name)!r} is not a MIG profile name ({exc})") from None


def _counts(raw: object, what: str) -> dict[str, int]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise AdviceError(f"{what} must map MIG profile names to counts, got {type(raw).__name__}")
    counts: dict[str, int] = {}
    for name, count in raw.items():
        profile = _canonical(name, what)
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise AdviceError(f"{what}: the count of {profile} must be a whole number >= 0, got {count!r}")
        counts[profile] = counts.get(profile, 0) + count
    return {p: c for p, c in sorted(counts.items()) if c}


@dataclass
class _Candidate:
    vector: tuple[int, ...]  # free instances per dimension (demanded profile), capped
    cost: int
    destroyed: int
    slots: tuple[tuple[str, int], ...]  # (profile, start) of every instance after, allocated ones included


def _gpu_candidates(gpu: GpuNow, dims: list[str], caps: tuple[int, ...], creatable: set[str]) -> list[_Candidate]:
    """The Pareto front of this GPU's layouts: free counts per dimension (capped) against cost."""
    catalog = gpu.catalog
    fixed = [i for i in gpu.instances if i.allocated]
    existing_free = [i for i in gpu.instances if not i.allocated]
    # Options: each existing free instance (kept if chosen, destroyed if not), then each new placement of a
    # creatable profile that is not already an existing instance's.
    existing_keys = {(i.profile, i.start) for i in existing_free}
    options: list[tuple[str, int, int]] = [
        (i.profile, i.start, _size(catalog, i.profile, i.start)) for i in existing_free
    ]
    for name in sorted(creatable):
        if name not in catalog.by_name:
            continue
        for start, size in catalog.by_name[name].placements:
            if (name, start) not in existing_keys:
                options.append((name, start, size))
    dim_of_option = [dims.index(name) if name in dims else None for name, _start, _size in options]
    fixed_slots = [(i.profile, i.start) for i in fixed]
    best: dict[tuple[int, ...], _Candidate] = {}

    def record(chosen: list[int]) -> None:
        free = [0] * len(dims)
        kept = 0
        for o in chosen:
            if o < len(existing_free):
                kept += 1
            d = dim_of_option[o]
            if d is not None:
                free[d] += 1
        vector = tuple(min(c, f) for c, f in zip(caps, free, strict=True))
        destroyed = len(existing_free) - kept
        cost = destroyed + len(chosen) - kept
        slots = tuple(sorted(fixed_slots + [options[o][:2] for o in chosen], key=_by_start))
        current = best.get(vector)
        if current is None or (cost, destroyed, slots) < (current.cost, current.destroyed, current.slots):
            best[vector] = _Candidate(vector, cost, destroyed, slots)

    held = [(i.profile, i.start, _size(catalog, i.profile, i.start)) for i in fixed]
    walk_subsets(catalog, held, options, record)
    front: list[_Candidate] = []
    for cand in sorted(best.values(), key=lambda c: (c.cost, c.destroyed, [-v for v in c.vector], c.slots)):
        if not any(
            k.cost <= cand.cost and all(a >= b for a, b in zip(k.vector, cand.vector, strict=True)) for k in front
        ):
            front.append(cand)
    return front


def _by_start(slot: tuple[str, int]) -> tuple[int, str]:
    return slot[1], slot[0]


def _size(catalog: Catalog, profile: str, start: int) -> int:
    size = placement_size(catalog, profile, start)
    if size is None:
        raise AdviceError(f"{profile} cannot start at memory slice {start} on this GPU")
    return size


def _check_gpu(gpu: GpuNow) -> None:
    where = f"{gpu.node} GPU {gpu.index}"
    occupied = 0
    for inst in gpu.instances:
        if inst.profile not in gpu.catalog.by_name:
            raise AdviceError(f"{where}: instance profile {inst.profile} is not in the GPU's catalog")
        try:
            taken = mask(inst.start, _size(gpu.catalog, inst.profile, inst.start))
        except AdviceError as exc:
            raise AdviceError(f"{where}: {exc.message}") from None
        if occupied & taken:
            raise AdviceError(f"{where}: instances overlap at memory slice {inst.start}")
        occupied |= taken


def advise(
    gpus: list[GpuNow],
    demand: dict[str, Any],
    minimums: dict[str, Any] | None = None,
    allowed: list[Any] | None = None,
    max_states: int = DEFAULT_MAX_STATES,
) -> Advice:
    """Target layouts for the pool's MIG-enabled GPUs (see the module docstring for the objective and search)."""
    demand = _counts(demand, "demand")
    minimums = _counts(minimums, "minimums")
    if max_states < 1:
        raise AdviceError(f"max_states must be at least 1, got {max_states}")
    mig_gpus = [g for g in gpus if g.mig_enabled]
    known = {name for g in mig_gpus for name in g.catalog.by_name}
    allowed_set = {_canonical(n, "allowed profiles") for n in allowed} if allowed is not None else set(known)
    for what, names in (("demand", demand), ("minimums", minimums), ("allowed profiles", allowed_set)):
        unknown = sorted(set(names) - known)
        if unknown:
            raise AdviceError(
                f"{what}: {', '.join(unknown)} is not a profile of the pool's MIG GPUs "
                f"(they have: {', '.join(sorted(known)) or 'none'})"
            )
    for gpu in mig_gpus:
        _check_gpu(gpu)
    allocated: dict[str, int] = {}
    for gpu in mig_gpus:
        for inst in gpu.instances:
            if inst.allocated:
                allocated[inst.profile] = allocated.get(inst.profile, 0) + 1
    # Free instances needed on top of the allocated ones to meet each minimum.
    need = {p: max(0, m - allocated.get(p, 0)) for p, m in minimums.items()}
    dims = sorted(set(demand) | {p for p, n in need.items() if n})
    caps = tuple(max(demand.get(p, 0), need.get(p, 0)) for p in dims)
    needs = tuple(need.get(p, 0) for p in dims)
    wanted = tuple(demand.get(p, 0) for p in dims)
    weight = tuple(_weight(mig_gpus, p) for p in dims)
    creatable = set(dims) & allowed_set

    def served(vector: tuple[int, ...]) -> int:
        return sum(w * min(d, v) for w, d, v in zip(weight, wanted, vector, strict=True))

    def shortfall(vector: tuple[int, ...]) -> int:
        return sum(w * max(0, n - v) for w, n, v in zip(weight, needs, vector, strict=True))

    fronts = [_gpu_candidates(g, dims, caps, creatable) for g in mig_gpus]
    states: dict[tuple[int, ...], int] = {tuple([0] * len(dims)): 0}
    steps: list[dict[tuple[int, ...], tuple[tuple[int, ...], int]]] = []
    exact, largest = True, 1
    for front in fronts:
        zero = [(c, cand) for c, cand in enumerate(front) if cand.cost == 0]
        nxt: dict[tuple[int, ...], int] = {}
        back: dict[tuple[int, ...], tuple[tuple[int, ...], int]] = {}
        for vector, cost in states.items():
            # A vector already at every cap gains nothing from a change: only the unchanged layout (cost 0) counts.
            options = zero if vector == caps else enumerate(front)
            for c, cand in options:
                new = tuple([min(cap, a + b) for cap, a, b in zip(caps, vector, cand.vector, strict=True)])
                total = cost + cand.cost
                if new not in nxt or total < nxt[new]:
                    nxt[new] = total
                    back[new] = (vector, c)
        if len(nxt) > max_states:
            exact = False
            keep = sorted(nxt, key=lambda v: (shortfall(v), -served(v), nxt[v], v))[:max_states]
            nxt = {v: nxt[v] for v in keep}
        largest = max(largest, len(nxt))
        states = nxt
        steps.append(back)
    feasible = [v for v in states if shortfall(v) == 0]
    if not feasible:
        short = min(states, key=lambda v: (shortfall(v), -served(v), states[v]))
        missing = ", ".join(
            f"{need[p]} free {p} (at most {short[d]})" for d, p in enumerate(dims) if short[d] < needs[d]
        )
        raise AdviceError(f"the minimums cannot be met around the allocated instances: the pool needs {missing}")
    final = max(feasible, key=lambda v: (served(v), -states[v], v))
    # Walk back to each GPU's choice.
    choice = [0] * len(mig_gpus)
    vector = final
    for g in range(len(mig_gpus) - 1, -1, -1):
        vector, choice[g] = steps[g][vector]
    if not exact:
        _cheapen(fronts, choice, lambda v: (shortfall(v), -served(v)))
    advice_gpus = [_gpu_advice(gpu, fronts[g][choice[g]]) for g, gpu in enumerate(mig_gpus)]
    free_after = {p: 0 for p in dims}
    for advised in advice_gpus:
        held = {(i.profile, i.start) for i in advised.allocated}
        for slot in advised.after:
            if slot.profile in free_after and (slot.profile, slot.start) not in held:
                free_after[slot.profile] += 1
    upper = sum(
        w * min(d, sum(max((c.vector[k] for c in front), default=0) for front in fronts))
        for k, (w, d) in enumerate(zip(weight, wanted, strict=True))
    )
    served_counts = {p: min(demand.get(p, 0), free_after[p]) for p in dims if demand.get(p, 0)}
    return Advice(
        gpus=advice_gpus,
        demand=dict(demand),
        served=served_counts,
        free_after=free_after,
        served_slices=served(final),
        demand_slices=sum(w * d for w, d in zip(weight, wanted, strict=True)),
        upper_bound_slices=served(final) if exact else upper,
        exact=exact,
        states=largest,
    )


def _cheapen(
    fronts: list[list[_Candidate]], choice: list[int], rank: Callable[[tuple[int, ...]], tuple[int, int]]
) -> None:
    """After a beam search: give each GPU, in turn, the cheapest candidate that serves the pool as well (the other
    GPUs' choices fixed), until no GPU gets cheaper. Only ever lowers the cost; served demand does not change."""
    dims = len(fronts[0][0].vector) if fronts and fronts[0] else 0
    totals = [sum(fronts[g][choice[g]].vector[d] for g in range(len(fronts))) for d in range(dims)]
    target = rank(tuple(totals))
    improved = True
    while improved:
        improved = False
        for g, front in enumerate(fronts):
            current = front[choice[g]]
            rest = [t - v for t, v in zip(totals, current.vector, strict=True)]
            for c, cand in enumerate(front):  # the front is sorted by cost
                if cand.cost >= current.cost:
                    break
                if rank(tuple(r + v for r, v in zip(rest, cand.vector, strict=True))) <= target:
                    choice[g] = c
                    totals = [r + v for r, v in zip(rest, cand.vector, strict=True)]
                    improved = True
                    break


def _weight(gpus: list[GpuNow], profile: str) -> int:
    for gpu in gpus:
        if profile in gpu.catalog.by_name:
            return gpu.catalog.by_name[profile].slice_count
    return 1


def _gpu_advice(gpu: GpuNow, cand: _Candidate) -> GpuAdvice:
    after_keys = set(cand.slots)
    current_keys = {(i.profile, i.start) for i in gpu.instances}

    def slot(name: str, start: int) -> Slot:
        return Slot(name, start, _size(gpu.catalog, name, start))

    return GpuAdvice(
        node=gpu.node,
        index=gpu.index,
        before=[slot(i.profile, i.start) for i in sorted(gpu.instances, key=lambda i: i.start)],
        after=[slot(n, s) for n, s in cand.slots],
        destroy=sorted((i for i in gpu.instances if (i.profile, i.start) not in after_keys), key=lambda i: i.start),
        create=[slot(n, s) for n, s in cand.slots if (n, s) not in current_keys],
        allocated=sorted((i for i in gpu.instances if i.allocated), key=lambda i: i.start),
    )


def catalog_from_facts(mig_profiles: list[dict[str, Any]]) -> Catalog:
    """The GPU's catalog from nvidia_gpu_info's `mig_profiles` (as NVML reported it on the host)."""
    from .planner import ProfileInfo

    try:
        return Catalog(
            [
                ProfileInfo(
                    int(p["profile_enum"]),
                    int(p["profile_id"]),
                    str(p["name"]),
                    int(p["compute_slices"]),
                    int(p["max_instances"]),
                    int(p["memory_mib"]),
                    tuple((int(pl["start"]), int(pl["size"])) for pl in p["placements"]),
                )
                for p in mig_profiles
            ]
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise AdviceError(f"mig_profiles is not in nvidia_gpu_info's shape ({type(exc).__name__}: {exc})") from None


def gpus_from_facts(
    node: str, gpu_info: list[dict[str, Any]], pod_resources: dict[str, Any] | None = None
) -> list[GpuNow]:
    """A node's GPUs from nvidia_gpu_info's `gpus` and kubelet_pod_resources' result (its `allocated` list).

    An instance is allocated when the kubelet has handed one of its MIG devices to a container, or when a process
    runs in it (a workload outside Kubernetes is not disturbed either).
    """
    held = {a.get("device_id") for a in (pod_resources or {}).get("allocated", []) if isinstance(a, dict)}
    result = []
    for gpu in gpu_info:
        if not isinstance(gpu, dict) or "index" not in gpu:
            raise AdviceError(f"{node}: each GPU must be an entry of nvidia_gpu_info's gpus, got {gpu!r:.60}")
        mig = gpu.get("mig_mode", {})
        enabled = bool(mig.get("current")) and bool(mig.get("pending", mig.get("current")))
        instances = []
        for inst in gpu.get("gpu_instances", []) if enabled else []:
            uuids = [ci.get("mig_device_uuid") for ci in inst.get("compute_instances", [])]
            allocated = bool(inst.get("processes")) or any(u in held for u in uuids if u)
            instances.append(
                CurrentInstance(inst["profile"], int(inst["start"]), allocated, next((u for u in uuids if u), None))
            )
        result.append(
            GpuNow(node, int(gpu["index"]), catalog_from_facts(gpu.get("mig_profiles", [])), enabled, instances)
        )
    return result


def demand_from_pods(pods: list[dict[str, Any]]) -> dict[str, int]:
    """MIG instances wanted by pending pods (Kubernetes Pod objects), summed over the pods: each pod's
    nvidia.com/mig-<profile> request as kube-scheduler reads it (pod_requests: requests or limits, init containers
    and sidecars, Kubernetes quantities)."""
    demand: dict[str, int] = {}
    for pod in pods:
        name = pod.get("metadata", {}).get("name") if isinstance(pod, dict) else None
        try:
            wanted = pod_devices_from_object(pod, lambda resource: str(resource).startswith(MIG_RESOURCE_PREFIX))
        except QuantityError as exc:
            raise AdviceError(f"pod {name}: {exc}") from None
        for resource, count in wanted.items():
            profile = _canonical(resource[len(MIG_RESOURCE_PREFIX) :], "pod request")
            demand[profile] = demand.get(profile, 0) + count
    return dict(sorted(demand.items()))


def rollout_surprises(
    advice_node: dict[str, Any],
    plan: dict[str, Any],
    gpu_info: list[dict[str, Any]],
    pod_resources: dict[str, Any] | None,
) -> list[str]:
    """What changed on a node since its advice, read just before applying it (an empty list: go ahead).

    advice_node: one entry of the advice's `nodes`; plan: nvidia_mig's check-mode result for that node's config;
    gpu_info: nvidia_gpu_info's `gpus` read now; pod_resources: kubelet_pod_resources' result read now (or None).
    A surprise is a GPU whose instances are no longer those the advice started from, a plan that would destroy
    other instances than the advice chose, or an instance to destroy that is now allocated or busy.
    """
    name = advice_node.get("name", "?")
    problems = []
    now = {g.index: g for g in gpus_from_facts(name, gpu_info, pod_resources)}
    planned = {g.get("index"): g for g in plan.get("gpus", [])}
    for gpu in advice_node.get("gpus", []):
        index = gpu["index"]
        where = f"{name} GPU {index}"
        current = now.get(index)
        if current is None or not current.mig_enabled:
            problems.append(f"{where}: no longer a MIG-enabled GPU")
            continue
        before = sorted((s["profile"], s["start"]) for s in gpu["before"])
        if sorted((i.profile, i.start) for i in current.instances) != before:
            problems.append(f"{where}: its instances changed since the advice")
            continue
        destroy = sorted(
            (a["profile"], a["start"]) for a in planned.get(index, {}).get("actions", []) if a["op"] == "destroy"
        )
        if destroy != sorted((d["profile"], d["start"]) for d in gpu["destroy"]):
            problems.append(
                f"{where}: nvidia_mig would destroy {destroy or 'nothing'}, the advice chose other instances"
            )
        held = sorted(
            f"{i.profile}@{i.start}" for i in current.instances if i.allocated and (i.profile, i.start) in destroy
        )
        if held:
            problems.append(f"{where}: {', '.join(held)} to be destroyed is now allocated or busy")
    return problems
