#!/usr/bin/python
# Copyright: gpufleet maintainers
# Apache License 2.0 (see galaxy.yml)

from __future__ import annotations

DOCUMENTATION = r"""
module: mig_layout_advice
short_description: Propose per-GPU MIG layouts for a pool's demand, keeping every allocated instance
version_added: 0.1.0
description:
  - Given a pool's nodes (each node's C(gpufleet.mig.nvidia_gpu_info) GPUs and C(gpufleet.mig.kubelet_pod_resources)
    result) and the demand per MIG profile, proposes a new layout for each MIG-enabled GPU, and the
    C(gpufleet.mig.nvidia_mig) config per node that applies it.
  - In order of priority, the layouts (1) keep every allocated instance where it is - held by a container according
    to the kubelet, or running a process; (2) give the pool at least O(minimums) instances of each profile; (3) serve
    as much of the demand as fits, counted in compute slices, with free instances; (4) change the fewest instances
    (destroyed plus created). New instances are only of O(allowed_profiles).
  - The search is exact while the pool-wide count vectors it tracks stay within O(max_states); above that it is a
    bounded beam search, RV(exact) is false and RV(upper_bound_slices) bounds what any layout could serve.
  - GPUs with MIG disabled (or a mode change pending) are left out; the advice never changes a MIG mode.
  - Pure computation, nothing is read from or written to GPUs - run it on the controller.
author: gpufleet maintainers (@gpufleet)
options:
  nodes:
    description: The pool's nodes.
    type: list
    elements: dict
    required: true
    suboptions:
      name:
        description: Node name (inventory hostname).
        type: str
        required: true
      gpus:
        description: The node's C(gpus), as returned by C(gpufleet.mig.nvidia_gpu_info).
        type: list
        elements: dict
        required: true
      pod_resources:
        description:
          - The node's C(gpufleet.mig.kubelet_pod_resources) result (its C(allocated) list is used). Without it only
            instances running a process count as allocated.
        type: dict
  demand:
    description:
      - Instances wanted per MIG profile for pods that have none yet (pending pods, expected arrivals), for example
        C(3g.40gb) to V(4). Free instances that already exist serve it first.
    type: dict
    default: {}
  pending_pods:
    description:
      - Pending Pod objects (as C(kubernetes.core.k8s_info) returns them); their containers' C(nvidia.com/mig-<profile>)
        requests are added to O(demand).
    type: list
    elements: dict
    default: []
  prometheus:
    description:
      - Add recent usage read from Prometheus to the demand - per MIG profile, the most instances of the pool that
        were busy at once over O(prometheus.window) minus those busy now (instances recently used and free now, the
        demand recent usage predicts). Busy means dcgm-exporter's C(DCGM_FI_PROF_GR_ENGINE_ACTIVE) above
        O(prometheus.busy_above) on a series with a C(GPU_I_PROFILE) label, on the pool's hosts (label
        O(prometheus.host_label), by default either spelling dcgm-exporter uses). The query is in RV(usage_query).
    type: dict
    suboptions:
      url:
        description: Prometheus base URL, for example C(https://prometheus.monitoring:9090).
        type: str
        required: true
      window:
        description: How far back usage counts (a PromQL duration).
        type: str
        default: 1h
      step:
        description: Resolution of the look back (a PromQL duration).
        type: str
        default: 1m
      busy_above:
        description: Graphics engine activity above which an instance counts as busy.
        type: float
        default: 0.05
      hostnames:
        description: Values of the host label that belong to the pool. Default - the O(nodes) names.
        type: list
        elements: str
      host_label:
        description:
          - dcgm-exporter's label for the node. Default - C(Hostname) (released images) or C(hostname) (newer
            ones), whichever a series has.
        type: str
      timeout:
        description: Seconds to wait for Prometheus.
        type: int
        default: 10
      ca_file:
        description:
          - CA bundle (PEM, on the host running the module) that Prometheus' https certificate must chain to, such
            as the fleet's Prometheus CA. Default - the system's CAs.
        type: path
      token_file:
        description:
          - File holding a bearer token Prometheus requires (the one line of a ServiceAccount token, say); sent as
            C(Authorization - Bearer <token>) and never returned or logged.
        type: path
  demand_file:
    description:
      - YAML file (on the host running the module) with C(version v1) and any of C(demand), C(minimums) and
        C(allowed_profiles); its C(demand) is added to O(demand), its C(minimums) and C(allowed_profiles) are used
        when the options are not set.
    type: path
  minimums:
    description:
      - Instances of each profile the pool must keep in total (allocated or free), for example C(3g.40gb) to V(8).
    type: dict
  allowed_profiles:
    description: Profiles that may be created. Default - every profile of the pool's GPUs.
    type: list
    elements: str
  max_states:
    description:
      - Bound of the search - pool-wide count vectors kept after each GPU. Beyond it the result is no longer proven
        optimal (RV(exact) false).
    type: int
    default: 200
attributes:
  check_mode:
    support: full
    description: Computes only; runs the same in check mode.
  diff_mode:
    support: none
    description: Nothing changes; RV(nodes[].gpus) holds each GPU's before and after.
seealso:
  - module: gpufleet.mig.kubelet_pod_resources
  - module: gpufleet.mig.nvidia_gpu_info
  - module: gpufleet.mig.nvidia_mig
"""

EXAMPLES = r"""
- name: Propose layouts for the image-generation pool
  gpufleet.mig.mig_layout_advice:
    # [{name, gpus: <nvidia_gpu_info gpus>, pod_resources: <kubelet_pod_resources result>}, ...]
    nodes: "{{ pool_nodes }}"
    demand:
      3g.40gb: 6
    minimums:
      2g.20gb: 8
    allowed_profiles: [1g.10gb, 2g.20gb, 3g.40gb]
  delegate_to: localhost
  run_once: true
  register: advice

- name: Demand from pending pods and the last hour's usage in Prometheus
  gpufleet.mig.mig_layout_advice:
    nodes: "{{ pool_nodes }}"
    pending_pods: "{{ pending.resources }}"
    prometheus:
      url: https://prometheus.monitoring:9090
      window: 1h
      ca_file: ~/.gpufleet/pki/prometheus-ca.crt
      token_file: ~/.gpufleet/prometheus-token
  delegate_to: localhost
  run_once: true

- name: Demand from a file
  gpufleet.mig.mig_layout_advice:
    nodes: "{{ pool_nodes }}"
    demand_file: files/night-demand.yml
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
exact:
  description: Whether the layouts are proven optimal (false when the search hit O(max_states)).
  returned: success
  type: bool
  sample: true
demand:
  description: The demand per profile that was planned for (options, file and pending pods together).
  returned: success
  type: dict
  sample: {"3g.40gb": 6}
served:
  description: Instances of the demand the proposed layouts serve with free instances, per profile.
  returned: success
  type: dict
  sample: {"3g.40gb": 6}
unserved:
  description: Demand left without an instance, per profile (only profiles with some left).
  returned: success
  type: dict
  sample: {}
served_slices:
  description: Served demand in compute slices.
  returned: success
  type: int
  sample: 18
demand_slices:
  description: The whole demand in compute slices.
  returned: success
  type: int
  sample: 18
usage:
  description: Demand added from Prometheus (O(prometheus)), per profile; empty without it.
  returned: success
  type: dict
  sample: {"1g.10gb": 5}
usage_query:
  description: The PromQL query that gave RV(usage) (absent without O(prometheus)).
  returned: when O(prometheus) is set
  type: str
upper_bound_slices:
  description: No layout serves more than this (equal to RV(served_slices) when RV(exact)).
  returned: success
  type: int
  sample: 18
destroyed:
  description: Instances destroyed over the pool.
  returned: success
  type: int
  sample: 2
created:
  description: Instances created over the pool.
  returned: success
  type: int
  sample: 3
nodes:
  description: Per node - what changes and the C(gpufleet.mig.nvidia_mig) config that applies it.
  returned: success
  type: list
  elements: dict
  contains:
    name:
      description: Node name.
      type: str
    changed:
      description: Whether any GPU of the node changes.
      type: bool
    destroyed:
      description: Instances destroyed on the node.
      type: int
    created:
      description: Instances created on the node.
      type: int
    config:
      description: C(gpufleet.mig.nvidia_mig) config entries, one per MIG-enabled GPU.
      type: list
      elements: dict
      sample: [{"devices": [4], "mig_enabled": true, "mig_devices": {"2g.20gb": 2, "1g.10gb": 3}}]
    gpus:
      description:
        - Per GPU - C(before), C(after) and C(create) (profile and start), C(destroy) and C(allocated) (profile,
          start, MIG device UUID), C(mig_devices) (counts after) and C(changed).
      type: list
      elements: dict
summary:
  description: One line per node that changes, and a total.
  returned: success
  type: list
  elements: str
  sample: ["hk-gpu-14: destroy 1, create 3", "pool: serves 18 of 18 demanded compute slices, destroy 1, create 3"]
"""

import json
import os
import re

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import open_url
from ansible_collections.gpufleet.mig.plugins.module_utils.advisor import (
    AdviceError,
    advise,
    demand_from_pods,
    gpus_from_facts,
)

try:
    import yaml
except ImportError:  # ansible-core depends on PyYAML; a host without it can still pass demand inline
    yaml = None

SUPPORTED_VERSIONS = ("v1",)
FILE_KEYS = {"version", "demand", "minimums", "allowed_profiles"}


def argument_spec() -> dict:
    return {
        "nodes": {
            "type": "list",
            "elements": "dict",
            "required": True,
            "options": {
                "name": {"type": "str", "required": True},
                "gpus": {"type": "list", "elements": "dict", "required": True},
                "pod_resources": {"type": "dict"},
            },
        },
        "demand": {"type": "dict", "default": {}},
        "pending_pods": {"type": "list", "elements": "dict", "default": []},
        "demand_file": {"type": "path"},
        "prometheus": {
            "type": "dict",
            "options": {
                "url": {"type": "str", "required": True},
                "window": {"type": "str", "default": "1h"},
                "step": {"type": "str", "default": "1m"},
                "busy_above": {"type": "float", "default": 0.05},
                "hostnames": {"type": "list", "elements": "str"},
                "host_label": {"type": "str"},
                "timeout": {"type": "int", "default": 10},
                "ca_file": {"type": "path"},
                "token_file": {"type": "path"},
            },
        },
        "minimums": {"type": "dict"},
        "allowed_profiles": {"type": "list", "elements": "str"},
        "max_states": {"type": "int", "default": 200},
    }


def _read_demand_file(path: str) -> dict:
    if yaml is None:
        raise AdviceError("demand_file needs PyYAML on the host running the module")
    if not os.path.isfile(path):
        raise AdviceError(f"demand_file {path} does not exist")
    try:
        with open(path, encoding="utf-8") as handle:
            document = yaml.safe_load(handle)
    except (OSError, yaml.YAMLError) as exc:
        raise AdviceError(f"demand_file {path}: {str(exc).splitlines()[0]}") from None
    if not isinstance(document, dict):
        raise AdviceError(f"demand_file {path}: must be a mapping with version: v1")
    if document.get("version") not in SUPPORTED_VERSIONS:
        raise AdviceError(f"demand_file {path}: unsupported version {document.get('version')!r} (supported: v1)")
    unknown = sorted(str(k) for k in set(document) - FILE_KEYS)
    if unknown:
        raise AdviceError(f"demand_file {path}: unknown key(s) {', '.join(unknown)}")
    return document


PROMQL_DURATION = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")
PROMQL_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
# dcgm-exporter's host label: `Hostname` in released images, `hostname` in newer ones.
HOST_LABELS = ("Hostname", "hostname")


def usage_query(options: dict, hostnames: list) -> str:
    """Per GPU_I_PROFILE: the most instances busy at once over the window, minus those busy now (0 when none is)."""
    for key in ("window", "step"):
        if not PROMQL_DURATION.match(str(options[key])):
            raise AdviceError(f"prometheus.{key} must be a PromQL duration such as 1h or 30s, got {options[key]!r}")
    host_labels = [options["host_label"]] if options.get("host_label") else list(HOST_LABELS)
    for label in host_labels:
        if not PROMQL_LABEL.match(str(label)):
            raise AdviceError(f"prometheus.host_label {label!r} is not a Prometheus label name")
    hosts = "|".join(re.escape(str(h)).replace("\\", "\\\\") for h in hostnames)
    selectors = [f'DCGM_FI_PROF_GR_ENGINE_ACTIVE{{GPU_I_PROFILE!="",{label}=~"{hosts}"}}' for label in host_labels]
    series = selectors[0] if len(selectors) == 1 else "(" + " or ".join(selectors) + ")"
    busy = f"count by (GPU_I_PROFILE) ({series} > {float(options['busy_above'])})"
    peak = f"max_over_time(({busy})[{options['window']}:{options['step']}])"
    # "or peak": a profile with no instance busy now (or none left at all) has no series to subtract.
    return f"{peak} - on (GPU_I_PROFILE) {busy} or {peak}"


def demand_from_prometheus(options: dict, hostnames: list) -> tuple:
    """(the query, {profile: instances}) from Prometheus' HTTP API (an instant query)."""
    query = usage_query(options, hostnames)
    url = str(options["url"]).rstrip("/") + "/api/v1/query"
    headers = {"Content-Type": "application/x-www-form-urlencoded"}
    token_file = options.get("token_file")
    if token_file:
        try:
            with open(token_file, encoding="utf-8") as handle:
                token = handle.read().strip()
        except OSError as exc:
            raise AdviceError(f"prometheus.token_file {token_file}: {exc.strerror}") from None
        if not token:
            raise AdviceError(f"prometheus.token_file {token_file} is empty")
        headers["Authorization"] = f"Bearer {token}"
    ca_file = options.get("ca_file")
    if ca_file and not os.path.isfile(ca_file):
        raise AdviceError(f"prometheus.ca_file {ca_file} does not exist")
    try:
        response = open_url(
            url,
            method="POST",
            data=f"query={_quote(query)}",
            headers=headers,
            timeout=options["timeout"],
            ca_path=ca_file or None,
        )
        answer = json.loads(response.read())
    except Exception as exc:  # open_url raises URLError, HTTPError, socket errors...; one message for all
        raise AdviceError(f"prometheus: cannot query {url}: {exc}") from None
    if not isinstance(answer, dict) or answer.get("status") != "success":
        raise AdviceError(f"prometheus: {url} answered {str(answer)[:200]}")
    usage: dict = {}
    for sample in answer.get("data", {}).get("result", []):
        profile = sample.get("metric", {}).get("GPU_I_PROFILE")
        try:
            count = int(float(sample["value"][1]))
        except (KeyError, IndexError, TypeError, ValueError):
            raise AdviceError(f"prometheus: a sample of {url} is not a number: {str(sample)[:200]}") from None
        if profile and count > 0:
            usage[profile] = usage.get(profile, 0) + count
    return query, dict(sorted(usage.items()))


def _quote(text: str) -> str:
    from urllib.parse import quote

    return quote(text, safe="")


def _add(total: dict, more: dict, what: str) -> dict:
    if not isinstance(more, dict):
        raise AdviceError(f"{what} must map MIG profile names to counts")
    result = dict(total)
    for name, count in more.items():
        result[name] = result.get(name, 0) + count if isinstance(count, int) else count
    return result


def run(params: dict) -> dict:
    demand = dict(params["demand"] or {})
    minimums, allowed = params["minimums"], params["allowed_profiles"]
    if params["demand_file"]:
        document = _read_demand_file(params["demand_file"])
        demand = _add(demand, document.get("demand") or {}, "demand_file demand")
        minimums = minimums if minimums is not None else document.get("minimums")
        allowed = allowed if allowed is not None else document.get("allowed_profiles")
    demand = _add(demand, demand_from_pods(params["pending_pods"]), "pending pods")
    usage, query = {}, None
    if params["prometheus"]:
        hostnames = params["prometheus"]["hostnames"] or [node["name"] for node in params["nodes"]]
        query, usage = demand_from_prometheus(params["prometheus"], hostnames)
        demand = _add(demand, usage, "Prometheus usage")
    gpus = [g for node in params["nodes"] for g in gpus_from_facts(node["name"], node["gpus"], node["pod_resources"])]
    advice = advise(gpus, demand, minimums, allowed, params["max_states"])
    nodes = advice.nodes()
    unserved = {p: d - advice.served.get(p, 0) for p, d in advice.demand.items() if d > advice.served.get(p, 0)}
    summary = [f"{n['name']}: destroy {n['destroyed']}, create {n['created']}" for n in nodes if n["changed"]]
    summary.append(
        f"pool: serves {advice.served_slices} of {advice.demand_slices} demanded compute slices, "
        f"destroy {advice.destroyed}, create {advice.created}" + ("" if advice.exact else " (beam search, not proven)")
    )
    result = {
        "changed": False,
        "exact": advice.exact,
        "demand": advice.demand,
        "served": advice.served,
        "unserved": unserved,
        "served_slices": advice.served_slices,
        "demand_slices": advice.demand_slices,
        "upper_bound_slices": advice.upper_bound_slices,
        "destroyed": advice.destroyed,
        "created": advice.created,
        "nodes": nodes,
        "summary": summary,
        "usage": usage,
    }
    if query is not None:
        result["usage_query"] = query
    return result


def main():
    module = AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)
    try:
        result = run(module.params)
    except AdviceError as exc:
        module.fail_json(msg=exc.message)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
