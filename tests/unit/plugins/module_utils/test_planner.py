"""Placement search and minimal-change planning, checked against brute force."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from _helpers import H100, H200, bench, every_count_combination
from ansible_collections.gpufleet.mig.plugins.module_utils.exceptions import BusyInstanceError, SpecError
from ansible_collections.gpufleet.mig.plugins.module_utils.placement import all_layouts, minimum_destroyed
from ansible_collections.gpufleet.mig.plugins.module_utils.planner import (
    Catalog,
    GpuState,
    Instance,
    ProfileInfo,
    Slot,
    describe_counts,
    plan_gpu,
    search_placement,
    validate_target,
)
from ansible_collections.gpufleet.mig.plugins.module_utils.profile_tables import H100_80GB
from ansible_collections.gpufleet.mig.plugins.module_utils.spec import GpuTarget


def greedy_first_fit(wanted: dict[str, int], catalog: Catalog, order: list[str]) -> bool:
    """What a naive tool does: each instance at the lowest free placement, profiles in the given order."""
    used: set[int] = set()
    for name in order:
        for _ in range(wanted[name]):
            for start, size in catalog.by_name[name].placements:
                cells = set(range(start, start + size))
                if not cells & used:
                    used |= cells
                    break
            else:
                return False
    return True


def _is_valid(slots: list[Slot], wanted: dict[str, int], catalog: Catalog) -> bool:
    cells = [m for s in slots for m in range(s.start, s.start + s.size)]
    return (
        Counter(s.profile for s in slots) == Counter(wanted)
        and len(cells) == len(set(cells))
        and all((s.start, s.size) in catalog.by_name[s.profile].placements for s in slots)
        and sum(catalog.by_name[s.profile].slice_count for s in slots) <= catalog.compute_slices
    )


@pytest.mark.parametrize("catalog", [H100, H200], ids=["h100", "h200"])
def test_search_agrees_with_brute_force_on_every_request(catalog):
    checked = 0
    for wanted in every_count_combination(catalog):
        found = search_placement(wanted, catalog)
        feasible = next(all_layouts(wanted, catalog), None) is not None
        assert (found is not None) == feasible, wanted
        if found is not None:
            assert _is_valid(found, wanted, catalog), (wanted, found)
        checked += 1
    assert checked > 1000  # the whole request space of a Hopper GPU, not a sample


def test_greedy_counterexamples_exist_and_are_solved():
    """Find, by brute force, valid requests that first-fit greedy misses, in the user's order or largest first."""
    by_size = sorted(H100.names(), key=lambda n: -H100.by_name[n].slice_count)
    misses_user_order, misses_largest_first = [], []
    for wanted in every_count_combination(H100):
        if search_placement(wanted, H100) is None:
            continue
        if not greedy_first_fit(wanted, H100, sorted(wanted)):
            misses_user_order.append(wanted)
        if not greedy_first_fit(wanted, H100, [n for n in by_size if n in wanted]):
            misses_largest_first.append(wanted)
    assert {"1g.10gb": 1, "4g.40gb": 1} in misses_user_order  # 4g.40gb can only start at 0
    assert {"2g.20gb": 2, "3g.40gb": 1} in misses_largest_first  # 3g.40gb must go to 4
    for wanted in misses_user_order + misses_largest_first:
        assert _is_valid(search_placement(wanted, H100), wanted, H100)


@pytest.mark.parametrize(
    ("wanted", "expected"),
    [
        ({"1g.10gb": 1, "4g.40gb": 1}, [Slot("4g.40gb", 0, 4), Slot("1g.10gb", 4, 1)]),
        ({"2g.20gb": 2, "3g.40gb": 1}, [Slot("2g.20gb", 0, 2), Slot("2g.20gb", 2, 2), Slot("3g.40gb", 4, 4)]),
        ({"7g.80gb": 1}, [Slot("7g.80gb", 0, 8)]),
    ],
)
def test_search_places_away_from_slot_zero_when_needed(wanted, expected):
    assert search_placement(wanted, H100) == expected


def test_geometry_failure_message_with_a_catalog_where_totals_fit():
    # A GPU whose 2-slice profile may only start at 1: two of them fit the totals but never the geometry.
    odd = Catalog(
        [
            ProfileInfo(0, 1, "1g.10gb", 1, 4, 10, ((0, 1), (1, 1), (2, 1), (3, 1))),
            ProfileInfo(1, 2, "2g.20gb", 2, 2, 20, ((1, 2), (2, 2))),
            ProfileInfo(3, 5, "4g.40gb", 4, 1, 40, ((0, 4),)),
        ]
    )
    with pytest.raises(SpecError, match=r"GPU 9: no valid placement for 2 x 2g.20gb .*2g.20gb at 1/2"):
        validate_target({"2g.20gb": 2}, odd, "GPU 9")
    # Two profiles whose placements overlap: each one's starts, "; " between them.
    roomy = Catalog(odd.profiles)
    roomy.memory_slices = roomy.compute_slices = 8  # totals that fit, placements that still overlap
    with pytest.raises(SpecError) as refused:
        validate_target({"2g.20gb": 1, "4g.40gb": 1}, roomy, "GPU 9")
    assert refused.value.message == (
        "GPU 9: no valid placement for 1 x 2g.20gb + 1 x 4g.40gb (totals fit, but the possible placements overlap: "
        "2g.20gb at 1/2; 4g.40gb at 0)"
    )


def _state(instances, mig=True):
    return GpuState(
        index=3, uuid="GPU-x", name="NVIDIA H100 80GB HBM3", mig_current=mig, mig_pending=mig, instances=instances
    )


def _inst(gi_id, profile, start, pids=()):
    return Instance(gi_id, profile, start, H100.by_name[profile].placements[0][1], tuple(pids))


def test_only_changed_instances_are_touched():
    state = _state([_inst(1, "3g.40gb", 0), _inst(2, "2g.20gb", 4), _inst(3, "1g.10gb", 6)])
    plan = plan_gpu(state, GpuTarget(True, {"3g.40gb": 1, "1g.10gb": 3}, 0), H100, force=False)
    assert plan.actions() == [
        {"op": "destroy", "profile": "2g.20gb", "start": 4},
        {"op": "create", "profile": "1g.10gb", "start": 4},
        {"op": "create", "profile": "1g.10gb", "start": 5},
    ]


def test_kept_instance_forces_placement_of_the_rest():
    # 1g.10gb at 0 stays; 3g.40gb then has to go to 4 and the 2g.20gb to 2.
    state = _state([_inst(1, "1g.10gb", 0)])
    plan = plan_gpu(state, GpuTarget(True, {"1g.10gb": 1, "3g.40gb": 1, "2g.20gb": 1}, 0), H100, force=False)
    assert plan.destroy == []
    assert [s.as_dict() for s in plan.create] == [
        {"profile": "2g.20gb", "start": 2},
        {"profile": "3g.40gb", "start": 4},
    ]


def test_busy_instance_is_kept_in_preference_to_an_idle_one():
    # Two 1g.20gb at 0 and 6; the new layout (4g.40gb + 1g.20gb) keeps only one: the busy one at 6.
    state = _state([_inst(1, "1g.20gb", 0), _inst(2, "1g.20gb", 6, pids=[4242])])
    plan = plan_gpu(state, GpuTarget(True, {"4g.40gb": 1, "1g.20gb": 1}, 0), H100, force=False)
    assert [i.gi_id for i in plan.destroy] == [1]


@pytest.mark.parametrize("force", [False, True], ids=["no-force", "force"])
def test_busy_instance_is_kept_where_geometry_leaves_a_choice(force):
    # Either 1g.20gb can stay: 3g.40gb fits at 4 (keep the one at 0) or at 0 (keep the one at 4). Only the rule
    # "busy first" decides, so the idle one at 0 goes, with or without force, and the running job is untouched.
    state = _state([_inst(1, "1g.20gb", 0), _inst(2, "1g.20gb", 4, pids=[4242])])
    plan = plan_gpu(state, GpuTarget(True, {"1g.20gb": 1, "3g.40gb": 1}, 0), H100, force=force)
    assert [i.gi_id for i in plan.destroy] == [1]
    assert [s.as_dict() for s in plan.create] == [{"profile": "3g.40gb", "start": 0}]


def test_idle_instances_keep_the_lowest_placement_when_nothing_is_busy():
    # The same layout with nobody busy: keeping either one destroys one instance; the first (lowest) stays.
    state = _state([_inst(1, "1g.20gb", 0), _inst(2, "1g.20gb", 4)])
    plan = plan_gpu(state, GpuTarget(True, {"1g.20gb": 1, "3g.40gb": 1}, 0), H100, force=False)
    assert [i.gi_id for i in plan.destroy] == [2]
    assert [s.as_dict() for s in plan.create] == [{"profile": "3g.40gb", "start": 4}]


def test_busy_instance_refusal_names_gpu_instance_and_pids():
    state = _state([_inst(5, "7g.80gb", 0, pids=[111, 222])])
    with pytest.raises(
        BusyInstanceError, match=r"GPU 3: instance 7g.80gb at slice 0 \(GPU instance 5\).*PIDs 111, 222"
    ):
        plan_gpu(state, GpuTarget(True, {"3g.40gb": 2}, 0), H100, force=False)
    plan = plan_gpu(state, GpuTarget(True, {"3g.40gb": 2}, 0), H100, force=True)
    assert [a["op"] for a in plan.actions()] == ["destroy", "create", "create"]


def test_disabling_mig_destroys_everything_and_sets_the_mode():
    state = _state([_inst(1, "3g.40gb", 0), _inst(2, "3g.40gb", 4)])
    plan = plan_gpu(state, GpuTarget(False, {}, 0), H100, force=False)
    assert plan.set_mode and plan.after == [] and len(plan.destroy) == 2


def test_matching_gpu_is_not_touched():
    state = _state([_inst(1, "3g.40gb", 0), _inst(2, "3g.40gb", 4)])
    assert not plan_gpu(state, GpuTarget(True, {"3g.40gb": 2}, 0), H100, force=False).changed


@pytest.mark.parametrize(
    ("state", "target", "disruptive"),
    [
        # creating in free slices touches nothing that runs
        (_state([_inst(1, "3g.40gb", 0)]), GpuTarget(True, {"3g.40gb": 2}, 0), False),
        # replacing an instance destroys one
        (_state([_inst(1, "3g.40gb", 0), _inst(2, "3g.40gb", 4)]), GpuTarget(True, {"7g.80gb": 1}, 0), True),
        # switching MIG on resets the GPU, even with nothing to destroy
        (_state([], mig=False), GpuTarget(True, {"3g.40gb": 2}, 0), True),
        # and so does switching it off
        (_state([]), GpuTarget(False, {}, 0), True),
        # nothing to do
        (_state([_inst(1, "3g.40gb", 0), _inst(2, "3g.40gb", 4)]), GpuTarget(True, {"3g.40gb": 2}, 0), False),
    ],
    ids=["create-only", "destroy", "enable-mig", "disable-mig", "unchanged"],
)
def test_plan_says_whether_it_is_disruptive(state, target, disruptive):
    assert plan_gpu(state, target, H100, force=True).disruptive is disruptive


@pytest.mark.parametrize("seed", range(4))
def test_random_transitions_destroy_the_brute_force_minimum(seed):
    rng = random.Random(seed)
    for _ in range(40):
        before = bench.random_layout(rng, H100)
        current = search_placement(before, H100) or []
        # shuffle where the current instances are, among all valid placements of that layout
        layouts = list(all_layouts(before, H100)) if before else [frozenset()]
        chosen = sorted(rng.choice(layouts), key=lambda item: item[1])
        current = [_inst(i + 1, name, start) for i, (name, start) in enumerate(chosen)]
        target = bench.random_layout(rng, H100)
        plan = plan_gpu(_state(current), GpuTarget(True, target, 0), H100, force=False)
        minimum = minimum_destroyed([(i.profile, i.start) for i in current], target, H100)
        assert len(plan.destroy) == minimum, (chosen, target)
        assert _is_valid(plan.after, target, H100)


def test_h100_catalog_has_the_driver_profile_ids_and_placements():
    # H100 80GB: the GI profile IDs and placements (start:size, 8 memory slices) NVML reports. Built here, not
    # at import, so that the test runs Catalog.from_table itself.
    h100 = Catalog.from_table(H100_80GB)
    listed = {p["name"]: p for p in h100.as_dict()}
    row = next(r for r in H100_80GB.profiles if r.name == "3g.40gb")
    assert list(listed) == ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]
    assert {n: p["profile_id"] for n, p in listed.items()} == {
        "1g.10gb": 19, "1g.10gb+me": 20, "1g.20gb": 15, "2g.20gb": 14, "3g.40gb": 9, "4g.40gb": 5, "7g.80gb": 0,
    }  # fmt: skip
    placements = {n: [(s["start"], s["size"]) for s in p["placements"]] for n, p in listed.items()}
    assert placements["1g.10gb"] == [(start, 1) for start in range(7)]
    assert placements["1g.20gb"] == [(0, 2), (2, 2), (4, 2), (6, 2)]
    assert placements["2g.20gb"] == [(0, 2), (2, 2), (4, 2)]
    assert placements["3g.40gb"] == [(0, 4), (4, 4)]
    assert placements["4g.40gb"] == [(0, 4)] and placements["7g.80gb"] == [(0, 8)]
    assert listed["3g.40gb"] == {
        "name": "3g.40gb",
        "profile_id": 9,
        "profile_enum": row.enum,
        "compute_slices": 3,
        "max_instances": 2,
        "memory_mib": row.memory_mib,
        "placements": [{"start": 0, "size": 4}, {"start": 4, "size": 4}],
    }
    assert listed["1g.10gb"]["max_instances"] == 7 and listed["7g.80gb"]["compute_slices"] == 7
    assert (h100.compute_slices, h100.memory_slices) == (7, 8)
    assert h100.by_id[9] is h100.by_name["3g.40gb"]
    assert describe_counts({"3g.40gb": 2, "1g.10gb": 1}) == "1 x 1g.10gb + 2 x 3g.40gb"
    assert describe_counts({}) == "no instances"


@pytest.mark.parametrize(
    ("target", "message"),
    [
        (
            {"1c.3g.40gb": 1, "1c.2g.20gb": 1, "9g.90gb": 1},
            "1c.2g.20gb, 1c.3g.40gb: compute-instance profiles smaller than their GPU instance are not supported "
            "(nvidia_mig creates one compute instance spanning each GPU instance); use the <G>g.<GB>gb form",
        ),
        (
            {"9g.90gb": 1, "8g.1gb": 2, "bogus": 1},
            "unknown MIG profile(s) 8g.1gb, 9g.90gb, bogus for this GPU; valid profiles: 1g.10gb, 1g.10gb+me, "
            "1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb",
        ),
        ({"1g.10gb+me": 2}, "2 x 1g.10gb+me requested, at most 1 fit on one GPU"),
        ({"1g.10gb": 8}, "8 x 1g.10gb requested, at most 7 fit on one GPU"),
        (
            {"4g.40gb": 1, "1g.10gb": 4},
            "the layout needs 8 compute slices (4 x 1g.10gb + 1 x 4g.40gb), the GPU has 7",
        ),
        (
            {"3g.40gb": 2, "1g.10gb": 1},
            "the layout needs 9 memory slices (1 x 1g.10gb + 2 x 3g.40gb), the GPU has 8",
        ),
    ],
)
def test_validate_target_refusals_name_the_constraint_word_for_word(target, message):
    with pytest.raises(SpecError) as failure:
        validate_target(target, H100, "GPU 0")
    assert failure.value.message == f"GPU 0: {message}"


def test_a_layout_at_the_limits_is_valid():
    assert validate_target({"1g.10gb": 7}, H100, "GPU 0") == [Slot("1g.10gb", s, 1) for s in range(7)]
    assert validate_target({"4g.40gb": 1, "3g.40gb": 1}, H100, "GPU 0") == [
        Slot("4g.40gb", 0, 4),
        Slot("3g.40gb", 4, 4),
    ]


def test_busy_refusal_lists_every_busy_instance_and_processes_outside_instances():
    state = GpuState(
        2, "GPU-u", "NVIDIA H100 80GB HBM3", True, True,
        [Instance(4, "3g.40gb", 4, 4, (11, 12), uuid="MIG-abc"), Instance(5, "3g.40gb", 0, 4, (13,))],
    )  # fmt: skip
    with pytest.raises(BusyInstanceError) as failure:
        plan_gpu(state, GpuTarget(True, {"7g.80gb": 1}, 0), H100, force=False)
    assert failure.value.message == (
        "GPU 2: instance 3g.40gb at slice 0 (GPU instance 5) has running processes (PIDs 13); "
        "GPU 2: instance 3g.40gb at slice 4 (GPU instance 4, MIG-abc) has running processes (PIDs 11, 12); "
        "stop them or set force=true"
    )
    off = GpuState(2, "GPU-u", "NVIDIA H100 80GB HBM3", False, False, [], gpu_pids=(77, 88))
    with pytest.raises(BusyInstanceError) as failure:
        plan_gpu(off, GpuTarget(True, {"7g.80gb": 1}, 0), H100, force=False)
    assert failure.value.message == (
        "GPU 2: MIG mode must change but processes run on the GPU (PIDs 77, 88); stop them or set force=true"
    )
    # Processes outside instances only matter when the mode changes.
    on = GpuState(2, "GPU-u", "NVIDIA H100 80GB HBM3", True, True, [], gpu_pids=(77,))
    assert [a["op"] for a in plan_gpu(on, GpuTarget(True, {"7g.80gb": 1}, 0), H100, force=False).actions()] == [
        "create"
    ]


def test_an_empty_catalog_has_no_slices():
    # What read_catalog gives for a GPU without MIG profiles when MIG is not wanted on it.
    empty = Catalog([])
    assert (empty.names(), empty.compute_slices, empty.memory_slices, empty.by_id) == ([], 0, 0, {})


def test_instances_of_a_profile_wanted_fewer_times_do_not_end_the_search():
    # Keeping both 1g.10gb is over the count; keeping one of them with the 2g.20gb is the best choice.
    state = _state([_inst(1, "1g.10gb", 0), _inst(2, "1g.10gb", 1), _inst(3, "2g.20gb", 2)])
    plan = plan_gpu(state, GpuTarget(True, {"1g.10gb": 1, "2g.20gb": 1}, 0), H100, force=False)
    assert [i.gi_id for i in plan.destroy] == [2]
    assert plan.create == []


def test_plan_lists_the_layout_before_by_start_and_names_entry_and_gpu_in_refusals():
    state = _state([_inst(2, "3g.40gb", 4), _inst(1, "1g.10gb", 0)])
    plan = plan_gpu(state, GpuTarget(True, {"3g.40gb": 1, "1g.10gb": 1}, 0), H100, force=False)
    assert plan.before == [Slot("1g.10gb", 0, 1), Slot("3g.40gb", 4, 4)] and not plan.changed
    with pytest.raises(SpecError) as failure:
        plan_gpu(state, GpuTarget(True, {"1g.10gb": 8}, 2), H100, force=False)
    assert failure.value.message == (
        "config[2]: GPU 3 (NVIDIA H100 80GB HBM3): 8 x 1g.10gb requested, at most 7 fit on one GPU"
    )


def test_enabling_mig_plans_every_instance_and_destroys_nothing_nvml_still_lists():
    # MIG off now: instances NVML may still list vanish with the mode change; the whole layout is created.
    stale = GpuState(3, "GPU-x", "NVIDIA H100 80GB HBM3", False, False, [_inst(1, "7g.80gb", 0)], gpu_pids=(5,))
    plan = plan_gpu(stale, GpuTarget(True, {"3g.40gb": 2}, 0), H100, force=True)
    assert plan.set_mode and plan.destroy == [] and plan.gpu_pids == (5,)
    assert plan.create == [Slot("3g.40gb", 0, 4), Slot("3g.40gb", 4, 4)] == plan.after
    off = plan_gpu(stale, GpuTarget(False, {}, 0), H100, force=True)
    assert off.destroy == [] and not off.changed


def test_a_pending_mode_change_the_other_way_is_overridden():
    # MIG is on, but a disable is pending (active at the next reset): wanting MIG on must set the mode again.
    state = GpuState(3, "GPU-x", "NVIDIA H100 80GB HBM3", True, False, [_inst(1, "7g.80gb", 0)])
    plan = plan_gpu(state, GpuTarget(True, {"7g.80gb": 1}, 0), H100, force=False)
    assert plan.set_mode and plan.destroy == [] and plan.create == []


@pytest.mark.parametrize(
    ("wanted", "expected"),
    [
        # Larger placements go first, so they take the low slots.
        ({"1g.10gb": 1, "3g.40gb": 1}, [Slot("3g.40gb", 0, 4), Slot("1g.10gb", 4, 1)]),
        # Same placement size: more compute slices first.
        ({"1g.20gb": 1, "2g.20gb": 1}, [Slot("2g.20gb", 0, 2), Slot("1g.20gb", 2, 2)]),
    ],
)
def test_search_places_larger_profiles_in_the_low_slots(wanted, expected):
    assert search_placement(wanted, H100) == expected


def test_compute_slices_of_kept_instances_count_against_the_new_ones():
    # A GPU where compute, not memory, is the limit: 4 compute slices, 8 memory slices.
    tight = Catalog(
        [
            ProfileInfo(0, 1, "1g.10gb", 1, 8, 10, tuple((start, 1) for start in range(8))),
            ProfileInfo(1, 2, "4g.40gb", 4, 1, 40, ((0, 4),)),
        ]
    )
    kept = [Slot("1g.10gb", 0, 1), Slot("1g.10gb", 1, 1), Slot("1g.10gb", 2, 1)]
    assert search_placement({"1g.10gb": 1}, tight, kept) == [Slot("1g.10gb", 3, 1)]
    assert search_placement({"1g.10gb": 2}, tight, kept) is None  # 3 kept + 2 new = 5 compute slices > 4


def test_the_busy_instance_is_found_after_idle_ones_of_equal_score():
    # One 1g.20gb can stay; the first two candidates are idle and tie, the busy one comes last and must win.
    state = _state([_inst(1, "1g.20gb", 0), _inst(2, "1g.20gb", 2), _inst(3, "1g.20gb", 4, pids=[4242])])
    plan = plan_gpu(state, GpuTarget(True, {"1g.20gb": 1, "3g.40gb": 1}, 0), H100, force=False)
    assert [i.gi_id for i in plan.destroy] == [1, 2]
    assert plan.create == [Slot("3g.40gb", 0, 4)]


def test_keeping_a_busy_instance_beats_keeping_more_idle_ones():
    # Keeping both idle instances (2g.20gb@0, 1g.20gb@2) would put 3g.40gb at 4 over the busy 2g.20gb; keeping the
    # busy one alone costs one more destroyed instance but leaves the running job untouched.
    state = _state([_inst(1, "2g.20gb", 0), _inst(2, "1g.20gb", 2), _inst(3, "2g.20gb", 4, pids=[4242])])
    plan = plan_gpu(state, GpuTarget(True, {"1g.20gb": 1, "3g.40gb": 1, "2g.20gb": 1}, 0), H100, force=False)
    assert [i.gi_id for i in plan.destroy] == [1, 2]
    assert [(s.profile, s.start) for s in plan.after] == [("3g.40gb", 0), ("2g.20gb", 4), ("1g.20gb", 6)]


def test_when_not_every_busy_instance_can_stay_one_is_kept_and_the_other_refused():
    state = _state([_inst(1, "1g.20gb", 0, pids=[11]), _inst(2, "1g.20gb", 2, pids=[22])])
    target = GpuTarget(True, {"1g.20gb": 1, "3g.40gb": 1}, 0)
    with pytest.raises(BusyInstanceError, match=r"instance 1g.20gb at slice 2 \(GPU instance 2\).*PIDs 22"):
        plan_gpu(state, target, H100, force=False)
    assert [i.gi_id for i in plan_gpu(state, target, H100, force=True).destroy] == [2]
