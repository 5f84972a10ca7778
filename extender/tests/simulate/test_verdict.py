"""The verdict in words (simulate/verdict.py): figures stated, missed goals with the model's reason and a docs link."""

from __future__ import annotations

from gpufleet_extender.simulate.verdict import DOCS, findings, goal_lines, goals_missed


def _policy(hot: int, cov: float, held: int = 0) -> dict:
    return {"hot_placements": hot, "load_cov": cov, "held": held}


def _capacity(gpus: float, nodes: float) -> dict:
    return {"free_gpus_mean": gpus, "free_nodes_mean": nodes}


def test_exclusive_devices_say_load_places_like_count_with_the_figures():
    document = {"fleet": {"replicas": 1}, "policies": {"count": _policy(0, 0.619), "load": _policy(0, 0.621, 9)}}
    (line,) = findings(document)
    assert line.startswith("With exclusive devices (as deployed) the load-aware extender places like counting GPUs")
    assert "hot placements 0 vs 0, node-load CoV 0.621 vs 0.619, 9 pod(s) held back" in line


def test_shared_devices_say_whether_load_keeps_pods_off_hot_devices():
    better = {"fleet": {"replicas": 2}, "policies": {"count": _policy(95, 0.491), "load": _policy(19, 0.491)}}
    assert "keeps pods off hot devices" in findings(better)[0]
    worse = {"fleet": {"replicas": 2}, "policies": {"count": _policy(5, 0.4), "load": _policy(7, 0.4)}}
    assert "does no better than counting" in findings(worse)[0]


def test_packing_states_free_nodes_and_gpus_with_ratios():
    document = {"capacity": {"spread": _capacity(128.4, 8.2), "auto": _capacity(130.4, 13.6)}}
    (line,) = findings(document)
    assert "13.6 vs 8.2 whole nodes free (x1.66)" in line and "130.4 vs 128.4 whole GPUs (x1.02)" in line


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
