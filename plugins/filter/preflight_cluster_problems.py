"""gpufleet.mig.preflight_cluster_problems: what keeps a cluster from taking site.yml, one line per problem."""

from __future__ import annotations

import json
import re

from ansible.errors import AnsibleFilterError
from ansible_collections.gpufleet.mig.plugins.module_utils import host_gpus
from ansible_collections.gpufleet.mig.plugins.module_utils.exceptions import MigError

DOCUMENTATION = r"""
name: preflight_cluster_problems
short_description: One line per problem that keeps the cluster from taking site.yml
description:
  - Judges what the C(gpufleet.mig.preflight) role read from the cluster (its C(cluster.yml) tasks, apply mode) - the
    Kubernetes version against the supported range, every GPU host as a Node under the name the roles use, the
    Secrets the roles mount but do not create, C(helm) for the DRA mode, the images the fleet builds itself
    coming from a registry, and what C(gpufleet-extender probe-prometheus) found as each reader of Prometheus.
  - An empty list means the cluster is ready.
options:
  _input:
    description:
      - C(reachable), C(error), C(version) (C(v1.36.3)), C(min_version), C(max_version) (C(1.30)), C(gpu_hosts),
        C(hostvars) (a host's Node is its C(gpufleet_node_name), else its inventory name), C(nodes) and C(secrets)
        (names found), C(namespace), C(needed_secrets) ({name, var, fix}), C(helm) (bool), C(images) ({var, image}),
        C(prometheus) (one reader each - C(name), C(prefix), C(url), C(namespace), C(secret), C(ca_config_map),
        C(ca_key), C(exporter_job), C(exporter_namespace), C(query), C(secret_found), C(ca_found), and the probe's
        C(stdout) and C(stderr)), C(prometheus_url) (C(preflight_prometheus_url), '' for each reader's own).
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Judge the cluster
  ansible.builtin.set_fact:
    problems: "{{ facts | gpufleet.mig.preflight_cluster_problems }}"
"""

RETURN = r"""
_value:
  description: The problems, each naming what is missing and how to fix it.
  type: list
  elements: str
"""


def _minor(version: str) -> tuple[int, int] | None:
    match = re.match(r"v?(\d+)\.(\d+)", str(version))
    return (int(match.group(1)), int(match.group(2))) if match else None


def _registry(image: str) -> bool:
    """Whether an image reference names a registry (its first path part has a dot or a port, or is localhost)."""
    first = str(image).split("/", 1)[0] if "/" in str(image) else ""
    return bool(first) and ("." in first or ":" in first or first == "localhost")


def preflight_cluster_problems(facts) -> list[str]:
    if not isinstance(facts, dict):
        raise AnsibleFilterError("preflight_cluster_problems: expected the facts the preflight role gathered")
    if not facts.get("reachable"):
        return [
            f"the cluster did not answer ({facts.get('error') or 'no answer'}): check gpufleet_kubeconfig (or "
            "~/.kube/config) on the controller"
        ]
    problems: list[str] = []
    found, low, high = _minor(facts["version"]), _minor(facts["min_version"]), _minor(facts["max_version"])
    if found is None or (low and found < low) or (high and found > high):
        problems.append(
            f"Kubernetes {facts['version']} is outside the supported range {facts['min_version']} to "
            f"{facts['max_version']}: upgrade the cluster (the admission policies need {facts['min_version']}), or "
            "raise preflight_kubernetes_max_version at your own risk"
        )
    nodes = set(facts.get("nodes") or [])
    hostvars = facts.get("hostvars") or {}
    for host in facts.get("gpu_hosts") or []:
        try:
            node = host_gpus.node_name(host, hostvars[host])
        except MigError as err:
            problems.append(str(err))
            continue
        if node not in nodes:
            problems.append(
                f"GPU host {host}: no Node named {node} in the cluster (kubectl get nodes): join it, or set "
                "gpufleet_node_name for the host to its Node's name"
            )
    secrets = set(facts.get("secrets") or [])
    for needed in facts.get("needed_secrets") or []:
        if needed["name"] not in secrets:
            problems.append(
                f"Secret {facts['namespace']}/{needed['name']} ({needed['var']}) is missing: {needed['fix']}"
            )
    if not facts.get("helm", True):
        problems.append(
            "helm is not on the controller's PATH: the DRA mode installs NVIDIA's DRA driver chart with it "
            "(install helm 3 on the controller)"
        )
    for image in facts.get("images") or []:
        if not _registry(image["image"]):
            problems.append(
                f"{image['var']} is {image['image']}, an image name without a registry the nodes can pull from: "
                f"push the image `make images` builds to your registry and set {image['var']} to it"
            )
    for reader in facts.get("prometheus") or []:
        problems.extend(_prometheus_problems(reader, facts.get("prometheus_url") or ""))
    return problems


def _prometheus_problems(reader: dict, url_override: str) -> list[str]:
    """What the probe of one reader found, in a line that says how to fix it ([] when Prometheus answered)."""
    name, prefix, namespace = reader["name"], reader["prefix"], reader["namespace"]
    url = url_override or reader["url"]
    if not reader.get("ca_found"):
        return [
            f"ConfigMap {namespace}/{reader['ca_config_map']} ({prefix}_prometheus_ca_configmap) is missing: create it "
            f"with key {reader['ca_key']} holding the CA that issued Prometheus' certificate"
        ]
    if not reader.get("secret_found") and not reader.get("token_given"):
        return []  # said once among the Secrets the roles mount
    try:
        found = json.loads(reader.get("stdout") or "")
        kind, message = found["kind"], found["message"]
    except (ValueError, KeyError, TypeError):
        said = (reader.get("stderr") or "no output").strip().splitlines()
        return [
            f"Prometheus could not be probed for {name}: gpufleet-extender probe-prometheus said "
            f"{said[-1] if said else 'nothing'} (install the collection's extender package on the controller, "
            "docs/controller.md)"
        ]
    where = f"Prometheus at {url} ({name})"
    token = (
        f"the token in {prefix}_prometheus_token"
        if reader.get("token_given")
        else f"the token in Secret {namespace}/{reader['secret']} key prometheusAuthToken"
    )
    fixes = {
        "ok": "",
        "unreachable": (
            f"{where} did not answer the controller: {message}. If the controller cannot reach the cluster's Service "
            "names, give an address it reaches with preflight_prometheus_url (for example a kubectl port-forward) and "
            "the name in Prometheus' certificate with preflight_prometheus_server_name, or set "
            "preflight_prometheus_probe: false"
        ),
        "tls": (
            f"{where}: TLS failed: {message}. Its certificate must chain to the CA in ConfigMap "
            f"{namespace}/{reader['ca_config_map']} key {reader['ca_key']} and hold the URL's host name (or "
            "preflight_prometheus_server_name)"
        ),
        "credential": f"{where} refused {token}: {message}. Give {name} a token that may read Prometheus",
        "answer": f"{where} did not answer as Prometheus' query API: {message}",
        "no_series": (
            f"{where}: {message}, though dcgm-exporter runs: check that Prometheus scrapes it (job "
            f"{reader['exporter_job'] or 'any'}, namespace {reader['exporter_namespace'] or 'any'})"
        ),
    }
    line = fixes.get(kind, f"{where}: {message}")
    return [line] if line else []


class FilterModule:
    def filters(self):
        return {"preflight_cluster_problems": preflight_cluster_problems}
