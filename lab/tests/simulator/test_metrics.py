"""Figures of a run and the goal checks."""

from __future__ import annotations

import pytest

from gpufleet_lab.simulate.metrics import PolicySummary, goal_checks, percentile, pooled_cov, summarise
from gpufleet_lab.simulate.model import PodOutcome, RunResult


def test_percentile_is_nearest_rank():
    values = [5, 1, 4, 2, 3]
    assert (percentile(values, 0.5), percentile(values, 0.95), percentile(values, 0.2)) == (3, 5, 1)
    assert percentile([], 0.5) is None


def test_cov_is_computed_within_each_pool():
    # Pool x: 0.2 and 0.6 (mean 0.4, stdev 0.2 -> 0.5); pool y: 0.9 and 0.9 (0). Weighted by size: 0.25.
    # Across all four nodes it would be much larger: the pools' own levels must not count.
    assert pooled_cov([0.2, 0.6, 0.9, 0.9], ["x", "x", "y", "y"]) == pytest.approx(0.25)
    assert pooled_cov([0.0, 0.0, 0.2, 0.6], ["x", "x", "y", "y"]) == pytest.approx(
        0.5
    )  # idle pool x: nothing to balance
    assert pooled_cov([0.0, 0.0], ["x", "x"]) is None


def test_summary_of_a_run():
    result = RunResult("count", ["a", "b"], ["x", "x"])
    result.outcomes = [
        PodOutcome("p1", "x", 0.0, start=0.0, hot=True),
        PodOutcome("p2", "x", 5.0, start=35.0, held=True),
        PodOutcome("p3", "x", 9.0),
    ]
    result.sample_times = [0.0, 15.0]
    result.node_load = [[0.2, 0.6], [0.4, 0.4]]  # CoV 0.5 then 0: time-weighted 0.25
    result.device_load.extend([0.1, 0.9, 0.5, 0.3])
    summary = summarise(result)
    assert (summary.placed, summary.never_placed, summary.hot_placements, summary.held) == (2, 1, 1, 1)
    assert (summary.wait_p50_s, summary.wait_p95_s) == (0.0, 30.0)
    assert summary.load_cov == pytest.approx(0.25)
    assert summary.mean_node_load == pytest.approx(0.4)
    assert (summary.device_load_p95, summary.device_load_max) == (0.9, 0.9)


def _summary(policy: str, hot: int, cov: float) -> PolicySummary:
    return PolicySummary(policy, 10, 10, 0, 0.0, 0.0, hot, hot, 0, cov, 0.5, 0.9, 1.0)


def test_retired_goal_checks_show_their_figures_and_are_never_judged():
    better = goal_checks({"count": _summary("count", 3, 0.4), "load": _summary("load", 0, 0.2)}, replicas=2)
    worse = goal_checks({"count": _summary("count", 3, 0.4), "load": _summary("load", 1, 0.21)}, replicas=2)
    assert [c.passed for c in better + worse] == [None] * 4  # neither outcome is judged
    assert "ratio 0.50" in better[1].detail and "retired" in better[1].detail
    assert "(1 on nodes the last sample showed with cool room: device choice or lag)" in worse[0].detail
    assert worse[0].detail.startswith("load: 1 hot placement(s) of 10 placed") and "; count: 3 (" in worse[0].detail
    assert [c.key for c in worse] == ["load-hot", "load-cov"]
    assert goal_checks({"count": _summary("count", 0, 0.4)}, replicas=1)[0].passed is None
    exclusive = goal_checks({"count": _summary("count", 0, 0.0), "load": _summary("load", 0, 0.0)}, replicas=1)
    assert "ratio n/a" in exclusive[1].detail


def test_fewest_that_serves_bisects_to_the_least_and_counts_its_calls():
    from gpufleet_lab.simulate.metrics import fewest_that_serves

    calls = []

    def serves(gpus: int) -> bool:
        calls.append(gpus)
        return gpus >= 37

    assert fewest_that_serves(100, serves) == 37
    assert len(calls) <= 1 + 7  # the limit, then a bisection of 1..100
    assert fewest_that_serves(36, lambda gpus: gpus >= 37) is None
    assert fewest_that_serves(5, lambda gpus: True) == 1
