"""The monitoring role: the PrometheusRule and the dashboard's ConfigMap rendered with the other manifests, the
plain rules file and dashboard JSON beside them, one dashboard per fleet, and a bad fleet name refused."""

from __future__ import annotations

import json

import yaml
from conftest import REPO, load_manifests, validate_manifests
from gpufleet_testsupport.collection import render_roles, try_render

FILES = REPO / "roles" / "monitoring" / "files"
RULES = yaml.safe_load((FILES / "gpufleet-alerts.rules.yml").read_text())
DASHBOARD = json.loads((FILES / "gpufleet-fleet-dashboard.json").read_text())


def _objects(manifests):
    return {(d["kind"], d["metadata"]["name"]): d for docs in load_manifests(manifests).values() for d in docs}


def test_lab_renders_the_rules_and_the_fleets_dashboard_as_objects_and_as_plain_files(tmp_path):
    manifests = render_roles(["gpufleet.mig.monitoring"], tmp_path)
    assert validate_manifests(manifests) == 2  # Namespace, ConfigMap (the PrometheusRule is a CRD)
    objects = _objects(manifests)

    rule = objects[("PrometheusRule", "gpufleet-alerts")]
    assert rule["apiVersion"] == "monitoring.coreos.com/v1" and rule["metadata"]["namespace"] == "gpufleet-system"
    assert rule["spec"] == RULES  # the annotations' {{ $labels... }} reach Prometheus untouched by Jinja

    # The fleet's name is its inventory directory's: the lab runs Hong Kong's inventory as it is.
    config_map = objects[("ConfigMap", "gpufleet-dashboard-hongkong")]
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(config_map["data"]["gpufleet-hongkong.json"])
    assert (dashboard["title"], dashboard["uid"]) == ("gpufleet - hongkong", "gpufleet-hongkong")
    assert dashboard["panels"] == DASHBOARD["panels"] and dashboard["templating"] == DASHBOARD["templating"]

    plain = tmp_path / "monitoring"  # beside the manifests directory, where kubectl apply -R never reads
    assert yaml.safe_load((plain / "gpufleet-alerts.rules.yml").read_text()) == RULES
    assert json.loads((plain / "gpufleet-fleet-dashboard.json").read_text()) == dashboard


def test_one_dashboard_per_fleet_and_no_prometheus_rule_when_switched_off(tmp_path):
    extra = {"monitoring_prometheus_rule": "never", "monitoring_prometheus_rule_labels": {"release": "kps"}}
    manifests = render_roles(["gpufleet.mig.monitoring"], tmp_path, "inventories/hongkong", extra)
    objects = _objects(manifests)
    assert not any(kind == "PrometheusRule" for kind, _name in objects)
    dashboard = json.loads(objects[("ConfigMap", "gpufleet-dashboard-hongkong")]["data"]["gpufleet-hongkong.json"])
    assert dashboard["uid"] == "gpufleet-hongkong"
    assert yaml.safe_load((tmp_path / "monitoring" / "gpufleet-alerts.rules.yml").read_text()) == RULES


def test_a_fleet_name_that_cannot_make_a_dashboard_uid_is_refused_and_nothing_is_written(tmp_path):
    result, manifests = try_render(["gpufleet.mig.monitoring"], tmp_path, extra_vars={"monitoring_fleet_name": "HK 1"})
    assert result.returncode != 0
    output = " ".join(result.stdout.split())
    assert "monitoring_fleet_name must be lower-case letters, digits and dashes" in output and '"HK 1"' in output
    assert "Traceback" not in result.stdout + result.stderr
    assert not manifests.exists() and not (tmp_path / "monitoring").exists()
