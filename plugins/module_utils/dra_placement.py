"""DynamicMIG placement under DRA: which device kube-scheduler's allocator takes for a MIG claim, and how much room
for large profiles that leaves. Pure (no Kubernetes, no NVML): the one specification that GPUScore's claim scoring
(k8s/plugins/gpuclaimscore, through vectors generated from here), the placement simulator and the DRA tests follow.

What NVIDIA's DRA driver publishes with DynamicMIG (kubernetes-sigs/dra-driver-nvidia-gpu, cmd/gpu-kubelet-plugin):
every (profile, placement) of each GPU is a device named gpu-<minor>-mig-<profile without dots>-<profile id>-<start>
(1g.10gb at memory slice 2 of GPU 0: gpu-0-mig-1g10gb-19-2), next to the whole GPU gpu-<minor>; each consumes
memory-slice-<i> counters (one per memory slice it covers) of its GPU's counter set gpu-<minor>-counter-set, so two
devices that overlap can never both be allocated. One ResourceSlice per GPU holds its devices sorted by name.

What the allocator does (k8s.io/dynamic-resource-allocation/structured, 1.36): for a node, it walks the pools sorted
by driver and name, each pool's slices sorted by name, each slice's devices in order, and takes the first device
that matches the request's selectors and whose counters are still free: first fit, with no scoring of devices. For
one profile that is the first GPU (in slice order) with a free placement, and on it the lowest free start.

Room for large profiles: a GPU's `room` counts, in memory slices, what the large profiles could still get on it:
4 per free 3g/4g block (memory slices 0-3 and 4-7, the only starts of 3g.40gb and 4g.40gb) and 8 more when the GPU is
empty (7g.80gb, or the whole GPU). The `loss` of a placement is the room it takes away; GPUScore prefers the node
where the allocator's first fit loses the least room, then the node whose chosen GPU is fullest (packing).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .profile_tables import H100_80GB, MEMORY_SLICES, ProductTable, ProfileRow

DRIVER = "gpu.nvidia.com"
WHOLE_GPU = "gpu"  # the whole-GPU device kind (nvidia.com/gpu on the device plugin path)
LARGE_BLOCKS = ((0, 4), (4, 4))  # (start, size) of the 3g/4g placements: the blocks large profiles need
MAX_SCORE = 100
LOSS_WEIGHT = 5  # score points per memory slice of room lost (a placement loses at most 16: 80 points)


class PlacementError(ValueError):
    """A profile the GPU's table does not know, or a GPU description that is not a set of memory slices."""


@dataclass(frozen=True)
class Kind:
    """One device kind a claim asks for: a MIG profile (its placements) or the whole GPU (start 0, all slices)."""

    name: str  # "1g.10gb" ... or WHOLE_GPU
    starts: tuple[int, ...]
    size: int


def kind(profile: str, table: ProductTable = H100_80GB) -> Kind:
    """The placements of `profile` (a MIG profile name of `table`, or WHOLE_GPU)."""
    if profile == WHOLE_GPU:
        return Kind(WHOLE_GPU, (0,), MEMORY_SLICES)
    for row in table.profiles:
        if row.name == profile:
            return Kind(row.name, row.starts, row.size)
    known = ", ".join(row.name for row in table.profiles)
    raise PlacementError(f"{profile!r} is no MIG profile of {table.product} (known: {known}, or {WHOLE_GPU})")


def device_name(minor: int, row: ProfileRow, start: int) -> str:
    """The driver's name of a MIG device (MigSpecTuple.ToCanonicalName: dots dropped, then RFC 1123)."""
    compact = row.name.replace(".", "").lower()
    compact = "".join(c if c.isalnum() or c in "-." else "-" for c in compact).strip("-")
    return f"gpu-{minor}-mig-{compact}-{row.id}-{start}"


def published_devices(minor: int, table: ProductTable = H100_80GB) -> list[tuple[str, str, int, int]]:
    """Every device the driver publishes for one GPU with DynamicMIG, in its slice's order (sorted by name):
    (name, kind name, start, size); the whole GPU is (gpu-<minor>, WHOLE_GPU, 0, 8)."""
    devices = [(f"gpu-{minor}", WHOLE_GPU, 0, MEMORY_SLICES)]
    for row in table.profiles:
        devices.extend((device_name(minor, row, start), row.name, start, row.size) for start in row.starts)
    return sorted(devices)


def _check(gpu: Iterable[int]) -> frozenset[int]:
    slices = frozenset(gpu)
    if any(not isinstance(s, int) or isinstance(s, bool) or not 0 <= s < MEMORY_SLICES for s in slices):
        raise PlacementError(f"a GPU is a set of occupied memory slices 0..{MEMORY_SLICES - 1}, not {sorted(gpu)!r}")
    return slices


def free_starts(gpu: Iterable[int], want: Kind) -> list[int]:
    """The starts of `want` whose memory slices are all free on this GPU, lowest first (the driver's name order:
    one digit each)."""
    occupied = _check(gpu)
    return [s for s in want.starts if not occupied & set(range(s, s + want.size))]


def first_fit(gpus: Sequence[Iterable[int]], want: Kind) -> tuple[int, int] | None:
    """The allocator's choice on one node: (GPU position in slice order, start), or None when nothing fits."""
    for position, gpu in enumerate(gpus):
        starts = free_starts(gpu, want)
        if starts:
            return position, starts[0]
    return None


def room(gpu: Iterable[int]) -> int:
    """Room for large profiles on one GPU, in memory slices (0, 4, 8 or 16)."""
    occupied = _check(gpu)
    blocks = sum(4 for start, size in LARGE_BLOCKS if not occupied & set(range(start, start + size)))
    return blocks + (MEMORY_SLICES if not occupied else 0)


@dataclass(frozen=True)
class NodeVerdict:
    """What first fit does on one node and what GPUScore makes of it."""

    gpu: int  # position of the GPU the allocator takes
    start: int
    loss: int  # room lost, memory slices
    score: int  # 0..MAX_SCORE


def evaluate_node(gpus: Sequence[Iterable[int]], want: Kind) -> NodeVerdict | None:
    """GPUScore's verdict for one node: None when first fit finds no device there; otherwise the device it takes and
    score = MAX_SCORE - LOSS_WEIGHT x loss - (free memory slices of the chosen GPU before the placement), so that
    the least loss wins and, at equal loss, the fullest GPU (packing keeps empty GPUs for large profiles)."""
    choice = first_fit(gpus, want)
    if choice is None:
        return None
    position, start = choice
    before = _check(gpus[position])
    after = before | set(range(start, start + want.size))
    loss = room(before) - room(after)
    free_before = MEMORY_SLICES - len(before)
    return NodeVerdict(position, start, loss, MAX_SCORE - LOSS_WEIGHT * loss - free_before)


def free_slices(gpus: Iterable[Iterable[int]]) -> int:
    """Free memory slices over GPUs: with at least a profile's size free and no placement for it, a request fails
    for fragmentation, not for capacity."""
    return sum(MEMORY_SLICES - len(_check(gpu)) for gpu in gpus)


def vectors() -> dict[str, object]:
    """Decision vectors for GPUScore's claim scoring (k8s/plugins/gpuclaimscore/testdata/dra_vectors.json): every
    occupancy of one GPU that valid placements can leave, each kind asked of it, with room before and the verdict.
    Written by `python tools/dra_vectors.py`; the Python tests regenerate it and compare."""
    rows = [kind(row.name) for row in H100_80GB.profiles] + [kind(WHOLE_GPU)]
    occupancies: set[frozenset[int]] = {frozenset()}
    frontier: list[frozenset[int]] = [frozenset()]
    while frontier:  # every set of slices reachable by placing instances one by one
        current = frontier.pop()
        for want in rows:
            for start in free_starts(current, want):
                nxt = current | set(range(start, start + want.size))
                if nxt not in occupancies:
                    occupancies.add(nxt)
                    frontier.append(nxt)
    cases = []
    for occupied in sorted(occupancies, key=lambda s: (len(s), sorted(s))):
        for want in rows:
            verdict = evaluate_node([occupied], want)
            cases.append(
                {
                    "occupied": sorted(occupied),
                    "room": room(occupied),
                    "kind": want.name,
                    "size": want.size,
                    "start": None if verdict is None else verdict.start,
                    "loss": None if verdict is None else verdict.loss,
                    "score": None if verdict is None else verdict.score,
                }
            )
    return {"version": 1, "memorySlices": MEMORY_SLICES, "lossWeight": LOSS_WEIGHT, "cases": cases}
