"""gpufleet.mig.preflight_cluster_problems: what the Prometheus probe found, per reader, as the line an operator
reads (the probe itself: tests/unit/test_probe_prometheus.py; the role on the real control plane: test_site_apply)."""

from __future__ import annotations

import json

import pytest
from ansible_collections.gpufleet.mig.plugins.filter.preflight_cluster_problems import preflight_cluster_problems

READER = {
    "name": "the extender",
    "prefix": "gpu_extender",
    "url": "https://prometheus-operated.monitoring.svc:9090",
    "namespace": "gpufleet-system",
    "secret": "gpufleet-extender-prometheus",
    "ca_config_map": "prometheus-ca",
    "ca_key": "ca.crt",
    "exporter_job": "dcgm-exporter",
    "exporter_namespace": "",
    "secret_found": True,
    "ca_found": True,
    "token_given": False,
    "stderr": "",
}


def problems(reader: dict, url: str = "") -> list[str]:
    facts = {"reachable": True, "version": "v1.36.3", "min_version": "1.30", "max_version": "1.36"}
    return preflight_cluster_problems({**facts, "prometheus": [reader], "prometheus_url": url})


def found(kind: str, message: str = "what the probe said") -> str:
    return json.dumps({"ok": kind == "ok", "kind": kind, "message": message, "nodes": 0, "newest_age_seconds": None})


@pytest.mark.parametrize(
    ("kind", "says"),
    [
        ("unreachable", "did not answer the controller: what the probe said. If the controller cannot reach"),
        (
            "tls",
            "TLS failed: what the probe said. Its certificate must chain to the CA in ConfigMap "
            "gpufleet-system/prometheus-ca key ca.crt",
        ),
        (
            "credential",
            "refused the token in Secret gpufleet-system/gpufleet-extender-prometheus key "
            "prometheusAuthToken: what the probe said. Give the extender a token",
        ),
        ("answer", "did not answer as Prometheus' query API: what the probe said"),
        (
            "no_series",
            "what the probe said, though dcgm-exporter runs: check that Prometheus scrapes it (job "
            "dcgm-exporter, namespace any)",
        ),
    ],
)
def test_each_finding_is_one_line_naming_the_reader_and_the_fix(kind, says):
    (line,) = problems({**READER, "stdout": found(kind)})
    assert line.startswith("Prometheus at https://prometheus-operated.monitoring.svc:9090 (the extender)"), line
    assert says in line, line


def test_an_answer_is_no_problem_and_the_override_url_is_the_one_named():
    assert problems({**READER, "stdout": found("ok")}) == []
    (line,) = problems({**READER, "stdout": found("unreachable")}, url="https://127.0.0.1:9090")
    assert line.startswith("Prometheus at https://127.0.0.1:9090 (the extender)")


def test_a_token_given_in_a_variable_is_named_as_such():
    (line,) = problems({**READER, "token_given": True, "secret_found": False, "stdout": found("credential")})
    assert "refused the token in gpu_extender_prometheus_token" in line


def test_a_missing_ca_config_map_is_named_and_nothing_probed():
    (line,) = problems({**READER, "ca_found": False, "stdout": ""})
    assert line == (
        "ConfigMap gpufleet-system/prometheus-ca (gpu_extender_prometheus_ca_configmap) is missing: create it with key "
        "ca.crt holding the CA that issued Prometheus' certificate"
    )


def test_a_missing_secret_is_left_to_the_secrets_line():
    assert problems({**READER, "secret_found": False, "stdout": ""}) == []


def test_a_probe_that_did_not_run_says_what_it_said():
    (line,) = problems({**READER, "stdout": "", "stderr": "Traceback...\nNo module named gpufleet_extender"})
    assert line == (
        "Prometheus could not be probed for the extender: gpufleet-extender probe-prometheus said No module named "
        "gpufleet_extender (install the collection's extender package on the controller, docs/controller.md)"
    )
