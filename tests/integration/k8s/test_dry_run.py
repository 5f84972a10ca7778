"""Every object the lab renders passes the real apiserver's server-side dry-run with strict field validation:
unknown or duplicate fields, wrong types, invalid values and admission refusals all fail here, exactly as they
would on `ansible-playbook site.yml` in apply mode."""

from __future__ import annotations

import copy

import pytest
import yaml
from conftest import ensure_namespace
from kubernetes import dynamic
from kubernetes.client.rest import ApiException
from support import render_roles

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
# cert-manager's kinds (the extender's TLS) and the Prometheus Operator's (dcgm_exporter's recording rules): the test
# apiserver has none of their CRDs to check them against (tests/integration/roles/test_dcgm_exporter.py checks the
# PrometheusRule's content).
CRD_KINDS = {"Certificate", "Issuer", "PrometheusRule", "ServiceMonitor"}


@pytest.fixture(scope="module")
def lab_objects(tmp_path_factory) -> list[dict]:
    manifests = render_roles(ROLES, tmp_path_factory.mktemp("render"))
    objects = []
    for path in sorted(manifests.rglob("*.yaml")):
        skipped = NOT_API_OBJECTS | CRD_KINDS
        objects += [doc for doc in yaml.safe_load_all(path.read_text()) if doc and doc["kind"] not in skipped]
    return objects


def dry_run_apply(client: dynamic.DynamicClient, obj: dict) -> None:
    resource = client.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
    client.server_side_apply(
        resource,
        body=obj,
        field_manager="gpufleet-dry-run",
        dry_run="All",
        query_params=[("fieldValidation", "Strict")],
    )


def test_every_lab_object_passes_strict_server_side_dry_run(api, core, lab_objects):
    client = dynamic.DynamicClient(api)
    # Namespaced objects need their namespace to exist; the namespaces themselves are dry-run like the rest.
    for namespace in {obj["metadata"]["namespace"] for obj in lab_objects if obj["metadata"].get("namespace")}:
        ensure_namespace(core, namespace)
    kinds = {obj["kind"] for obj in lab_objects}
    assert {"Namespace", "ResourceQuota", "PriorityClass", "Node", "DaemonSet", "Deployment", "ClusterRole"} <= kinds

    refused = []
    for obj in lab_objects:
        try:
            dry_run_apply(client, obj)
        except ApiException as err:
            refused.append(
                f"{obj['kind']} {obj['metadata'].get('namespace', '')}/{obj['metadata']['name']}: {err.body}"
            )
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
