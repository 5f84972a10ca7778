"""The scoring strategies in the simulator: spread/pack/auto policies, the free-capacity probe and figures, the
new traces, the goal checks and the command's output."""

from __future__ import annotations

import json

import pytest
from gpufleet_extender.pods import MIG_RESOURCE_PREFIX
from gpufleet_extender.scoring import Mode, Policy

from gpufleet_lab.simulate import main
from gpufleet_lab.simulate.capacity import (
    PROBE_NAME,
    CapacityProbe,
    CapacitySummary,
    PoolCapacity,
    strategy_goal_checks,
    summarise_capacity,
)
from gpufleet_lab.simulate.fleet import Device, Fleet, Node, fleet_from_yaml
from gpufleet_lab.simulate.generator import SCENARIOS, generate_trace
from gpufleet_lab.simulate.metrics import PolicySummary
from gpufleet_lab.simulate.model import RunResult, simulate
from gpufleet_lab.simulate.policies import POLICIES, SchedulerView, make_policy
from gpufleet_lab.simulate.state import SimCluster
from gpufleet_lab.simulate.trace import Schedule, make_trace

from sim_helpers import pod, whole_gpu_node
from test_generator_and_cli import SMALL_FLEET

# Two nodes of 4 whole GPUs, exclusive devices. p1 runs from t=1; the scrape at 15 shows its GPU busy
# (util 0.8 -> device load 0.56, node load 0.14); p2 arrives at 20.
TWO_NODES = Fleet((whole_gpu_node("a", 4), whole_gpu_node("b", 4)), {}, replicas=1, source="test")
TRACE = make_trace([pod("p1", 1, 0.8), pod("p2", 20, 0.8)])


def run(name: str, fleet: Fleet = TWO_NODES, trace=TRACE) -> tuple[RunResult, object]:
    policy = make_policy(name, 1)
    return simulate(fleet, trace, policy, Policy(), probes=(CapacityProbe(),)), policy


def test_pack_puts_the_second_pod_beside_the_first_spread_does_not():
    spread, _ = run("spread")
    pack, _ = run("pack")
    # spread: every fitting node offers an idle GPU (score 10); least allocated breaks the tie: b.
    assert [o.node for o in spread.outcomes] == ["a", "b"]
    # pack: a's GPUs carry load 0.14 -> score 7; idle b -> 6.
    assert [o.node for o in pack.outcomes] == ["a", "a"]
    # Sample at 30 (both pods running): pack leaves node b free and 4 GPUs placeable on one node; spread neither.
    at_30 = {name: r.probes[PROBE_NAME][r.sample_times.index(30.0)][None] for name, r in (("s", spread), ("p", pack))}
    assert at_30["p"] == PoolCapacity(free_gpus=6, free_nodes=1, largest_placeable=4)
    assert at_30["s"] == PoolCapacity(free_gpus=6, free_nodes=0, largest_placeable=3)


def test_auto_packs_a_quiet_fleet_and_counts_its_placements_per_mode():
    result, policy = run("auto")
    assert [o.node for o in result.outcomes] == ["a", "a"]
    assert policy.placements_by_mode == {"pack": 2}
    assert policy.modes == {"nvidia.com/gpu": Mode.PACK}
    assert make_policy("pack", 1).modes is None


def test_auto_spreads_once_the_fleet_is_busy():
    # Both nodes 3/4 busy at util 1.0 and memory 0.8 (device load 0.94): fleet mean 0.705 > 0.5 -> spread.
    policy = make_policy("auto", 1)
    cluster = SimCluster(TWO_NODES, Policy())
    busy = [pod(f"{n}{i}", 0, 1.0, mem_gb=Schedule.constant(64.0)) for n in "ab" for i in range(3)]
    for spec in busy:
        node = cluster.nodes[spec.name[0]]
        cluster.bind(spec, node, node.free_devices(spec.resource)[:1], 0.0)
    snapshot = cluster.scrape(0.0)
    view = SchedulerView(1.0, snapshot, {}, Policy())
    fitting = list(cluster.nodes.values())
    policy.choose(pod("new", 1, 0.5), fitting, view)
    assert policy.modes == {"nvidia.com/gpu": Mode.SPREAD}
    assert policy.placements_by_mode == {"spread": 1}


def test_load_policy_follows_the_settings_strategy_and_the_named_ones_force_theirs():
    assert {"spread", "pack", "auto"} <= set(POLICIES)
    packing_settings = Policy(strategy="pack")
    load = make_policy("load", 1)
    result = simulate(TWO_NODES, TRACE, load, packing_settings)
    assert [o.node for o in result.outcomes] == ["a", "a"]  # SCORING_STRATEGY=pack reaches `load`
    forced = simulate(TWO_NODES, TRACE, make_policy("spread", 1), packing_settings)
    assert [o.node for o in forced.outcomes] == ["a", "b"]


def test_a_mig_gpu_is_free_only_when_all_its_instances_are():
    profile = MIG_RESOURCE_PREFIX + "3g.40gb"
    node = Node(
        "m",
        None,
        (
            Device("gpu0/mig0", profile, 40.0),
            Device("gpu0/mig1", profile, 40.0),
            Device("gpu1", "nvidia.com/gpu", 80.0),
        ),
    )
    cluster = SimCluster(Fleet((node,), {}, 1), Policy())
    probe = CapacityProbe()
    assert probe.sample(0.0, cluster) == {None: PoolCapacity(free_gpus=2, free_nodes=1, largest_placeable=2)}
    state = cluster.nodes["m"]
    cluster.bind(pod("x", 0, 0.5, resource=profile), state, [state.devices[1]], 0.0)
    assert probe.sample(1.0, cluster) == {None: PoolCapacity(free_gpus=1, free_nodes=0, largest_placeable=1)}


def test_capacity_summary_averages_up_to_the_last_arrival():
    result = RunResult("auto", ["a"], ["t"])
    result.sample_times = [0.0, 15.0, 30.0, 45.0]
    result.probes[PROBE_NAME] = [
        {"t": PoolCapacity(4, 1, 4)},
        {"t": PoolCapacity(2, 0, 2)},
        {"t": PoolCapacity(0, 0, 0)},
        {"t": PoolCapacity(8, 1, 8)},  # after the last arrival: the drain, left out
    ]
    summary = summarise_capacity(result, last_arrival=30.0, by_mode={"pack": 3, "spread": 1})
    assert summary.free_gpus_mean == pytest.approx(2.0) and summary.free_nodes_mean == pytest.approx(1 / 3)
    assert summary.largest_placeable_mean == {"t": pytest.approx(2.0)} and summary.largest_placeable_min == {"t": 0}
    assert summary.pack_share == 0.75
    assert summarise_capacity(result, 30.0).pack_share is None


def _summary(name: str, hot: int, cov: float) -> PolicySummary:
    return PolicySummary(name, 10, 10, 0, 0.0, 0.0, hot, 0, 0, cov, 0.3, 0.5, 0.9)


def _capacity(name: str, free: float) -> CapacitySummary:
    return CapacitySummary(name, free, 0.0, {}, {}, {}, None)


def test_goal_checks_judge_each_goal_on_its_own_trace():
    summaries = {"spread": _summary("spread", 3, 0.30), "auto": _summary("auto", 3, 0.3004)}
    capacities = {"spread": _capacity("spread", 10.0), "auto": _capacity("auto", 20.0)}
    quiet = strategy_goal_checks(summaries, capacities, "quiet-night")
    assert [c.passed for c in quiet] == [True, None, None]
    assert "x2.00" in quiet[0].detail and "not judged" in quiet[1].detail
    peak = strategy_goal_checks(summaries, capacities, "peak-hour")
    assert [c.passed for c in peak] == [None, True, True]  # CoV equal at the printed precision
    worse = {"spread": _summary("spread", 3, 0.30), "auto": _summary("auto", 4, 0.32)}
    assert [c.passed for c in strategy_goal_checks(worse, capacities, "peak-hour")] == [None, False, False]
    fewer = {"spread": _capacity("spread", 10.0), "auto": _capacity("auto", 19.9)}
    assert strategy_goal_checks(summaries, fewer, "quiet-night")[0].passed is False
    skipped = strategy_goal_checks({"spread": summaries["spread"]}, capacities, "quiet-night")
    assert [c.passed for c in skipped] == [None, None, None] and "auto not run" in skipped[0].detail


def test_quiet_and_peak_traces_differ_only_in_how_busy_they_are(tmp_path):
    path = tmp_path / "fleet.yml"
    path.write_text(SMALL_FLEET)
    fleet = fleet_from_yaml(path)
    traces = {name: generate_trace(fleet, 1, 3600, SCENARIOS[name], name) for name in ("quiet-night", "peak-hour")}
    quiet, peak = traces["quiet-night"], traces["peak-hour"]
    assert len(peak.pods) > 3 * len(quiet.pods) > 0
    assert {p.resource for p in quiet.pods} == {p.resource for p in peak.pods}
    assert quiet.source.startswith("generated: quiet-night, seed 1")
    # The night dips in the middle; the peak hour rises there.
    night, busy = SCENARIOS["quiet-night"], SCENARIOS["peak-hour"]
    assert night.at(0.5) < night.at(0.0) < busy.at(0.0) < busy.at(0.5)


def test_command_compares_the_strategies_on_a_quiet_night(tmp_path, capsys):
    path = tmp_path / "fleet.yml"
    path.write_text(SMALL_FLEET)
    out = tmp_path / "sim"
    args = ["--fleet", str(path), "--scenario", "quiet-night", "--hours", "0.5", "--output", str(out), "--quiet"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    for name in ("spread", "pack", "auto"):
        assert f"\n{name} " in printed
    assert "Goals of the scoring strategies" in printed and "Goals of the load-aware extender" not in printed
    assert "issue" not in printed.lower()  # no tracker numbers a user cannot know
    assert "free GPUs" in printed and "largest llm" in printed
    document = json.loads((out / "results.json").read_text())
    assert list(document["policies"]) == ["spread", "pack", "auto"] == list(document["capacity"])
    assert [g["passed"] is None for g in document["goals"]] == [False, True, True]  # only the quiet goal judged
    assert document["extender"]["scoring_strategy"] == "spread"
    assert (out / "free_capacity.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Both sets of policies in one run print both sets of goals.
    assert main([*args, "--policies", "count,load,auto,spread", "--no-plot"]) == 0
    printed = capsys.readouterr().out
    assert "Goals of the load-aware extender" in printed and "Goals of the scoring strategies" in printed
