"""The tenant workloads of `examples/`, as a user submits them, against the real apiserver with every object the
tenants role renders for the lab inventory (admission policies, Pod Security, quotas, RBAC, pool labels and taints):

- each example is created as its tenant's own identity (a user in the group the role's RoleBinding names), admitted,
  and within quota: the pods its controller makes pass admission too;
- the device-plugin forms are bound by gpufleet-scheduler (the GPUScore plugin, the kube_scheduler role's plugin-mode
  configuration) to nodes of the tenant's pool, every replica;
- the DRA forms are admitted as they are (the pod templates and the tenant's own ResourceClaimTemplate), and, with
  the tenants role in DRA mode, the DeviceClasses and ResourceClaimTemplates the gpu_dra_driver role renders and the
  driver's ResourceSlices published for every GPU node (tests/dra_slices.py), bound by gpufleet-scheduler into their
  pools with every claim allocated on the pod's node.

The examples name no scheduler (the static-pod mode's default scheduler calls the extender); as each file says, a
plugin-mode fleet adds `schedulerName: gpufleet-scheduler`, which is what this test does."""

from __future__ import annotations

import contextlib
import copy
from pathlib import Path

import pytest
import yaml
from conftest import apply_tenants_role, lab_gpu_hosts, register_lab_gpu_nodes
from dra_slices import DRIVER, node_slices
from gpufleet_testsupport.collection import REPO, render_roles
from gpufleet_testsupport.controlplane import needs_assets
from gpufleet_testsupport.scheduling import rendered_scheduler_config
from gpufleet_testsupport.waits import wait_for
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes import dynamic
from kubernetes.client.rest import ApiException
from test_scheduler_plugin import SCHEDULER, FakePrometheus, _plugin_scheduler

pytestmark = pytest.mark.integration

EXAMPLES = REPO / "examples"
KEY = "gpufleet.io/tenant"
WORKLOAD_KINDS = {"Deployment", "Job"}


def documents(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def pod_template(doc: dict) -> dict:
    return doc["spec"]["template"]


def tenant_of(doc: dict) -> str:
    return pod_template(doc)["spec"]["nodeSelector"][KEY]


@pytest.fixture(scope="module")
def pools(control_plane, core, tmp_path_factory):
    """The lab's GPU nodes registered with the allocatable their layouts imply, the tenants role applied: each
    tenant's pool nodes."""
    kubelet = register_lab_gpu_nodes(core)
    apply_tenants_role(control_plane, tmp_path_factory.mktemp("tenants"))
    members: dict[str, set[str]] = {}
    for host, vars_ in lab_gpu_hosts().items():
        members.setdefault(vars_["gpufleet_tenant"], set()).add(host)
    wait_for(
        lambda: all(q.status and q.status.hard for q in core.list_resource_quota_for_all_namespaces().items),
        timeout=60,
        what="the quota controller to compute the tenants' quotas",
    )
    yield members
    kubelet.stop()


@pytest.fixture(scope="module")
def tenant_api(control_plane):
    """Each tenant's own API client: a user in the group gpufleet:<tenant> that the rendered RoleBinding names."""
    clients: dict[str, k8s.ApiClient] = {}

    def api(tenant: str) -> k8s.ApiClient:
        if tenant not in clients:
            path = control_plane.user_kubeconfig(f"{tenant}-user", (f"gpufleet:{tenant}",))
            clients[tenant] = k8s_config.new_client_from_config(config_file=str(path))
        return clients[tenant]

    return api


def create(api: k8s.ApiClient, doc: dict, dry_run: bool = False) -> None:
    resource = dynamic.DynamicClient(api).resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
    try:
        resource.create(body=doc, namespace=doc["metadata"]["namespace"], dry_run="All" if dry_run else None)
    except ApiException as err:
        pytest.fail(f"{doc['kind']} {doc['metadata']['name']} refused: {err.status} {err.body}")


def as_pod(doc: dict, name: str) -> dict:
    """The pod the workload's controller would create from its template (what pod admission and quota judge)."""
    template = copy.deepcopy(pod_template(doc))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": doc["metadata"]["namespace"], **template.get("metadata", {})},
        "spec": template["spec"],
    }


def tenant_of_namespace(namespace: str) -> str:
    """The tenant whose namespaces (gpufleet_tenants) hold `namespace`."""
    tenants = next(iter(lab_gpu_hosts().values()))["gpufleet_tenants"]
    return next(tenant for tenant, spec in tenants.items() if namespace in spec["namespaces"])


@pytest.mark.parametrize("form", ["device-plugin", "dra"])
def test_every_example_is_admitted_as_its_tenant_with_pods_within_quota(pools, tenant_api, form):
    docs = [doc for path in sorted((EXAMPLES / form).glob("*.yaml")) for doc in documents(path)]
    workloads = [doc for doc in docs if doc["kind"] in WORKLOAD_KINDS]
    assert sorted(tenant_of(doc) for doc in workloads) == ["finnlp", "imagegen", "llm"], form
    for doc in docs:  # a tenant's own objects first (the claim template), as kubectl applies them in file order
        tenant = tenant_of_namespace(doc["metadata"]["namespace"])
        assert tenant in pools, (doc["metadata"], tenant)
        create(tenant_api(tenant), doc, dry_run=True)
        if doc["kind"] in WORKLOAD_KINDS:
            assert tenant_of(doc) == tenant, doc["metadata"]
            create(tenant_api(tenant), as_pod(doc, f"{doc['metadata']['name']}-probe"), dry_run=True)


def test_a_pod_for_a_resource_its_pool_lacks_is_refused_naming_the_pools_resources(pools, tenant_api):
    doc = next(d for d in documents(EXAMPLES / "device-plugin" / "imagegen-job.yaml") if d["kind"] == "Job")
    pod = as_pod(doc, "sdxl-whole-gpu")
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    del limits["nvidia.com/mig-3g.40gb"]
    limits["nvidia.com/gpu"] = "1"
    with pytest.raises(ApiException) as refused:
        k8s.CoreV1Api(tenant_api("imagegen")).create_namespaced_pod("imagegen", pod)
    assert refused.value.status == 403
    text = " ".join(refused.value.body.split())
    assert "container(s) render (nvidia.com/gpu) ask for GPU resources its pool does not offer" in text, text
    assert "offers nvidia.com/mig-1g.10gb, nvidia.com/mig-2g.20gb, nvidia.com/mig-3g.40gb" in text, text


@pytest.fixture
def prometheus(tmp_path):
    fake = FakePrometheus(tmp_path)
    yield fake
    fake.close()


def test_device_plugin_examples_are_bound_into_their_pools_by_gpufleet_scheduler(
    control_plane, core, api, pools, tenant_api, prometheus, tmp_path
):
    # Quiet finnlp instances in Prometheus; the other pools have no series (onMissingMetrics: allow).
    prometheus.set_loads({host: [0.1] * 24 for host in pools["finnlp"]})
    scheduler = _plugin_scheduler(control_plane, prometheus, tmp_path)
    next(scheduler)
    try:
        expected: dict[str, tuple[str, str, int]] = {}  # workload -> (tenant, namespace, pods)
        for path in sorted((EXAMPLES / "device-plugin").glob("*.yaml")):
            for doc in documents(path):
                doc = copy.deepcopy(doc)
                if doc["kind"] not in WORKLOAD_KINDS:
                    continue
                tenant, namespace = tenant_of(doc), doc["metadata"]["namespace"]
                pod_template(doc)["spec"]["schedulerName"] = SCHEDULER
                claims = [
                    v["persistentVolumeClaim"]["claimName"]
                    for v in pod_template(doc)["spec"].get("volumes", [])
                    if "persistentVolumeClaim" in v
                ]
                for claim in claims:  # the model weights' volume: an admin's PV, the tenant's claim
                    provide_volume(core, k8s.CoreV1Api(tenant_api(tenant)), namespace, claim)
                create(tenant_api(tenant), doc)
                spec = doc["spec"]
                expected[doc["metadata"]["name"]] = (
                    tenant,
                    namespace,
                    spec.get("replicas", spec.get("parallelism", 1)),
                )

        def bound():
            placed = {}
            for name, (_, namespace, _) in expected.items():
                pods = core.list_namespaced_pod(namespace, label_selector=f"app.kubernetes.io/name={name}").items
                placed[name] = [p.spec.node_name for p in pods if p.spec.node_name]
            return placed if all(len(placed[n]) == expected[n][2] for n in expected) else None

        placed = wait_for(bound, timeout=90, interval=0.5, what="every example pod to be bound")
        for name, nodes in placed.items():
            tenant = expected[name][0]
            assert set(nodes) <= pools[tenant], (name, nodes, sorted(pools[tenant]))
    finally:
        next(scheduler, None)


def provide_volume(admin: k8s.CoreV1Api, tenant: k8s.CoreV1Api, namespace: str, claim: str) -> None:
    name = f"{namespace}-{claim}"
    admin.create_persistent_volume(
        {
            "metadata": {"name": name},
            "spec": {
                "capacity": {"storage": "200Gi"},
                "accessModes": ["ReadOnlyMany"],
                "hostPath": {"path": f"/srv/{name}"},
                "claimRef": {"namespace": namespace, "name": claim},
            },
        }
    )
    tenant.create_namespaced_persistent_volume_claim(
        namespace,
        {
            "metadata": {"name": claim},
            "spec": {
                "accessModes": ["ReadOnlyMany"],
                "volumeName": name,
                "storageClassName": "",
                "resources": {"requests": {"storage": "200Gi"}},
            },
        },
    )


def delete_workloads(api: k8s.ApiClient, core: k8s.CoreV1Api, form: str) -> None:
    """The examples' workloads of one form gone, their pods with them (no kubelet ends them: grace 0)."""
    for path in sorted((EXAMPLES / form).glob("*.yaml")):
        for doc in documents(path):
            if doc["kind"] not in WORKLOAD_KINDS:
                continue
            resource = dynamic.DynamicClient(api).resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
            namespace, name = doc["metadata"]["namespace"], doc["metadata"]["name"]
            with contextlib.suppress(ApiException):
                resource.delete(name=name, namespace=namespace, body={"propagationPolicy": "Background"})
            selector = f"app.kubernetes.io/name={name}"

            def gone(namespace=namespace, selector=selector) -> bool:
                core.delete_collection_namespaced_pod(namespace, label_selector=selector, grace_period_seconds=0)
                return not core.list_namespaced_pod(namespace, label_selector=selector).items

            wait_for(gone, timeout=60, interval=0.5, what=f"{name}'s pods to go")


@pytest.fixture
def dra_fleet(control_plane, core, api, pools, tmp_path):
    """The lab's fleet in DRA mode: the tenants role's DRA form, the gpu_dra_driver role's DeviceClasses and claim
    templates, and the driver's ResourceSlices for every GPU node (H100 with DynamicMIG). Undone after."""
    delete_workloads(api, core, "device-plugin")  # the device-plugin test's pods hold the namespaces' quota
    apply_tenants_role(control_plane, tmp_path / "tenants", gpufleet_gpu_allocation="dra")
    manifests = render_roles(
        ["gpufleet.mig.gpu_dra_driver"], tmp_path / "dra", "inventories/hongkong", {"gpufleet_gpu_allocation": "dra"}
    )
    resource_api = k8s.ResourceV1Api(api)
    classes = [c for c in yaml.safe_load_all((manifests / "gpu_dra_driver/device-classes.yaml").read_text()) if c]
    templates = [t for t in yaml.safe_load_all((manifests / "gpu_dra_driver/claim-templates.yaml").read_text()) if t]
    for device_class in classes:
        resource_api.create_device_class(device_class)
    for template in templates:
        resource_api.create_namespaced_resource_claim_template(template["metadata"]["namespace"], template)
    hosts = lab_gpu_hosts()
    for host, vars_ in hosts.items():
        for resource_slice in node_slices(host, int(vars_["gpufleet_gpus_per_node"])):
            resource_api.create_resource_slice(resource_slice)
    yield resource_api
    delete_workloads(api, core, "dra")
    for namespace in {t["metadata"]["namespace"] for t in templates} | {"llm-inference"}:
        resource_api.delete_collection_namespaced_resource_claim(namespace)
        resource_api.delete_collection_namespaced_resource_claim_template(namespace)
    resource_api.delete_collection_resource_slice(field_selector=f"spec.driver={DRIVER}")
    for device_class in classes:
        resource_api.delete_device_class(device_class["metadata"]["name"])
    apply_tenants_role(control_plane, tmp_path / "tenants-again")


@needs_assets("gpufleet-scheduler")
def test_dra_examples_are_bound_into_their_pools_with_their_claims_allocated(
    core, api, pools, tenant_api, dra_fleet, schedulers, tmp_path
):
    resource_api = dra_fleet
    config = rendered_scheduler_config(
        tmp_path / "render",
        kube_scheduler_mode="plugin",
        gpufleet_gpu_allocation="dra",
        kube_scheduler_prometheus_allow_http=True,  # nothing answers there: every node's load missing, allowed
        kube_scheduler_plugin_extra_args={"prometheusURL": "http://127.0.0.1:9", "metricsRefreshSeconds": 1},
    )
    schedulers(config, binary=SCHEDULER, name=f"gpufleet-scheduler-{tmp_path.name}")
    expected: dict[str, tuple[str, str, int]] = {}  # workload -> (tenant, namespace, pods)
    for path in sorted((EXAMPLES / "dra").glob("*.yaml")):
        for doc in documents(path):
            doc = copy.deepcopy(doc)
            tenant, namespace = tenant_of_namespace(doc["metadata"]["namespace"]), doc["metadata"]["namespace"]
            if doc["kind"] in WORKLOAD_KINDS:
                pod_template(doc)["spec"]["schedulerName"] = SCHEDULER
                for volume in pod_template(doc)["spec"].get("volumes", []):
                    if claim := volume.get("persistentVolumeClaim", {}).get("claimName"):
                        with contextlib.suppress(ApiException):  # made by the device-plugin test already
                            provide_volume(core, k8s.CoreV1Api(tenant_api(tenant)), namespace, claim)
                spec = doc["spec"]
                expected[doc["metadata"]["name"]] = (
                    tenant,
                    namespace,
                    spec.get("replicas", spec.get("parallelism", 1)),
                )
            create(tenant_api(tenant), doc)

    def bound():
        placed = {}
        for name, (_, namespace, _) in expected.items():
            pods = core.list_namespaced_pod(namespace, label_selector=f"app.kubernetes.io/name={name}").items
            placed[name] = [p for p in pods if p.spec.node_name]
        return placed if all(len(placed[n]) == expected[n][2] for n in expected) else None

    placed = wait_for(bound, timeout=120, interval=0.5, what="every DRA example pod to be bound")
    for name, pods in placed.items():
        tenant, namespace, _ = expected[name]
        assert {p.spec.node_name for p in pods} <= pools[tenant], (name, [p.spec.node_name for p in pods])
        for pod in pods:
            statuses = pod.status.resource_claim_statuses or []
            assert statuses, f"{pod.metadata.name}: no claim made from its template"
            for status in statuses:
                claim = resource_api.read_namespaced_resource_claim(status.resource_claim_name, namespace)
                allocation = claim.status.allocation
                assert allocation is not None, claim.metadata.name
                results = allocation.devices.results
                assert results and {r.pool for r in results} == {pod.spec.node_name}, (claim.metadata.name, results)
                if name == "llama-70b":
                    assert len({r.device for r in results}) == 8
