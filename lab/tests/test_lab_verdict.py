"""make lab's closing block (gpufleet-lab verdict) on a lab directory laid out as make lab leaves it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

SUMMARY = """tenant llm (tenant_llm): 2 nodes - whole GPUs
  hk-gpu-01    8 x whole GPU
  hk-gpu-02    7 x whole GPU  (!) layout implies 8 x whole GPU
  pool total   15 x whole GPU
"""


def _lab(tmp_path: Path, cov_met: bool) -> Path:
    lab = tmp_path / "lab"
    (lab / "manifests" / "tenants").mkdir(parents=True)
    (lab / "manifests" / "tenants" / "quotas.yaml").write_text("kind: ResourceQuota\n")
    (lab / "fleet-summary.txt").write_text(SUMMARY)
    mixed = {
        "fleet": {"replicas": 1},
        "trace": {"pods": 100},
        "policies": {
            "count": {"hot_placements": 0, "load_cov": 0.6, "held": 0},
            "load": {"hot_placements": 0, "load_cov": 0.2 if cov_met else 0.6, "held": 3},
        },
        "goals": [
            {"goal": "load makes zero hot placements", "passed": True, "detail": "0", "key": "load-hot"},
            {"goal": "load CoV <= 0.5 x count's", "passed": cov_met, "detail": "ratio", "key": "load-cov"},
        ],
    }
    quiet = {
        "trace": {"pods": 50, "scenario": "quiet-night"},
        "capacity": {
            "spread": {"free_gpus_mean": 10.0, "free_nodes_mean": 1.0},
            "auto": {"free_gpus_mean": 11.0, "free_nodes_mean": 2.0},
        },
        "goals": [{"goal": "auto hot placements <= spread's (peak-hour)", "passed": None, "detail": "-"}],
    }
    # The shared-device run: out-of-memory failures and slowdown in the time-sliced pool.
    figures = {"wait_p95_by_size": {"finnlp": {"1": 0.0}}, "mean_slowdown": {"finnlp": 0.2}}
    shared = {
        "fleet": {"replicas": 1, "sharing": {"finnlp:nvidia.com/mig-1g.10gb": 4}},
        "trace": {"pods": 80},
        "policies": {"count": {"held": 0}, "load": {"held": 5}},
        "pools": {
            "count": {**figures, "oom": {"finnlp": 20}, "p95_slowdown": {"finnlp": 0.8}},
            "load": {**figures, "oom": {"finnlp": 1}, "p95_slowdown": {"finnlp": 0.4}},
        },
    }
    tp = {"trace": {"pods": 60}}
    relayout = {
        "kind": "mig-relayout",
        "trace": {"pods": 40},
        "parameters": {"every_minutes": 10, "wait_bound_minutes": 20, "search_limit_gpus": 48},
        "pools": {
            "static": {"imagegen": {"pending_pod_minutes": 4000.0, "wait_p95_s": 900.0}},
            "relayout": {
                "imagegen": {
                    "pending_pod_minutes": 100.0,
                    "wait_p95_s": 0.0,
                    "relayouts": 7,
                    "destroyed": 12,
                    "created": 30,
                    "disturbed": 0,
                }
            },
        },
        "gpus_needed": {"static": {"imagegen": None}, "relayout": {"imagegen": 8}},
        "goals": [{"goal": "re-layout disturbs no running pod", "passed": True, "detail": "0 disturbed"}],
    }
    runs = (("sim", mixed), ("sim-quiet", quiet), ("sim-shared", shared), ("sim-tp", tp), ("sim-relayout", relayout))
    for run, document in runs:
        (lab / run).mkdir()
        (lab / run / "results.json").write_text(json.dumps(document))
    (lab / "sim" / "node_load.png").write_bytes(b"\x89PNG")
    return lab


def _verdict(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gpufleet_lab.cli", "verdict", *args],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
    )


def test_a_missed_goal_is_said_with_its_reason_and_passes_unless_enforced(tmp_path):
    lab = _lab(tmp_path, cov_met=False)
    run = _verdict(str(lab), "--reuse-relayout")
    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert "imagegen: pending pod-minutes 100 with a re-layout every 10 min vs 4,000 static" in out
    assert "imagegen 8 vs more than 48" in out and "met      re-layout disturbs no running pod: 0 disturbed" in out
    assert "tenant llm (tenant_llm): 2 nodes" in out and "pool total   15 x whole GPU" in out
    assert "hk-gpu-02    7 x whole GPU  (!) layout implies" in out and "hk-gpu-01" not in out  # only odd nodes
    assert "places like counting GPUs" in out and "2.0 whole nodes free against 1.0 spreading (x2.00)" in out
    # The gains lead, in the order a user feels them, before the limits, the fleet and the goals.
    gains = out.index("What the fleet gains")
    oom = out.index("finnlp, 1g.10gb time-sliced x4: 1 pod(s) failed with out-of-memory")
    relayout = out.index("100 pending pod-minutes against 4,000 with static layouts")
    assert gains < oom < relayout < out.index("whole nodes free against")
    assert "with re-layout against" not in out  # static needed more than the search tried: no GPUs figure claimed
    assert out.index("whole nodes free against") < out.index("Where load-awareness does not help") < out.index("Goals:")
    assert "p95 slowdown +40.0% against +80.0% (x0.50)" in out and "5 pod(s) waited" in out
    assert "docs/simulator.md#sensitivity" in out
    assert "NOT MET  load CoV <= 0.5 x count's" in out
    assert "docs/simulator.md#goals-and-what-the-model-says-about-them" in out
    assert "1 goal(s) not met" in out and "LAB_GOALS=enforce" in out
    assert "peak-hour" not in out  # not judged on these traces: not listed
    assert f"manifests   {lab}/manifests/ (1 files" in out and f"{lab}/sim/node_load.png" in out
    assert "issue" not in out.lower()
    enforced = _verdict(str(lab), "--enforce-goals", "--reuse-relayout")
    assert enforced.returncode == 1 and "make lab fails" in enforced.stdout


def test_all_goals_met_and_a_missing_step(tmp_path):
    lab = _lab(tmp_path, cov_met=True)
    run = _verdict(str(lab), "--enforce-goals", "--reuse-relayout")
    assert run.returncode == 0 and "every goal judged on these traces is met" in run.stdout
    (lab / "sim-quiet" / "results.json").unlink()
    missing = _verdict(str(lab), "--reuse-relayout")
    assert missing.returncode == 2 and "sim-quiet/results.json is missing: the simulator step did not run" in (
        missing.stderr
    )


def test_the_alert_rules_and_the_dashboard_are_listed_with_their_counts(tmp_path):
    lab = _lab(tmp_path, cov_met=True)
    without = _verdict(str(lab), "--reuse-relayout")
    assert without.returncode == 0 and "monitoring" not in without.stdout  # the role did not run: no line
    (lab / "monitoring").mkdir()
    files = REPO / "roles" / "monitoring" / "files"
    for name in ("gpufleet-alerts.rules.yml", "gpufleet-fleet-dashboard.json"):
        (lab / "monitoring" / name).write_text((files / name).read_text())
    alerts = (files / "gpufleet-alerts.rules.yml").read_text().count("- alert: ")
    panels = [
        p for p in json.loads((files / "gpufleet-fleet-dashboard.json").read_text())["panels"] if p["type"] != "row"
    ]
    out = " ".join(_verdict(str(lab), "--reuse-relayout").stdout.split())
    assert f"monitoring {lab}/monitoring/gpufleet-alerts.rules.yml ({alerts} alert rules;" in out
    assert f"{lab}/monitoring/gpufleet-fleet-dashboard.json (Grafana, {len(panels)} panels;" in out
    assert alerts >= 14 and len(panels) >= 14
