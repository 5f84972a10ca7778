"""The verdict in words (simulate/verdict.py): figures stated, missed goals with the model's reason and a docs link."""

from __future__ import annotations

from gpufleet_lab.simulate.verdict import DOCS, findings, gains, goal_lines, goals_missed, limits


def _policy(hot: int, cov: float, held: int = 0) -> dict:
    return {"hot_placements": hot, "load_cov": cov, "held": held}


def _capacity(gpus: float, nodes: float) -> dict:
    return {"free_gpus_mean": gpus, "free_nodes_mean": nodes}


def _pools(oom: dict, p95: dict, mean: dict, waits: dict) -> dict:
    return {"oom": oom, "p95_slowdown": p95, "mean_slowdown": mean, "wait_p95_by_size": waits}


def test_exclusive_devices_say_load_places_like_count_with_the_figures():
    document = {"fleet": {"replicas": 1}, "policies": {"count": _policy(0, 0.619), "load": _policy(0, 0.621, 9)}}
    assert gains(document) == []
    (line,) = findings(document)
    assert line.startswith("With exclusive devices (as deployed) the load-aware extender places like counting GPUs")
    assert "hot placements 0 vs 0, node-load CoV 0.621 vs 0.619, 9 pod(s) held back" in line


def test_shared_devices_lead_with_out_of_memory_and_slowdown_then_say_what_waiting_costs():
    document = {
        "fleet": {"replicas": 1, "sharing": {"finnlp:nvidia.com/mig-1g.10gb": 4, "llm:nvidia.com/gpu": 1}},
        "policies": {"count": _policy(1129, 0.589), "load": _policy(0, 0.591, 4562)},
        "pools": {
            "count": _pools({"finnlp": 2}, {"finnlp": 0.73}, {"finnlp": 0.2}, {"finnlp": {"1": 0.0}}),
            "load": _pools({"finnlp": 0}, {"finnlp": 0.453}, {"finnlp": 0.129}, {"finnlp": {"1": 123.0}}),
        },
    }
    (gain,) = gains(document)
    assert gain.startswith("finnlp, 1g.10gb time-sliced x4: 0 pod(s) failed with out-of-memory with load-aware")
    assert "against 2 with counting; p95 slowdown +45.3% against +73.0% (x0.62), mean +12.9% against +20.0%" in gain
    assert gain.endswith(f"({DOCS}#what-the-fleet-gains)")
    (cost,) = limits(document)
    assert cost.startswith("What it costs in finnlp: 4562 pod(s) waited") and "123 s against 0 s counting" in cost
    assert findings(document) == [gain, cost]  # gains first
    # No gain when load fails as often and slows as much: nothing claimed.
    document["pools"]["load"] = document["pools"]["count"]
    assert gains(document) == []


def test_packing_states_free_nodes_as_a_gain_and_free_gpus_as_a_limit_on_the_quiet_night_only():
    document = {
        "trace": {"scenario": "quiet-night"},
        "capacity": {"spread": _capacity(128.4, 8.2), "auto": _capacity(130.4, 13.6)},
    }
    (gain,) = gains(document)
    assert "13.6 whole nodes free against 8.2 spreading (x1.66)" in gain
    (limit,) = limits(document)
    assert "(130.4 vs 128.4, x1.02)" in limit
    document["trace"]["scenario"] = "tp-mix"
    assert findings(document) == []


def test_tensor_parallel_wait_and_relayout_gains():
    tp = {
        "pools": {
            "spread": _pools({}, {}, {"llm": 0.038}, {"llm": {"1": 0.0, "8": 807.0}}),
            "auto": _pools({}, {}, {"llm": 0.14}, {"llm": {"1": 0.0, "8": 0.0}}),
            "count": _pools({}, {}, {"llm": 0.039}, {"llm": {"8": 807.0}}),
        },
        "model": {"interference_alpha": 0.3},
    }
    assert gains(tp) == [
        "llm: 8-GPU pods wait 0 s at p95 when auto packs the pool against 807 s when it spreads "
        f"({DOCS}#shared-devices-interference-and-tensor-parallel-pods)"
    ]
    assert "mean slowdown +3.8% with the interference term against +3.9% counting" in limits(tp)[0]
    relayout = {
        "kind": "mig-relayout",
        "parameters": {"every_minutes": 10, "wait_bound_minutes": 20},
        "pools": {
            "static": {"a": {"pending_pod_minutes": 465_000.0}, "b": {"pending_pod_minutes": 692.0}},
            "relayout": {"a": {"pending_pod_minutes": 100.0}, "b": {"pending_pod_minutes": 7.0}},
        },
        "gpus_needed": {"static": {"a": 44, "b": 6}, "relayout": {"a": 8, "b": 6}},
    }
    pending, needed = gains(relayout)
    assert "107 pending pod-minutes against 465,692 with static layouts" in pending
    assert "14 with re-layout against 50 static (x0.28)" in needed
    relayout["gpus_needed"]["static"]["a"] = None  # beyond the search: no figure to claim
    assert len(gains(relayout)) == 1


def test_goal_lines_give_a_reason_and_a_docs_link_for_each_missed_goal_and_skip_unjudged_ones():
    document = {
        "goals": [
            {"goal": "load makes zero hot placements", "passed": True, "detail": "load: 0", "key": "load-hot"},
            {"goal": "load CoV <= 0.5 x count's", "passed": False, "detail": "ratio 1.00", "key": "load-cov"},
            {"goal": "auto hot placements <= spread's (peak-hour)", "passed": None, "detail": "-", "key": "auto-hot"},
        ]
    }
    lines = goal_lines(document)
    assert lines[0] == "met      load makes zero hot placements: load: 0"
    assert lines[1] == "NOT MET  load CoV <= 0.5 x count's: ratio 1.00"
    assert lines[2].startswith("         why: the extender scores the devices a pod would get")
    assert lines[2].endswith(f"({DOCS}#goals-and-what-the-model-says-about-them)")
    assert len(lines) == 3 and goals_missed(document) == 1
