"""The fleet's alert rules (roles/monitoring/files/gpufleet-alerts.rules.yml) under the real promtool.

`promtool test rules` runs the cases in tests/unit/monitoring/gpufleet-alerts.test.yml; the checks here make
sure every alert has a case that fires it and one that keeps it silent on the series it reads, and a runbook
section in docs/monitoring.md. promtool comes with Debian's prometheus package (tests/setup-system.sh): without
it these tests skip, unless CI or GPUFLEET_REQUIRE_PROMETHEUS=1 makes its absence a failure.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from gpufleet_testsupport.collection import require_tool

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "roles" / "monitoring" / "files" / "gpufleet-alerts.rules.yml"
CASES = REPO / "tests" / "unit" / "monitoring" / "gpufleet-alerts.test.yml"
RUNBOOK = REPO / "docs" / "monitoring.md"
METRIC = re.compile(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?:\{|\[|\)|\s|$)")


def _alerts() -> dict[str, dict]:
    groups = yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]
    return {rule["alert"]: rule for group in groups for rule in group["rules"] if "alert" in rule}


def _metrics_read(expr: str) -> set[str]:
    """Metric names an expression selects (the exporters' names all have an underscore; PromQL's functions,
    keywords and label names inside braces are not picked up)."""
    without_matchers = re.sub(r"\{[^}]*\}", "{}", expr)
    without_groupings = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", without_matchers)
    return {name for name in METRIC.findall(without_groupings) if "_" in name and not name.startswith("group_")}


@pytest.fixture(scope="module")
def promtool() -> str:
    return require_tool("promtool", "prometheus", override="GPUFLEET_PROMTOOL_BINARY")


def test_rules_file_passes_promtool_check(promtool):
    result = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(_alerts())} rules found" in result.stdout


def test_promtool_cases_fire_and_stay_silent(promtool):
    result = subprocess.run(
        [promtool, "test", "rules", CASES.name], cwd=CASES.parent, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_has_a_firing_case_and_a_silent_case_on_its_own_series():
    cases = yaml.safe_load(CASES.read_text(encoding="utf-8"))
    assert cases["rule_files"] == [os.path.relpath(RULES, CASES.parent)]
    alerts = _alerts()
    fired: set[str] = set()
    silent: set[str] = set()
    for case in cases["tests"]:
        series = {re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", s["series"]).group(0) for s in case["input_series"]}
        for check in case["alert_rule_test"]:
            alert = alerts.get(check["alertname"])
            assert alert is not None, f"{case['name']}: no alert named {check['alertname']}"
            if check["exp_alerts"]:
                fired.add(check["alertname"])
            elif _metrics_read(alert["expr"]) <= series:
                silent.add(check["alertname"])  # silent while the series it reads are there, not for lack of them
    assert set(alerts) - fired == set(), "alerts no case fires"
    assert set(alerts) - silent == set(), "alerts no case keeps silent with their series present"


def test_every_alert_has_a_severity_and_a_runbook_section():
    headings = {
        line[4:].strip() for line in RUNBOOK.read_text(encoding="utf-8").splitlines() if line.startswith("### ")
    }
    for name, alert in _alerts().items():
        assert alert["labels"]["severity"] in {"critical", "warning", "info"}, name
        assert alert["annotations"]["runbook_url"] == f"docs/monitoring.md#{name.lower()}", name
        assert name in headings, f"docs/monitoring.md has no '### {name}' runbook section"
        assert alert["annotations"]["summary"] and alert["annotations"]["description"], name


def test_metric_names_are_read_from_expressions():
    assert _metrics_read(
        'sum by (job, instance) (rate(rest_client_requests_total{job=~".*scheduler.*", code=~"5..|<error>"}[5m]))'
    ) == {"rest_client_requests_total"}
    assert _metrics_read(
        "gpufleet_mig_layout_check_success == 0 or time() - gpufleet_mig_layout_check_timestamp_seconds > 3600"
    ) == {
        "gpufleet_mig_layout_check_success",
        "gpufleet_mig_layout_check_timestamp_seconds",
    }
