"""What kube-scheduler sends an extender: pods and ExtenderArgs, shaped as it sends them (for the extender's, the
lab's and the collection's tests)."""

from __future__ import annotations


def make_pod(resources: dict | None = None, namespace: str = "team-a", init: dict | None = None) -> dict:
    container = {"name": "main", "image": "cuda:12", "resources": {"limits": resources} if resources else {}}
    spec: dict = {"containers": [container], "schedulerName": "default-scheduler"}
    if init:
        spec["initContainers"] = [{"name": "init", "image": "busybox", "resources": {"limits": init}}]
    return {
        "metadata": {"name": "job-1", "namespace": namespace, "uid": "2f0c1c9e-0000-4000-8000-000000000001"},
        "spec": spec,
        "status": {"phase": "Pending"},
    }


def names_args(pod: dict, names: list[str]) -> dict:
    """ExtenderArgs of an extender with nodeCacheCapable: true (Go writes the nil Nodes as null)."""
    return {"Pod": pod, "Nodes": None, "NodeNames": names}


def node_obj(name: str, labels: dict | None = None) -> dict:
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
        "spec": {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]},
        "status": {"allocatable": {"nvidia.com/gpu": "8"}, "nodeInfo": {"kubeletVersion": "v1.31.4"}},
    }


def nodes_args(pod: dict, nodes: list[dict]) -> dict:
    """ExtenderArgs of an extender with nodeCacheCapable: false."""
    return {"Pod": pod, "Nodes": {"metadata": {}, "items": nodes}, "NodeNames": None}
