"""gpufleet.mig.fleet_verify: playbooks/verify.yml's judgement of a deployed fleet, from what the cluster reports.

Per tenant pool: every host of the pool's group is a Node under the name the roles use, labelled and tainted for
its pool, advertising exactly the GPU resources its MIG layout implies (times the pool's time-slicing). Fleet-wide:
every Deployment, StatefulSet and DaemonSet the collection delivered is ready (device plugin, GPU Feature Discovery,
dcgm-exporter, the extender - whose readiness needs fresh metrics -, the scheduler, the descheduler; with pushed
load the extender and gpufleet-scheduler are StatefulSets of receivers, ready only once Prometheus sends to them),
and in static-pod mode every kube-scheduler runs with gpufleet's configuration. One problem is one sentence naming
the object and what to do.
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.gpufleet.mig.plugins.filter.tenants_model import tenants_sharing
from ansible_collections.gpufleet.mig.plugins.module_utils import host_gpus as facts
from ansible_collections.gpufleet.mig.plugins.module_utils.exceptions import MigError

GPU_RESOURCE_PREFIX = "nvidia.com/"
CONFIG_HASH_ANNOTATION = "gpufleet.io/scheduler-config-hash"


def fleet_expected(hostvars, groups, tenants, allocation: str = "device_plugin") -> dict:
    """tenant -> {node name: {GPU resource: count the device plugin advertises}} (DRA mode: {} per node, the
    driver publishes ResourceSlices instead of extended resources)."""
    if not isinstance(tenants, dict):
        raise AnsibleFilterError("fleet_expected: gpufleet_tenants must be a mapping of tenants")
    sharing = tenants_sharing(tenants)["tenants"]
    expected: dict[str, dict[str, dict[str, int]]] = {}
    for tenant, spec in tenants.items():
        pool: dict[str, dict[str, int]] = {}
        for host in (groups or {}).get(spec.get("group"), []):
            hv = hostvars[host]
            try:
                if allocation == "dra" or facts.LAYOUT_VAR not in hv:
                    pool[facts.node_name(host, hv)] = {}
                else:
                    pool[facts.node_name(host, hv)] = facts.host_gpus(host, hv).resources(sharing.get(tenant))
            except MigError as err:
                raise AnsibleFilterError(f"fleet_expected: {err}") from None
        expected[str(tenant)] = pool
    return expected


def _ready(workload: dict, receiver_label: str = "") -> str | None:
    """Why a Deployment, StatefulSet or DaemonSet is not ready, or None. `receiver_label`: the pod label of the
    pushed load's receivers (a StatefulSet of them is ready once Prometheus sends to it)."""
    kind, meta, status = workload.get("kind"), workload.get("metadata") or {}, workload.get("status") or {}
    spec = workload.get("spec") or {}
    namespace, short = meta.get("namespace"), meta.get("name")
    name = f"{kind} {namespace}/{short}"
    if kind in ("Deployment", "StatefulSet"):
        wanted = spec.get("replicas", 1)
        ready = status.get("readyReplicas", 0)
        if ready >= wanted:
            return None
        pod_labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
        if kind == "StatefulSet" and receiver_label and pod_labels.get(receiver_label) == "true":
            return (
                f"{name}: {ready} of {wanted} replicas ready; a receiver of the pushed load is ready once Prometheus"
                " sends to it: give Prometheus the remote-write entries the roles wrote beside the manifests"
                " (docs/metrics_push.md), then check its prometheus_remote_storage_samples_failed_total and"
                f" kubectl -n {namespace} logs {short}-0"
            )
        return f"{name}: {ready} of {wanted} replicas ready (kubectl -n {namespace} describe {kind.lower()} {short})"
    elif kind == "DaemonSet":
        wanted, ready = status.get("desiredNumberScheduled", 0), status.get("numberReady", 0)
        if wanted == 0:
            return f"{name}: scheduled on no node (are the GPU nodes labelled? is the DaemonSet's nodeSelector met?)"
        if ready < wanted:
            return f"{name}: {ready} of {wanted} pods ready (kubectl -n {namespace} get pods -o wide)"
    return None


def fleet_verify(
    expected,
    nodes,
    tenant_key: str,
    taint_effect: str,
    workloads=None,
    scheduler_pods=None,
    scheduler_mode: str = "static_pod",
    receiver_label: str = "",
) -> dict:
    """C(pools): tenant -> {nodes, problems}; C(problems): the fleet-wide ones; C(ok): nothing wrong anywhere."""
    by_name = {(n.get("metadata") or {}).get("name"): n for n in nodes or []}
    pools: dict[str, dict] = {}
    for tenant, members in (expected or {}).items():
        problems: list[str] = []
        for node_name, resources in members.items():
            node = by_name.get(node_name)
            if node is None:
                problems.append(
                    f"node {node_name} is not in the cluster: join it, or set gpufleet_node_name for its host to the"
                    " name its kubelet registered"
                )
                continue
            labels = (node.get("metadata") or {}).get("labels") or {}
            if labels.get(tenant_key) != tenant:
                problems.append(
                    f"node {node_name} is labelled {tenant_key}={labels.get(tenant_key, '(none)')}, not {tenant}:"
                    " rerun site.yml (the tenants role labels the pools' nodes)"
                )
            taints = (node.get("spec") or {}).get("taints") or []
            pool_taint = {"key": tenant_key, "value": tenant, "effect": taint_effect}
            if not any(all(t.get(k) == v for k, v in pool_taint.items()) for t in taints):
                problems.append(
                    f"node {node_name} lacks the pool taint {tenant_key}={tenant}:{taint_effect}: rerun site.yml"
                )
            allocatable = (node.get("status") or {}).get("allocatable") or {}
            advertised = {r: int(v) for r, v in allocatable.items() if r.startswith(GPU_RESOURCE_PREFIX)}
            wrong = [
                f"{r} {advertised.get(r, 0)} (layout: {resources.get(r, 0)})"
                for r in sorted(set(resources) | set(advertised))
                if advertised.get(r, 0) != resources.get(r, 0)
            ]
            if wrong:
                problems.append(
                    f"node {node_name} advertises {', '.join(wrong)}: its GPUs or the device plugin disagree with"
                    " the layout (playbooks/mig.yml --limit <host> --check --diff; the device plugin pod's log)"
                )
        pools[tenant] = {"nodes": len(members), "problems": problems}

    fleet: list[str] = [p for w in workloads or [] if (p := _ready(w, receiver_label))]
    if scheduler_mode == "static_pod":
        pods = scheduler_pods or []
        if not pods:
            fleet.append("no kube-scheduler pod in kube-system (component=kube-scheduler): is this a kubeadm cluster?")
        for pod in pods:
            meta = pod.get("metadata") or {}
            if CONFIG_HASH_ANNOTATION not in (meta.get("annotations") or {}):
                fleet.append(
                    f"kube-scheduler pod {meta.get('name')} runs without gpufleet's configuration: rerun"
                    " playbooks/scheduler.yml"
                )
            conditions = {c.get("type"): c.get("status") for c in (pod.get("status") or {}).get("conditions") or []}
            if conditions.get("Ready") != "True":
                fleet.append(f"kube-scheduler pod {meta.get('name')} is not ready (kubectl -n kube-system logs ...)")
    ok = not fleet and not any(p["problems"] for p in pools.values())
    return {"pools": pools, "problems": fleet, "ok": ok}


def fleet_canary_resource(pool) -> str:
    """The GPU resource a pool (node -> {resource: count}) has the most devices of: the canary asks for one."""
    totals: dict[str, int] = {}
    for resources in (pool or {}).values():
        for resource, count in resources.items():
            totals[resource] = totals.get(resource, 0) + int(count)
    if not any(totals.values()):
        raise AnsibleFilterError("fleet_canary_resource: the pool's layouts give it no GPU resource")
    return max(sorted(totals), key=lambda r: totals[r])


class FilterModule:
    def filters(self):
        return {
            "fleet_expected": fleet_expected,
            "fleet_verify": fleet_verify,
            "fleet_canary_resource": fleet_canary_resource,
        }
