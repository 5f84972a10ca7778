"""Per-pool time-slicing, the upstream device plugin's choice, the interference model and the per-pool goals."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from gpufleet_extender.pods import WHOLE_GPU_RESOURCE
from gpufleet_extender.scoring import Policy, shared_candidates

from gpufleet_lab.simulate.fleet import Device, Fleet, FleetError, Node, fleet_from_inventory_data
from gpufleet_lab.simulate.generator import SCENARIO_WORKLOADS, generate_trace
from gpufleet_lab.simulate.metrics import GoalCheck
from gpufleet_lab.simulate.model import DeviceChoice, ModelSettings, choose_devices, simulate, timeslice_speed
from gpufleet_lab.simulate.policies import CountPolicy
from gpufleet_lab.simulate.pools import pool_figures, pool_goal_checks
from gpufleet_lab.simulate.state import SimCluster
from gpufleet_lab.simulate.trace import Schedule, make_trace

from sim_helpers import pod, whole_gpu_node

MIG1G = "nvidia.com/mig-1g.10gb"
REPO = Path(__file__).resolve().parents[3]


def mig_node(name: str, instances: int, tenant: str) -> Node:
    return Node(name, tenant, tuple(Device(f"gpu0-mig{i}", MIG1G, 10.0) for i in range(instances)))


def test_inventory_sharing_is_per_pool_and_resource():
    data = {
        "_meta": {
            "hostvars": {
                "nlp1": {
                    "gpufleet_tenant": "finnlp",
                    "gpufleet_gpus_per_node": 1,
                    "mig_partition_config": [{"devices": "all", "mig_enabled": True, "mig_devices": {"1g.10gb": 7}}],
                    "gpufleet_tenants": {"finnlp": {"namespaces": ["finnlp"], "sharing": {"1g.10gb": 4}}},
                },
                "llm1": {
                    "gpufleet_tenant": "llm",
                    "gpufleet_gpus_per_node": 2,
                    "mig_partition_config": [{"devices": "all", "mig_enabled": False}],
                },
            }
        }
    }
    fleet = fleet_from_inventory_data(data)
    assert fleet.replicas_for("finnlp", MIG1G) == 4
    assert fleet.replicas_for("llm", WHOLE_GPU_RESOURCE) == 1
    assert fleet.shared_resources() == {MIG1G: 4}
    cluster = SimCluster(fleet, Policy())
    assert cluster.nodes["nlp1"].replicas_of == {MIG1G: 4}
    # The tenants role's rules and messages (mig_utils.names.parse_sharing): 1 to 64 replicas, every problem listed.
    data["_meta"]["hostvars"]["nlp1"]["gpufleet_tenants"]["finnlp"]["sharing"] = {"1g.10gb": 0, "gpu": 65, "9g.1gb": 2}
    with pytest.raises(FleetError) as refused:
        fleet_from_inventory_data(data)
    assert str(refused.value) == (
        "gpufleet_tenants.finnlp: sharing of nvidia.com/mig-1g.10gb must be a whole number of replicas from 1 "
        "(exclusive) to 64, not 0; gpufleet_tenants.finnlp: sharing of nvidia.com/gpu must be a whole number of "
        "replicas from 1 (exclusive) to 64, not 65; gpufleet_tenants.finnlp: sharing names 9g.1gb, which is not "
        "nvidia.com/gpu or nvidia.com/mig-<profile>"
    )


def _picks(node, spec, how: DeviceChoice) -> set[tuple[int, ...]]:
    return {tuple(d.position for d in choose_devices(node, spec, 0.0, how, random.Random(seed))) for seed in range(40)}


def test_plugin_choice_is_distributed_alloc_of_the_deployed_device_plugin():
    """``distributedAlloc`` (internal/rm/allocate.go, k8s-device-plugin v0.17.1): one device at a time, a device with
    the fewest replicas allocated; candidates come from a Go map and an unstable sort, so equal devices are taken
    in no fixed order. ``getPreferredAllocation`` (internal/rm/nvml_manager.go) sends MIG devices and replicated
    GPUs there; only unreplicated whole GPUs get the aligned allocation (modelled as the first free)."""
    fleet = Fleet((mig_node("n", 4, "t"),), {"ns": "t"}).with_sharing({("t", MIG1G): 2})
    cluster = SimCluster(fleet, Policy())
    node = cluster.nodes["n"]
    spec = pod("p", 0, 0.5, resource=MIG1G, namespace="ns")
    cluster.bind(spec, node, [node.devices[2]], 0.0)
    # Never the device already holding a pod; every equally used one, not only the lowest index.
    assert _picks(node, spec, DeviceChoice.PLUGIN) == {(0,), (1,), (3,)}
    assert _picks(node, spec, DeviceChoice.DISTRIBUTED) == {(0,), (1,), (3,)}  # the earlier name
    assert _picks(node, spec, DeviceChoice.LOWEST_INDEX) == {(0,)}
    # Two replicas: the two least used devices, any two of the three tied ones; never a second pod on device 2.
    pair = pod("q", 0, 0.5, resource=MIG1G, namespace="ns", count=2)
    assert _picks(node, pair, DeviceChoice.PLUGIN) == {(a, b) for a in (0, 1, 3) for b in (0, 1, 3) if a != b}
    # Once every device holds one pod, the next goes to any of them (all tie again).
    for position in (0, 1, 3):
        cluster.bind(spec, node, [node.devices[position]], 0.0)
    assert _picks(node, spec, DeviceChoice.PLUGIN) == {(0,), (1,), (2,), (3,)}


def test_plugin_choice_of_exclusive_devices():
    # Exclusive MIG instances are never aligned: any free instance, in no fixed order.
    fleet = Fleet((mig_node("n", 3, "t"),), {"ns": "t"})
    cluster = SimCluster(fleet, Policy())
    node = cluster.nodes["n"]
    spec = pod("p", 0, 0.5, resource=MIG1G, namespace="ns")
    cluster.bind(spec, node, [node.devices[0]], 0.0)
    assert _picks(node, spec, DeviceChoice.PLUGIN) == {(1,), (2,)}
    # Unreplicated whole GPUs: the aligned allocation, modelled as the first free.
    gpus = SimCluster(Fleet((whole_gpu_node("g", 4),)), Policy())
    whole = gpus.nodes["g"]
    gpus.bind(pod("x", 0, 0.5), whole, [whole.devices[0]], 0.0)
    assert _picks(whole, pod("y", 0, 0.5, count=2), DeviceChoice.PLUGIN) == {(1, 2)}


def test_the_filter_judges_every_device_the_plugin_may_hand_out():
    """The product's side of the device choice: for a time-sliced resource the extender's filter and score look at
    ``scoring.shared_candidates``, every device the plugin may pick, so whichever it hands out was judged. Checked
    against the plugin model on random states of one node (pods per device, in-flight pods)."""
    draw = random.Random(7)
    for _ in range(300):
        replicas, size = draw.choice((2, 4, 7)), draw.randint(1, 7)
        fleet = Fleet((mig_node("n", size, "t"),), {"ns": "t"}).with_sharing({("t", MIG1G): replicas})
        cluster = SimCluster(fleet, Policy())
        node = cluster.nodes["n"]
        for device in node.devices:
            for _ in range(draw.randint(0, replicas)):
                cluster.bind(pod("o", 0, 0.1, resource=MIG1G, namespace="ns"), node, [device], 0.0)
        spec = pod("p", 0, 0.5, resource=MIG1G, namespace="ns", count=draw.randint(1, 2))
        if not node.fits(spec):
            continue
        sampled = node.metrics(0.0).devices[MIG1G]
        candidates = {d.key for d in shared_candidates(sampled, spec.count, replicas)}
        for seed in range(10):
            chosen = choose_devices(node, spec, 0.0, DeviceChoice.PLUGIN, random.Random(seed))
            assert {d.device.key for d in chosen} <= candidates


def test_a_pod_that_does_not_fit_in_its_devices_memory_fails_and_holds_nothing():
    fleet = Fleet((mig_node("n", 1, "t"),), {"ns": "t"}).with_sharing({("t", MIG1G): 4})
    trace = make_trace(
        [
            pod("first", 0, 0.3, resource=MIG1G, namespace="ns", mem_gb=Schedule.constant(6.0)),
            pod("second", 10, 0.3, resource=MIG1G, namespace="ns", mem_gb=Schedule.constant(4.0)),
            pod("third", 20, 0.3, resource=MIG1G, namespace="ns", mem_gb=Schedule.constant(0.5)),
            pod("fourth", 30, 0.3, resource=MIG1G, namespace="ns", mem_gb=Schedule.constant(0.1)),
        ]
    )
    result = simulate(fleet, trace, CountPolicy(), Policy(), ModelSettings(timeslice_efficiency=0.0))
    outcomes = {o.name: o for o in result.outcomes}
    # 6 + 4 = 10 GB fits exactly; then 0.5 more does not: the third fails at start-up and frees its replica at once,
    # so the fourth (0.1 GB, still too much) gets a replica and fails too. Both count as started, neither runs.
    assert [outcomes[n].oom for n in ("first", "second", "third", "fourth")] == [False, False, True, True]
    assert outcomes["third"].start == 20 and outcomes["third"].slowdown is None
    assert pool_figures(result).oom == {"t": 2}


def test_time_sliced_pods_slow_down_only_when_their_device_is_oversubscribed():
    fleet = Fleet((mig_node("n", 1, "t"),), {"ns": "t"}).with_sharing({("t", MIG1G): 4})
    light = [pod(f"l{i}", 0, 0.3, duration=600, resource=MIG1G, namespace="ns") for i in range(2)]
    heavy = [pod(f"h{i}", 0, 0.6, duration=600, resource=MIG1G, namespace="ns") for i in range(2)]
    settings = ModelSettings(scrape_interval=10, timeslice_efficiency=0.76)
    # Two pods asking 0.3 each: 0.6 <= 0.76, nobody waits for a turn.
    calm = simulate(fleet, make_trace(light), CountPolicy(), Policy(), settings)
    assert all(o.slowdown == pytest.approx(1.0) for o in calm.outcomes)
    # Two asking 0.6 each: 1.2 over 0.76 useful, each runs at 0.76 / 1.2 of its speed while both are on.
    busy = simulate(fleet, make_trace(heavy), CountPolicy(), Policy(), settings)
    assert [o.slowdown for o in busy.outcomes] == pytest.approx([1.2 / 0.76] * 2, rel=1e-3)
    off = simulate(fleet, make_trace(heavy), CountPolicy(), Policy(), ModelSettings(timeslice_efficiency=0.0))
    assert all(o.slowdown == pytest.approx(1.0) for o in off.outcomes)
    assert timeslice_speed(SimCluster(fleet, Policy()).nodes["n"].devices[0], 0.0, 0.76) == 1.0  # alone: full speed


def test_the_role_deploys_the_device_plugin_the_model_is_pinned_to():
    """The plugin model and docs/design/simulator.md cite k8s-device-plugin v0.17.1's source; a new version in the role
    must be read again (and this pin moved) before the model may claim to be the deployed one."""
    defaults = (REPO / "roles" / "gpu_device_plugin" / "defaults" / "main.yml").read_text(encoding="utf-8")
    assert "gpu_device_plugin_image: nvcr.io/nvidia/k8s-device-plugin:v0.17.1\n" in defaults
    docs = (REPO / "docs" / "design" / "simulator.md").read_text(encoding="utf-8")
    for cited in ("v0.17.1", "internal/rm/allocate.go", "distributedAlloc", "getPreferredAllocation"):
        assert cited in docs, cited


def test_interference_stretches_a_pod_by_its_neighbours_load():
    fleet = Fleet((whole_gpu_node("a", 2),))
    # The neighbour drives util 1.0 (load 0.7) on gpu0 from t=0; the probe pod runs 1000 s nominal on gpu1.
    trace = make_trace([pod("neighbour", 0, 1.0, duration=3000), pod("probe", 0, 0.0, duration=1000)])
    result = simulate(fleet, trace, CountPolicy(), Policy(), ModelSettings(interference=0.3, scrape_interval=10))
    outcomes = {o.name: o for o in result.outcomes}
    # Other devices' load seen by the probe: gpu0 at 0.7 (memory-weighted over the one other device).
    assert outcomes["probe"].slowdown == pytest.approx(1 + 0.3 * 0.7, rel=1e-6)
    off = simulate(fleet, trace, CountPolicy(), Policy(), ModelSettings(scrape_interval=10))
    assert all(o.slowdown == pytest.approx(1.0) for o in off.outcomes)


def test_tp_mix_trace_asks_for_1_2_4_and_8_gpus():
    fleet = Fleet(tuple(whole_gpu_node(f"llm{i}", 8, "llm") for i in range(4)), {"llm-inference": "llm"})
    trace = generate_trace(fleet, 1, 4 * 3600, scenario="tp-mix", workloads=SCENARIO_WORKLOADS["tp-mix"])
    counts = [p.count for p in trace.pods]
    shares = {size: counts.count(size) / len(counts) for size in (1, 2, 4, 8)}
    assert set(counts) == {1, 2, 4, 8}
    assert shares[1] == pytest.approx(0.40, abs=0.08) and shares[8] == pytest.approx(0.15, abs=0.06)


def test_pool_figures_and_goal_lines():
    fleet = Fleet((whole_gpu_node("a", 2, "llm"), whole_gpu_node("b", 2, "llm")), {"ns": "llm"})
    trace = make_trace(
        [
            pod("one", 0, 0.5, namespace="ns", duration=100),
            pod("two", 0, 0.5, namespace="ns", duration=100, count=2),
            pod("late", 1, 0.5, namespace="ns", duration=100, count=2, mem_gb=Schedule.constant(0.0)),
        ]
    )
    result = simulate(fleet, trace, CountPolicy(), Policy(), ModelSettings())
    figures = pool_figures(result)
    # "one" on a, "two" on b, "late" waits for a node with two free GPUs: b's pod ends at 100.
    assert figures.wait_p95_by_size["llm"] == {1: 0.0, 2: 99.0}
    assert figures.mean_slowdown["llm"] == pytest.approx(0.0)
    same = {"spread": figures, "auto": figures, "count": figures}
    checks = pool_goal_checks(same, [], ["llm"], "tp-mix", interference=0.3)
    assert [c.passed for c in checks] == [None, True, True]  # no 8-GPU pod; 0 s vs 0 s; 0 vs 0 slowdown
    assert all(isinstance(c, GoalCheck) and "llm pool" in c.goal for c in checks)
    assert pool_goal_checks(same, [], ["llm"], "mixed", interference=0.3) == []
