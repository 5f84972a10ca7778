"""Scoring strategies (issue 7): spread, pack (TargetLoadPacking), auto with hysteresis, and their settings."""

from __future__ import annotations

import json

import pytest
from gpufleet_testsupport.exposition import render_exposition
from gpufleet_testsupport.scheduler_requests import make_pod, names_args

from gpufleet_extender.config import SettingsError, load_settings
from gpufleet_extender.metrics_source import parse_exposition
from gpufleet_extender.pods import ResourceRequest
from gpufleet_extender.scoring import (
    Mode,
    ModeSelector,
    Outcome,
    Policy,
    Strategy,
    evaluate_nodes,
    fleet_mean_load,
    next_mode,
    pack_score,
)
from gpufleet_extender.service import Extender
from gpufleet_extender.snapshot import DeviceMetrics, MetricsSnapshot, NodeMetrics, build_snapshot

from extender_helpers import body, gpus

GPU = "nvidia.com/gpu"
MIG1G = "nvidia.com/mig-1g.10gb"
NOW = 10_000.0
BUSY = (0.8, 0.8)  # device load 0.7 x 0.8 + 0.3 x 0.8 = 0.8: a device an exclusive pod keeps busy
IDLE = (0.0, 0.0)


def node(name: str, pairs, resource: str = GPU) -> NodeMetrics:
    devices = tuple(DeviceMetrics(str(i), util, mem) for i, (util, mem) in enumerate(pairs))
    return NodeMetrics(name, NOW - 1, {resource: devices})


def snapshot_of(*nodes: NodeMetrics) -> MetricsSnapshot:
    return MetricsSnapshot(nodes={n.name: n for n in nodes}, taken_at=NOW, version=1)


# An 8-GPU pool with exclusive devices: how many GPUs are busy is all that differs.
POOL = snapshot_of(
    node("empty", [IDLE] * 8),
    node("one-busy", [BUSY] + [IDLE] * 7),
    node("half", [BUSY] * 4 + [IDLE] * 4),
    node("at-target", [BUSY] * 6 + [IDLE] * 2),  # load 0.6 = PACK_TARGET_UTIL
    node("past-target", [BUSY] * 7 + [IDLE]),  # load 0.7
)
NAMES = list(POOL.nodes)


def ranking(policy: Policy, modes=None, count: int = 1, snapshot: MetricsSnapshot = POOL) -> list[str]:
    """Node names best first (ties by name), as kube-scheduler would rank the extender's scores."""
    verdicts = evaluate_nodes(list(snapshot.nodes), snapshot, (ResourceRequest(GPU, count),), policy, NOW, None, modes)
    assert all(v.passed for v in verdicts.values())
    return sorted(verdicts, key=lambda name: (-verdicts[name].score, name))


def scores(policy: Policy, modes=None, snapshot: MetricsSnapshot = POOL) -> dict[str, int]:
    verdicts = evaluate_nodes(list(snapshot.nodes), snapshot, (ResourceRequest(GPU, 1),), policy, NOW, None, modes)
    return {name: v.score for name, v in verdicts.items()}


# --- pack_score: TargetLoadPacking's curve --------------------------------------------------------------------


def test_pack_score_rises_to_the_target_then_falls():
    target = 0.6
    assert pack_score(0.0, target) == 6  # an idle node scores 10 x target
    assert pack_score(target, target) == 10
    assert pack_score(1.0, target) == 0
    rising = [pack_score(x / 100, target) for x in range(0, 61)]
    falling = [pack_score(x / 100, target) for x in range(60, 101)]
    assert rising == sorted(rising) and falling == sorted(falling, reverse=True)
    # Just past the target a node is worse than an idle one: packing does not push nodes towards hot.
    assert pack_score(0.75, target) < pack_score(0.0, target)


def test_pack_score_clamps_loads_outside_0_1():
    assert pack_score(-0.5, 0.6) == pack_score(0.0, 0.6)
    assert pack_score(1.5, 0.6) == 0


# --- ordering on hand-made node sets ---------------------------------------------------------------------------


def test_spread_cannot_tell_exclusive_nodes_apart_by_the_devices_a_pod_would_get():
    # The devices a 1-GPU pod would get are idle everywhere: every node scores 10 and the tie-break decides.
    assert set(scores(Policy())) == set(NAMES)
    assert set(scores(Policy()).values()) == {10}


def test_spread_prefers_the_coolest_devices_when_devices_are_shared():
    shared = snapshot_of(
        node("cool", [(0.1, 0.1)] * 2), node("warm", [(0.5, 0.4)] * 2), node("hot-ish", [(0.7, 0.6)] * 2)
    )
    assert ranking(Policy(), snapshot=shared) == ["cool", "warm", "hot-ish"]
    # Pack: warm (load 0.47) is nearest under the target; hot-ish (0.67) is past it and ranks below idle-ish cool.
    assert ranking(Policy(strategy=Strategy.PACK), snapshot=shared) == ["warm", "cool", "hot-ish"]


def test_pack_prefers_the_fullest_node_under_the_target():
    pack = Policy(strategy=Strategy.PACK)
    assert scores(pack) == {"empty": 6, "one-busy": 7, "half": 9, "at-target": 10, "past-target": 4}
    assert ranking(pack) == ["at-target", "half", "one-busy", "empty", "past-target"]


def test_pack_target_moves_the_peak():
    low_target = Policy(strategy=Strategy.PACK, pack_target_util=0.3)
    assert ranking(low_target)[0] == "one-busy"  # 0.1 is closest under 0.3; half (0.4) is already past it
    assert ranking(low_target)[-1] == "past-target"


def test_pack_never_passes_a_node_without_a_device_below_the_thresholds():
    hot = snapshot_of(node("all-hot", [(0.85, 0.5)] * 4), node("one-cool", [(0.85, 0.5)] * 3 + [IDLE]))
    verdicts = evaluate_nodes(list(hot.nodes), hot, (ResourceRequest(GPU, 1),), Policy(strategy=Strategy.PACK), NOW)
    assert not verdicts["all-hot"].passed and verdicts["all-hot"].outcome is Outcome.OVERLOADED
    assert verdicts["one-cool"].passed


def test_pack_counts_in_flight_pods_on_the_node():
    pack = Policy(strategy=Strategy.PACK)
    request = (ResourceRequest(GPU, 1),)
    # Two pods bound to "empty" since the sample: it is no longer empty, and now beats "one-busy".
    verdicts = evaluate_nodes(["empty", "one-busy"], POOL, request, pack, NOW, {"empty": {GPU: 2}})
    assert verdicts["empty"].score > verdicts["one-busy"].score


def test_auto_scores_each_resource_in_the_mode_chosen_for_it():
    auto = Policy(strategy=Strategy.AUTO)
    assert scores(auto, {GPU: Mode.PACK}) == scores(Policy(strategy=Strategy.PACK))
    assert scores(auto, {GPU: Mode.SPREAD}) == scores(Policy())
    assert scores(auto, {MIG1G: Mode.PACK}) == scores(Policy())  # no choice for this resource yet: spread
    assert scores(auto, None) == scores(Policy())
    # A fixed strategy ignores auto's modes.
    assert scores(Policy(), {GPU: Mode.PACK}) == scores(Policy())


def test_reasons_name_the_mode_and_the_figures():
    request = (ResourceRequest(GPU, 1),)
    pack = evaluate_nodes(["half"], POOL, request, Policy(strategy=Strategy.PACK), NOW)["half"]
    assert pack.reason == "half: pack: nvidia.com/gpu load 0.40, target 0.60, score 9"
    auto = evaluate_nodes(["half"], POOL, request, Policy(strategy=Strategy.AUTO), NOW, None, {GPU: Mode.SPREAD})[
        "half"
    ]
    assert auto.reason == "half: spread (SCORING_STRATEGY=auto): nvidia.com/gpu score 10"


# --- auto: the mode selector -------------------------------------------------------------------------------------


def test_fleet_mean_load_per_resource_skips_stale_nodes():
    stale = NodeMetrics("stale", NOW - 600, {GPU: (DeviceMetrics("0", 1.0, 1.0),)})
    mixed = snapshot_of(node("a", [BUSY, IDLE]), node("b", [IDLE, IDLE]), node("m", [BUSY], MIG1G), stale)
    assert fleet_mean_load(mixed, Policy(), NOW) == pytest.approx({GPU: 0.2, MIG1G: 0.8})
    assert fleet_mean_load(mixed, Policy(max_age_seconds=0), NOW)[GPU] == pytest.approx(1.8 / 5)


def test_next_mode_packs_below_spreads_above_and_keeps_its_mode_in_between():
    below, margin = 0.4, 0.1
    assert next_mode(None, 0.2, below, margin) is Mode.PACK
    assert next_mode(None, 0.45, below, margin) is Mode.SPREAD  # start-up inside the band: the safe default
    assert next_mode(Mode.PACK, 0.45, below, margin) is Mode.PACK
    assert next_mode(Mode.SPREAD, 0.45, below, margin) is Mode.SPREAD
    assert next_mode(Mode.PACK, 0.51, below, margin) is Mode.SPREAD
    assert next_mode(Mode.SPREAD, 0.39, below, margin) is Mode.PACK


def test_selector_does_not_flap_around_the_boundary():
    selector = ModeSelector(pack_below=0.4, hysteresis=0.1)
    loads = [0.30, 0.41, 0.39, 0.42, 0.48, 0.44, 0.52, 0.46, 0.41, 0.42, 0.38, 0.43]
    modes, switches = [], 0
    for load in loads:
        switches += len(selector.update({GPU: load}))
        modes.append(selector.modes[GPU])
    P, S = Mode.PACK, Mode.SPREAD
    assert modes == [P, P, P, P, P, P, S, S, S, S, P, P]
    assert switches == 3  # the first choice, up past 0.5, down below 0.4
    # Without a margin the same loads flap at every crossing of 0.4.
    no_margin = ModeSelector(pack_below=0.4, hysteresis=0.0)
    flips = sum(len(no_margin.update({GPU: load})) for load in loads)
    assert flips > switches


def test_selector_keeps_a_mode_per_resource():
    selector = ModeSelector(pack_below=0.4, hysteresis=0.1)
    assert selector.update({GPU: 0.7, MIG1G: 0.1}) == {GPU: Mode.SPREAD, MIG1G: Mode.PACK}
    assert selector.update({GPU: 0.7, MIG1G: 0.1}) == {}
    assert selector.fleet_load == {GPU: 0.7, MIG1G: 0.1}


# --- the service: the selector's state, /metrics --------------------------------------------------------------


def _snapshot(version: int, fleet: dict):
    samples = parse_exposition(render_exposition(fleet))
    return build_snapshot(samples, ("Hostname",), default_time=NOW, taken_at=NOW, version=version)


def test_service_auto_switches_with_the_fleet_load_and_exports_the_mode():
    current = {"snap": _snapshot(1, {"a": gpus(0.0, 0.0, 0.0, 0.0), "b": gpus(0.6, 0.6, 0.0, 0.0)})}
    extender = Extender(
        load_settings(KUBE_API="off", SCORING_STRATEGY="auto", METRICS_MAX_AGE_SECONDS=0),
        snapshot_provider=lambda: current["snap"],
        clock=lambda: NOW,
    )
    registry = extender.telemetry.registry
    request = body(names_args(make_pod({"nvidia.com/gpu": "1"}), ["a", "b"]))
    quiet = {e["Host"]: e["Score"] for e in json.loads(extender.prioritize(request))}
    assert quiet["b"] > quiet["a"]  # quiet fleet: pack onto the node already in use
    assert registry.get_sample_value("gpufleet_extender_scoring_mode", {"resource": GPU, "mode": "pack"}) == 1
    assert registry.get_sample_value("gpufleet_extender_scoring_strategy", {"strategy": "auto"}) == 1

    # Two hot nodes lift the fleet's mean GPU load past AUTO_PACK_BELOW + AUTO_HYSTERESIS (0.5).
    busy_fleet = {"a": gpus(0.6, 0.6, 0.6, 0.1), "b": gpus(0.5, 0.5, 0.5, 0.3)}
    busy_fleet.update(c=gpus(0.95, 0.95, 0.95, 0.95), d=gpus(0.95, 0.95, 0.95, 0.95))
    current["snap"] = _snapshot(2, busy_fleet)
    busy = {e["Host"]: e["Score"] for e in json.loads(extender.prioritize(request))}
    spread = evaluate_nodes(["a", "b"], current["snap"], (ResourceRequest(GPU, 1),), Policy(max_age_seconds=0), NOW)
    assert busy == {name: v.score for name, v in spread.items()}
    assert busy["a"] > busy["b"]  # busy fleet: spread to the coolest devices (pack would score both 8)
    assert registry.get_sample_value("gpufleet_extender_scoring_mode", {"resource": GPU, "mode": "spread"}) == 1
    assert registry.get_sample_value("gpufleet_extender_scoring_mode", {"resource": GPU, "mode": "pack"}) == 0
    switches = registry.get_sample_value(
        "gpufleet_extender_scoring_mode_switches_total", {"resource": GPU, "mode": "spread"}
    )
    assert switches == 1
    assert registry.get_sample_value("gpufleet_extender_fleet_mean_load", {"resource": GPU}) > 0.5


def test_service_with_a_fixed_strategy_keeps_no_auto_state():
    extender = Extender(load_settings(KUBE_API="off", SCORING_STRATEGY="pack"), clock=lambda: NOW)
    assert extender.mode_selector is None
    assert extender.telemetry.registry.get_sample_value("gpufleet_extender_scoring_strategy", {"strategy": "pack"}) == 1


# --- settings --------------------------------------------------------------------------------------------------


def test_defaults_keep_spread():
    settings = load_settings()
    assert settings.SCORING_STRATEGY == "spread"
    assert (settings.PACK_TARGET_UTIL, settings.AUTO_PACK_BELOW, settings.AUTO_HYSTERESIS) == (0.6, 0.4, 0.1)
    policy = Policy.from_settings(load_settings(SCORING_STRATEGY="auto", AUTO_PACK_BELOW=0.3, AUTO_HYSTERESIS=0.05))
    assert (policy.strategy, policy.auto_pack_below, policy.auto_hysteresis) == (Strategy.AUTO, 0.3, 0.05)


def test_strategy_from_the_environment(monkeypatch):
    monkeypatch.setenv("SCORING_STRATEGY", "pack")
    monkeypatch.setenv("PACK_TARGET_UTIL", "0.5")
    settings = load_settings()
    assert settings.SCORING_STRATEGY == "pack" and settings.PACK_TARGET_UTIL == 0.5


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"SCORING_STRATEGY": "binpack"}, "SCORING_STRATEGY: Input should be 'spread', 'pack' or 'auto'"),
        ({"PACK_TARGET_UTIL": 0}, "PACK_TARGET_UTIL: Input should be greater than 0"),
        ({"PACK_TARGET_UTIL": 1}, "PACK_TARGET_UTIL: Input should be less than 1"),
        ({"AUTO_PACK_BELOW": 1.2}, "AUTO_PACK_BELOW: Input should be less than 1"),
        ({"AUTO_HYSTERESIS": -0.1}, "AUTO_HYSTERESIS: Input should be greater than or equal to 0"),
        (
            {"SCORING_STRATEGY": "pack", "GPU_UTIL_THRESHOLD": 0.5},
            "PACK_TARGET_UTIL (0.6) must be below GPU_UTIL_THRESHOLD (0.5) with SCORING_STRATEGY=pack",
        ),
        (
            {"SCORING_STRATEGY": "auto", "AUTO_PACK_BELOW": 0.9, "AUTO_HYSTERESIS": 0.2},
            "AUTO_PACK_BELOW + AUTO_HYSTERESIS must be below 1 (got 0.9 + 0.2)",
        ),
    ],
)
def test_bad_strategy_settings_are_refused_with_a_clear_message(overrides, message):
    with pytest.raises(SettingsError) as raised:
        load_settings(**overrides)
    assert message in str(raised.value)


def test_a_low_threshold_does_not_refuse_spread():
    # PACK_TARGET_UTIL only matters to the packing strategies.
    assert load_settings(GPU_UTIL_THRESHOLD=0.5).SCORING_STRATEGY == "spread"
