"""A trace small enough to place by hand, checked against every policy decision the simulator makes."""

from __future__ import annotations

from gpufleet_extender.scoring import Policy

from gpufleet_lab.simulate.model import DeviceChoice, ModelSettings, simulate
from gpufleet_lab.simulate.policies import CountPolicy, LoadPolicy
from gpufleet_lab.simulate.trace import make_trace

from sim_helpers import pod

# Worked by hand with the device plugin's ties broken by index (the real plugin draws them) and no time-slicing
# slowdown, so every placement and end can be checked on paper.
BY_INDEX = ModelSettings(device_choice=DeviceChoice.LOWEST_INDEX, timeslice_efficiency=0.0)

TRACE = make_trace(
    [
        pod("p1", 1, 0.9),
        pod("p2", 2, 0.9),
        pod("p3", 20, 0.3),
        pod("p4", 40, 0.3),
        pod("p5", 41, 0.2),
    ]
)


def placements(result):
    return [(o.name, f"{o.node}/{','.join(o.devices)}", o.start, o.hot) for o in result.outcomes]


def on_cool_node(result):
    return [o.name for o in result.outcomes if o.hot_on_cool_node]


def test_hand_worked_trace(two_shared_nodes):
    """Nodes a and b, 2 GPUs each, 2 pods per GPU; scrapes at 0, 15, 30, 45; thresholds 0.8 util / 0.9 mem;
    device load = 0.7 util (no memory used). Pods run 1000 s, so nothing ends.

    count (least allocated once placed, ties by name; the device plugin gives the GPU with fewest pods,
    then the lowest index):
      p1 t=1:  a 1/4, b 1/4 -> a; a/gpu0.      p2 t=2:  a 2/4, b 1/4 -> b; b/gpu0.
      p3 t=20: a 2/4, b 2/4 -> a; a/gpu1.      p4 t=40: a 3/4, b 2/4 -> b; b/gpu1.
      p5 t=41: a 3/4, b 3/4 -> a; every GPU holds one pod, so gpu0, whose true util is 0.9: hot, while a/gpu1
               (0.3, a free slot) was cooler -> 1 hot placement.

    load (the extender; ties by least allocated, then name):
      p1 t=1:  t=0 sample: all idle, both score 10 -> tie -> a; a/gpu0.
      p2 t=2:  t=0 sample; p1 in flight on a takes a's least-loaded GPU, a/gpu1 (0) is left: 10; b: 10.
               Tie -> least allocated -> b; b/gpu0.
      p3 t=20: t=15 sample: gpu0 of a and b at 0.9 (load 0.63), gpu1 idle: both 10, allocation ties -> a;
               a/gpu1.
      p4 t=40: t=30 sample: a's best GPU is gpu1 at 0.3 (load 0.21): score round(10 x 0.79) = 8; b's gpu1
               is idle: 10 -> b; b/gpu1.
      p5 t=41: t=30 sample still. a: gpu1 (util 0.3) passes, score 8. b: p4 is in flight and takes b's
               least-loaded GPU (gpu1), leaving gpu0 at util 0.9 >= 0.8: filtered. -> a. The extender chose
               the right node, but the device plugin hands out gpu0 (fewest pods, lowest index): hot.
    load with least-loaded device choice: the same nodes, and p5 gets a/gpu1 (0.3): no hot placement.
    load without in-flight accounting: at p5, b's gpu1 looks idle in the t=30 sample (p4 is not in it):
      b scores 10 and wins; the plugin gives b/gpu0 (0.9): hot.
    """
    count = simulate(two_shared_nodes, TRACE, CountPolicy(), Policy(), BY_INDEX)
    assert placements(count) == [
        ("p1", "a/gpu0", 1, False),
        ("p2", "b/gpu0", 2, False),
        ("p3", "a/gpu1", 20, False),
        ("p4", "b/gpu1", 40, False),
        ("p5", "a/gpu0", 41, True),
    ]
    # a/gpu1 had room and looked cool in the t=30 sample: the node was right, the plugin's device choice was not.
    assert on_cool_node(count) == ["p5"]
    load = simulate(two_shared_nodes, TRACE, LoadPolicy(inflight=True), Policy(), BY_INDEX)
    assert placements(load) == placements(count)
    least_loaded = ModelSettings(device_choice=DeviceChoice.LEAST_LOADED, timeslice_efficiency=0.0)
    load_ll = simulate(two_shared_nodes, TRACE, LoadPolicy(inflight=True), Policy(), least_loaded)
    assert placements(load_ll)[-1] == ("p5", "a/gpu1", 41, False)
    no_inflight = simulate(two_shared_nodes, TRACE, LoadPolicy(inflight=False), Policy(), BY_INDEX)
    assert placements(no_inflight)[-1] == ("p5", "b/gpu0", 41, True)


def test_the_extender_verdicts_behind_p5(two_shared_nodes):
    """The same p5 decision, looked at through the extender's own verdicts (scoring.evaluate_nodes)."""
    seen = {}

    class Recorder(LoadPolicy):
        def choose(self, spec, fitting, view):
            decision = super().choose(spec, fitting, view)
            seen[spec.name] = {name: (v.passed, v.score, v.outcome.value) for name, v in decision.verdicts.items()}
            return decision

    simulate(two_shared_nodes, TRACE, Recorder(inflight=True), Policy(), BY_INDEX)
    assert seen["p4"] == {"a": (True, 8, "pass"), "b": (True, 10, "pass")}
    assert seen["p5"] == {"a": (True, 8, "pass"), "b": (False, 0, "overloaded")}
