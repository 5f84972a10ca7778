"""MIG re-layout on a day trace (simulate/relayout.py): the advisor's re-layouts against the static layout."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from gpufleet_lab.mig_utils.placement import minimum_destroyed_keeping
from gpufleet_lab.simulate import relayout
from gpufleet_lab.simulate.fleet import FleetError, fleet_from_inventory_data
from gpufleet_lab.simulate.relayout import (
    HOUR,
    Pod,
    PoolModel,
    day_trace,
    gpus_needed,
    pools_from_fleet,
    run_pool,
    time_sliced,
)
from gpufleet_lab.simulate.verdict import goal_lines

REPO = Path(__file__).resolve().parents[3]
ALLOWED = ["1g.10gb", "3g.40gb"]
TWO_3G = [("3g.40gb", 0), ("3g.40gb", 4)]
SEVEN_1G = [("1g.10gb", s) for s in range(7)]
IMAGEGEN = [TWO_3G] * 4 + [[("2g.20gb", 0), ("2g.20gb", 2), ("2g.20gb", 4), ("1g.10gb", 6)]] * 4


@pytest.fixture(scope="module")
def minimum_destroyed():
    """The exhaustive reference the simulator checks each re-layout against (the one bench-mig uses)."""
    return minimum_destroyed_keeping


def test_the_minimum_keeps_the_held_instances(minimum_destroyed):
    # Found by the lab variant's search: 1g@0 and 3g@4 held, 1g@2 and 1g@3 free; the advice makes 2 x 1g + 2g + 3g
    # with the 2g at slice 2 (the only place left), destroying both free 1g. Ignoring the held ones, 1 would do.
    current = [("1g.10gb", 0), ("1g.10gb", 2), ("1g.10gb", 3), ("3g.40gb", 4)]
    target = {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}
    assert minimum_destroyed(current, target, {("1g.10gb", 0), ("3g.40gb", 4)}, relayout.H100) == 2
    assert minimum_destroyed(current, target, set(), relayout.H100) == 1


def _pod(number: int, profile: str, arrival: float, duration: float, tenant: str = "t") -> Pod:
    return Pod(number, tenant, "s", profile, arrival, duration)


def test_hand_worked_trace_re_layout_frees_the_idle_half_and_keeps_the_running_pod(minimum_destroyed):
    # One GPU of 2 x 3g.40gb. Pod 0 (3g, t=0, 50 min) takes 3g@0, the first free. Pods 1-3 want 1g.10gb at t=100 s.
    # Static: no 1g instance ever, so they wait until the horizon (last arrival + 1 h = 3700 s): 3 x 3600 s.
    # Re-layout every 10 min: at 600 s the demand is 3 waiting + 3 arrived in the last 10 min = 6 x 1g.10gb; the
    # only free instance, 3g@4, goes (1 destroyed, the minimum), 1g@4, 5, 6 come (3 created), and pods 1-3 start at
    # 600 s: 3 x 500 s = 25 pod-minutes. Pod 0 keeps its instance.
    pods = [_pod(0, "3g.40gb", 0, 3000)] + [_pod(i, "1g.10gb", 100, 600) for i in (1, 2, 3)]
    static = run_pool("t", [TWO_3G], pods, None)
    assert static.never == 3 and static.pending_pod_minutes == pytest.approx(180.0)
    model = PoolModel("t", [TWO_3G], pods, every=10, minimum_destroyed=minimum_destroyed, allowed=ALLOWED)
    run = model.simulate()
    assert run.never == 0 and run.waits == [0.0, 500.0, 500.0, 500.0]
    assert run.pending_pod_minutes == pytest.approx(25.0)
    (record,) = run.relayouts
    assert record.at == 600 and record.demand == {"1g.10gb": 6}
    assert (record.destroyed, record.minimum, record.created, record.disturbed) == (1, 1, 3, 0)
    assert sorted((i.profile, i.start) for i in model.gpus[0]) == [
        ("1g.10gb", 4),
        ("1g.10gb", 5),
        ("1g.10gb", 6),
        ("3g.40gb", 0),
    ]


def test_re_layout_never_destroys_an_allocated_instance_and_destroys_the_minimum_on_a_day_slice(minimum_destroyed):
    # Six hours around the evening change of shape, on 8 imagegen GPUs at a tenth of the rates.
    pods = [p for p in day_trace(hours=24, seed=3, scale=0.1) if 16 * HOUR <= p.arrival < 22 * HOUR]
    pods = [Pod(i, p.tenant, p.stream, p.profile, p.arrival - 16 * HOUR, p.duration) for i, p in enumerate(pods)]
    run = run_pool("imagegen", IMAGEGEN, pods, 10, minimum_destroyed)
    assert len(run.relayouts) >= 3 and run.destroyed > 0  # it did re-partition, so the checks below bite
    assert run.disturbed == 0
    assert run.above_minimum == 0
    static = run_pool("imagegen", IMAGEGEN, pods, None)
    assert run.pending_pod_minutes < static.pending_pod_minutes


def test_a_destroyed_running_pod_is_counted_as_disturbed(monkeypatch):
    # An advisor that destroys every instance, running or not: the model must count the running pod.
    from gpufleet_lab.mig_utils.advisor import advise as real_advise

    def careless(gpus, demand, **kwargs):
        for gpu in gpus:
            gpu.instances = [i.__class__(i.profile, i.start, False) for i in gpu.instances]
        return real_advise(gpus, demand, **kwargs)

    monkeypatch.setattr(relayout, "advise", careless)
    pods = [_pod(0, "3g.40gb", 0, 3000), _pod(1, "3g.40gb", 0, 3000), _pod(2, "1g.10gb", 100, 600)]
    run = run_pool("t", [TWO_3G], pods, 10, allowed=ALLOWED)
    assert run.disturbed == 1  # both 3g.40gb hold a pod; the advice destroys one to make room for 1g.10gb


def test_gpus_needed_bisects_to_the_smallest_pool_within_the_bound():
    # 15 one-slice pods at once, 10 min each, 7 x 1g.10gb per GPU: 3 GPUs start them all at once; 2 GPUs leave one
    # waiting 10 min. With a 5 min bound: 3; with a 15 min bound: 2.
    pods = [_pod(i, "1g.10gb", 0, 600) for i in range(15)]
    assert gpus_needed("t", [SEVEN_1G], pods, None, 300, 10)[0] == 3
    assert gpus_needed("t", [SEVEN_1G], pods, None, 900, 10)[0] == 2
    # A profile the layout lacks: static never serves it, within any limit.
    assert gpus_needed("t", [SEVEN_1G], [_pod(0, "3g.40gb", 0, 60)], None, 900, 4)[0] is None


def test_the_day_trace_shifts_shape_and_is_the_same_for_a_seed():
    pods = day_trace(seed=1)
    assert pods == day_trace(seed=1) and pods != day_trace(seed=2)
    day = Counter(p.profile for p in pods if p.tenant == "imagegen" and 11 * HOUR <= p.arrival < 17 * HOUR)
    night = Counter(
        p.profile for p in pods if p.tenant == "imagegen" and (p.arrival < 5 * HOUR or p.arrival >= 23 * HOUR)
    )
    assert day["3g.40gb"] > 4 * night["3g.40gb"] and night["1g.10gb"] > 4 * day["1g.10gb"]
    assert [p.number for p in pods] == list(range(len(pods))) and pods == sorted(pods, key=lambda p: p.arrival)


def _inventory(**img_vars):
    return {
        "_meta": {
            "hostvars": {
                "img-1": {
                    "gpufleet_tenant": "imagegen",
                    "gpufleet_gpus_per_node": 2,
                    "mig_partition_config": [{"devices": "all", "mig_enabled": True, "mig_devices": {"3g.40gb": 2}}],
                    **img_vars,
                },
                "llm-1": {
                    "gpufleet_tenant": "llm",
                    "gpufleet_gpus_per_node": 8,
                    "mig_partition_config": [{"devices": "all", "mig_enabled": False}],
                },
                "cp": {},
            }
        }
    }


def test_pools_come_from_the_fleet_readers_layouts_exactly_placed():
    # The pools are read by the placement simulator's inventory reader (fleet.py), not by a reader of their own.
    assert pools_from_fleet(fleet_from_inventory_data(_inventory())) == {"imagegen": [TWO_3G, TWO_3G]}
    whole_gpus_only = _inventory()
    del whole_gpus_only["_meta"]["hostvars"]["img-1"]
    with pytest.raises(relayout.RelayoutError, match="no MIG pool"):
        pools_from_fleet(fleet_from_inventory_data(whole_gpus_only))
    # Each host's gpufleet_gpu_product counts: an H200 pool is named, not modelled as an H100 one; an unknown
    # product is refused by the reader with the layout library's message, under the variable's name.
    h100 = _inventory(gpufleet_gpu_product="NVIDIA H100 80GB HBM3")
    assert pools_from_fleet(fleet_from_inventory_data(h100)) == {"imagegen": [TWO_3G, TWO_3G]}
    h200_layout = [{"devices": "all", "mig_enabled": True, "mig_devices": {"3g.71gb": 2}}]
    h200 = fleet_from_inventory_data(_inventory(gpufleet_gpu_product="NVIDIA H200", mig_partition_config=h200_layout))
    pools = relayout.mig_pools(h200)
    assert pools["imagegen"].layouts == [[("3g.71gb", 0), ("3g.71gb", 4)]] * 2
    assert pools["imagegen"].table.product == "NVIDIA H200"  # its own catalog, not H100's
    with pytest.raises(FleetError, match=r"^host img-1: gpufleet_gpu_product: "):
        fleet_from_inventory_data(_inventory(gpufleet_gpu_product="NVIDIA T4"))


def test_a_pool_of_two_products_is_refused_naming_the_node():
    data = _inventory()
    data["_meta"]["hostvars"]["img-2"] = {
        **data["_meta"]["hostvars"]["img-1"],
        "gpufleet_gpu_product": "NVIDIA H200",
        "mig_partition_config": [{"devices": "all", "mig_enabled": True, "mig_devices": {"3g.71gb": 2}}],
    }
    data["pool_imagegen"] = {"hosts": ["img-1", "img-2"]}
    with pytest.raises(relayout.RelayoutError, match=r"^img-2: gpufleet_gpu_product NVIDIA H200: pool imagegen has"):
        relayout.mig_pools(fleet_from_inventory_data(data))


def test_any_fleets_pools_get_the_day_by_their_shape_and_size():
    # Hong Kong's pools get the day exactly as it was written for them.
    hongkong = relayout.mig_pools(relayout.inventory_fleet(REPO / "inventories/hongkong"))
    assert set(relayout.pool_streams(hongkong)) == set(relayout.DAY_STREAMS)
    # Another fleet: an H200 pool of several sizes (16 GPUs) gets the mixed pool's streams in its own profiles, a
    # third of imagegen's (48 GPUs); a 4-GPU pool of one size the single-size pool's, an eighth of finnlp's (32).
    harbour = relayout.mig_pools(relayout.inventory_fleet(REPO / "tests/data/fleets/harbour"))
    streams = {(s.tenant, s.name): s for s in relayout.pool_streams(harbour)}
    assert {key: s.profile for key, s in streams.items()} == {
        ("genai", "sdxl"): "3g.71gb",
        ("genai", "previews"): "1g.18gb",
        ("genai", "upscale"): "2g.35gb",
        ("embed", "batch"): "1g.10gb",
        ("embed", "interactive"): "1g.10gb",
    }
    assert streams[("genai", "sdxl")].peak == pytest.approx(36 / 3)
    assert streams[("embed", "batch")].peak == pytest.approx(150 / 8)


def test_an_h200_pool_is_re_laid_out_in_its_own_profiles_at_the_minimum(minimum_destroyed):
    harbour = relayout.mig_pools(relayout.inventory_fleet(REPO / "tests/data/fleets/harbour"))
    genai = harbour["genai"]
    pods = [p for p in day_trace(relayout.pool_streams(harbour), hours=6, scale=0.25) if p.tenant == "genai"]
    layouts = relayout.scaled_down(genai.layouts, 0.25)
    # A quarter of the pool keeps its mix of layouts (the first GPUs alone would all be 3g.71gb).
    assert Counter(map(tuple, layouts)) == Counter(map(tuple, genai.layouts[::4]))
    allowed = sorted({profile for layout in genai.layouts for profile, _ in layout})
    model = PoolModel("genai", layouts, pods, 10.0, minimum_destroyed, allowed, catalog=genai.catalog)
    run = model.simulate()
    assert run.relayouts and run.disturbed == 0 and run.above_minimum == 0
    assert run.never == 0
    assert {i.profile for gpu in model.gpus for i in gpu} <= {"3g.71gb", "2g.35gb", "1g.18gb"}
    static = run_pool("genai", layouts, pods, None, allowed=allowed, catalog=genai.catalog)
    assert run.pending_pod_minutes < static.pending_pod_minutes


def test_time_sliced_pools_are_named_not_ignored():
    # The pool's sharing, as the fleet reader reads gpufleet_tenants; the model holds one pod per instance, so the
    # run names the pools it simulates as exclusive (its first report line and results.json's parameters).
    data = _inventory(gpufleet_tenants={"imagegen": {"sharing": {"3g.40gb": 2}}})
    fleet = fleet_from_inventory_data(data)
    pools = pools_from_fleet(fleet)
    assert time_sliced(fleet, pools) == {"imagegen": {"3g.40gb": 2}}
    assert time_sliced(fleet_from_inventory_data(_inventory()), pools) == {}
    comparison = relayout.compare(
        pools,
        [_pod(0, "3g.40gb", 0, 60, tenant="imagegen")],
        search=False,
        parameters={"time_sliced_as_exclusive": time_sliced(fleet, pools)},
    )
    assert relayout.format_report(comparison)[1] == (
        "Time-sliced in the inventory, simulated with one pod per instance: imagegen 3g.40gb x2"
    )


def test_goals_are_worded_like_the_simulators_with_figures():
    pods = [_pod(0, "3g.40gb", 0, 3000)] + [_pod(i, "1g.10gb", 100, 600) for i in (1, 2, 3)]
    comparison = relayout.compare(
        {"t": [TWO_3G]}, pods, every=10, bound_minutes=20, search=True, search_limit=4, allowed={"t": ALLOWED}
    )
    lines = goal_lines(comparison.document())
    assert lines[0].startswith("met      re-layout disturbs no running pod: 0 disturbed over 1 re-layouts")
    assert "met      re-layout's pending pod-minutes <= 0.5 x static's: 25 vs 180 (x0.14)" in lines
    # Static never serves a 1g.10gb pod on 2 x 3g.40gb GPUs; re-layout does it with one GPU.
    assert comparison.needed == {"static": {"t": None}, "relayout": {"t": 1}}
    assert any(line.startswith("met      re-layout needs <= 0.75 x static's GPUs") for line in lines)
