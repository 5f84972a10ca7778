"""DRA on the real control plane: ResourceSlices shaped as NVIDIA's DRA driver publishes them for H100 with
DynamicMIG (tests/dra_slices.py), the DeviceClasses the gpu_dra_driver role renders for the Hong Kong pools, and
claims allocated by the real kube-scheduler 1.36. No kubelet runs: the test plays its part (pods are deleted with
grace 0 when released).

The replay (dra_slices.replay_sequence) runs once with the stock kube-scheduler and once with gpufleet-scheduler
(GPUScore's claim scoring), and counts the large requests that fail for fragmentation: unschedulable while the
nodes' free memory slices would hold them. Every device the allocator takes is checked against
dra_placement.first_fit, the model the claim scoring and the simulator rely on."""

from __future__ import annotations

import time

import pytest
import yaml
from conftest import ensure_namespace
from dra_slices import DRIVER, dra_device_class, dra_placement, node_slices, replay_sequence
from gpufleet_testsupport.collection import render_roles
from gpufleet_testsupport.controlplane import needs_assets
from gpufleet_testsupport.scheduling import rendered_scheduler_config
from gpufleet_testsupport.waits import wait_for
from kubernetes import client as k8s

pytestmark = pytest.mark.integration

NODES = [f"dra-h100-{i}" for i in range(4)]
GPUS = 2
# Pods ask for CPU as inference pods do (4 of a node's 64): the stock scheduler's default scoring (LeastAllocated)
# then spreads them over the nodes, as it does in a real cluster; tiny requests would leave it choosing at random.
NODE_CPUS = 64
POD_CPUS = 4
# The rendered classes the replay claims through (the allocation question is per node, so one pool's MIG classes
# and another's whole-GPU class on the same nodes ask it as well as one pool would).
CLASSES = {
    "1g.10gb": dra_device_class("imagegen", "nvidia.com/mig-1g.10gb"),
    "3g.40gb": dra_device_class("imagegen", "nvidia.com/mig-3g.40gb"),
    dra_placement.WHOLE_GPU: dra_device_class("llm", "nvidia.com/gpu"),
}


@pytest.fixture(scope="module")
def resource_api(api) -> k8s.ResourceV1Api:
    return k8s.ResourceV1Api(api)


@pytest.fixture(scope="module")
def dra_nodes(core, resource_api, tmp_path_factory):
    """Four H100 nodes (2 GPUs each) with the driver's slices, and the DeviceClasses as the role renders them."""
    manifests = render_roles(
        ["gpufleet.mig.gpu_dra_driver"],
        tmp_path_factory.mktemp("dra-render"),
        "inventories/hongkong",
        {"gpufleet_gpu_allocation": "dra"},
    )
    classes = list(yaml.safe_load_all((manifests / "gpu_dra_driver/device-classes.yaml").read_text()))
    classes = [c for c in classes if c and c["metadata"]["name"] in CLASSES.values()]
    assert len(classes) == len(CLASSES)
    for device_class in classes:
        resource_api.create_device_class(device_class)
    for node in NODES:
        core.create_node(k8s.V1Node(metadata=k8s.V1ObjectMeta(name=node)))
        core.patch_node_status(node, _ready())
        core.patch_node(node, {"spec": {"taints": None}})
        for resource_slice in node_slices(node, GPUS):
            resource_api.create_resource_slice(resource_slice)
    yield NODES
    for node in NODES:
        core.delete_node(node)
    resource_api.delete_collection_resource_slice(field_selector=f"spec.driver={DRIVER}")
    for device_class in classes:
        resource_api.delete_device_class(device_class["metadata"]["name"])


def _ready() -> dict:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "lastHeartbeatTime": now}
    resources = {"cpu": str(NODE_CPUS), "memory": "512Gi", "pods": "110"}
    return {
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [{**ready, "lastTransitionTime": now}],
        }
    }


def claim_body(name: str, kind: str) -> dict:
    request = {"name": "gpu", "exactly": {"deviceClassName": CLASSES[kind]}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [request]}},
    }


def pod_body(name: str, scheduler: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": scheduler,
            "automountServiceAccountToken": False,
            "nodeSelector": {"dra-test": "replay"},
            "containers": [
                {
                    "name": "main",
                    "image": "registry.invalid/cuda:12",
                    "resources": {"requests": {"cpu": str(POD_CPUS)}, "claims": [{"name": "gpu"}]},
                }
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
        },
    }


class Replay:
    """Plays one sequence against one scheduler; keeps the nodes' GPUs as the allocations say."""

    def __init__(self, core, resource_api, namespace: str, scheduler: str):
        self.core, self.resource_api, self.namespace, self.scheduler = core, resource_api, namespace, scheduler
        self.gpus = {node: [set() for _ in range(GPUS)] for node in NODES}
        self.held: dict[int, tuple[str, int, set[int]]] = {}
        self.failures: list[tuple[int, str, bool]] = []  # (claim, kind, for fragmentation)
        self.mismatches: list[str] = []

    def run(self, sequence) -> Replay:
        releases: list[int] = []
        for op, number, kind in sequence:
            if op == "alloc":
                self.release(releases)  # consecutive releases go together: their order does not matter
                releases = []
                self.allocate(number, kind)
            else:
                releases.append(number)
        self.release(releases)
        return self

    def _outcome(self, name: str):
        pod = self.core.read_namespaced_pod(name, self.namespace)
        if pod.spec.node_name:
            return "bound"
        for condition in pod.status.conditions or []:
            if condition.type == "PodScheduled" and condition.status == "False" and condition.reason == "Unschedulable":
                return "unschedulable"
        return None

    def allocate(self, number: int, kind: str) -> None:
        name = f"c{number}"
        want = dra_placement.kind(kind)
        self.resource_api.create_namespaced_resource_claim(self.namespace, claim_body(name, kind))
        self.core.create_namespaced_pod(self.namespace, pod_body(name, self.scheduler))
        outcome = wait_for(lambda: self._outcome(name), timeout=30, interval=0.05, what=f"pod {name} scheduled")
        if outcome == "unschedulable":
            free = dra_placement.free_slices(gpu for gpus in self.gpus.values() for gpu in gpus)
            self.failures.append((number, kind, free >= want.size))
            self._delete([name])
            return
        claim = wait_for(
            lambda: self.resource_api.read_namespaced_resource_claim(name, self.namespace).status.allocation,
            what=f"claim {name} allocated",
        )
        (result,) = claim.devices.results
        node = result.pool
        minor, start = self._device(result.device)
        position = minor  # slices sorted by name put GPU minors in order
        expected = dra_placement.first_fit(self.gpus[node], want)
        if expected != (position, start):
            self.mismatches.append(f"{name} ({kind}) on {node}: {result.device}, first fit says {expected}")
        slices = set(range(start, start + want.size))
        self.gpus[node][position] |= slices
        self.held[number] = (node, position, slices)

    @staticmethod
    def _device(device: str) -> tuple[int, int]:
        parts = device.split("-")  # gpu-<minor> or gpu-<minor>-mig-<profile>-<id>-<start>
        return int(parts[1]), int(parts[-1]) if len(parts) > 2 else 0

    def release(self, numbers: list[int]) -> None:
        held = [number for number in numbers if number in self.held]  # the others failed
        self._delete([f"c{number}" for number in held])
        for number in held:
            node, position, slices = self.held.pop(number)
            self.gpus[node][position] -= slices

    def _delete(self, names: list[str]) -> None:
        """What the kubelet and the claim controller do when pods end: the pods go, then their claims are
        deallocated and removed; the next request waits until the scheduler can see the devices free."""
        for name in names:
            self.core.delete_namespaced_pod(name, self.namespace, grace_period_seconds=0)
            self.resource_api.delete_namespaced_resource_claim(name, self.namespace)

        def gone() -> bool:
            left = {c.metadata.name for c in self.resource_api.list_namespaced_resource_claim(self.namespace).items}
            return not left & set(names)

        wait_for(gone, timeout=30, interval=0.05, what=f"claims {names} released")


def label_nodes(core, value: str | None) -> None:
    for node in NODES:
        core.patch_node(node, {"metadata": {"labels": {"dra-test": value}}})


def run_replay(control_plane, core, resource_api, namespace: str, scheduler: str, config=None, binary=None):
    ensure_namespace(core, namespace)
    label_nodes(core, "replay")
    name = control_plane.start_scheduler(config, binary=binary or "kube-scheduler", name=f"{scheduler}-dra")
    try:
        return Replay(core, resource_api, namespace, scheduler).run(replay_sequence())
    finally:
        control_plane.stop_component(name)
        label_nodes(core, None)
        core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
        core.delete_namespace(namespace)


@pytest.fixture(scope="module")
def stock_replay(control_plane, core, resource_api, dra_nodes) -> Replay:
    """The replay with the stock kube-scheduler, once for the tests below."""
    return run_replay(control_plane, core, resource_api, "dra-stock", "default-scheduler")


def test_the_stock_scheduler_allocates_first_fit_and_fragments(stock_replay):
    replay = stock_replay
    # The allocator takes the first free device in slice and name order: exactly the model's first fit.
    assert replay.mismatches == []
    fragmentation = [f for f in replay.failures if f[2]]
    print(f"stock kube-scheduler: {len(replay.failures)} failed, {len(fragmentation)} for fragmentation")
    # Spread over the nodes by the default scoring, the 1g.10gb claims take a GPU on every node: whole GPUs fail
    # while the nodes hold more than enough free memory slices.
    assert len(fragmentation) >= 2
    assert {kind for _, kind, _ in fragmentation} <= {dra_placement.WHOLE_GPU, "3g.40gb"}


def gpufleet_config(tmp_path) -> dict:
    """The kube_scheduler role's plugin-mode configuration in DRA mode: GPUScore, and GPUClaimScore at preScore and
    score with the role's weight (10: the room a node keeps for large profiles outweighs the default spreading by
    CPU requests). No Prometheus answers here: every node's load is missing, allowed, and the same for all."""
    config = rendered_scheduler_config(
        tmp_path / "render",
        kube_scheduler_mode="plugin",
        gpufleet_gpu_allocation="dra",
        kube_scheduler_prometheus_allow_http=True,  # the address nothing answers on is plain http
        kube_scheduler_plugin_extra_args={"prometheusURL": "http://127.0.0.1:9", "metricsRefreshSeconds": 1},
    )
    profile = config["profiles"][0]
    assert {"name": "GPUClaimScore", "weight": 10} in profile["plugins"]["score"]["enabled"]
    return config


@needs_assets("gpufleet-scheduler")
def test_gpufleet_scheduler_halves_the_fragmentation_failures(
    control_plane, core, resource_api, stock_replay, tmp_path
):
    stock = stock_replay
    config = gpufleet_config(tmp_path)
    ours = run_replay(
        control_plane, core, resource_api, "dra-gpufleet", "gpufleet-scheduler", config, "gpufleet-scheduler"
    )
    # Node choice only: the allocator still takes the first fit on the node GPUClaimScore chose.
    assert ours.mismatches == []
    stock_fragmentation = sum(1 for f in stock.failures if f[2])
    ours_fragmentation = sum(1 for f in ours.failures if f[2])
    allocations = sum(1 for op in replay_sequence() if op[0] == "alloc")
    print(
        f"{allocations} claims: fragmentation failures stock kube-scheduler {stock_fragmentation}, "
        f"gpufleet-scheduler (GPUClaimScore) {ours_fragmentation}"
    )
    assert stock_fragmentation >= 2
    assert ours_fragmentation <= 0.5 * stock_fragmentation
