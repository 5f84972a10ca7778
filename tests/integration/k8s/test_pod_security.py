"""Pod Security of the fleet's own pods against the real apiserver's PodSecurity admission: the extender, the
secondary scheduler and the descheduler pass `restricted` in gpufleet-system; the node agents (device plugin, GPU
Feature Discovery, dcgm-exporter) need `privileged` and get it in a namespace of their own, and would be refused in
gpufleet-system. Each workload's pod template is created as a Pod with dry-run, in the namespace the lab renders
with the labels the lab renders."""

from __future__ import annotations

import copy

import pytest
import yaml
from gpufleet_testsupport.collection import render_roles
from gpufleet_testsupport.waits import wait_for
from kubernetes import dynamic
from kubernetes.client.rest import ApiException

pytestmark = pytest.mark.integration

ROLES = [
    "gpufleet.mig.gpu_device_plugin",
    "gpufleet.mig.dcgm_exporter",
    "gpufleet.mig.gpu_extender",
    # Hong Kong patches static pods on its control-plane hosts; the Deployment of a plugin-mode fleet is what
    # the apiserver here can check.
    {"role": "gpufleet.mig.kube_scheduler", "kube_scheduler_mode": "plugin"},
    "gpufleet.mig.descheduler",
]
NODE_AGENTS = {"nvidia-device-plugin", "gpu-feature-discovery", "dcgm-exporter"}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict[str, list[dict]]:
    manifests = render_roles(ROLES, tmp_path_factory.mktemp("render"))
    documents = {}
    for path in sorted(manifests.rglob("*.yaml")):
        documents[str(path.relative_to(manifests))] = [d for d in yaml.safe_load_all(path.read_text()) if d]
    return documents


@pytest.fixture(scope="module")
def namespaces(api, core, rendered) -> dict[str, dict]:
    """The rendered Namespace objects, applied (as apply mode does), each with its default ServiceAccount."""
    client = dynamic.DynamicClient(api)
    resource = client.resources.get(api_version="v1", kind="Namespace")
    found = {}
    for docs in rendered.values():
        for doc in docs:
            if doc["kind"] == "Namespace":
                client.server_side_apply(resource, body=doc, field_manager="gpufleet", force_conflicts=True)
                found[doc["metadata"]["name"]] = doc["metadata"]["labels"]
    for namespace in found:
        wait_for(
            lambda ns=namespace: any(
                sa.metadata.name == "default" for sa in core.list_namespaced_service_account(ns).items
            ),
            what=f"the default ServiceAccount of {namespace}",
        )
    return found


def workloads(rendered) -> dict[str, dict]:
    return {
        doc["metadata"]["name"]: doc
        for docs in rendered.values()
        for doc in docs
        if doc["kind"] in ("Deployment", "DaemonSet")
    }


def pod_of(workload: dict) -> dict:
    template = copy.deepcopy(workload["spec"]["template"])
    # The ServiceAccounts are not created here; Pod Security does not look at them.
    template["spec"].pop("serviceAccountName", None)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": workload["metadata"]["name"],
            **{k: v for k, v in template["metadata"].items() if k == "labels"},
        },
        "spec": template["spec"],
    }


def admit(core, namespace: str, pod: dict) -> str | None:
    """None when the apiserver would admit the pod, else its refusal."""
    try:
        core.create_namespaced_pod(namespace, pod, dry_run="All")
    except ApiException as err:
        return err.body
    return None


def test_namespace_levels(namespaces):
    assert namespaces["gpufleet-system"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert namespaces["gpufleet-node-agents"]["pod-security.kubernetes.io/enforce"] == "privileged"


def test_every_fleet_pod_is_admitted_where_it_is_rendered(core, rendered, namespaces):
    found = workloads(rendered)
    assert NODE_AGENTS | {"gpufleet-extender", "gpufleet-scheduler", "descheduler"} <= set(found)
    refusals = {
        name: refusal
        for name, workload in found.items()
        if (refusal := admit(core, workload["metadata"]["namespace"], pod_of(workload)))
    }
    assert refusals == {}
    for name in NODE_AGENTS:
        assert found[name]["metadata"]["namespace"] == "gpufleet-node-agents"
    for name in set(found) - NODE_AGENTS:
        assert found[name]["metadata"]["namespace"] == "gpufleet-system"


def test_node_agents_would_be_refused_by_restricted(core, rendered, namespaces):
    """Why they have a namespace of their own: host paths and SYS_ADMIN are not `restricted` (nor `baseline`)."""
    found = workloads(rendered)
    for name in NODE_AGENTS:
        refusal = admit(core, "gpufleet-system", pod_of(found[name]))
        assert refusal and 'violates PodSecurity \\"restricted:latest\\"' in refusal, (name, refusal)
        assert "SYS_ADMIN" in refusal
