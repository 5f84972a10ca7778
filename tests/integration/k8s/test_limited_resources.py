"""The ResourceQuota admission configuration docs/tenants.md gives operators (limitedResources for nvidia.com/),
on a real kube-apiserver started with it: a pod asking for an nvidia.com/ resource is refused in a namespace
whose quota does not name that resource (or that has no quota), and admitted where the quota names it. Pods
without GPUs are not affected.

The configuration is read from the documentation itself, so the test fails if the documented YAML stops working.
It needs an apiserver of its own (the flag is read at start), with a controller-manager for quota status."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from conftest import REPO, ensure_namespace
from gpufleet_testsupport.controlplane import ControlPlane
from gpufleet_testsupport.waits import wait_for
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.rest import ApiException

pytestmark = pytest.mark.integration

GPU, MIG = "nvidia.com/gpu", "nvidia.com/mig-1g.10gb"


def documented_admission_config() -> dict:
    """The AdmissionConfiguration block of docs/tenants.md."""
    text = (REPO / "docs" / "tenants.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", text, flags=re.DOTALL)
    (block,) = [b for b in blocks if "kind: AdmissionConfiguration" in b]
    return yaml.safe_load(block)


@pytest.fixture(scope="module")
def core(tmp_path_factory):
    config = documented_admission_config()
    assert config["plugins"][0]["configuration"]["limitedResources"][0]["matchContains"] == ["nvidia.com/"]
    with ControlPlane(tmp_path_factory.mktemp("limited-resources"), admission_config=config) as plane:
        plane.start_controller_manager()
        yield k8s.CoreV1Api(k8s_config.new_client_from_config(config_file=str(plane.kubeconfig)))


def pod(name: str, resources: dict[str, str] | None) -> dict:
    container = {"name": "main", "image": "registry.invalid/cuda:12"}
    if resources:
        container["resources"] = {"limits": resources}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {"containers": [container]}}


def create(core, namespace: str, body: dict) -> str | None:
    """None when admitted, else the refusal's message."""
    try:
        core.create_namespaced_pod(namespace, body)
    except ApiException as err:
        return json.loads(err.body)["message"]
    return None


def quota_computed(core, namespace: str) -> bool:
    status = core.read_namespaced_resource_quota("gpufleet-gpu", namespace).status
    return bool(status and status.hard)


def test_gpu_resources_need_a_quota_that_names_them(core):
    ensure_namespace(core, "no-quota")
    ensure_namespace(core, "mig-quota")
    quota = {"metadata": {"name": "gpufleet-gpu"}, "spec": {"hard": {f"requests.{MIG}": "4"}}}
    core.create_namespaced_resource_quota("mig-quota", quota)
    wait_for(lambda: quota_computed(core, "mig-quota"), what="the quota controller to compute gpufleet-gpu")

    refused = create(core, "no-quota", pod("whole-gpu", {GPU: "1"}))
    assert refused and f"insufficient quota to consume: requests.{GPU}" in refused, refused
    # A quota limits only what it names: a resource it does not list is refused, not unlimited.
    refused = create(core, "mig-quota", pod("whole-gpu", {GPU: "1"}))
    assert refused and f"insufficient quota to consume: requests.{GPU}" in refused, refused

    assert create(core, "mig-quota", pod("mig", {MIG: "1"})) is None
    assert create(core, "no-quota", pod("cpu-only", None)) is None
