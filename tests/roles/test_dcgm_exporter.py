"""The dcgm_exporter role: strict validation for both inventories, the counters CSV, the ServiceMonitor or the
scrape config snippet, the apply path's arguments (check mode against a closed port), and the recorded form's rules
taken away."""

from __future__ import annotations

import hashlib
import sys

import pytest
import yaml
from conftest import closed_port_kubeconfig, load_manifests, validate_manifests
from gpufleet_testsupport.collection import render_roles, run_playbook, try_render

PROFILING = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"


def objects_of(documents: dict[str, list[dict]]) -> dict[tuple[str, str], dict]:
    return {(d["kind"], d["metadata"]["name"]): d for docs in documents.values() for d in docs}


def counters(config_map: dict) -> dict[str, str]:
    """field -> Prometheus type from the counters CSV (comments skipped)."""
    rows = [line.split(",") for line in config_map["data"]["gpufleet-counters.csv"].splitlines()]
    rows = [row for row in rows if row[0].strip() and not row[0].startswith("#")]
    assert all(len(row) == 3 for row in rows), rows
    return {row[0].strip(): row[1].strip() for row in rows}


@pytest.mark.parametrize("inventory", ["inventories/hongkong+lab", "inventories/hongkong"])
def test_renders_valid_exporter_with_profiling_counters_and_service_monitor(tmp_path, inventory):
    manifests = render_roles(
        ["gpufleet.mig.dcgm_exporter"], tmp_path, inventory, {"dcgm_exporter_service_monitor": "auto"}
    )
    # Namespace, ConfigMap, DaemonSet, Service, NetworkPolicy (ServiceMonitor is a CRD)
    assert validate_manifests(manifests) == 5
    documents = load_manifests(manifests)
    objects = objects_of(documents)
    # Only the named Prometheus reaches the exporters, on the metrics port (tests/netpol.py evaluates it).
    policy = objects[("NetworkPolicy", "dcgm-exporter")]["spec"]
    assert policy["podSelector"]["matchLabels"]["app.kubernetes.io/name"] == "dcgm-exporter"
    assert policy["ingress"] == [
        {
            "ports": [{"port": "metrics", "protocol": "TCP"}],
            "from": [
                {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
                    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
                }
            ],
        }
    ]

    config_map = objects[("ConfigMap", "dcgm-exporter-counters")]
    fields = counters(config_map)
    for field in (
        PROFILING,
        "DCGM_FI_PROF_SM_ACTIVE",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_GPU_UTIL",
    ):
        assert fields[field] == "gauge"
    assert set(fields.values()) <= {"gauge", "counter"}

    daemonset = objects[("DaemonSet", "dcgm-exporter")]
    pod = daemonset["spec"]["template"]
    container = pod["spec"]["containers"][0]
    assert container["args"] == ["-f", "/etc/dcgm-exporter/gpufleet-counters.csv"]
    assert "SYS_ADMIN" in container["securityContext"]["capabilities"]["add"]  # profiling fields need it
    assert {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in container["env"]
    assert pod["spec"]["nodeSelector"] == {"gpufleet.io/gpu-node": "true"}
    assert {"key": "gpufleet.io/tenant", "operator": "Exists"} in pod["spec"]["tolerations"]
    csv_text = config_map["data"]["gpufleet-counters.csv"]
    assert pod["metadata"]["annotations"]["gpufleet.io/config-hash"] == hashlib.sha256(csv_text.encode()).hexdigest()

    service = objects[("Service", "dcgm-exporter")]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()

    # The ServiceMonitor finds the Service and its port by name.
    monitor = objects[("ServiceMonitor", "dcgm-exporter")]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [service["metadata"]["namespace"]]
    ports = {port["name"] for port in service["spec"]["ports"]}
    assert [endpoint["port"] for endpoint in monitor["spec"]["endpoints"]] == ["metrics"] and "metrics" in ports
    assert not (manifests / "dcgm_exporter" / "prometheus-scrape-config.yaml.snippet").exists()


def test_without_service_monitor_a_scrape_config_snippet_is_written(tmp_path):
    extra = {"dcgm_exporter_service_monitor": "never", "dcgm_exporter_scrape_interval": "30s"}
    manifests = render_roles(["gpufleet.mig.dcgm_exporter"], tmp_path, extra_vars=extra)
    objects = objects_of(load_manifests(manifests))
    assert ("ServiceMonitor", "dcgm-exporter") not in objects
    (job,) = yaml.safe_load((manifests / "dcgm_exporter" / "prometheus-scrape-config.yaml.snippet").read_text())
    assert job["scrape_interval"] == "30s"
    assert job["kubernetes_sd_configs"] == [{"role": "pod", "namespaces": {"names": ["gpufleet-node-agents"]}}]
    # Every `keep` on a pod label must match the exporter pods' labels, or Prometheus would drop them all.
    pod_labels = objects[("DaemonSet", "dcgm-exporter")]["spec"]["template"]["metadata"]["labels"]
    sanitized = {key.replace(".", "_").replace("/", "_").replace("-", "_"): value for key, value in pod_labels.items()}
    keeps = [rule for rule in job["relabel_configs"] if rule["action"] == "keep"]
    label_keeps = {
        rule["source_labels"][0].removeprefix("__meta_kubernetes_pod_label_"): rule["regex"].replace("\\", "")
        for rule in keeps
        if rule["source_labels"][0].startswith("__meta_kubernetes_pod_label_")
    }
    assert label_keeps == sanitized
    assert {
        "source_labels": ["__meta_kubernetes_pod_container_port_name"],
        "regex": "metrics",
        "action": "keep",
    } in keeps
    assert any(rule.get("target_label") == "node" for rule in job["relabel_configs"])


def test_a_counter_list_without_the_profiling_field_is_refused(tmp_path):
    counters = [{"field": "DCGM_FI_DEV_GPU_UTIL", "type": "gauge", "help": "util"}]
    result, manifests = try_render(["dcgm_exporter"], tmp_path, extra_vars={"dcgm_exporter_counters": counters})
    assert result.returncode != 0
    output = " ".join(result.stdout.split())
    assert f"dcgm_exporter_counters lacks {PROFILING}, DCGM_FI_DEV_FB_USED, DCGM_FI_DEV_FB_FREE" in output
    assert not (manifests / "dcgm_exporter").exists()


def test_an_image_digest_pins_the_exporter_and_a_bad_one_is_refused(tmp_path):
    tag = "nvcr.io/nvidia/k8s/dcgm-exporter:4.2.3-4.1.3-ubuntu22.04"
    digest = "sha256:" + "fedcba9876543210" * 4
    for run, value, image in (("tag", None, tag), ("pinned", digest, f"{tag}@{digest}")):
        manifests = render_roles(["dcgm_exporter"], tmp_path / run, extra_vars={"dcgm_exporter_image_digest": value})
        daemonset = objects_of(load_manifests(manifests))[("DaemonSet", "dcgm-exporter")]
        assert daemonset["spec"]["template"]["spec"]["containers"][0]["image"] == image

    for bad in ("sha256:" + "FEDCBA9876543210" * 4, "md5:" + "ab" * 16, digest + "0"):
        extra = {"dcgm_exporter_image_digest": bad}
        result, manifests = try_render(["dcgm_exporter"], tmp_path / "bad", extra_vars=extra)
        assert result.returncode != 0
        output = " ".join(result.stdout.split())
        assert "dcgm_exporter_image_digest must be sha256:<64 lower-case hex> or null" in output
        assert not (manifests / "dcgm_exporter").exists()


def test_apply_mode_reaches_for_the_api_with_valid_arguments(tmp_path):
    """Check mode against a closed 127.0.0.1 port: the apply task gets past argument validation and fails connecting."""
    kubeconfig = closed_port_kubeconfig(tmp_path)
    playbook = tmp_path / "apply.yml"
    play = {"hosts": "localhost", "gather_facts": False, "check_mode": True, "roles": ["dcgm_exporter"]}
    playbook.write_text(yaml.safe_dump([play]))
    extra = {
        "gpufleet_k8s_mode": "apply",
        "gpufleet_kubeconfig": kubeconfig,
        "gpufleet_manifests_dir": str(tmp_path / "out"),
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
    }
    result = run_playbook(str(playbook), "inventories/hongkong+lab", extra, tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "Apply the objects with server-side apply (namespaces/gpufleet-node-agents)" in output
    assert "Connection refused" in output or "Failed to get client" in output or "MaxRetryError" in output
    assert "Unsupported parameters" not in output and "missing required arguments" not in output


def test_no_recording_rules_and_those_an_earlier_release_rendered_are_taken_away(tmp_path):
    # The recorded form is gone: its PrometheusRule manifest and rules file, left in the manifest directory by an
    # earlier render (a GitOps tool would keep applying them), are removed; nothing of the kind is rendered again.
    old = tmp_path / "manifests" / "dcgm_exporter"
    old.mkdir(parents=True)
    for name in ("recording-rules.yaml", "recording-rules.yaml.snippet"):
        (old / name).write_text("kind: PrometheusRule\n")
    manifests = render_roles(["gpufleet.mig.dcgm_exporter"], tmp_path)
    kinds = {kind for kind, _name in objects_of(load_manifests(manifests))}
    assert "PrometheusRule" not in kinds and "DaemonSet" in kinds
    assert not (old / "recording-rules.yaml").exists() and not (old / "recording-rules.yaml.snippet").exists()
