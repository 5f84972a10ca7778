"""The advisor against brute force on small pools (every combination of every GPU's layouts), and its guarantees
on larger ones: allocated instances kept, minimums met, only allowed profiles created, destroys at the minimum
for the chosen layout (the bench-mig reference), no change without a reason, the beam's bound."""

from __future__ import annotations

import json
import random
from itertools import product

import pytest
from ansible_collections.gpufleet.mig.plugins.module_utils import gpu_info
from ansible_collections.gpufleet.mig.plugins.module_utils.advisor import (
    AdviceError,
    CurrentInstance,
    GpuNow,
    advise,
    demand_from_pods,
    gpus_from_facts,
    rollout_surprises,
)
from ansible_collections.gpufleet.mig.plugins.module_utils.nvml_sim import SimulatedNvml, new_state
from ansible_collections.gpufleet.mig.plugins.module_utils.placement import minimum_destroyed_keeping
from ansible_collections.gpufleet.mig.plugins.module_utils.planner import Catalog
from ansible_collections.gpufleet.mig.plugins.module_utils.profile_tables import H100_80GB
from ansible_collections.gpufleet.mig.plugins.module_utils.runner import apply

H100 = Catalog.from_table(H100_80GB)

SMALL = ("1g.10gb", "2g.20gb", "3g.40gb")


def layouts(catalog: Catalog, profiles, fixed=()):
    """Every valid set of (profile, start) over `profiles` that contains `fixed` (naive, for reference)."""
    slots = [(p, s, z) for p in profiles for s, z in catalog.by_name[p].placements]
    fixed_set = set(fixed)
    result = []
    for pick in product((False, True), repeat=len(slots)):
        chosen = [slots[i] for i in range(len(slots)) if pick[i]]
        keys = {(p, s) for p, s, _z in chosen}
        if not fixed_set <= keys:
            continue
        cells = [c for _p, s, z in chosen for c in range(s, s + z)]
        counts = {p: sum(1 for q, _s, _z in chosen if q == p) for p in profiles}
        if len(cells) != len(set(cells)):
            continue
        if sum(catalog.by_name[p].slice_count for p, _s, _z in chosen) > catalog.compute_slices:
            continue
        if any(counts[p] > catalog.by_name[p].instance_count for p in profiles):
            continue
        result.append(frozenset(keys))
    return result


ALL_SMALL = layouts(H100, SMALL)


def random_gpu(rng: random.Random, node: str, index: int) -> GpuNow:
    layout = rng.choice(ALL_SMALL)
    instances = [CurrentInstance(p, s, allocated=rng.random() < 0.4) for p, s in sorted(layout, key=lambda x: x[1])]
    return GpuNow(node, index, H100, True, instances)


def brute_force(gpus: list[GpuNow], demand: dict, minimums: dict):
    """Best (served slices, -changes) over every combination of every GPU's layouts (creating only SMALL profiles)."""
    options = []
    for gpu in gpus:
        fixed = [(i.profile, i.start) for i in gpu.instances if i.allocated]
        existing_profiles = sorted({i.profile for i in gpu.instances} | set(SMALL))
        options.append(layouts(H100, existing_profiles, fixed))
    best = None
    for combo in product(*options):
        free, total, changes = {}, {}, 0
        for gpu, layout in zip(gpus, combo, strict=True):
            current = {(i.profile, i.start) for i in gpu.instances}
            held = {(i.profile, i.start) for i in gpu.instances if i.allocated}
            changes += len(current - layout) + len(layout - current)
            for p, s in layout:
                total[p] = total.get(p, 0) + 1
                if (p, s) not in held:
                    free[p] = free.get(p, 0) + 1
        if any(total.get(p, 0) < m for p, m in minimums.items()):
            continue
        served = sum(H100.by_name[p].slice_count * min(d, free.get(p, 0)) for p, d in demand.items())
        key = (served, -changes)
        if best is None or key > best:
            best = key
    return best


def changes(advice) -> int:
    return advice.destroyed + advice.created


@pytest.mark.parametrize("seed", range(12))
def test_optimal_against_brute_force_on_two_gpus(seed):
    rng = random.Random(seed)
    gpus = [random_gpu(rng, "n1", 0), random_gpu(rng, "n1", 1)]
    demand = {p: rng.randint(0, 4) for p in SMALL}
    minimums = {"2g.20gb": rng.randint(0, 2)} if seed % 3 == 0 else {}
    expected = brute_force(gpus, demand, minimums)
    if expected is None:
        with pytest.raises(AdviceError, match="minimums cannot be met"):
            advise(gpus, demand, minimums, allowed=list(SMALL))
        return
    advice = advise(gpus, demand, minimums, allowed=list(SMALL))
    assert (advice.served_slices, -changes(advice)) == expected
    assert advice.exact and advice.upper_bound_slices == advice.served_slices


def hk_imagegen(nodes: int = 6, seed: int = 0) -> list[GpuNow]:
    """The image-generation pool's layout (GPUs 0-3: 2 x 3g.40gb; 4-7: 3 x 2g.20gb + 1g.10gb), about half held."""
    rng = random.Random(seed)
    gpus = []
    for n in range(nodes):
        for i in range(8):
            slots = [("3g.40gb", 0), ("3g.40gb", 4)] if i < 4 else [("2g.20gb", 0), ("2g.20gb", 2), ("2g.20gb", 4)]
            slots += [] if i < 4 else [("1g.10gb", 6)]
            instances = [CurrentInstance(p, s, allocated=rng.random() < 0.5, uuid=f"MIG-{n}-{i}-{s}") for p, s in slots]
            gpus.append(GpuNow(f"hk-gpu-{11 + n:02d}", i, H100, True, instances))
    return gpus


def check_guarantees(gpus, advice, minimums=None, allowed=None):
    by_key = {(g.node, g.index): g for g in gpus}
    for gpu in advice.gpus:
        now = by_key[(gpu.node, gpu.index)]
        after = {(s.profile, s.start) for s in gpu.after}
        # Allocated instances stay, at their placement.
        assert {(i.profile, i.start) for i in now.instances if i.allocated} <= after
        assert all(not i.allocated for i in gpu.destroy)
        # What is destroyed is the fewest any valid placement of the new counts that keeps the allocated
        # instances destroys (bench-mig's reference).
        current = [(i.profile, i.start) for i in now.instances]
        held = {(i.profile, i.start) for i in now.instances if i.allocated}
        if gpu.changed:
            assert len(gpu.destroy) == minimum_destroyed_keeping(current, gpu.counts(), held, H100)
        if allowed is not None:
            assert all(s.profile in allowed for s in gpu.create)
    totals = {}
    for gpu in advice.gpus:
        for slot in gpu.after:
            totals[slot.profile] = totals.get(slot.profile, 0) + 1
    for profile, minimum in (minimums or {}).items():
        assert totals.get(profile, 0) >= minimum


def test_night_shift_to_small_instances_keeps_every_held_instance():
    gpus = hk_imagegen()
    demand = {"1g.10gb": 40}
    advice = advise(gpus, demand, minimums={"3g.40gb": 12}, allowed=["1g.10gb", "2g.20gb", "3g.40gb"])
    check_guarantees(gpus, advice, {"3g.40gb": 12}, {"1g.10gb", "2g.20gb", "3g.40gb"})
    assert advice.served["1g.10gb"] > 24  # more than the 4 free per node the static layout has at most
    assert advice.served_slices <= advice.upper_bound_slices
    # Rerun on the new layout (nothing new held, the same demand): nothing changes.
    after = [
        GpuNow(
            g.node,
            g.index,
            H100,
            True,
            [
                CurrentInstance(
                    s.profile, s.start, allocated=(s.profile, s.start) in {(i.profile, i.start) for i in g.allocated}
                )
                for s in g.after
            ],
        )
        for g in advice.gpus
    ]
    again = advise(after, demand, minimums={"3g.40gb": 12}, allowed=["1g.10gb", "2g.20gb", "3g.40gb"])
    assert changes(again) == 0 and again.served == advice.served


def test_no_demand_changes_nothing():
    advice = advise(hk_imagegen(), {})
    assert changes(advice) == 0 and all(not n["changed"] for n in advice.nodes())


def test_demand_already_served_changes_nothing():
    gpus = hk_imagegen()
    free_3g = sum(1 for g in gpus for i in g.instances if i.profile == "3g.40gb" and not i.allocated)
    advice = advise(gpus, {"3g.40gb": free_3g})
    assert changes(advice) == 0 and advice.served == {"3g.40gb": free_3g}


def test_allowed_profiles_are_the_only_ones_created():
    gpus = hk_imagegen(nodes=2)
    advice = advise(gpus, {"1g.10gb": 30, "2g.20gb": 10}, allowed=["2g.20gb"])
    check_guarantees(gpus, advice, allowed={"2g.20gb"})
    assert all(s.profile == "2g.20gb" for g in advice.gpus for s in g.create)


def test_impossible_minimum_is_one_line():
    gpus = [GpuNow("n1", 0, H100, True, [CurrentInstance("7g.80gb", 0, allocated=True)])]
    with pytest.raises(AdviceError) as info:
        advise(gpus, {}, minimums={"1g.10gb": 1})
    assert "\n" not in info.value.message and "1 free 1g.10gb" in info.value.message


@pytest.mark.parametrize(
    ("demand", "message"),
    [({"5g.50gb": 1}, "not a profile of the pool"), ({"nope": 1}, "not a MIG profile name"), ({"1g.10gb": -1}, ">= 0")],
)
def test_bad_demand(demand, message):
    with pytest.raises(AdviceError, match=message):
        advise(hk_imagegen(nodes=1), demand)


def test_beam_bound_when_the_pool_is_large():
    gpus = hk_imagegen(nodes=6, seed=3)
    demand = {"1g.10gb": 30, "2g.20gb": 12}
    exact = advise(gpus, demand, max_states=10_000)
    beam = advise(gpus, demand, max_states=4)
    assert exact.exact and not beam.exact and beam.states <= 4
    check_guarantees(gpus, beam)
    assert beam.served_slices <= exact.served_slices <= beam.upper_bound_slices
    assert changes(beam) >= changes(exact)


def test_gpus_from_facts_and_pending_pods(tmp_path):
    """nvidia_gpu_info's facts (from the simulator) + kubelet_pod_resources' allocations -> allocated instances."""
    state = tmp_path / "sim.json"
    state.write_text(json.dumps(new_state(gpus=1, product="NVIDIA H100 80GB HBM3")))
    sim = SimulatedNvml(str(state))
    apply(sim, [{"devices": "all", "mig_enabled": True, "mig_devices": {"3g.40gb": 2}}])
    facts = gpu_info.collect(sim)
    uuid_at = {i["start"]: i["compute_instances"][0]["mig_device_uuid"] for i in facts[0]["gpu_instances"]}
    held = {"allocated": [{"resource_name": "nvidia.com/mig-3g.40gb", "device_id": uuid_at[4]}]}
    (gpu,) = gpus_from_facts("n1", facts, held)
    assert [(i.profile, i.start, i.allocated) for i in gpu.instances] == [("3g.40gb", 0, False), ("3g.40gb", 4, True)]
    pods = [
        {
            "metadata": {"name": "a"},
            "spec": {"containers": [{"resources": {"limits": {"nvidia.com/mig-1g.10gb": "2"}}}]},
        },
        {
            "metadata": {"name": "b"},
            "spec": {"containers": [{"resources": {"requests": {"nvidia.com/mig-1g.10gb": 1}}}]},
        },
    ]
    demand = demand_from_pods(pods)
    assert demand == {"1g.10gb": 3}
    advice = advise([gpu], demand)
    (after,) = advice.gpus
    assert after.destroy[0].start == 0 and [s.profile for s in after.create] == ["1g.10gb"] * 3
    assert ("3g.40gb", 4) in {(s.profile, s.start) for s in after.after}


def test_rollout_surprises(tmp_path):
    """Read again just before applying: a plan that no longer matches the advice, or a newly held instance, stops."""
    state = tmp_path / "sim.json"
    state.write_text(json.dumps(new_state(gpus=1, product="NVIDIA H100 80GB HBM3")))
    sim = SimulatedNvml(str(state))
    apply(sim, [{"devices": "all", "mig_enabled": True, "mig_devices": {"1g.10gb": 7}}])
    facts = gpu_info.collect(sim)
    advice = advise(gpus_from_facts("n1", facts), {"3g.40gb": 1}, allowed=["1g.10gb", "3g.40gb"])
    (node,) = advice.nodes()
    plan = apply(sim, node["config"], check_mode=True)
    assert rollout_surprises(node, plan, facts, None) == []
    victim = node["gpus"][0]["destroy"][0]
    uuid = next(
        i["compute_instances"][0]["mig_device_uuid"] for i in facts[0]["gpu_instances"] if i["start"] == victim["start"]
    )
    problems = rollout_surprises(node, plan, facts, {"allocated": [{"device_id": uuid}]})
    assert problems == [f"n1 GPU 0: 1g.10gb@{victim['start']} to be destroyed is now allocated or busy"]
    other = dict(plan, gpus=[dict(plan["gpus"][0], actions=[])])
    assert "the advice chose other instances" in rollout_surprises(node, other, facts, None)[0]
    apply(sim, [{"devices": "all", "mig_enabled": True, "mig_devices": {"2g.20gb": 3}}])
    assert "changed since the advice" in rollout_surprises(node, plan, gpu_info.collect(sim), None)[0]
