"""The device plugin refresh after a repartition, against the real apiserver: the role deletes the node's plugin
pod (its DaemonSet would start a fresh one, which enumerates the new MIG devices) and waits until the Node's
allocatable matches the layout. The kubelet's part is played by FakeKubelet: it finishes the pod's deletion and
reports the new allocatable only some seconds later, as a real kubelet does once the new plugin registers."""

from __future__ import annotations

import threading
import time

import pytest
from conftest import FakeKubelet, ensure_namespace
from gpufleet_testsupport.collection import run_refresh
from gpufleet_testsupport.waits import wait_for
from kubernetes import client as k8s

pytestmark = pytest.mark.integration

NAMESPACE = "gpufleet-system"
PLUGIN_LABELS = {"app.kubernetes.io/name": "nvidia-device-plugin", "app.kubernetes.io/part-of": "gpufleet"}
SEVEN_SMALL = [{"devices": "all", "mig_enabled": True, "mig_devices": {"1g.10gb": 7}}]
WHOLE_GPU = {"nvidia.com/gpu": "1"}
SEVEN_SMALL_RESOURCES = {"nvidia.com/gpu": "0", "nvidia.com/mig-1g.10gb": "7"}


@pytest.fixture
def plugin_node(core, request):
    """A node advertising one whole GPU, with a device plugin pod bound to it."""
    node = request.node.name.replace("_", "-")[:50].strip("-")
    kubelet = FakeKubelet(core, {node: WHOLE_GPU}).register()
    ensure_namespace(core, NAMESPACE)
    pod = k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name=f"nvidia-device-plugin-{node}", labels=PLUGIN_LABELS),
        spec=k8s.V1PodSpec(node_name=node, containers=[k8s.V1Container(name="plugin", image="registry.invalid/p:1")]),
    )
    core.create_namespaced_pod(NAMESPACE, pod)
    kubelet.run_pods(NAMESPACE)
    kubelet.start()
    yield node, kubelet
    kubelet.stop()
    assert kubelet.errors == []


def plugin_pods(core, node: str) -> list:
    return core.list_namespaced_pod(NAMESPACE, field_selector=f"spec.nodeName={node}").items


def test_refresh_waits_for_the_late_allocatable(control_plane, core, plugin_node, tmp_path):
    node, kubelet = plugin_node

    # The new plugin registers some seconds after the old pod is gone: well after kubernetes.core's wait for the
    # deletion (it polls every 5 s) and the next task's start, so the role must be polling by then.
    registered_at = []

    def new_plugin_registers():
        wait_for(lambda: not plugin_pods(core, node), what="the plugin pod's deletion")
        threading.Event().wait(15)
        kubelet.set_allocatable(node, SEVEN_SMALL_RESOURCES)
        registered_at.append(time.monotonic())

    late = threading.Thread(target=new_plugin_registers)
    late.start()
    result = run_refresh(tmp_path, control_plane.kubeconfig, NAMESPACE, {node: True}, {node: SEVEN_SMALL}, retries=40)
    finished_at = time.monotonic()
    late.join()

    assert result.returncode == 0, result.stdout[-4000:]
    assert plugin_pods(core, node) == []
    allocatable = core.read_node(node).status.allocatable
    assert allocatable["nvidia.com/mig-1g.10gb"] == "7"
    # It was still waiting when the allocatable changed, and had polled before: the first reads saw the whole GPU.
    assert registered_at and finished_at > registered_at[0]
    assert result.stdout.count("FAILED - RETRYING: [localhost]: Poll the node's allocatable") >= 1, result.stdout


def test_refresh_fails_naming_node_resource_expected_and_actual(control_plane, core, plugin_node, tmp_path):
    node, _ = plugin_node

    result = run_refresh(tmp_path, control_plane.kubeconfig, NAMESPACE, {node: True}, {node: SEVEN_SMALL}, retries=3)

    output = " ".join((result.stdout + result.stderr).split())
    assert result.returncode != 0
    assert plugin_pods(core, node) == []
    assert (
        f"Node {node}: allocatable does not match its MIG layout after 3s: nvidia.com/gpu expected 0, actual 1; "
        "nvidia.com/mig-1g.10gb expected 7, actual 0." in output
    ), output[-3000:]
    assert "Traceback" not in output
