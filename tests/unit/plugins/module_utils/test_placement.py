"""The placement rules and the searches built on them, each against a naive reference written here (sets of memory
slices, every subset of candidate slots) rather than the engine's masks and backtracking."""

from __future__ import annotations

import random
from itertools import combinations, product

import pytest
from _helpers import H100, every_count_combination
from ansible_collections.gpufleet.mig.plugins.module_utils.placement import (
    Board,
    Catalog,
    Slot,
    all_layouts,
    mask,
    minimum_destroyed,
    minimum_destroyed_keeping,
    placement_size,
    search_placement,
    totals_problem,
    walk_subsets,
)
from ansible_collections.gpufleet.mig.plugins.module_utils.planner import ProfileInfo

# 4 compute slices, 8 memory slices: compute, not memory, is the limit.
TIGHT = Catalog(
    [
        ProfileInfo(0, 1, "1g.10gb", 1, 8, 10, tuple((start, 1) for start in range(8))),
        ProfileInfo(1, 2, "4g.40gb", 4, 1, 40, ((0, 4),)),
    ]
)


def naive_valid(slots: list[tuple[str, int]], catalog: Catalog) -> bool:
    """The rules from scratch: listed placements, disjoint memory slices, compute and per-profile totals."""
    cells: list[int] = []
    for name, start in slots:
        sizes = [size for s, size in catalog.by_name[name].placements if s == start]
        if not sizes:
            return False
        cells += range(start, start + sizes[0])
    names = [name for name, _start in slots]
    return (
        len(cells) == len(set(cells))
        and sum(catalog.by_name[n].slice_count for n in names) <= catalog.compute_slices
        and all(names.count(n) <= catalog.by_name[n].instance_count for n in set(names))
    )


def naive_layouts(wanted: dict[str, int], catalog: Catalog) -> set[frozenset[tuple[str, int]]]:
    per_profile = [
        combinations([(name, start) for start, _size in catalog.by_name[name].placements], count)
        for name, count in sorted(wanted.items())
    ]
    return {
        frozenset(slot for group in pick for slot in group)
        for pick in product(*per_profile)
        if naive_valid([slot for group in pick for slot in group], catalog)
    }


def test_mask_sets_one_bit_per_memory_slice():
    assert mask(0, 1) == 0b1
    assert mask(2, 3) == 0b11100
    assert mask(0, 8) == 0xFF


def test_placement_size_is_the_listed_placement_or_none():
    assert placement_size(H100, "3g.40gb", 4) == 4
    assert placement_size(H100, "1g.20gb", 6) == 2
    assert placement_size(H100, "3g.40gb", 2) is None
    assert placement_size(H100, "7g.80gb", 1) is None


def test_board_checks_each_rule_and_remove_undoes_place():
    board = Board(H100, [("3g.40gb", 0, 4)])
    one_g = H100.by_name["1g.10gb"]
    assert not board.fits(one_g, 3, 1)  # overlaps the 3g.40gb
    assert board.fits(one_g, 4, 1)
    board.place(one_g, 4, 1)
    assert (board.occupied, board.compute, board.counts) == (0b11111, 4, {"3g.40gb": 1, "1g.10gb": 1})
    board.remove(one_g, 4, 1)
    assert (board.occupied, board.compute, board.counts) == (0b1111, 3, {"3g.40gb": 1, "1g.10gb": 0})
    assert Board(H100, [("1g.20gb", 0, 2), ("1g.20gb", 2, 2), ("1g.20gb", 4, 2)]).counts == {"1g.20gb": 3}
    # Compute: 3 x 1g.10gb leave 1 of TIGHT's 4 compute slices with 5 memory slices free.
    tight = Board(TIGHT, [("1g.10gb", s, 1) for s in range(3)])
    assert tight.fits(TIGHT.by_name["1g.10gb"], 3, 1)
    tight.place(TIGHT.by_name["1g.10gb"], 3, 1)
    assert not tight.fits(TIGHT.by_name["1g.10gb"], 4, 1)  # memory free, compute full
    # Count: one 1g.10gb+me per GPU, though memory and compute are free.
    media = Board(H100, [("1g.10gb+me", 0, 1)])
    assert not media.fits(H100.by_name["1g.10gb+me"], 1, 1)
    assert media.fits(H100.by_name["1g.10gb"], 1, 1)


@pytest.mark.parametrize(
    ("counts", "problem"),
    [
        ({"2g.20gb": 4}, "4 x 2g.20gb requested, at most 3 fit on one GPU"),
        ({"3g.40gb": 2, "1g.10gb": 2}, "the layout needs 8 compute slices (2 x 1g.10gb + 2 x 3g.40gb), the GPU has 7"),
        ({"3g.40gb": 2, "1g.10gb": 1}, "the layout needs 9 memory slices (1 x 1g.10gb + 2 x 3g.40gb), the GPU has 8"),
        ({"4g.40gb": 1, "3g.40gb": 1}, None),  # 7 of 7 compute, 8 of 8 memory slices: the geometry decides
        ({"1g.10gb": 7}, None),
    ],
)
def test_totals_problem_names_the_first_total_broken(counts, problem):
    assert totals_problem(counts, H100) == problem


def test_all_layouts_is_every_valid_set_once():
    requests = list(every_count_combination(H100))
    for wanted in [*random.Random(5).sample(requests, 60), {"1g.10gb": 2}, {"1g.10gb+me": 2}, {"3g.40gb": 2}]:
        found = list(all_layouts(wanted, H100))
        assert len(found) == len(set(found)), wanted  # no permutation twice
        assert set(found) == naive_layouts(wanted, H100), wanted
    assert len(list(all_layouts({"1g.10gb": 2}, H100))) == 21  # 7 choose 2
    assert list(all_layouts({"1g.10gb+me": 2}, H100)) == []  # at most one per GPU


def test_search_places_around_fixed_slots_or_says_none():
    fixed = [Slot("3g.40gb", 4, 4)]
    # Only the slots added come back, sorted by start.
    assert search_placement({"2g.20gb": 2}, H100, fixed) == [Slot("2g.20gb", 0, 2), Slot("2g.20gb", 2, 2)]
    assert search_placement({"4g.40gb": 1}, H100, fixed) == [Slot("4g.40gb", 0, 4)]
    assert search_placement({"2g.20gb": 3}, H100, fixed) is None  # the third 2g.20gb (at 4) is under the 3g.40gb
    assert search_placement({"3g.40gb": 1}, H100, fixed) == [Slot("3g.40gb", 0, 4)]
    assert search_placement({}, H100, fixed) == []
    assert search_placement({"1g.10gb": 2}, TIGHT, [Slot("1g.10gb", s, 1) for s in range(3)]) is None


def test_minimum_destroyed_keeping_keeps_the_busy_and_counts_the_rest():
    # Around a held 1g.10gb at 0 and 3g.40gb at 4, 2 x 1g.10gb + 2g.20gb + 3g.40gb only fits with the 2g.20gb at 2.
    current = [("1g.10gb", 0), ("1g.10gb", 2), ("1g.10gb", 3), ("3g.40gb", 4)]
    target = {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}
    assert minimum_destroyed_keeping(current, target, {("1g.10gb", 0), ("3g.40gb", 4)}, H100) == 2
    assert minimum_destroyed_keeping(current, target, set(), H100) == 1
    assert minimum_destroyed(current, target, H100) == 1
    assert minimum_destroyed(current, {"1g.10gb": 4}, H100) == 1  # keep three of the 1g.10gb, destroy the 3g
    assert minimum_destroyed([], {"7g.80gb": 1}, H100) == 0
    # A busy 3g.40gb at 0 leaves no room for the 4g.40gb (it only starts at 0): no placement keeps it.
    assert minimum_destroyed_keeping([("3g.40gb", 0)], {"4g.40gb": 1}, {("3g.40gb", 0)}, H100) is None
    assert minimum_destroyed_keeping([("3g.40gb", 0)], {"4g.40gb": 1}, set(), H100) == 1
    with pytest.raises(ValueError, match="no valid placement for"):
        minimum_destroyed([], {"7g.80gb": 1, "1g.10gb": 1}, H100)


@pytest.mark.parametrize(
    ("catalog", "fixed", "options"),
    [
        (H100, [("3g.40gb", 4, 4)], [("1g.10gb", 0, 1), ("1g.10gb", 1, 1), ("3g.40gb", 0, 4), ("4g.40gb", 0, 4)]),
        (H100, [], [("1g.10gb+me", 0, 1), ("1g.10gb+me", 3, 1), ("2g.20gb", 2, 2), ("7g.80gb", 0, 8)]),
        (TIGHT, [("1g.10gb", 0, 1)], [("1g.10gb", s, 1) for s in range(1, 8)]),
    ],
    ids=["around-a-3g", "count-and-overlap", "compute"],
)
def test_walk_subsets_visits_every_fitting_subset_once(catalog, fixed, options):
    seen: list[tuple[int, ...]] = []
    walk_subsets(catalog, fixed, options, lambda chosen: seen.append(tuple(chosen)))
    expected = [
        pick
        for size in range(len(options) + 1)
        for pick in combinations(range(len(options)), size)
        if naive_valid([(n, s) for n, s, _z in fixed] + [options[i][:2] for i in pick], catalog)
    ]
    assert sorted(seen) == sorted(expected)
    assert len(seen) == len(set(seen))
