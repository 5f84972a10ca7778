"""Shared (time-sliced) resources and the interference term: the devices a pod would share, and its neighbours."""

from __future__ import annotations

import pytest

from gpufleet_extender.config import SettingsError, load_settings
from gpufleet_extender.pods import ResourceRequest
from gpufleet_extender.scoring import (
    Outcome,
    Policy,
    Strategy,
    evaluate_node,
    interference_load,
    shared_candidates,
    short_of_memory,
)
from gpufleet_extender.snapshot import DeviceMetrics, NodeMetrics

MIG1G = "nvidia.com/mig-1g.10gb"
GPU = "nvidia.com/gpu"
NOW = 1000.0
SHARED = Policy(shared_resources=((MIG1G, 4),))


def dev(key: str, util: float, pods: int | None = None, mem: float = 0.0) -> DeviceMetrics:
    return DeviceMetrics(key, util, mem, pods)


def shared_node(*devices: DeviceMetrics) -> NodeMetrics:
    return NodeMetrics("n", NOW - 1, {MIG1G: devices})


def test_candidates_are_the_least_used_devices_whatever_their_load():
    devices = [dev("a", 0.1, pods=2), dev("b", 0.9, pods=1), dev("c", 0.2, pods=1), dev("d", 0.0, pods=4)]
    assert [d.key for d in shared_candidates(devices, 1, 4)] == ["b", "c"]
    # Two replicas: one from each of b and c, both at the lowest count.
    assert [d.key for d in shared_candidates(devices, 2, 4)] == ["b", "c"]
    # Three: b and c, then any device at 2 pods (a); d is full.
    assert [d.key for d in shared_candidates(devices, 3, 4)] == ["b", "c", "a"]
    assert shared_candidates(devices, 4, 4) == []


def test_in_flight_pods_take_their_replicas_first():
    devices = [dev("a", 0.1, pods=1), dev("b", 0.1, pods=0)]
    assert [d.key for d in shared_candidates(devices, 1, 4, assumed=0)] == ["b"]
    # One pod bound since the sample went to b (fewest pods): a and b now tie at one pod each.
    assert [d.key for d in shared_candidates(devices, 1, 4, assumed=1)] == ["a", "b"]


def test_a_shared_node_fails_when_the_plugin_may_hand_out_a_busy_device():
    # The least-loaded device (c) has room, but the plugin gives the pod b, the device with the fewest pods.
    metrics = shared_node(dev("a", 0.3, pods=2), dev("b", 0.85, pods=1), dev("c", 0.05, pods=2))
    request = (ResourceRequest(MIG1G, 1),)
    verdict = evaluate_node("n", metrics, request, SHARED, NOW)
    assert not verdict.passed and verdict.outcome is Outcome.OVERLOADED
    assert "b: util 0.85 > 0.80" in verdict.reason
    # The same node judged as exclusive devices passes: it has a cool device with room.
    assert evaluate_node("n", metrics, request, Policy(), NOW).passed


def test_a_shared_node_scores_the_mean_load_of_the_devices_it_may_get():
    metrics = shared_node(dev("a", 0.9, pods=3), dev("b", 0.2, pods=1), dev("c", 0.4, pods=1))
    verdict = evaluate_node("n", metrics, (ResourceRequest(MIG1G, 1),), SHARED, NOW)
    assert verdict.passed
    assert verdict.score == round(10 * (1 - 0.7 * (0.2 + 0.4) / 2))  # mem 0: load = 0.7 x util


def test_without_pod_counts_a_shared_resource_is_judged_the_exclusive_way():
    metrics = shared_node(dev("a", 0.85), dev("b", 0.1))
    request = (ResourceRequest(MIG1G, 1),)
    assert evaluate_node("n", metrics, request, SHARED, NOW) == evaluate_node("n", metrics, request, Policy(), NOW)


def test_interference_load_counts_the_other_devices_and_in_flight_ones_as_full():
    metrics = NodeMetrics("n", NOW - 1, {GPU: (dev("0", 0.0), dev("1", 1.0), dev("2", 0.5), dev("3", 0.0))})
    policy = Policy()
    picked = [metrics.devices[GPU][0]]
    assert interference_load(metrics, picked, policy) == pytest.approx(0.7 * (1.0 + 0.5 + 0.0) / 3)
    # One in-flight pod took the least-loaded device left (3, idle in the sample): it counts as full.
    assert interference_load(metrics, [metrics.devices[GPU][3]], policy, {GPU: 1}) == pytest.approx(
        (1.0 + 0.7 * 1.0 + 0.7 * 0.5) / 3
    )


def test_spread_prefers_the_idle_gpu_on_the_quiet_node_with_interference_on():
    busy = NodeMetrics("busy", NOW - 1, {GPU: (dev("0", 0.0), *(dev(str(i), 0.9) for i in range(1, 8)))})
    quiet = NodeMetrics("quiet", NOW - 1, {GPU: (dev("0", 0.05), *(dev(str(i), 0.0) for i in range(1, 8)))})
    request = (ResourceRequest(GPU, 1),)
    plain = Policy()
    assert evaluate_node("busy", busy, request, plain, NOW).score == 10  # the idle GPU is all spread looks at
    assert evaluate_node("quiet", quiet, request, plain, NOW).score == 10
    weighted = Policy(interference_weight=0.5)
    busy_score = evaluate_node("busy", busy, request, weighted, NOW)
    assert busy_score.score == round(10 * (1 - 0.5 * 7 * 0.63 / 7))
    assert "INTERFERENCE_WEIGHT 0.5" in busy_score.reason
    assert evaluate_node("quiet", quiet, request, weighted, NOW).score == 10
    # Pack ignores the term: it wants busy nodes.
    packing = Policy(interference_weight=0.5, strategy=Strategy.PACK)
    assert (
        evaluate_node("busy", busy, request, packing, NOW).score
        == evaluate_node("busy", busy, request, Policy(strategy=Strategy.PACK), NOW).score
    )


def test_a_shared_node_fails_when_a_device_it_may_get_is_short_of_memory():
    # b and c tie at one pod; b's pods hold 75 % of its memory. With 35 % required free the plugin may hand the pod
    # b, where it would not fit: the node fails, naming the device. Without the rule (0, the default) it passes.
    metrics = shared_node(dev("a", 0.1, pods=2), dev("b", 0.3, pods=1, mem=0.75), dev("c", 0.2, pods=1, mem=0.2))
    request = (ResourceRequest(MIG1G, 1),)
    guarded = Policy(shared_resources=((MIG1G, 4),), shared_mem_free_min=0.35)
    verdict = evaluate_node("n", metrics, request, guarded, NOW)
    assert not verdict.passed and verdict.outcome is Outcome.OVERLOADED
    assert "b: mem 0.75, less than SHARED_MEM_FREE_MIN 0.35 free; 1 pod(s)" in verdict.reason
    assert evaluate_node("n", metrics, request, SHARED, NOW).passed
    # 65 % used leaves exactly 35 %: enough. A device without memory figures is never judged short.
    assert not short_of_memory(dev("x", 0.1, pods=1, mem=0.65), guarded)
    assert short_of_memory(dev("x", 0.1, pods=1, mem=0.66), guarded)
    assert not short_of_memory(DeviceMetrics("x", 0.1, None, 1), guarded)
    # Only the devices the plugin may hand out count: a full device with more pods than the candidates does not.
    spare = shared_node(dev("a", 0.1, pods=2, mem=0.95), dev("b", 0.3, pods=1, mem=0.2))
    assert evaluate_node("n", spare, request, guarded, NOW).passed


def test_settings_read_shared_mem_free_min(monkeypatch):
    monkeypatch.setenv("SHARED_MEM_FREE_MIN", "0.35")
    assert Policy.from_settings(load_settings()).shared_mem_free_min == 0.35
    monkeypatch.setenv("SHARED_MEM_FREE_MIN", "1.5")
    with pytest.raises(SettingsError, match="SHARED_MEM_FREE_MIN"):
        load_settings()


def test_settings_read_shared_resources_and_the_interference_weight(monkeypatch):
    monkeypatch.setenv("SHARED_RESOURCES", '{"nvidia.com/mig-1g.10gb": 4}')
    monkeypatch.setenv("INTERFERENCE_WEIGHT", "0.5")
    policy = Policy.from_settings(load_settings())
    assert policy.shared_resources == ((MIG1G, 4),)
    assert policy.replicas_of(MIG1G) == 4 and policy.replicas_of(GPU) == 1
    assert policy.interference_weight == 0.5
    monkeypatch.setenv("SHARED_RESOURCES", '{"example.com/fpga": 2}')
    with pytest.raises(SettingsError, match="SHARED_RESOURCES"):
        load_settings()


def test_defaults_leave_scoring_as_it_was():
    settings_policy = Policy.from_settings(load_settings())
    assert settings_policy.shared_resources == () and settings_policy.interference_weight == 0.0
    assert settings_policy.shared_mem_free_min == 0.0  # off unless set


# Every branch of the shared-device judgement, its whole verdict written out (passed, score, outcome, reason): the
# reasons are what kube-scheduler logs and the conformance vectors hold, so each word is part of the rule.
SHARED_MEM = Policy(shared_resources=((MIG1G, 4), (GPU, 2)), shared_mem_free_min=0.3)
OVER = Outcome.OVERLOADED


@pytest.mark.parametrize(
    ("devices", "resource", "assumed", "verdict"),
    [
        (
            [DeviceMetrics("a", 0.1, 0.1, 4), DeviceMetrics("b", 0.1, 0.1, 4)],
            MIG1G,
            None,
            (False, 0, OVER, f"n: every {MIG1G} replica taken (4 per device)"),
        ),
        (
            [DeviceMetrics("a", 0.85, 0.1, 1), DeviceMetrics("b", 0.1, 0.1, 2)],
            MIG1G,
            None,
            (False, 0, OVER, f"n: the device plugin may share a busy {MIG1G} instance (a: util 0.85 > 0.80, mem 0.10; "
             "1 pod(s), 1 equally used)"),
        ),
        (
            [DeviceMetrics("g0", 0.9, 0.1, 1), DeviceMetrics("g1", 0.9, 0.5, 1)],
            GPU,
            None,
            (False, 0, OVER, f"n: the device plugin may share a busy {GPU} GPU (g0: util 0.90 > 0.80, mem 0.10; "
             "1 pod(s), 2 equally used)"),
        ),
        (
            [DeviceMetrics("a", 0.2, 0.8, 1), DeviceMetrics("b", 0.1, 0.1, 2)],
            MIG1G,
            None,
            (False, 0, OVER, f"n: the device plugin may share a {MIG1G} instance short of memory (a: mem 0.80, less "
             "than SHARED_MEM_FREE_MIN 0.3 free; 1 pod(s))"),
        ),
        (
            [DeviceMetrics("a", 0.2, 0.1, 1), DeviceMetrics("b", 0.4, 0.5, 1), DeviceMetrics("c", 0.0, 0.0, 3)],
            MIG1G,
            None,
            (True, 7, Outcome.PASS, f"n: spread: shared {MIG1G} x4, 2 device(s) it may get, mean load 0.30, score 7"),
        ),
        (  # the pod bound since the sample took a's replica: a and b now tie
            [DeviceMetrics("a", 0.2, 0.1, 1), DeviceMetrics("b", 0.4, 0.5, 2)],
            MIG1G,
            {MIG1G: 1},
            (True, 7, Outcome.PASS, f"n: spread: shared {MIG1G} x4, 2 device(s) it may get, mean load 0.30, score 7"),
        ),
        (
            [DeviceMetrics("a", 0.2, 0.1, 1), DeviceMetrics("b", 0.4, 0.5, 2)],
            MIG1G,
            None,
            (True, 8, Outcome.PASS, f"n: spread: shared {MIG1G} x4, 1 device(s) it may get, mean load 0.17, score 8"),
        ),
        (  # no pod mapping in the sample: judged as exclusive devices
            [DeviceMetrics("a", 0.2, 0.1, None), DeviceMetrics("b", 0.4, 0.5, None)],
            MIG1G,
            None,
            (True, 8, Outcome.PASS, f"n: spread: {MIG1G} score 8"),
        ),
    ],
)  # fmt: skip
def test_each_shared_verdict_in_full(devices, resource, assumed, verdict):
    metrics = NodeMetrics("n", NOW - 1, {resource: tuple(devices)})
    found = evaluate_node("n", metrics, (ResourceRequest(resource, 1),), SHARED_MEM, NOW, assumed=assumed)
    assert (found.passed, found.score, found.outcome, found.reason) == verdict
