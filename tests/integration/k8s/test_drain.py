"""Cordon and drain around a disruptive MIG change (`playbooks/mig.yml --limit <node>` with
mig_partition_k8s_drain), against the real apiserver and its disruption controller.

The node's GPUs are the lab's simulator; the change (MIG off -> 7 x 1g.10gb on hk-gpu-17, finnlp's layout)
switches MIG mode, which is disruptive, so the role drains the Kubernetes node first."""

from __future__ import annotations

import json

import pytest
from conftest import FakeKubelet, ensure_namespace
from gpufleet_testsupport.collection import run_playbook
from gpufleet_testsupport.waits import wait_for
from kubernetes import client as k8s

pytestmark = pytest.mark.integration

HOST = "hk-gpu-17"


def start_replicaset(api, core, namespace: str, node: str, labels: dict, replicas: int = 2) -> None:
    """A ReplicaSet's pods bound to `node` (drain refuses unmanaged pods, as kubectl drain does). No scheduler runs
    here, so the test binds them, as a scheduler would; the replacements of evicted pods stay pending."""
    template = k8s.V1PodTemplateSpec(
        metadata=k8s.V1ObjectMeta(labels=labels),
        spec=k8s.V1PodSpec(containers=[k8s.V1Container(name="main", image="registry.invalid/workload:1")]),
    )
    spec = k8s.V1ReplicaSetSpec(replicas=replicas, selector=k8s.V1LabelSelector(match_labels=labels), template=template)
    k8s.AppsV1Api(api).create_namespaced_replica_set(
        namespace, k8s.V1ReplicaSet(metadata=k8s.V1ObjectMeta(name="job"), spec=spec)
    )
    pods = wait_for(
        lambda: (items := core.list_namespaced_pod(namespace).items) and len(items) == replicas and items,
        what=f"the ReplicaSet's {replicas} pods",
    )
    for pod in pods:
        target = k8s.V1ObjectReference(api_version="v1", kind="Node", name=node)
        binding = k8s.V1Binding(metadata=k8s.V1ObjectMeta(name=pod.metadata.name), target=target)
        core.create_namespaced_pod_binding(pod.metadata.name, namespace, binding, _preload_content=False)


def pods_on(core, node: str) -> list:
    return core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items


def make_pdb(api, namespace: str, name: str, labels: dict, min_available: int) -> None:
    policy = k8s.PolicyV1Api(api)
    body = k8s.V1PodDisruptionBudget(
        metadata=k8s.V1ObjectMeta(name=name),
        spec=k8s.V1PodDisruptionBudgetSpec(
            min_available=min_available, selector=k8s.V1LabelSelector(match_labels=labels)
        ),
    )
    policy.create_namespaced_pod_disruption_budget(namespace, body)

    def settled():
        status = policy.read_namespaced_pod_disruption_budget(name, namespace).status
        return status and status.observed_generation and status.current_healthy == status.expected_pods

    wait_for(settled, what=f"the disruption controller to observe PodDisruptionBudget {name}")


def mig_run(control_plane, tmp_path, node: str, drain_timeout: int = 10):
    extra = {
        "gpufleet_kubeconfig": str(control_plane.kubeconfig),
        "gpufleet_lab_dir": str(tmp_path),
        "mig_partition_k8s_drain": True,
        "gpufleet_node_name": node,
        "mig_partition_k8s_drain_timeout": drain_timeout,
    }
    result = run_playbook("playbooks/mig.yml", "inventories/hongkong+lab", extra, tmp_path, ("--limit", HOST))
    return result.returncode, result.stdout + result.stderr


def mig_enabled_gpus(tmp_path) -> int:
    state = json.loads((tmp_path / "nvml" / f"{HOST}.json").read_text())
    return sum(1 for gpu in state["gpus"] if gpu["mig_mode"]["current"])


@pytest.fixture
def node_with_pods(api, core, request):
    """A Ready node named after the test, two running pods on it, and a kubelet that ends evicted pods."""
    node = request.node.name.replace("_", "-")[:50].strip("-")
    namespace = node
    kubelet = FakeKubelet(core, {node: {"nvidia.com/gpu": "8"}}).register()
    ensure_namespace(core, namespace)
    start_replicaset(api, core, namespace, node, {"app": "job"})
    kubelet.run_pods(namespace)
    kubelet.start()
    yield node, namespace
    kubelet.stop()
    assert kubelet.errors == []


def test_drain_evicts_repartitions_and_uncordons(control_plane, core, node_with_pods, tmp_path):
    node, _ = node_with_pods

    code, output = mig_run(control_plane, tmp_path, node)

    assert code == 0, output[-6000:]
    assert "and the node is drained around the apply" in output
    assert pods_on(core, node) == []
    assert mig_enabled_gpus(tmp_path) == 8
    assert not core.read_node(node).spec.unschedulable


def test_a_pdb_that_allows_no_disruption_stops_the_drain(control_plane, api, core, node_with_pods, tmp_path):
    node, namespace = node_with_pods
    make_pdb(api, namespace, "keep-both", {"app": "job"}, min_available=2)

    code, output = mig_run(control_plane, tmp_path, node, drain_timeout=5)

    text = " ".join(output.split())
    assert code != 0
    assert f'The MIG layout change on {HOST} stopped at "Cordon and drain the node' in text
    assert "disruption budget" in text.lower(), text[-3000:]
    assert "The node is uncordoned." in text
    assert "Traceback" not in output
    # Nothing repartitioned, both pods still there, the node schedulable again.
    assert mig_enabled_gpus(tmp_path) == 0
    assert len(pods_on(core, node)) == 2
    assert not core.read_node(node).spec.unschedulable
