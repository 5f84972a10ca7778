"""gpufleet.mig.k8s_owned, k8s_uninstall_plan and k8s_node_release_patch: how delivered objects are marked, and how
uninstall finds, orders and releases them."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.gpufleet.mig.plugins.filter.k8s_objects import (
    k8s_node_release_patch,
    k8s_owned,
    k8s_uninstall_plan,
)


def obj(kind: str, name: str, manifest: str | None = None, namespace: str | None = None, **labels) -> dict:
    metadata: dict = {"name": name}
    if namespace:
        metadata["namespace"] = namespace
    if labels:
        metadata["labels"] = dict(labels)
    if manifest:
        metadata["annotations"] = {"gpufleet.io/manifest": manifest}
    return {"apiVersion": "v1", "kind": kind, "metadata": metadata}


def test_owned_objects_carry_the_label_and_their_set_and_keep_their_own_metadata():
    rendered = [
        obj("ConfigMap", "a", namespace="gpufleet-system", app="x"),
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "b", "annotations": {"keep": "me"}}},
    ]
    marked = k8s_owned(rendered, "gpu_extender/config")
    assert marked[0]["metadata"]["labels"] == {"app": "x", "app.kubernetes.io/part-of": "gpufleet"}
    assert marked[0]["metadata"]["annotations"] == {"gpufleet.io/manifest": "gpu_extender/config"}
    assert marked[1]["metadata"]["annotations"] == {"keep": "me", "gpufleet.io/manifest": "gpu_extender/config"}
    assert "annotations" not in rendered[0]["metadata"]  # the input is not changed


def test_nodes_are_never_marked_as_the_collections():
    node = obj("Node", "gpu-1", **{"gpufleet.io/tenant": "llm"})
    assert k8s_owned([node], "tenants/nodes") == [node]


def test_owned_refuses_what_is_not_a_list_of_objects():
    with pytest.raises(AnsibleFilterError, match="tenants/quotas"):
        k8s_owned("kind: ConfigMap", "tenants/quotas")


def test_uninstall_goes_in_the_reverse_of_site_order_with_the_fleet_namespaces_last():
    found = [
        obj("Namespace", "gpufleet-system", "namespaces/gpufleet-system"),
        obj("ResourceQuota", "q", "tenants/quotas", "finnlp"),
        obj("Deployment", "gpufleet-extender", "gpu_extender/deployment", "gpufleet-system"),
        obj("ConfigMap", "dash", "monitoring/grafana-dashboard", "gpufleet-system"),
        obj("ConfigMap", "old", None, "gpufleet-system"),  # delivered by another release: before the namespaces
        obj("DaemonSet", "nvidia-device-plugin", "gpu_device_plugin/device-plugin", "gpufleet-node-agents"),
        obj("Deployment", "gpufleet-scheduler", "kube_scheduler/secondary", "gpufleet-system"),
    ]
    plan = k8s_uninstall_plan(found)
    assert [o["metadata"]["name"] for o in plan["delete"]] == [
        "dash",
        "gpufleet-scheduler",
        "gpufleet-extender",
        "nvidia-device-plugin",
        "q",
        "old",
        "gpufleet-system",
    ]
    assert plan["keep"] == []


def test_tenant_namespaces_are_kept_unless_told_otherwise():
    found = [
        obj("Namespace", "finnlp", "tenants/namespaces"),
        obj("Namespace", "gpufleet-system", "namespaces/gpufleet-system"),
        obj("Namespace", "llm-inference", "tenants/namespaces"),
    ]
    kept = k8s_uninstall_plan(found)
    assert kept["keep"] == ["finnlp", "llm-inference"]
    assert [o["metadata"]["name"] for o in kept["delete"]] == ["gpufleet-system"]
    gone = k8s_uninstall_plan(found, keep_tenant_namespaces=False)
    assert gone["keep"] == []
    assert [o["metadata"]["name"] for o in gone["delete"]][-1] == "gpufleet-system"
    assert len(gone["delete"]) == 3


LABELS = ["gpufleet.io/gpu-node", "gpufleet.io/tenant", "nvidia.com/device-plugin.config"]


def test_node_release_removes_only_gpufleets_labels_and_pool_taint():
    node = {
        "metadata": {
            "name": "gpu-1",
            "labels": {"gpufleet.io/gpu-node": "true", "gpufleet.io/tenant": "llm", "kubernetes.io/os": "linux"},
        },
        "spec": {
            "taints": [
                {"key": "gpufleet.io/tenant", "value": "llm", "effect": "NoExecute"},
                {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"},
            ]
        },
    }
    assert k8s_node_release_patch(node, LABELS, "gpufleet.io/tenant") == [
        {"op": "remove", "path": "/metadata/labels/gpufleet.io~1gpu-node"},
        {"op": "remove", "path": "/metadata/labels/gpufleet.io~1tenant"},
        {"op": "replace", "path": "/spec/taints", "value": [node["spec"]["taints"][1]]},
    ]


def test_a_released_node_needs_no_patch():
    node = {"metadata": {"name": "gpu-1", "labels": {"kubernetes.io/os": "linux"}}, "spec": {}}
    assert k8s_node_release_patch(node, LABELS, "gpufleet.io/tenant") == []
