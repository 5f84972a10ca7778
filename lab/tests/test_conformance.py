"""The Go GPUScore plugin's vector file is what scoring.py decides today: regenerate it and compare byte for byte.

When this fails after a change of the decision code, regenerate the file and run the plugin's tests:
``python -m gpufleet_lab.conformance ../k8s/gpuscore/testdata/vectors.json && cd ../k8s && go test ./gpuscore/``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpufleet_lab import conformance

VECTORS = Path(__file__).resolve().parents[2] / "k8s" / "gpuscore" / "testdata" / "vectors.json"


def test_committed_vectors_are_what_scoring_py_decides_now():
    assert VECTORS.is_file(), f"{VECTORS} is missing: the extender is tested inside the repository"
    committed = VECTORS.read_text(encoding="utf-8")
    regenerated = conformance.render(conformance.build())
    if committed != regenerated:
        pytest.fail(
            "k8s/gpuscore/testdata/vectors.json differs from what scoring.py decides now; regenerate it with "
            "`python -m gpufleet_lab.conformance ../k8s/gpuscore/testdata/vectors.json` and run "
            "`go test ./gpuscore/` in k8s/"
        )


def test_generation_ignores_the_environment(monkeypatch):
    baseline = conformance.render(conformance.build(seed=3))
    monkeypatch.setenv("GPU_UTIL_THRESHOLD", "0.3")
    assert conformance.render(conformance.build(seed=3)) == baseline


def test_vectors_cover_every_outcome_strategy_and_section():
    vectors = json.loads(VECTORS.read_text(encoding="utf-8"))
    outcomes = {verdict[2] for case in vectors["decisions"] for verdict in case["expect"].values()}
    assert outcomes == {
        "pass",
        "no_gpu_request",
        "overloaded",
        "missing_metrics_allowed",
        "missing_metrics_denied",
        "tenant_mismatch",
    }
    assert {case["args"]["scoringStrategy"] for case in vectors["decisions"]} == {"spread", "pack", "auto"}
    assert any(
        "taken by pods bound since the last sample" in v[3] for c in vectors["decisions"] for v in c["expect"].values()
    )
    assert {True, False} == {case["valid"] for case in vectors["args"]}
    assert any(step["changed"] for case in vectors["auto"] for step in case["steps"])
    hosts = {label for case in vectors["prometheus"] for item in case["series"] for label in item["metric"]}
    assert {"Hostname", "hostname", "GPU_I_PROFILE"} <= hosts
    claims = {verdict[2] for case in vectors["claims"] for verdict in case["expect"].values()}
    assert claims == {"pass", "overloaded", "missing_metrics_allowed", "missing_metrics_denied"}
    scores = {verdict[4] for case in vectors["claims"] for verdict in case["expect"].values()}
    assert 0 in scores and len(scores) > 20  # refused nodes and a spread of combined scores
    assert VECTORS.stat().st_size < 1_000_000


def test_vectors_cover_shared_resources_and_interference():
    vectors = json.loads(VECTORS.read_text(encoding="utf-8"))
    reasons = [v[3] for c in vectors["decisions"] for v in c["expect"].values()]
    for part in (
        "spread: shared",  # scored by the devices it may share
        "replica taken",  # every replica of the node's devices taken
        "the device plugin may share a busy",  # a candidate device over the thresholds
        "INTERFERENCE_WEIGHT",
    ):
        assert sum(part in reason for reason in reasons) >= 10, part
    # Both settings varied: several replica counts, a weight of 0 and several above it, in spread cases.
    spread = [c["args"] for c in vectors["decisions"] if c["args"]["scoringStrategy"] == "spread"]
    replicas = {n for args in spread for n in args.get("sharedResources", {}).values()}
    weights = {args.get("interferenceWeight", 0.0) for args in spread}
    assert {1, 2, 4, 7} <= replicas
    assert 0.0 in weights and len(weights - {0.0}) >= 5
    # Pod counts from dcgm-exporter's pod labels, both names, and devices whose series carry none.
    labels = {label for case in vectors["prometheus"] for item in case["series"] for label in item["metric"]}
    assert {"pod", "exported_pod"} <= labels
    nodes = [node for case in vectors["prometheus"] for node in case["expect"]["nodes"]]
    pods = [device[3] for node in nodes for devices in node["devices"].values() for device in devices]
    assert None in pods and any(isinstance(n, int) and n > 1 for n in pods)
    assert any(not a["valid"] and "sharedResources" in a["args"] for a in vectors["args"])
    assert any(not a["valid"] and "interferenceWeight" in a["args"] for a in vectors["args"])
    # The metrics path: the CA-needs-https rule, and a token file with and without a CA.
    assert any(not a["valid"] and "prometheusCAFile" in a["args"] for a in vectors["args"])
    files = ("prometheusCAFile", "prometheusTokenFile")
    assert any(a["valid"] and all(a["args"].get(f) for f in files) for a in vectors["args"])


def test_arg_names_cover_the_settings_that_change_decisions():
    # A new setting of the extender must get a plugin argument (or a reason here why it does not).
    # FILTER_REASONS changes what the answer says, never what it decides. METRICS_SOURCE is GPUScore's too
    # (metricsSource: prometheus or push); its lab-only value file and METRICS_FILE are not.
    not_for_the_plugin = {"METRICS_FILE", "MAX_BODY_BYTES", "KUBE_API", "FILTER_REASONS"}
    # Every rule that changes a decision is GPUScore's too: no setting of the extender is left out of the vectors.
    assert set(conformance.ARG_NAMES) == set(conformance.Settings.model_fields) - not_for_the_plugin


def test_vectors_exercise_every_decision_setting():
    # Each argument of the plugin that changes a decision takes a value other than its default in some decision
    # case whose verdicts the Go plugin must match; for SHARED_MEM_FREE_MIN, verdicts refuse nodes for it.
    vectors = json.loads(VECTORS.read_text(encoding="utf-8"))
    used = {name for case in vectors["decisions"] for name in case["args"]}
    decision_args = {
        conformance.ARG_NAMES[s]
        for s in (
            "GPU_UTIL_THRESHOLD",
            "MEM_UTIL_THRESHOLD",
            "WEIGHT_GPU_UTIL",
            "WEIGHT_MEM_UTIL",
            "METRICS_MAX_AGE_SECONDS",
            "ON_MISSING_METRICS",
            "SCORING_STRATEGY",
            "PACK_TARGET_UTIL",
            "AUTO_PACK_BELOW",
            "AUTO_HYSTERESIS",
            "SHARED_RESOURCES",
            "INTERFERENCE_WEIGHT",
            "SHARED_MEM_FREE_MIN",
        )
    }
    assert decision_args <= used, decision_args - used
    reasons = [v[3] for c in vectors["decisions"] for v in c["expect"].values()]
    assert sum("short of memory" in reason for reason in reasons) >= 10


def test_scoring_adds_loads_left_to_right_on_every_python():
    # The builtin sum compensates rounding since Python 3.12; the vectors must not depend on the Python that wrote
    # them, so scoring.py never calls it and add_loads is the plain loop GPUScore runs.
    import ast
    import inspect

    from gpufleet_extender import scoring

    tree = ast.parse(inspect.getsource(scoring))
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) in {"sum", "fsum"}]
    assert not calls, [ast.unparse(c) for c in calls]
    assert scoring.add_loads([0.1] * 10) == 0.9999999999999999  # compensated: 1.0
    assert scoring.add_loads([1e16, 1.0, -1e16]) == 0.0  # compensated: 1.0
    assert scoring.add_loads([], 2.5) == 2.5
