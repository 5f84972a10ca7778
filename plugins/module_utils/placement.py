"""Where MIG instances may sit on one GPU: the placement rules in one place, and the searches built on them.

The rules (a `Board` checks them): an instance of a profile sits at one of the placements NVML lists for that
profile; the memory slices of two instances may not overlap (occupancy masks); the compute slices of all instances
may not exceed the GPU's; a profile has at most `instance_count` instances on a GPU.

Three searches use the rules, each around fixed slots (instances that stay where they are):
- `search_placement`: the first layout of {profile: count}, the planner's exact search (nvidia_mig, the filters);
- `walk_subsets`: every subset of candidate slots that fits, the advisor's per-GPU candidates (mig_layout_advice);
- `all_layouts`: every layout of {profile: count}, the reference the tests, `make bench-mig` and the simulator
  check destroyed instances against (`minimum_destroyed`, `minimum_destroyed_keeping`).

Pure Python, no NVML calls: the catalog is what NVML reported, or a product's profile table without a GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from .nvml import ProfileInfo
from .profile_tables import ProductTable

__all__ = [
    "Board",
    "Catalog",
    "Slot",
    "all_layouts",
    "mask",
    "minimum_destroyed",
    "minimum_destroyed_keeping",
    "placement_size",
    "search_placement",
    "totals_problem",
    "walk_subsets",
]


class Catalog:
    """The GPU-instance profiles of one GPU, by name and by id."""

    def __init__(self, profiles: list[ProfileInfo]):
        self.profiles = sorted(profiles, key=lambda p: (p.slice_count, p.memory_mib, p.name))
        self.by_name = {p.name: p for p in self.profiles}
        self.by_id = {p.id: p for p in self.profiles}
        self.compute_slices = max((p.slice_count for p in self.profiles), default=0)
        self.memory_slices = max((start + size for p in self.profiles for start, size in p.placements), default=0)

    @classmethod
    def from_table(cls, table: ProductTable) -> Catalog:
        """Catalog from a profile_tables.ProductTable (offline validation on the controller)."""
        return cls(
            [
                ProfileInfo(
                    r.enum,
                    r.id,
                    r.name,
                    r.slice_count,
                    r.instance_count,
                    r.memory_mib,
                    tuple((s, r.size) for s in r.starts),
                )
                for r in table.profiles
            ]
        )

    def names(self) -> list[str]:
        return [p.name for p in self.profiles]

    def as_dict(self) -> list[dict[str, Any]]:
        return [
            {
                "name": p.name,
                "profile_id": p.id,
                "profile_enum": p.enum,
                "compute_slices": p.slice_count,
                "max_instances": p.instance_count,
                "memory_mib": p.memory_mib,
                "placements": [{"start": s, "size": z} for s, z in p.placements],
            }
            for p in self.profiles
        ]


@dataclass(frozen=True)
class Slot:
    """A placed instance of the layout: profile at (start, size)."""

    profile: str
    start: int
    size: int

    def as_dict(self) -> dict[str, Any]:
        return {"profile": self.profile, "start": self.start}


def mask(start: int, size: int) -> int:
    """The memory slices start .. start + size - 1 as bits of an int."""
    return ((1 << size) - 1) << start


def placement_size(catalog: Catalog, profile: str, start: int) -> int | None:
    """The memory slices an instance of `profile` takes at `start`; None when NVML lists no such placement."""
    for placement_start, size in catalog.by_name[profile].placements:
        if placement_start == start:
            return size
    return None


class Board:
    """One GPU's occupancy: memory slices taken (a mask), compute slices used, instances per profile."""

    __slots__ = ("catalog", "compute", "counts", "occupied")

    def __init__(self, catalog: Catalog, fixed: Iterable[tuple[str, int, int]] = ()):
        self.catalog = catalog
        self.occupied = 0
        self.compute = 0
        self.counts: dict[str, int] = {}
        for name, start, size in fixed:  # fixed slots are taken as they are (callers check them first)
            self.place(catalog.by_name[name], start, size)

    def fits(self, profile: ProfileInfo, start: int, size: int) -> bool:
        """Whether one more instance of `profile` at (start, size) keeps every rule."""
        return (
            not self.occupied & mask(start, size)
            and self.compute + profile.slice_count <= self.catalog.compute_slices
            and self.counts.get(profile.name, 0) < profile.instance_count
        )

    def place(self, profile: ProfileInfo, start: int, size: int) -> None:
        self.occupied |= mask(start, size)
        self.compute += profile.slice_count
        self.counts[profile.name] = self.counts.get(profile.name, 0) + 1

    def remove(self, profile: ProfileInfo, start: int, size: int) -> None:
        self.occupied &= ~mask(start, size)
        self.compute -= profile.slice_count
        self.counts[profile.name] -= 1


def totals_problem(counts: dict[str, int], catalog: Catalog) -> str | None:
    """The first total a request of known profiles breaks (a profile's maximum, compute slices, memory slices),
    as the end of a sentence; None when the totals fit (the geometry may still not)."""
    for name, count in sorted(counts.items()):
        maximum = catalog.by_name[name].instance_count
        if count > maximum:
            return f"{count} x {name} requested, at most {maximum} fit on one GPU"
    compute = sum(catalog.by_name[n].slice_count * c for n, c in counts.items())
    if compute > catalog.compute_slices:
        return (
            f"the layout needs {compute} compute slices ({describe_counts(counts)}), "
            f"the GPU has {catalog.compute_slices}"
        )
    memory = sum(catalog.by_name[n].placements[0][1] * c for n, c in counts.items())
    if memory > catalog.memory_slices:
        return (
            f"the layout needs {memory} memory slices ({describe_counts(counts)}), the GPU has {catalog.memory_slices}"
        )
    return None


def describe_counts(counts: dict[str, int]) -> str:
    return " + ".join(f"{c} x {n}" for n, c in sorted(counts.items())) or "no instances"


def _layouts(wanted: dict[str, int], catalog: Catalog, fixed: Sequence[Slot]) -> Iterator[list[Slot]]:
    """Every placement of `wanted` around `fixed`, as the slots added (the list is reused: copy what you keep).

    Larger profiles go first (fewer placements, earlier pruning); instances of the same profile take increasing
    starts, so that a set of slots comes once, not once per permutation.
    """
    board = Board(catalog, ((s.profile, s.start, s.size) for s in fixed))
    todo: list[ProfileInfo] = []
    for name in sorted(
        wanted, key=lambda n: (-catalog.by_name[n].placements[0][1], -catalog.by_name[n].slice_count, n)
    ):
        todo.extend([catalog.by_name[name]] * wanted[name])
    placed: list[Slot] = []

    def extend(i: int, min_start: int) -> Iterator[list[Slot]]:
        if i == len(todo):
            yield placed
            return
        profile = todo[i]
        next_same = i + 1 < len(todo) and todo[i + 1].name == profile.name
        for start, size in profile.placements:
            if start < min_start or not board.fits(profile, start, size):
                continue
            board.place(profile, start, size)
            placed.append(Slot(profile.name, start, size))
            yield from extend(i + 1, start + 1 if next_same else 0)
            placed.pop()
            board.remove(profile, start, size)

    yield from extend(0, 0)


def search_placement(wanted: dict[str, int], catalog: Catalog, fixed: Sequence[Slot] = ()) -> list[Slot] | None:
    """Exact search: place `wanted` (profile -> count) around the `fixed` slots, or None when impossible.

    Backtracking over NVML's possible placements per profile, the first layout found (sorted by start).
    """
    for placed in _layouts(wanted, catalog, fixed):
        return sorted(placed, key=lambda s: s.start)
    return None


def all_layouts(wanted: dict[str, int], catalog: Catalog) -> Iterator[frozenset[tuple[str, int]]]:
    """Every valid full placement of `wanted`, as sets of (profile, start): the exhaustive reference."""
    for placed in _layouts(wanted, catalog, ()):
        yield frozenset((s.profile, s.start) for s in placed)


def minimum_destroyed(current: Sequence[tuple[str, int]], wanted: dict[str, int], catalog: Catalog) -> int:
    """Fewest existing instances ((profile, start) each) any valid placement of `wanted` must destroy."""
    found = minimum_destroyed_keeping(current, wanted, set(), catalog)
    if found is None:
        raise ValueError(f"no valid placement for {wanted}")
    return found


def minimum_destroyed_keeping(
    current: Sequence[tuple[str, int]], wanted: dict[str, int], busy: set[tuple[str, int]], catalog: Catalog
) -> int | None:
    """Fewest of `current` destroyed by a placement of `wanted` that keeps every `busy` one; None if none can.

    By enumeration of every layout (not the planner's choice of which to keep), so it can check that choice.
    """
    now = set(current)
    overlaps = [len(layout & now) for layout in all_layouts(wanted, catalog) if busy <= layout]
    return len(current) - max(overlaps) if overlaps else None


def walk_subsets(
    catalog: Catalog,
    fixed: Iterable[tuple[str, int, int]],
    options: Sequence[tuple[str, int, int]],
    visit: Callable[[list[int]], None],
) -> None:
    """Call `visit` with the indexes of every subset of `options` ((profile, start, size) each) that fits around
    the `fixed` slots (the list is reused: copy what you keep). Options are tried in order, each left out first."""
    board = Board(catalog, fixed)
    chosen: list[int] = []

    def walk(i: int) -> None:
        if i == len(options):
            visit(chosen)
            return
        walk(i + 1)  # without option i
        name, start, size = options[i]
        profile = catalog.by_name[name]
        if not board.fits(profile, start, size):
            return
        board.place(profile, start, size)
        chosen.append(i)
        walk(i + 1)
        chosen.pop()
        board.remove(profile, start, size)

    walk(0)
