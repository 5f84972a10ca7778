"""Fixtures for the tests against a real control plane (etcd, kube-apiserver, kube-controller-manager,
kube-scheduler from `make k8s-assets`; see gpufleet_testsupport.controlplane).

One control plane serves the whole session; each test works in namespaces and on nodes of its own, or cleans up
what it shares. No kubelet runs: `FakeKubelet` plays its part for the nodes a test needs (registers the Node with
capacity and a Ready condition, reports pods running, finishes the deletion of terminating pods, changes the
advertised allocatable late, as a kubelet does after a device plugin restart).

Without the binaries every test here is skipped with one line naming `make k8s-assets`; with
GPUFLEET_REQUIRE_K8S=1 (set by `make integration`, which CI runs) a missing binary is an error instead.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from gpufleet_testsupport.collection import collections_path, try_render
from gpufleet_testsupport.controlplane import ControlPlane, assets_dir, missing_assets
from gpufleet_testsupport.scheduling import BindingWatch, node_status, register_node
from gpufleet_testsupport.waits import wait_for
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.rest import ApiException

REPO = Path(__file__).resolve().parents[3]

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    ours = [item for item in items if HERE in Path(str(item.fspath)).resolve().parents]
    missing = missing_assets()
    if not ours or not missing:
        return
    message = (
        f"no Kubernetes control-plane binaries in {assets_dir()} (missing: {', '.join(missing)}): "
        "run `make k8s-assets`, or point KUBE_ASSETS at a directory holding them"
    )
    if os.environ.get("GPUFLEET_REQUIRE_K8S"):
        raise pytest.UsageError(message)
    for item in ours:
        item.add_marker(pytest.mark.skip(reason=message))


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory):
    """etcd + kube-apiserver + kube-controller-manager for the session (schedulers are started per test)."""
    with ControlPlane(tmp_path_factory.mktemp("controlplane")) as plane:
        plane.start_controller_manager()
        yield plane


@pytest.fixture(scope="session")
def api(control_plane) -> k8s.ApiClient:
    return k8s_config.new_client_from_config(config_file=str(control_plane.kubeconfig))


@pytest.fixture(scope="session")
def core(api) -> k8s.CoreV1Api:
    return k8s.CoreV1Api(api)


@pytest.fixture
def schedulers(control_plane):
    """Starts schedulers on the session's control plane (control_plane.start_scheduler's arguments; returns the
    name) and stops each after the test."""
    names: list[str] = []

    def start(config: dict, **kwargs) -> str:
        names.append(control_plane.start_scheduler(config, **kwargs))
        return names[-1]

    yield start
    for name in names:
        control_plane.stop_component(name)


def ensure_namespace(core: k8s.CoreV1Api, name: str, labels: dict | None = None) -> None:
    """Create the namespace and wait for its default ServiceAccount (pods are refused until it exists)."""
    try:
        core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name, labels=labels)))
    except ApiException as err:
        if err.status != 409:
            raise

    def has_default_account():
        try:
            return core.read_namespaced_service_account("default", name)
        except ApiException as err:
            if err.status == 404:
                return None
            raise

    wait_for(has_default_account, what=f"the default ServiceAccount of namespace {name}")


@pytest.fixture
def namespace(core, request):
    """A namespace named after the test, and a watch of its pods' bindings. Afterwards the pods are deleted at once
    (no kubelet here to end them), so that the next test's scheduler does not place them."""
    name = request.node.name.removeprefix("test_").replace("_", "-")[:60].strip("-")
    ensure_namespace(core, name)
    bindings = BindingWatch(core, name)
    yield name, bindings
    bindings.stop()
    core.delete_collection_namespaced_pod(name, grace_period_seconds=0)


class FakeKubelet:
    """The kubelet's side of the API for some nodes: registration, pod status, final deletion, allocatable."""

    def __init__(self, core: k8s.CoreV1Api, nodes: dict[str, dict[str, str]], labels: dict[str, dict] | None = None):
        self.core = core
        self.allocatable = {name: dict(resources) for name, resources in nodes.items()}
        self.labels = labels or {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.errors: list[str] = []

    def register(self) -> FakeKubelet:
        for name in self.allocatable:
            try:
                register_node(self.core, name, self.allocatable[name], self.labels.get(name))
            except ApiException as err:
                if err.status != 409:
                    raise
                self.set_allocatable(name, self.allocatable[name])
        return self

    def set_allocatable(self, node: str, resources: dict[str, str]) -> None:
        """Report capacity = allocatable = resources (plus CPU, memory and pods) and Ready, as a kubelet's status."""
        self.allocatable[node] = dict(resources)
        self.core.patch_node_status(node, node_status(resources))

    def run_pods(self, namespace: str | None = None) -> None:
        """Mark every bound, pending pod on our nodes Running and Ready (what a kubelet reports once it starts)."""
        pods = (
            self.core.list_namespaced_pod(namespace) if namespace else self.core.list_pod_for_all_namespaces()
        ).items
        for pod in pods:
            if pod.spec.node_name in self.allocatable and pod.status.phase == "Pending":
                self._report_running(pod)

    def _report_running(self, pod) -> None:
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        status = {
            "phase": "Running",
            "conditions": [
                {"type": condition, "status": "True", "lastTransitionTime": now}
                for condition in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
            ],
        }
        self.core.patch_namespaced_pod_status(pod.metadata.name, pod.metadata.namespace, {"status": status})

    def start(self) -> FakeKubelet:
        """Finish graceful deletions on our nodes in the background (the kubelet's final delete with grace 0)."""
        self._thread = threading.Thread(target=self._loop, name="fake-kubelet", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(0.2):
            try:
                for pod in self.core.list_pod_for_all_namespaces().items:
                    if pod.spec.node_name in self.allocatable and pod.metadata.deletion_timestamp:
                        self.core.delete_namespaced_pod(
                            pod.metadata.name, pod.metadata.namespace, grace_period_seconds=0
                        )
            except ApiException as err:
                if err.status != 404:
                    self.errors.append(str(err))
            except Exception as err:
                self.errors.append(repr(err))

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(5)


def lab_hostvars() -> dict[str, dict]:
    """The Hong Kong inventory's host variables (what the lab simulates), as ansible-inventory resolves them."""
    inventory = Path(sys.executable).with_name("ansible-inventory")
    listing = subprocess.run(
        [str(inventory), "-i", str(REPO / "inventories" / "hongkong"), "--list"],
        cwd=REPO,
        env=dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg")),
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(listing.stdout)["_meta"]["hostvars"]


def lab_node_resources(hostvars: dict) -> dict[str, str]:
    """What the device plugin would advertise for a lab host (mixed strategy; its pool's time-sliced resources
    times their replicas), as the device plugin role expects it after a repartition."""
    collections_path()
    from ansible_collections.gpufleet.mig.plugins.filter.mig_layout import mig_node_resources
    from ansible_collections.gpufleet.mig.plugins.filter.tenants_model import tenants_sharing

    replicas = tenants_sharing(hostvars.get("gpufleet_tenants"))["tenants"].get(hostvars.get("gpufleet_tenant"))
    resources = mig_node_resources(
        hostvars["mig_partition_config"], hostvars["gpufleet_gpus_per_node"], replicas=replicas
    )
    return {name: str(count) for name, count in resources.items()}


def lab_gpu_hosts() -> dict[str, dict]:
    """The lab's GPU hosts (those with a MIG layout) and their variables."""
    return {host: vars_ for host, vars_ in lab_hostvars().items() if "mig_partition_config" in vars_}


def register_lab_gpu_nodes(core: k8s.CoreV1Api) -> FakeKubelet:
    """The lab's GPU nodes registered with the allocatable their layouts imply (stop the kubelet when done)."""
    hosts = lab_gpu_hosts()
    return FakeKubelet(core, {host: lab_node_resources(vars_) for host, vars_ in hosts.items()}).register()


def apply_tenants_role(control_plane, workdir: Path, **role_vars) -> None:
    """The tenants role applied to the control plane for the lab's pools (namespaces, quotas, policies, RBAC, node
    labels and taints); `role_vars` over the inventory's (gpufleet_gpu_allocation="dra": the DRA mode's)."""
    extra = {"gpufleet_k8s_mode": "apply", "gpufleet_kubeconfig": str(control_plane.kubeconfig), **role_vars}
    result, _ = try_render(["gpufleet.mig.tenants"], workdir, extra_vars=extra)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]


def kubeconfig_for_token(control_plane, token: str, path: Path) -> Path:
    """A kubeconfig that authenticates with a bearer token (a ServiceAccount's) instead of the admin cert."""
    ca = str(control_plane.pki.ca)
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "test", "cluster": {"server": control_plane.server, "certificate-authority": ca}}],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "sa@test", "context": {"cluster": "test", "user": "sa"}}],
        "current-context": "sa@test",
    }
    path.write_text(yaml.safe_dump(config))
    return path
