"""The model: load accounting on devices, the scrape lag the extender sees, in-flight pods, the waiting queue."""

from __future__ import annotations

import pytest
from gpufleet_extender.scoring import Policy

from gpufleet_lab.simulate.fleet import Device, Fleet, Node
from gpufleet_lab.simulate.model import ModelSettings, Probe, SimulationError, simulate
from gpufleet_lab.simulate.policies import CountPolicy, Decision, LoadPolicy
from gpufleet_lab.simulate.state import SimCluster
from gpufleet_lab.simulate.trace import PodSpec, Schedule, make_trace

from sim_helpers import pod, whole_gpu_node

EXTENDER = Policy()  # thresholds 0.8 util / 0.9 mem, weights 0.7 / 0.3


def test_device_load_is_the_clamped_sum_of_its_pods_at_their_age(two_shared_nodes):
    cluster = SimCluster(two_shared_nodes, EXTENDER)
    node = cluster.nodes["a"]
    gpu0 = node.by_resource["nvidia.com/gpu"][0]
    steady = pod("steady", 0, 0.5, mem_gb=Schedule.constant(20.0))
    bursty = pod("bursty", 0, Schedule((0.0, 30.0), (0.2, 0.9)), mem_gb=Schedule.constant(40.0))
    cluster.bind(steady, node, [gpu0], now=0.0)
    assert gpu0.metrics(10.0).util == 0.5
    assert gpu0.metrics(10.0).mem == pytest.approx(20 / 80)
    running = cluster.bind(bursty, node, [gpu0], now=10.0)
    assert gpu0.metrics(20.0).util == pytest.approx(0.7)  # 0.5 + 0.2: the burst starts 30 s after the pod
    assert gpu0.metrics(40.0).util == 1.0  # 0.5 + 0.9, clamped
    assert gpu0.metrics(40.0).mem == pytest.approx(60 / 80)
    assert gpu0.is_hot(40.0) and not gpu0.is_hot(20.0)
    assert gpu0.load(20.0) == pytest.approx(0.7 * 0.7 + 0.3 * 0.75)
    cluster.finish(running)
    assert gpu0.metrics(40.0).util == 0.5
    # Node load weights devices by memory; gpu1 is idle.
    assert node.load(40.0) == pytest.approx((0.7 * 0.5 + 0.3 * 0.25) / 2)
    cluster.bind(pod("fat", 0, 0.0, mem_gb=Schedule.constant(60.0)), node, [gpu0], now=40.0)
    assert gpu0.is_hot(50.0)  # util 0.5 but 80 GB of 80: hot by the memory threshold alone


def test_slots_and_least_allocated_share(two_shared_nodes):
    cluster = SimCluster(two_shared_nodes, EXTENDER)
    node = cluster.nodes["a"]
    gpus = node.by_resource["nvidia.com/gpu"]
    two_gpus = pod("two", 0, 0.1, count=2)
    assert node.fits(two_gpus) and node.allocated_share_after(two_gpus) == 2 / 4
    cluster.bind(two_gpus, node, gpus, 0.0)
    cluster.bind(pod("x", 0, 0.1), node, gpus[:1], 0.0)  # gpu0 now holds its 2 pods
    assert [d.device.key for d in node.free_devices("nvidia.com/gpu")] == ["gpu1"]
    assert not node.fits(two_gpus)  # two distinct devices with a free slot are needed
    assert node.fits(pod("one", 0, 0.1))


class Spy:
    """A policy that records what it was shown and then places like ``inner``."""

    def __init__(self, inner):
        self.inner, self.name, self.inflight = inner, "spy", inner.inflight
        self.seen = []

    def choose(self, spec: PodSpec, fitting, view) -> Decision:
        node_a = view.snapshot.nodes.get("a")
        util_a = max(d.util for d in node_a.devices["nvidia.com/gpu"]) if node_a else None
        self.seen.append((spec.name, view.snapshot.taken_at, util_a, {k: dict(v) for k, v in view.assumed.items()}))
        return self.inner.choose(spec, fitting, view)


def test_the_extender_sees_the_last_scrape_and_counts_pods_bound_since_as_in_flight():
    """Scrapes at 0, 15, 30. p1 lands on a at t=1 (util 0.9). At t=14 the extender still sees the t=0 sample
    (a idle) and p1 as in flight; at t=16 the t=15 sample shows p1 and nothing is in flight any more."""
    fleet = Fleet((whole_gpu_node("a", 2),), {}, replicas=2)
    trace = make_trace([pod("p1", 1, 0.9), pod("p2", 14, 0.1), pod("p3", 16, 0.1)])
    spy = Spy(LoadPolicy(inflight=True))
    simulate(fleet, trace, spy, EXTENDER, ModelSettings(scrape_interval=15))
    assert spy.seen == [
        ("p1", 0.0, 0.0, {}),
        ("p2", 0.0, 0.0, {"a": {"nvidia.com/gpu": 1}}),
        ("p3", 15.0, 0.9, {}),
    ]


def test_in_flight_pods_expire_after_inflight_max_seconds():
    fleet = Fleet((whole_gpu_node("a", 2),), {}, replicas=2)
    trace = make_trace([pod("p1", 1, 0.9), pod("p2", 50, 0.1)])
    spy = Spy(LoadPolicy(inflight=True))
    simulate(fleet, trace, spy, EXTENDER, ModelSettings(scrape_interval=600, inflight_max_seconds=30))
    assert spy.seen[1] == ("p2", 0.0, 0.0, {})  # no scrape since p1, but it is older than 30 s


def test_waiting_pods_start_in_arrival_order_when_devices_free_up():
    """One exclusive GPU. p1 holds it from 0 to 100; p2 (t=10) and p3 (t=20) wait; p2 starts when p1 ends
    (t=100), p3 when p2 ends (t=100+50)."""
    fleet = Fleet((whole_gpu_node("a", 1),), {}, replicas=1)
    trace = make_trace([pod("p1", 0, 0.5, 100), pod("p2", 10, 0.5, 50), pod("p3", 20, 0.5, 50)])
    result = simulate(fleet, trace, CountPolicy(), EXTENDER)
    assert [(o.name, o.start, o.wait) for o in result.outcomes] == [
        ("p1", 0, 0),
        ("p2", 100, 90),
        ("p3", 150, 130),
    ]
    assert not any(o.held for o in result.outcomes)  # they waited for room, not for the extender


def test_the_extender_holds_a_pod_until_a_sample_shows_a_cool_device():
    """One GPU shared by 2. p1 (util 0.95) runs 0..50. p2 arrives at t=20: the t=15 sample shows the GPU hot,
    so the extender passes no node and p2 waits. p1 ends at 50, but the t=45 sample still shows it; the t=60
    sample shows the GPU idle and p2 starts then: 40 s of waiting caused by the lag."""
    fleet = Fleet((whole_gpu_node("a", 1),), {}, replicas=2)
    trace = make_trace([pod("p1", 0, 0.95, 50), pod("p2", 20, 0.3)])
    result = simulate(fleet, trace, LoadPolicy(inflight=True), EXTENDER, ModelSettings(scrape_interval=15))
    p2 = result.outcomes[1]
    assert (p2.start, p2.wait, p2.held) == (60, 40, True)
    count = simulate(fleet, trace, CountPolicy(), EXTENDER).outcomes[1]
    assert (count.start, count.hot) == (20, False)  # hot GPU, but no cooler device existed: not a hot placement


def test_pods_are_never_placed_when_they_outwait_the_drain():
    fleet = Fleet((whole_gpu_node("a", 1),), {}, replicas=1)
    trace = make_trace([pod("p1", 0, 0.5, 10_000), pod("p2", 1, 0.5, 10)])
    result = simulate(fleet, trace, CountPolicy(), EXTENDER, ModelSettings(drain_seconds=600))
    assert result.outcomes[1].start is None


def test_tenant_pools_are_respected_and_impossible_pods_refused():
    fleet = Fleet(
        (whole_gpu_node("llm-1", 2, "llm"), whole_gpu_node("nlp-1", 2, "nlp")),
        {"llm-inference": "llm"},
        replicas=1,
    )
    trace = make_trace([pod(f"p{i}", i, 0.5, namespace="llm-inference") for i in range(2)])
    result = simulate(fleet, trace, CountPolicy(), EXTENDER)
    assert {o.node for o in result.outcomes} == {"llm-1"}
    with pytest.raises(SimulationError) as refused:
        simulate(fleet, make_trace([pod("p9", 0, 0.5, namespace="x")]), CountPolicy(), EXTENDER)
    assert str(refused.value) == (
        "1 pod(s) of the trace can never run on this fleet: p9: namespace 'x' belongs to no tenant (the fleet's "
        "namespaces: llm-inference) and no node is shared"
    )


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        # A typo in the resource names the resource and what the fleet has.
        (
            {"resource": "nvidia.com/mig-2g.21gb", "namespace": "llm-inference"},
            "p1: resource nvidia.com/mig-2g.21gb is on no node of this fleet (it has nvidia.com/gpu, "
            "nvidia.com/mig-1g.10gb)",
        ),
        # A resource of another pool names the pool.
        (
            {"resource": "nvidia.com/mig-1g.10gb", "namespace": "llm-inference"},
            "p1: no node of tenant llm's pool has nvidia.com/mig-1g.10gb (it has nvidia.com/gpu)",
        ),
        # More devices than any node of the pool.
        (
            {"count": 3, "namespace": "llm-inference"},
            "p1: needs 3x nvidia.com/gpu; a node of tenant llm's pool has at most 2",
        ),
        # An unknown namespace is named as such.
        (
            {"namespace": "nobody"},
            "p1: namespace 'nobody' belongs to no tenant (the fleet's namespaces: llm-inference, nlp) and no node is "
            "shared",
        ),
    ],
)
def test_a_pod_that_can_never_run_is_refused_with_the_reason(fields, reason):
    nlp = Node("nlp-1", "nlp", tuple(Device(f"mig{i}", "nvidia.com/mig-1g.10gb", 10.0) for i in range(7)))
    fleet = Fleet(
        (whole_gpu_node("llm-1", 2, "llm"), nlp),
        {"llm-inference": "llm", "nlp": "nlp"},
        replicas=1,
    )
    with pytest.raises(SimulationError) as refused:
        simulate(fleet, make_trace([pod("p1", 0, 0.5, **fields)]), CountPolicy(), EXTENDER)
    assert str(refused.value) == f"1 pod(s) of the trace can never run on this fleet: {reason}"


def test_a_burst_between_scrapes_makes_a_hot_placement_the_extender_could_not_see():
    """a and b, 1 GPU each, 2 pods per GPU. "bursty" (util 0.1, then 0.95 from 20 s) lands on a at t=0;
    "steady" (0.5) at t=1 goes to b because bursty is in flight on a's only GPU. At t=25 the t=15 sample shows
    a at 0.1 (score 9) and b at 0.5 (score 6), so the extender sends p2 to a, which is at 0.95 by now, while
    b (0.5) had room: a hot placement caused by the lag alone."""
    fleet = Fleet((whole_gpu_node("a", 1), whole_gpu_node("b", 1)), {}, replicas=2)
    bursty = pod("bursty", 0, Schedule((0.0, 20.0), (0.1, 0.95)))
    trace = make_trace([bursty, pod("steady", 1, 0.5), pod("p2", 25, 0.1)])
    result = simulate(fleet, trace, LoadPolicy(inflight=True), EXTENDER)
    assert [(o.name, o.node, o.hot, o.hot_on_cool_node) for o in result.outcomes] == [
        ("bursty", "a", False, False),
        ("steady", "b", False, False),
        ("p2", "a", True, True),
    ]


def test_probes_record_an_extra_series_at_every_sample():
    """The extension point for extra figures: idle whole GPUs at each scrape (0, 15, 30; p1 runs 10..40)."""

    class IdleGpus(Probe):
        name = "idle_gpus"

        def sample(self, now, cluster):
            return sum(1 for n in cluster.nodes.values() for d in n.devices if not d.pods)

    fleet = Fleet((whole_gpu_node("a", 2),), {}, replicas=1)
    result = simulate(fleet, make_trace([pod("p1", 10, 0.5, 30)]), CountPolicy(), EXTENDER, probes=(IdleGpus(),))
    assert result.sample_times == [0, 15, 30, 45]
    assert result.probes == {"idle_gpus": [2, 1, 1, 2]}
