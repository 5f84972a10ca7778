"""Per-pool time-slicing, the upstream device plugin's choice, the interference model and the per-pool goals."""

from __future__ import annotations

import random

import pytest
from sim_helpers import pod, whole_gpu_node

from gpufleet_extender.pods import WHOLE_GPU_RESOURCE
from gpufleet_extender.scoring import Policy
from gpufleet_extender.simulate.fleet import Device, Fleet, FleetError, Node, fleet_from_inventory_data
from gpufleet_extender.simulate.generator import SCENARIO_WORKLOADS, generate_trace
from gpufleet_extender.simulate.metrics import GoalCheck
from gpufleet_extender.simulate.model import DeviceChoice, ModelSettings, choose_devices, simulate
from gpufleet_extender.simulate.policies import CountPolicy
from gpufleet_extender.simulate.pools import pool_figures, pool_goal_checks
from gpufleet_extender.simulate.state import SimCluster
from gpufleet_extender.simulate.trace import Schedule, make_trace

MIG1G = "nvidia.com/mig-1g.10gb"


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
                "llm1": {"gpufleet_tenant": "llm", "gpufleet_gpus_per_node": 2, "mig_partition_config": None},
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


def test_distributed_choice_takes_the_fewest_pods_and_breaks_ties_arbitrarily():
    fleet = Fleet((mig_node("n", 4, "t"),), {"ns": "t"}).with_sharing({("t", MIG1G): 2})
    cluster = SimCluster(fleet, Policy())
    node = cluster.nodes["n"]
    spec = pod("p", 0, 0.5, resource=MIG1G, namespace="ns")
    cluster.bind(spec, node, [node.devices[2]], 0.0)
    picks = {
        choose_devices(node, spec, 0.0, DeviceChoice.DISTRIBUTED, random.Random(seed))[0].position for seed in range(20)
    }
    assert picks == {0, 1, 3}  # never the device already holding a pod; the others in no fixed order
    assert choose_devices(node, spec, 0.0, DeviceChoice.PLUGIN)[0].position == 0


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
