"""The pure decision functions: thresholds, device choice, score formula, policies, tenants."""

from __future__ import annotations

import pytest

from gpufleet_extender.pods import ResourceRequest
from gpufleet_extender.scoring import (
    NEUTRAL_SCORE,
    Outcome,
    Policy,
    below_thresholds,
    device_load,
    evaluate_node,
    evaluate_nodes,
    pick_devices,
    score_devices,
    tenant_mismatch,
)
from gpufleet_extender.snapshot import DeviceMetrics, MetricsSnapshot, NodeMetrics

GPU = "nvidia.com/gpu"
MIG2G = "nvidia.com/mig-2g.20gb"
NOW = 10_000.0
POLICY = Policy()  # the documented defaults: 0.8 / 0.9 thresholds, weights 0.7 / 0.3, 30 s max age


def node(name="n1", sample_time=NOW - 1, **devices) -> NodeMetrics:
    """devices: resource key (gpu / mig2g) -> list of (util, mem)."""
    resources = {"gpu": GPU, "mig2g": MIG2G}
    return NodeMetrics(
        name,
        sample_time,
        {
            resources[kind]: tuple(DeviceMetrics(str(i), util, mem) for i, (util, mem) in enumerate(pairs))
            for kind, pairs in devices.items()
        },
    )


def want(count=1, resource=GPU):
    return (ResourceRequest(resource, count),)


def expected_score(pairs, policy=POLICY):
    load = sum(policy.weight_gpu_util * u + policy.weight_mem_util * m for u, m in pairs) / len(pairs)
    return max(0, min(10, round(10 * (1 - load))))


def test_device_load_weights():
    assert device_load(DeviceMetrics("0", 0.5, 0.2), POLICY) == pytest.approx(0.7 * 0.5 + 0.3 * 0.2)
    assert device_load(DeviceMetrics("0", 0.5, None), POLICY) == pytest.approx(0.35)


def test_score_uses_the_least_loaded_devices_the_pod_would_get():
    pairs = [(0.9, 0.5), (0.1, 0.1), (0.3, 0.6), (0.2, 0.0)]
    verdict = evaluate_node("n1", node(gpu=pairs), want(2), POLICY, NOW)
    assert verdict.passed and verdict.outcome is Outcome.PASS
    assert verdict.score == expected_score([(0.1, 0.1), (0.2, 0.0)])  # 10 x (1 - 0.105) = 8.95 -> 9
    assert verdict.score == 9


def test_more_devices_asked_lower_the_score():
    pairs = [(0.0, 0.0), (0.5, 0.5), (0.9, 0.9)]
    one = evaluate_node("n1", node(gpu=pairs), want(1), POLICY, NOW).score
    three = evaluate_node("n1", node(gpu=pairs), want(3), POLICY, NOW).score
    assert one == 10 and three == expected_score(pairs) and three < one


def test_score_is_clamped_and_short_devices_count_as_busy():
    devices = [DeviceMetrics("0", 0.0, 0.0)]
    assert score_devices(devices, 1, POLICY) == 10
    assert score_devices(devices, 2, POLICY) == 5  # the missing second device counts as load 1.0
    assert score_devices([DeviceMetrics("0", 1.0, 1.0)], 1, POLICY) == 0
    assert score_devices([], 0, POLICY) == NEUTRAL_SCORE


def test_filter_needs_one_device_below_both_thresholds():
    # util below but memory above, and memory below but util above: neither counts.
    pairs = [(0.5, 0.95), (0.85, 0.1)]
    verdict = evaluate_node("hk-gpu-03", node("hk-gpu-03", gpu=pairs), want(), POLICY, NOW)
    assert not verdict.passed and verdict.outcome is Outcome.OVERLOADED
    assert verdict.score == 0
    assert verdict.reason.startswith("hk-gpu-03: no nvidia.com/gpu GPU below thresholds (best: ")
    assert evaluate_node("n1", node(gpu=[*pairs, (0.79, 0.89)]), want(), POLICY, NOW).passed


def test_reason_names_the_figures_of_the_best_instance():
    verdict = evaluate_node(
        "hk-gpu-03", node("hk-gpu-03", mig2g=[(0.91, 0.42), (0.95, 0.5)]), want(1, MIG2G), POLICY, NOW
    )
    assert verdict.reason == (
        "hk-gpu-03: no nvidia.com/mig-2g.20gb instance below thresholds (best: util 0.91 > 0.80, mem 0.42)"
    )


def test_thresholds_are_strict():
    at = Policy(gpu_util_threshold=0.5, mem_util_threshold=0.6)
    assert not evaluate_node("n1", node(gpu=[(0.5, 0.0)]), want(), at, NOW).passed
    assert not evaluate_node("n1", node(gpu=[(0.0, 0.6)]), want(), at, NOW).passed
    assert evaluate_node("n1", node(gpu=[(0.49, 0.59)]), want(), at, NOW).passed
    assert not below_thresholds(DeviceMetrics("0", 0.5, 0.0), at)
    assert not below_thresholds(DeviceMetrics("0", 0.0, 0.6), at)
    assert below_thresholds(DeviceMetrics("0", 0.49, 0.59), at) and below_thresholds(DeviceMetrics("0", 0.0, None), at)
    # The reason marks a figure at the threshold as over it, like the filter does.
    verdict = evaluate_node("n1", node(gpu=[(0.5, 0.6)]), want(), at, NOW)
    assert verdict.reason == "n1: no nvidia.com/gpu GPU below thresholds (best: util 0.50 > 0.50, mem 0.60 > 0.60)"


def test_mig_request_only_looks_at_that_profile():
    n = node(gpu=[(0.0, 0.0)], mig2g=[(0.95, 0.1)])
    assert not evaluate_node("n1", n, want(1, MIG2G), POLICY, NOW).passed
    assert evaluate_node("n1", n, want(1, GPU), POLICY, NOW).passed


def test_no_gpu_request_passes_with_the_neutral_score_even_without_metrics():
    verdict = evaluate_node("n1", None, (), Policy(deny_missing=True), NOW)
    assert verdict.passed and verdict.score == NEUTRAL_SCORE and verdict.outcome is Outcome.NO_GPU_REQUEST


@pytest.mark.parametrize("deny", [False, True])
@pytest.mark.parametrize(
    ("metrics", "fragment"),
    [
        (None, "no GPU metrics for this node"),
        (node(gpu=[(0.0, 0.0)], sample_time=NOW - 31), "GPU metrics are 31s old (max 30s)"),
        (node(mig2g=[(0.0, 0.0)]), "no nvidia.com/gpu GPU in the metrics"),
    ],
)
def test_missing_or_stale_metrics_follow_the_policy(deny, metrics, fragment):
    verdict = evaluate_node("n1", metrics, want(), Policy(deny_missing=deny), NOW)
    assert fragment in verdict.reason
    assert f"ON_MISSING_METRICS={'deny' if deny else 'allow'}" in verdict.reason
    assert verdict.passed is not deny
    assert verdict.outcome is (Outcome.MISSING_DENIED if deny else Outcome.MISSING_ALLOWED)
    assert verdict.score == (0 if deny else NEUTRAL_SCORE)


def test_max_age_zero_never_goes_stale():
    old = node(gpu=[(0.0, 0.0)], sample_time=0.0)
    assert evaluate_node("n1", old, want(), Policy(max_age_seconds=0), NOW).outcome is Outcome.PASS


def test_assumed_pods_take_the_best_devices_first():
    pairs = [(0.0, 0.0), (0.5, 0.0), (0.85, 0.0)]
    n = node(gpu=pairs)
    assert pick_devices(n.devices[GPU], 1, POLICY, assumed=1)[0].util == 0.5
    one_taken = evaluate_node("n1", n, want(), POLICY, NOW, {GPU: 1})
    assert one_taken.score == expected_score([(0.5, 0.0)])
    two_taken = evaluate_node("n1", n, want(), POLICY, NOW, {GPU: 2})
    assert not two_taken.passed and "2 taken by pods bound since the last sample" in two_taken.reason
    all_taken = evaluate_node("n1", n, want(), POLICY, NOW, {GPU: 3})
    assert "all 3 assumed busy" in all_taken.reason


def test_several_resources_pass_only_together_and_score_the_worst():
    n = node(gpu=[(0.0, 0.0)], mig2g=[(0.5, 0.5)])
    both = (ResourceRequest(MIG2G, 1), ResourceRequest(GPU, 1))
    verdict = evaluate_node("n1", n, both, POLICY, NOW)
    assert verdict.passed and verdict.score == expected_score([(0.5, 0.5)])


def test_evaluate_nodes_maps_the_snapshot():
    snap = MetricsSnapshot({"a": node("a", gpu=[(0.0, 0.0)]), "b": node("b", gpu=[(0.95, 0.0)])}, NOW, 1)
    verdicts = evaluate_nodes(["a", "b", "c"], snap, want(), POLICY, NOW, {"a": {GPU: 1}})
    assert [v.outcome for v in verdicts.values()] == [Outcome.OVERLOADED, Outcome.OVERLOADED, Outcome.MISSING_ALLOWED]


def test_policy_from_settings():
    from gpufleet_extender.config import load_settings

    policy = Policy.from_settings(load_settings(GPU_UTIL_THRESHOLD=0.6, ON_MISSING_METRICS="deny"))
    assert policy.gpu_util_threshold == 0.6 and policy.deny_missing and policy.missing_policy_name == "deny"


def test_tenant_pools():
    assert tenant_mismatch("n1", None, "ns", "llm") is None  # unlabelled nodes are shared
    assert tenant_mismatch("n1", "llm", "ns", "llm") is None
    assert "tenant pool 'llm'" in tenant_mismatch("n1", "llm", "ns", "imagegen")
    assert "no tenant" in tenant_mismatch("n1", "llm", "ns", None)
