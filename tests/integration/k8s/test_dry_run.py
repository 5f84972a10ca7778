"""Every object the lab renders passes the real apiserver's server-side dry-run with strict field validation:
unknown or duplicate fields, wrong types, invalid values and admission refusals all fail here, exactly as they
would on `ansible-playbook site.yml` in apply mode. Hong Kong's objects, and those of every fleet of the fleet
matrix (tests/fleet_matrix.py: other products, pools, names and scheduler modes)."""

from __future__ import annotations

import copy

import pytest
import yaml
from conftest import ensure_namespace
from fleet_matrix import FLEETS, write_fleet
from gpufleet_testsupport.collection import render_roles
from kubernetes import dynamic
from kubernetes.client.rest import ApiException

pytestmark = pytest.mark.integration

ROLES = [
    "gpufleet.mig.tenants",
    "gpufleet.mig.gpu_device_plugin",
    "gpufleet.mig.dcgm_exporter",
    "gpufleet.mig.gpu_extender",
    # Hong Kong patches static pods on its control-plane hosts; the Deployment of a plugin-mode fleet is what
    # the apiserver here can check.
    {"role": "gpufleet.mig.kube_scheduler", "kube_scheduler_mode": "plugin"},
    "gpufleet.mig.descheduler",
]
# Configuration files rendered beside the manifests for review: not API objects.
NOT_API_OBJECTS = {"KubeSchedulerConfiguration", "DeschedulerPolicy"}
# cert-manager's kinds (the extender's TLS) and the Prometheus Operator's (the monitoring role's alert rules,
# dcgm-exporter's ServiceMonitor): the test apiserver has none of their CRDs to check them against.
CRD_KINDS = {"Certificate", "Issuer", "PrometheusRule", "ServiceMonitor"}


def rendered_objects(manifests) -> list[dict]:
    objects = []
    for path in sorted(manifests.rglob("*.yaml")):
        skipped = NOT_API_OBJECTS | CRD_KINDS
        objects += [doc for doc in yaml.safe_load_all(path.read_text()) if doc and doc["kind"] not in skipped]
    return objects


@pytest.fixture(scope="module")
def lab_objects(tmp_path_factory) -> list[dict]:
    return rendered_objects(render_roles(ROLES, tmp_path_factory.mktemp("render")))


def dry_run_apply(client: dynamic.DynamicClient, obj: dict) -> None:
    resource = client.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
    client.server_side_apply(
        resource,
        body=obj,
        field_manager="gpufleet-dry-run",
        dry_run="All",
        query_params=[("fieldValidation", "Strict")],
    )


def dry_run_all(api, core, objects: list[dict]) -> list[str]:
    """Each object through strict server-side dry-run (its namespace made first); the refusals, one line each."""
    client = dynamic.DynamicClient(api)
    for namespace in {obj["metadata"]["namespace"] for obj in objects if obj["metadata"].get("namespace")}:
        ensure_namespace(core, namespace)
    refused = []
    for obj in objects:
        try:
            dry_run_apply(client, obj)
        except ApiException as err:
            refused.append(
                f"{obj['kind']} {obj['metadata'].get('namespace', '')}/{obj['metadata']['name']}: {err.body}"
            )
    return refused


@pytest.mark.parametrize("fleet", sorted(FLEETS))
def test_every_object_of_each_matrix_fleet_passes_strict_server_side_dry_run(api, core, tmp_path, fleet):
    pools, fleet_vars = FLEETS[fleet]
    inventory = write_fleet(tmp_path / f"fleet-{fleet}", pools, fleet_vars)
    # A static-pod fleet patches its control-plane hosts' files; its plugin-mode Deployment is what an apiserver checks.
    mode = "plugin" if fleet_vars["kube_scheduler_mode"] == "static_pod" else fleet_vars["kube_scheduler_mode"]
    roles = [r if isinstance(r, str) else {**r, "kube_scheduler_mode": mode} for r in ROLES]
    objects = rendered_objects(render_roles(roles, tmp_path / "render", f"{inventory}+lab"))
    assert {"Namespace", "ResourceQuota", "DaemonSet", "Deployment"} <= {obj["kind"] for obj in objects}
    namespaces = {obj["metadata"]["name"] for obj in objects if obj["kind"] == "Namespace"}
    assert {ns for spec in pools for ns in spec["namespaces"]} <= namespaces  # the fleet's own tenants
    refused = dry_run_all(api, core, objects)
    assert refused == [], "\n".join(refused)


def test_every_lab_object_passes_strict_server_side_dry_run(api, core, lab_objects):
    kinds = {obj["kind"] for obj in lab_objects}
    assert {"Namespace", "ResourceQuota", "PriorityClass", "Node", "DaemonSet", "Deployment", "ClusterRole"} <= kinds
    refused = dry_run_all(api, core, lab_objects)
    assert refused == [], "\n".join(refused)
    print(f"{len(lab_objects)} objects of {len(kinds)} kinds passed")


def test_the_same_path_refuses_an_unknown_field(api, lab_objects):
    """The check can fail: a field the API does not know is refused (a typo in a template would be)."""
    deployment = copy.deepcopy(next(obj for obj in lab_objects if obj["kind"] == "Deployment"))
    deployment["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(ApiException) as refusal:
        dry_run_apply(dynamic.DynamicClient(api), deployment)
    message = refusal.value.body.decode()
    assert "imagePullPolicyy: field not declared in schema" in message, message
