"""gpufleet.mig.fleet_expected, fleet_verify and fleet_canary_resource: playbooks/verify.yml's judgement."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from ansible.errors import AnsibleFilterError
from ansible_collections.gpufleet.mig.plugins.filter.fleet_verify import (
    fleet_canary_resource,
    fleet_expected,
    fleet_verify,
)

REPO = Path(__file__).resolve().parents[4]
KEY, EFFECT = "gpufleet.io/tenant", "NoExecute"
MIXED = [
    {"devices": [0], "mig_enabled": True, "mig_devices": {"3g.40gb": 2}},
    {"devices": [1], "mig_enabled": True, "mig_devices": {"1g.10gb": 7}},
]
HOSTVARS = {
    "img-1": {"mig_partition_config": MIXED, "gpufleet_gpus_per_node": 2},
    "img-2": {"mig_partition_config": MIXED, "gpufleet_gpus_per_node": 2, "gpufleet_node_name": "img-2.example"},
    "llm-1": {"mig_partition_config": [{"devices": "all", "mig_enabled": False}], "gpufleet_gpus_per_node": 4},
}
GROUPS = {"tenant_img": ["img-1", "img-2"], "tenant_llm": ["llm-1"]}
TENANTS = {
    "img": {"group": "tenant_img", "sharing": {"nvidia.com/mig-1g.10gb": 2}},
    "llm": {"group": "tenant_llm"},
}


def node(name: str, tenant: str | None, allocatable: dict, taint: bool = True) -> dict:
    return {
        "metadata": {"name": name, "labels": {KEY: tenant} if tenant else {}},
        "spec": {"taints": [{"key": KEY, "value": tenant, "effect": EFFECT}] if taint and tenant else []},
        "status": {"allocatable": {"cpu": "64", **{k: str(v) for k, v in allocatable.items()}}},
    }


def expected() -> dict:
    return fleet_expected(HOSTVARS, GROUPS, TENANTS)


def healthy_nodes() -> list[dict]:
    return [node(name, tenant, resources) for tenant, pool in expected().items() for name, resources in pool.items()]


def test_expected_resources_follow_the_layout_sharing_and_node_name():
    assert expected() == {
        "img": {
            "img-1": {"nvidia.com/mig-1g.10gb": 14, "nvidia.com/mig-3g.40gb": 2},
            "img-2.example": {"nvidia.com/mig-1g.10gb": 14, "nvidia.com/mig-3g.40gb": 2},
        },
        "llm": {"llm-1": {"nvidia.com/gpu": 4}},
    }
    assert fleet_expected(HOSTVARS, GROUPS, TENANTS, "dra")["img"] == {"img-1": {}, "img-2.example": {}}


def test_a_fleet_as_the_inventory_says_is_ok():
    result = fleet_verify(expected(), healthy_nodes(), KEY, EFFECT, scheduler_mode="plugin")
    assert result == {
        "pools": {"img": {"nodes": 2, "problems": []}, "llm": {"nodes": 1, "problems": []}},
        "problems": [],
        "ok": True,
    }


def test_each_node_problem_is_named():
    nodes = healthy_nodes()
    nodes[0] = node("img-1", "llm", {"nvidia.com/mig-1g.10gb": 10, "nvidia.com/mig-3g.40gb": 2})
    nodes[1]["spec"]["taints"] = []
    del nodes[2]  # llm-1 never joined
    result = fleet_verify(expected(), nodes, KEY, EFFECT, scheduler_mode="plugin")
    assert not result["ok"]
    img = result["pools"]["img"]["problems"]
    assert img[0].startswith("node img-1 is labelled gpufleet.io/tenant=llm, not img")
    assert img[1].startswith("node img-1 lacks the pool taint gpufleet.io/tenant=img:NoExecute")
    assert img[2].startswith("node img-1 advertises nvidia.com/mig-1g.10gb 10 (layout: 14):")
    assert img[3].startswith("node img-2.example lacks the pool taint")
    assert result["pools"]["llm"]["problems"][0].startswith("node llm-1 is not in the cluster")


def test_a_resource_the_layout_does_not_have_is_a_problem_too():
    nodes = healthy_nodes()
    nodes[2]["status"]["allocatable"]["nvidia.com/mig-1g.10gb"] = "7"
    problems = fleet_verify(expected(), nodes, KEY, EFFECT, scheduler_mode="plugin")["pools"]["llm"]["problems"]
    assert problems == [
        "node llm-1 advertises nvidia.com/mig-1g.10gb 7 (layout: 0): its GPUs or the device plugin disagree with"
        " the layout (playbooks/mig.yml --limit <host> --check --diff; the device plugin pod's log)"
    ]


def workload(kind: str, name: str, **status) -> dict:
    spec = {"replicas": 2} if kind == "Deployment" else {}
    return {"kind": kind, "metadata": {"name": name, "namespace": "gpufleet-system"}, "spec": spec, "status": status}


def test_workloads_not_ready_and_schedulers_without_the_config_are_named():
    workloads = [
        workload("Deployment", "gpufleet-extender", readyReplicas=1),
        workload("Deployment", "descheduler", readyReplicas=2),
        workload("DaemonSet", "dcgm-exporter", desiredNumberScheduled=3, numberReady=2),
        workload("DaemonSet", "nvidia-device-plugin", desiredNumberScheduled=0, numberReady=0),
    ]
    pods = [
        {
            "metadata": {"name": "kube-scheduler-cp-1", "annotations": {"gpufleet.io/scheduler-config-hash": "ab"}},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        },
        {"metadata": {"name": "kube-scheduler-cp-2"}, "status": {"conditions": [{"type": "Ready", "status": "False"}]}},
    ]
    result = fleet_verify(expected(), healthy_nodes(), KEY, EFFECT, workloads=workloads, scheduler_pods=pods)
    assert [p.split(":")[0] for p in result["problems"]] == [
        "Deployment gpufleet-system/gpufleet-extender",
        "DaemonSet gpufleet-system/dcgm-exporter",
        "DaemonSet gpufleet-system/nvidia-device-plugin",
        "kube-scheduler pod kube-scheduler-cp-2 runs without gpufleet's configuration",
        "kube-scheduler pod kube-scheduler-cp-2 is not ready (kubectl -n kube-system logs ...)",
    ]
    assert not result["ok"]
    assert "no kube-scheduler pod" in fleet_verify({}, [], KEY, EFFECT, scheduler_pods=[])["problems"][0]


def test_the_canary_asks_for_the_pools_most_plentiful_resource():
    assert fleet_canary_resource(expected()["img"]) == "nvidia.com/mig-1g.10gb"
    assert fleet_canary_resource(expected()["llm"]) == "nvidia.com/gpu"
    with pytest.raises(AnsibleFilterError, match="no GPU resource"):
        fleet_canary_resource({"n": {}})


def test_receivers_not_ready_say_that_prometheus_sends_them_nothing():
    # With pushed load the extender and gpufleet-scheduler are StatefulSets whose pods carry the receivers' label
    # (roles/gpufleet/vars); a replica is ready only once Prometheus has sent it samples.
    label = yaml.safe_load((REPO / "roles/gpufleet/vars/main.yml").read_text())["gpufleet_receiver_label"]

    def statefulset(name: str, ready: int, receiver: bool) -> dict:
        template = {"metadata": {"labels": {label: "true"} if receiver else {}}}
        return {
            "kind": "StatefulSet",
            "metadata": {"name": name, "namespace": "gpufleet-system"},
            "spec": {"replicas": 2, "template": template},
            "status": {"readyReplicas": ready},
        }

    workloads = [
        statefulset("gpufleet-extender", 0, True),
        statefulset("gpufleet-scheduler", 2, True),
        statefulset("something-else", 1, False),
    ]
    result = fleet_verify(
        expected(), healthy_nodes(), KEY, EFFECT, workloads, scheduler_mode="plugin", receiver_label=label
    )
    receivers, other = result["problems"]
    assert receivers.startswith("StatefulSet gpufleet-system/gpufleet-extender: 0 of 2 replicas ready")
    assert "remote-write entries" in receivers and "docs/metrics_push.md" in receivers
    assert other == (
        "StatefulSet gpufleet-system/something-else: 1 of 2 replicas ready "
        "(kubectl -n gpufleet-system describe statefulset something-else)"
    )
    assert not result["ok"]
    ready = [statefulset("gpufleet-extender", 2, True)]
    assert fleet_verify(expected(), healthy_nodes(), KEY, EFFECT, ready, scheduler_mode="plugin", receiver_label=label)[
        "ok"
    ]
