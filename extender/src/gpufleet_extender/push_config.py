"""The Prometheus side of the push form (METRICS_SOURCE=push): the remote-write configuration that sends the
receivers the dcgm series a decision reads, and nothing else.

What is sent is decided here once, from the same names the pull form queries (snapshot.DCGM_METRICS,
metrics_source.DECISION_LABELS and exporter_matchers' job and namespace): Prometheus keeps only those series
(``write_relabel_configs``: the four metrics of the exporter's job and namespace) and only the labels a decision
reads, so a receiver decodes a few labels per sample instead of the exporter's twenty. Printed by
`gpufleet-extender remote-write-config` for a plain Prometheus (a ``remote_write`` list) or for the Prometheus
Operator (entries of the Prometheus resource's ``spec.remoteWrite``); the dcgm_exporter role writes both.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from gpufleet_extender.metrics_source import DECISION_LABELS
from gpufleet_extender.snapshot import DCGM_METRICS

# Labels that tell series of different targets apart and carry the exporter's pinning: kept with the decision's.
TARGET_LABELS = ("job", "namespace", "instance", "container", "exported_container")


@dataclass(frozen=True)
class PushTarget:
    """One receiver: its URL and how Prometheus authenticates it and itself to it."""

    url: str
    token_file: str = ""  # plain Prometheus: the file holding the bearer token
    ca_file: str = ""  # plain Prometheus: the CA the receiver's certificate chains to


def kept_labels(node_labels: Iterable[str]) -> list[str]:
    """Every label a receiver reads, in a stable order: __name__, the host labels, the decision's, the target's."""
    seen: dict[str, None] = {"__name__": None}
    for label in (*node_labels, *DECISION_LABELS, *TARGET_LABELS):
        seen.setdefault(label, None)
    return list(seen)


def _anchored(values: Sequence[str]) -> str:
    # Prometheus anchors relabel regexes itself; escape the names so that a '.' is only a dot.
    return "|".join(re.escape(value) for value in values)


def write_relabel_configs(node_labels: Iterable[str], job: str = "", namespace: str = "") -> list[dict[str, Any]]:
    """Prometheus' relabelling of what it sends (snake_case, as prometheus.yml writes it)."""
    rules: list[dict[str, Any]] = [
        {"source_labels": ["__name__"], "regex": _anchored(DCGM_METRICS), "action": "keep"},
    ]
    for label, value in (("job", job), ("namespace", namespace)):
        if value:
            rules.append({"source_labels": [label], "regex": re.escape(value), "action": "keep"})
    rules.append({"regex": _anchored(kept_labels(node_labels)), "action": "labelkeep"})
    return rules


def _camel(rule: dict[str, Any]) -> dict[str, Any]:
    names = {"source_labels": "sourceLabels", "target_label": "targetLabel"}
    return {names.get(key, key): value for key, value in rule.items()}


def remote_write(
    targets: Sequence[PushTarget],
    node_labels: Iterable[str],
    job: str = "",
    namespace: str = "",
    batch_send_deadline: str = "1s",
) -> list[dict[str, Any]]:
    """A plain Prometheus' ``remote_write`` list: one entry per receiver (each receiver needs the whole stream)."""
    relabel = write_relabel_configs(node_labels, job, namespace)
    entries = []
    for target in targets:
        entry: dict[str, Any] = {
            "url": target.url,
            "name": _entry_name(target.url),
            "remote_timeout": "10s",
            "write_relabel_configs": copy.deepcopy(relabel),
            # The receivers read samples only: no metadata, no exemplars.
            "metadata_config": {"send": False},
            "send_exemplars": False,
            "queue_config": {"batch_send_deadline": batch_send_deadline},
        }
        if target.token_file:
            entry["authorization"] = {"type": "Bearer", "credentials_file": target.token_file}
        if target.ca_file:
            entry["tls_config"] = {"ca_file": target.ca_file}
        entries.append(entry)
    return entries


def operator_remote_write(
    urls: Sequence[str],
    node_labels: Iterable[str],
    job: str = "",
    namespace: str = "",
    token_secret: tuple[str, str] | None = None,
    ca_config_map: tuple[str, str] | None = None,
    batch_send_deadline: str = "1s",
) -> list[dict[str, Any]]:
    """The same entries for the Prometheus Operator's ``Prometheus.spec.remoteWrite`` (camelCase, credentials from a
    Secret key and the CA from a ConfigMap key in Prometheus' namespace)."""
    relabel = [_camel(rule) for rule in write_relabel_configs(node_labels, job, namespace)]
    entries = []
    for url in urls:
        entry: dict[str, Any] = {
            "url": url,
            "name": _entry_name(url),
            "remoteTimeout": "10s",
            "writeRelabelConfigs": copy.deepcopy(relabel),
            "metadataConfig": {"send": False},
            "sendExemplars": False,
            "queueConfig": {"batchSendDeadline": batch_send_deadline},
        }
        if token_secret:
            entry["authorization"] = {
                "type": "Bearer",
                "credentials": {"name": token_secret[0], "key": token_secret[1]},
            }
        if ca_config_map:
            entry["tlsConfig"] = {"ca": {"configMap": {"name": ca_config_map[0], "key": ca_config_map[1]}}}
        entries.append(entry)
    return entries


def _entry_name(url: str) -> str:
    # Prometheus names each queue (its prometheus_remote_storage_* series carry it): the receiver's host and port.
    host = re.sub(r"^[a-z]+://", "", url).split("/", 1)[0]
    return "gpufleet-" + re.sub(r"[^A-Za-z0-9_.-]", "-", host)
