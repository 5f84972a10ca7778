"""Synthetic fleets and kube-scheduler-shaped request bodies for the benchmark (and tests).

The Pod and Node objects carry what kube-scheduler really sends (it marshals its cached objects whole):
metadata with labels, annotations and managedFields, spec, and status with conditions, capacity,
allocatable, addresses, nodeInfo and a few images.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable

from gpufleet_testsupport.exposition import DeviceLoad, render_exposition

MIG_LAYOUT = ("3g.40gb", "2g.20gb", "2g.20gb")  # a node with MIG GPUs: one 3g + two 2g per GPU


def node_name(index: int) -> str:
    return f"gpu-node-{index:05d}"


def fleet_devices(nodes: int, seed: int = 7) -> dict[str, list[DeviceLoad]]:
    """``nodes`` nodes of 8 H100: three in four with whole GPUs, one in four split into MIG instances."""
    rng = random.Random(seed)
    fleet: dict[str, list[DeviceLoad]] = {}
    for index in range(nodes):
        devices = []
        for gpu in range(8):
            if index % 4 == 3:
                for instance, profile in enumerate(MIG_LAYOUT, start=1):
                    size = 40960 if profile.startswith("3g") else 20480
                    devices.append(
                        DeviceLoad(gpu, rng.random(), rng.uniform(0, size), size, profile, instance + gpu * 10)
                    )
            else:
                devices.append(DeviceLoad(gpu, rng.random(), rng.uniform(0, 81559)))
        fleet[node_name(index)] = devices
    return fleet


def metrics_text(nodes: int) -> str:
    return render_exposition(fleet_devices(nodes))


def pod(resource: str = "nvidia.com/gpu", count: int = 1, namespace: str = "llm-serving") -> dict:
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": "vllm-llama-70b-7d9c8b6f5-x2kqp",
            "generateName": "vllm-llama-70b-7d9c8b6f5-",
            "namespace": namespace,
            "uid": "0b6c3c57-5f4e-4c59-9a6e-2f0d6b1f9e21",
            "resourceVersion": "48213377",
            "creationTimestamp": "2025-01-14T08:21:07Z",
            "labels": {"app.kubernetes.io/name": "vllm", "pod-template-hash": "7d9c8b6f5", "gpufleet.io/tenant": "llm"},
            "annotations": {"kubectl.kubernetes.io/restartedAt": "2025-01-14T08:20:55Z"},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "vllm-llama-70b-7d9c8b6f5",
                    "uid": "a3f1c0de-7b1e-4d5c-8a77-3b3b0e6f4c10",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "managedFields": [
                {
                    "manager": "kube-controller-manager",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": "2025-01-14T08:21:07Z",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:metadata": {"f:generateName": {}, "f:labels": {".": {}}}, "f:spec": {}},
                }
            ],
        },
        "spec": {
            "volumes": [
                {"name": "model-cache", "persistentVolumeClaim": {"claimName": "llama-70b-weights"}},
                {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}},
            ],
            "containers": [
                {
                    "name": "vllm",
                    "image": "vllm/vllm-openai:v0.6.4",
                    "args": ["--model", "/models/llama-70b", "--tensor-parallel-size", str(count)],
                    "ports": [{"name": "http", "containerPort": 8000, "protocol": "TCP"}],
                    "env": [{"name": "HF_HOME", "value": "/models/.cache"}],
                    "resources": {
                        "limits": {"cpu": "16", "memory": "128Gi", resource: str(count)},
                        "requests": {"cpu": "8", "memory": "96Gi", resource: str(count)},
                    },
                    "volumeMounts": [
                        {"name": "model-cache", "mountPath": "/models"},
                        {"name": "shm", "mountPath": "/dev/shm"},
                    ],
                    "readinessProbe": {"httpGet": {"path": "/health", "port": 8000}, "periodSeconds": 10},
                    "terminationMessagePath": "/dev/termination-log",
                    "imagePullPolicy": "IfNotPresent",
                }
            ],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "priorityClassName": "gpufleet-llm",
            "priority": 100000,
            "schedulerName": "default-scheduler",
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
            ],
            "enableServiceLinks": True,
            "preemptionPolicy": "PreemptLowerPriority",
        },
        "status": {"phase": "Pending", "qosClass": "Burstable"},
    }


def node(index: int) -> dict:
    name = node_name(index)
    mig = index % 4 == 3
    extended = {"nvidia.com/mig-3g.40gb": "8", "nvidia.com/mig-2g.20gb": "16"} if mig else {"nvidia.com/gpu": "8"}
    resources = {"cpu": "224", "memory": "2113412Mi", "ephemeral-storage": "3748905484Ki", "pods": "110", **extended}
    return {
        "metadata": {
            "name": name,
            "uid": f"5c1f{index:08x}-0d0e-4b7a-9f6e-4a1c2b3d4e5f",
            "resourceVersion": str(48000000 + index),
            "creationTimestamp": "2024-11-02T03:14:15Z",
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": "h100-8x",
                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                "nvidia.com/mig.strategy": "mixed",
                "gpufleet.io/tenant": "llm" if index % 2 == 0 else "imagegen",
            },
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
            },
        },
        "spec": {
            "podCIDR": f"10.{index // 256 % 256}.{index % 256}.0/24",
            "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
        },
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [
                {
                    "type": kind,
                    "status": "False" if kind != "Ready" else "True",
                    "lastHeartbeatTime": "2025-01-14T08:20:00Z",
                    "lastTransitionTime": "2024-11-02T03:15:00Z",
                    "reason": f"Kubelet{kind}",
                    "message": f"kubelet reports {kind}",
                }
                for kind in ("MemoryPressure", "DiskPressure", "PIDPressure", "Ready")
            ],
            "addresses": [
                {"type": "InternalIP", "address": f"10.40.{index // 256 % 256}.{index % 256}"},
                {"type": "Hostname", "address": name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": f"{index:032x}",
                "systemUUID": f"4c4c4544-{index:04x}-4d10-8052-b4c04f4e3432",
                "bootID": f"b00t{index:028x}",
                "kernelVersion": "6.8.0-49-generic",
                "osImage": "Ubuntu 24.04.1 LTS",
                "containerRuntimeVersion": "containerd://1.7.24",
                "kubeletVersion": "v1.31.4",
                "kubeProxyVersion": "v1.31.4",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
            "images": [
                {"names": ["nvcr.io/nvidia/k8s-device-plugin@sha256:" + "a" * 64], "sizeBytes": 181234567},
                {"names": ["nvcr.io/nvidia/k8s/dcgm-exporter@sha256:" + "b" * 64], "sizeBytes": 431234567},
            ],
        },
    }


def args_body(pod_obj: dict, names: Iterable[str] | None = None, nodes: Iterable[dict] | None = None) -> bytes:
    """ExtenderArgs as Go marshals it: the unused form is null."""
    return json.dumps(
        {
            "Pod": pod_obj,
            "Nodes": {"metadata": {}, "items": list(nodes)} if nodes is not None else None,
            "NodeNames": list(names) if names is not None else None,
        },
        separators=(",", ":"),
    ).encode()
