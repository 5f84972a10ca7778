"""A DRA claim's load (scoring.claim_load_verdict) and GPUClaimScore's score (scoring.claim_score), hand-worked."""

from __future__ import annotations

from gpufleet_extender.scoring import (
    CLAIM_LOAD_WEIGHT,
    NEUTRAL_SCORE,
    Outcome,
    Policy,
    claim_load_verdict,
    claim_score,
)
from gpufleet_extender.snapshot import DeviceMetrics, NodeMetrics

NOW = 10_000.0
POLICY = Policy()  # 0.8 / 0.9 thresholds, weights 0.7 / 0.3, 30 s max age, missing metrics allowed


def node(gpus=(), migs=(), sample_time=NOW - 1) -> NodeMetrics:
    """Whole GPUs and MIG instances as (util, mem), as dcgm-exporter's series give them."""
    return NodeMetrics(
        "n1",
        sample_time,
        {
            "nvidia.com/gpu": tuple(DeviceMetrics(str(i), u, m) for i, (u, m) in enumerate(gpus)),
            "nvidia.com/mig-1g.10gb": tuple(DeviceMetrics(f"7/{i}", u, m) for i, (u, m) in enumerate(migs)),
        },
    )


def test_the_claim_is_judged_by_the_mean_load_of_every_device_of_the_node():
    # Whole GPU 0.7 x 0.5 + 0.3 x 0.5 = 0.5; instance 0.7 x 0.1 + 0.3 x 0.1 = 0.1: mean 0.3 -> 10 x 0.7 = 7.
    verdict = claim_load_verdict("n1", node(gpus=[(0.5, 0.5)], migs=[(0.1, 0.1)]), POLICY, NOW)
    assert (verdict.passed, verdict.score, verdict.outcome) == (True, 7, Outcome.PASS)
    assert claim_score(93, verdict) == 93 - 3 * CLAIM_LOAD_WEIGHT


def test_a_node_with_every_device_over_the_thresholds_scores_zero():
    verdict = claim_load_verdict("n1", node(gpus=[(0.85, 0.2)], migs=[(0.9, 0.1)]), POLICY, NOW)
    assert verdict.outcome is Outcome.OVERLOADED
    assert claim_score(100, verdict) == 0
    # One device below the thresholds is enough to pass, as for a GPUScore request.
    assert claim_load_verdict("n1", node(gpus=[(0.85, 0.2)], migs=[(0.1, 0.1)]), POLICY, NOW).passed


def test_missing_or_stale_metrics_follow_on_missing_metrics():
    allowed = claim_load_verdict("n1", None, POLICY, NOW)
    assert (allowed.outcome, allowed.score) == (Outcome.MISSING_ALLOWED, NEUTRAL_SCORE)
    assert claim_score(80, allowed) == 80 - 5 * CLAIM_LOAD_WEIGHT
    deny = Policy(deny_missing=True)
    stale = claim_load_verdict("n1", node(gpus=[(0.0, 0.0)], sample_time=NOW - 31), deny, NOW)
    assert stale.outcome is Outcome.MISSING_DENIED
    assert claim_score(100, stale) == 0


def test_equal_loads_keep_the_placement_order_and_scores_stay_in_range():
    idle = claim_load_verdict("n1", node(gpus=[(0.0, 0.0)]), POLICY, NOW)
    assert [claim_score(p, idle) for p in (12, 32, 93, 100)] == [12, 32, 93, 100]
    busy = claim_load_verdict("n1", node(gpus=[(0.79, 0.8)]), POLICY, NOW)
    assert claim_score(12, busy) == 0
