"""bench-mig judges results: it passes nvidia_mig's runner and fails runners that are broken in known ways."""

from __future__ import annotations

import pytest
from _helpers import bench

TRANSITIONS = 60
PRODUCT = "NVIDIA H100 80GB HBM3"


def test_nvidia_mig_runner_passes_every_check_with_jobs_running():
    report = bench.run(TRANSITIONS, seed=3, product=PRODUCT)
    totals = report["totals"]
    assert report["failures"] == []
    assert totals["destroyed"] == totals["minimum"] > 0
    # The run exercised both busy cases: jobs kept through a change, and changes that had to be refused.
    assert totals["busy"] > 0 and totals["busy_survived"] == totals["busy"]
    assert 0 < totals["refused"] < totals["with_busy"]


def test_a_runner_that_creates_nothing_fails():
    report = bench.run(TRANSITIONS, seed=3, product=PRODUCT, apply=bench.RUNNERS["creates-nothing"])
    problems = [p for case in report["failures"] for p in case["problems"]]
    assert any(p.startswith("GPU holds nothing, target ") for p in problems)


def test_a_runner_that_ignores_busy_instances_fails():
    report = bench.run(TRANSITIONS, seed=3, product=PRODUCT, apply=bench.RUNNERS["ignores-busy"])
    problems = [p for case in report["failures"] for p in case["problems"]]
    assert any(p.startswith("had to refuse (busy instances in the way), got ApplyError") for p in problems)
    assert any(p == "GPU changed although the run had to refuse" for p in problems)


def test_a_runner_that_kills_jobs_first_fails():
    # The simulator refuses to destroy an instance with processes (IN_USE), like the driver; a runner that
    # still got rid of them (processes gone first) is caught by the survival check.
    def destroy_jobs_then_apply(nvml, config):
        bench.end_jobs(nvml.path)  # the jobs are killed, through the state file the lab documents
        return bench.runner.apply(bench.SimulatedNvml(nvml.path), config)

    report = bench.run(TRANSITIONS, seed=3, product=PRODUCT, apply=destroy_jobs_then_apply)
    problems = [p for case in report["failures"] for p in case["problems"]]
    assert any(p.startswith("busy instance ") and p.endswith(" destroyed") for p in problems)


@pytest.mark.parametrize(
    ("before_destroyed", "expected"),
    [(0, "destroyed 0 instances, minimum 1"), (2, "destroyed 2 instances, minimum 1")],
)
def test_destroyed_count_is_checked_both_ways(before_destroyed, expected):
    # idle 1g.20gb@0 + idle 1g.20gb@4 -> {1g.20gb: 1, 3g.40gb: 1}: exactly one must go.
    obs = bench.Observed
    catalog = bench.Catalog.from_table(bench.product_table(PRODUCT))
    before = [obs("MIG-a", "1g.20gb", 0, ()), obs("MIG-b", "1g.20gb", 4, ())]
    after = {
        0: before,  # nothing destroyed (and the target not reached)
        2: [obs("MIG-c", "1g.20gb", 0, ()), obs("MIG-d", "3g.40gb", 4, ())],  # both rebuilt
    }[before_destroyed]
    problems, minimum = bench.check_transition(before, after, set(), {"1g.20gb": 1, "3g.40gb": 1}, {}, catalog)
    assert minimum == 1 and expected in problems
