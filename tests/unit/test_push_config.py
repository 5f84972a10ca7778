"""The Prometheus side of the push form (gpufleet_extender.push_config, `gpufleet-extender remote-write-config`):
accepted by Prometheus' own checker, one queue per receiver, and keeping exactly what a decision reads."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml
from gpufleet_extender.metrics_source import DECISION_LABELS
from gpufleet_extender.push_config import kept_labels, write_relabel_configs
from gpufleet_extender.snapshot import DCGM_METRICS
from gpufleet_testsupport.collection import require_tool

URLS = ("https://gpufleet-extender-0.rw.gpufleet-system.svc:9402/api/v1/write", "https://10.0.0.5:9402/api/v1/write")


def _cli(*args: str) -> dict:
    result = subprocess.run(
        [sys.executable, "-m", "gpufleet_extender", "remote-write-config", *args],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def test_prometheus_accepts_the_plain_configuration(tmp_path):
    promtool = require_tool("promtool", "prometheus", override="GPUFLEET_PROMTOOL_BINARY")
    (tmp_path / "token").write_text("secret\n")
    (tmp_path / "ca.crt").write_text("")
    args = [f"--url={url}" for url in URLS]
    args += [f"--token-file={tmp_path / 'token'}", f"--ca-file={tmp_path / 'ca.crt'}", "--exporter-job=dcgm-exporter"]
    config = {"global": {"scrape_interval": "15s"}, **_cli(*args, "--exporter-namespace=gpufleet-node-agents")}
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    result = subprocess.run([promtool, "check", "config", str(path)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    entries = config["remote_write"]
    # Every receiver gets the whole stream: one queue each, with distinct names.
    assert [entry["url"] for entry in entries] == list(URLS)
    assert len({entry["name"] for entry in entries}) == len(URLS)
    assert all(entry["authorization"]["credentials_file"] == str(tmp_path / "token") for entry in entries)


def test_what_is_sent_is_what_a_decision_reads():
    rules = write_relabel_configs(["Hostname", "hostname"], job="dcgm-exporter", namespace="gpufleet-node-agents")
    keep_metrics, keep_job, keep_namespace, keep_labels = rules
    assert keep_metrics["regex"].split("|") == list(DCGM_METRICS)
    assert (keep_job["source_labels"], keep_job["regex"]) == (["job"], r"dcgm\-exporter")
    assert (keep_namespace["source_labels"], keep_namespace["regex"]) == (["namespace"], r"gpufleet\-node\-agents")
    assert keep_labels["action"] == "labelkeep"
    kept = keep_labels["regex"].split("|")
    assert {"__name__", "Hostname", "hostname", *DECISION_LABELS} <= set(kept)
    # Nothing the exporter adds that no decision reads (its PCI bus, model, driver version).
    assert not {"pci_bus_id", "modelName", "DCGM_FI_DRIVER_VERSION", "device"} & set(kept)


@pytest.mark.parametrize("node_labels", [["node"], ["Hostname", "hostname"], ["kubernetes.io/hostname"]])
def test_host_labels_are_kept_in_order_once(node_labels):
    kept = kept_labels(node_labels)
    assert kept[: len(node_labels) + 1] == ["__name__", *node_labels]
    assert len(kept) == len(set(kept))


def test_unpinned_exporter_sends_every_job():
    rules = write_relabel_configs(["Hostname"])
    assert [rule["action"] for rule in rules] == ["keep", "labelkeep"]


def test_operator_entries_name_the_secret_and_the_config_map():
    document = _cli(
        "--operator", f"--url={URLS[0]}", "--token-secret=gpufleet-remote-write/token", "--ca-config-map=gpufleet-ca/ca"
    )
    (entry,) = document["remoteWrite"]
    assert entry["authorization"] == {
        "type": "Bearer",
        "credentials": {"name": "gpufleet-remote-write", "key": "token"},
    }
    assert entry["tlsConfig"] == {"ca": {"configMap": {"name": "gpufleet-ca", "key": "ca"}}}
    assert entry["writeRelabelConfigs"][0]["sourceLabels"] == ["__name__"]


def test_a_secret_without_a_key_is_refused_in_one_line():
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpufleet_extender",
            "remote-write-config",
            "--operator",
            f"--url={URLS[0]}",
            "--token-secret=gpufleet-remote-write",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode != 0
    assert result.stderr.strip() == "gpufleet-extender: --token-secret takes <name>/<key>, got 'gpufleet-remote-write'"
