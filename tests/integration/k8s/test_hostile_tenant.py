"""A hostile tenant against the real apiserver: the tenants role's objects for the lab inventory applied (admission
policies, Pod Security labels, quotas, RBAC, pool labels and taints), then a tenant of finnlp tries each way out of
its pool, its quotas and its namespace. Every attempt must be refused with a message that says why; the tenant's
legitimate work (a Deployment and a Job with a MIG instance, a ClusterIP Service, a claim its pool grants) must be
admitted and scheduled to its own pool.

The suite runs twice on one control plane, as two x509 users of the test CA:
- `role`: a member of the group the rendered RoleBinding names (gpufleet:finnlp), holding the role's Role only;
- `edit`: a user holding the built-in `edit` ClusterRole in finnlp (what most clusters grant a team), plus
  pods/binding, bindings and DRA claims (a tenant running a scheduler of its own, using DRA).
What RBAC already refuses the `role` tenant is refused with RBAC's message; the `edit` tenant meets the admission
policies. The tenant is finnlp (namespace finnlp): its pool shares the mig-1g.10gb resource with imagegen's, so
the quota alone cannot keep it off imagegen's nodes; the admission policy and the NoExecute pool taint do."""

from __future__ import annotations

import copy
import json
import time
from dataclasses import dataclass

import pytest
from conftest import apply_tenants_role, register_lab_gpu_nodes
from gpufleet_testsupport.waits import wait_for
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.rest import ApiException

pytestmark = pytest.mark.integration

TENANT, NAMESPACE, OTHER_NAMESPACE = "finnlp", "finnlp", "imagegen"
POOL_NODES = {f"hk-gpu-{i}" for i in range(17, 21)}
KEY = "gpufleet.io/tenant"
SCHEDULER = "gpufleet-test-tenant-scheduler"
# tenants_model's dra_device_class names (the dra branch's DeviceClasses): finnlp's own, and imagegen's.
OWN_CLASS, OTHER_CLASS = "gpufleet-finnlp-mig-1g.10gb", "gpufleet-imagegen-mig-1g.10gb"
IDENTITIES = ("role", "edit")


@dataclass
class Tenant:
    """One tenant identity: its API client, its CoreV1Api, and a suffix that keeps its objects' names apart."""

    identity: str
    api: k8s.ApiClient
    core: k8s.CoreV1Api

    def name(self, stem: str) -> str:
        return f"{stem}-{self.identity}"


@pytest.fixture(scope="module")
def tenants_applied(control_plane, core, tmp_path_factory):
    """The lab's 20 GPU nodes registered, then the tenants role applied to them."""
    kubelet = register_lab_gpu_nodes(core)
    apply_tenants_role(control_plane, tmp_path_factory.mktemp("tenants"))
    yield
    kubelet.stop()


def grant_edit(api: k8s.ApiClient, user: str) -> None:
    """`edit` in finnlp, plus what a tenant with a scheduler of its own and DRA claims would be given."""
    rbac = k8s.RbacAuthorizationV1Api(api)
    subjects = [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": user}]
    rbac.create_namespaced_role_binding(
        NAMESPACE,
        {
            "metadata": {"name": "team-edit"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
            "subjects": subjects,
        },
    )
    rules = [
        {"apiGroups": [""], "resources": ["pods/binding", "bindings"], "verbs": ["create"]},
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims", "resourceclaimtemplates"], "verbs": ["*"]},
    ]
    rbac.create_namespaced_role(NAMESPACE, {"metadata": {"name": "team-extras"}, "rules": rules})
    rbac.create_namespaced_role_binding(
        NAMESPACE,
        {
            "metadata": {"name": "team-extras"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "team-extras"},
            "subjects": subjects,
        },
    )


@pytest.fixture(scope="module", params=IDENTITIES)
def tenant(request, control_plane, api, tenants_applied) -> Tenant:
    """`role`: a user in the group gpufleet:finnlp, which the rendered RoleBinding names; `edit`: a user given the
    built-in edit ClusterRole and the extras above. Both authenticate with client certificates of the test CA."""
    if request.param == "role":
        path = control_plane.user_kubeconfig("mallory", ("gpufleet:finnlp",))
    else:
        grant_edit(api, "eve")
        path = control_plane.user_kubeconfig("eve")
    client = k8s_config.new_client_from_config(config_file=str(path))
    return Tenant(request.param, client, k8s.CoreV1Api(client))


def legitimate_pod(name: str, resources: dict | None = None) -> dict:
    """What finnlp is meant to run: its pool selected and tolerated, its class, one 1g.10gb instance, and a
    container that passes Pod Security `restricted`."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": pod_spec(resources),
    }


def pod_spec(resources: dict | None = None) -> dict:
    return {
        "schedulerName": SCHEDULER,
        "nodeSelector": {KEY: TENANT},
        "tolerations": [{"key": KEY, "operator": "Equal", "value": TENANT}],
        "priorityClassName": "gpufleet-batch",
        "automountServiceAccountToken": False,
        "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [
            {
                "name": "main",
                "image": "registry.invalid/finbert:1",
                "resources": {"limits": resources or {"nvidia.com/mig-1g.10gb": "1"}},
                "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
            }
        ],
    }


def message_of(err: ApiException) -> str:
    body = json.loads(err.body) if err.body else {}
    return " ".join(body.get("message", str(err)).split())


def refusal(client: k8s.CoreV1Api, pod: dict, namespace: str = NAMESPACE) -> tuple[int, str]:
    """Create the pod as `client`; return the refusal's status and message. An admitted pod fails the test."""
    try:
        client.create_namespaced_pod(namespace, pod)
    except ApiException as err:
        return err.status, message_of(err)
    pytest.fail(f"pod {pod['metadata']['name']} was admitted: {pod['spec']}")


def request(api: k8s.ApiClient, method: str, path: str, body: dict | None = None) -> tuple[int, str]:
    """Any API request as `api`: (HTTP status, the refusal's message or '')."""
    try:
        headers = {"Content-Type": "application/merge-patch+json"} if method == "PATCH" else {}
        answer = api.call_api(
            path, method, header_params=headers, body=body, _preload_content=False, _return_http_data_only=False
        )
    except ApiException as err:
        return err.status, message_of(err)
    return answer[1], ""


def attack(name: str, change) -> dict:
    pod = legitimate_pod(name)
    change(pod["spec"])
    return pod


def main_container(spec: dict) -> dict:
    return spec["containers"][0]


# Each way out of the pool: (name, how the legitimate pod is changed, what the refusal must say).
ATTACKS = [
    (
        "no-pool-selector",
        lambda s: s.pop("nodeSelector"),
        "tenant finnlp (namespace finnlp) may run only on its own pool: select it with nodeSelector "
        "gpufleet.io/tenant: finnlp",
    ),
    (
        "other-pool-selector",
        lambda s: s.update(nodeSelector={KEY: "imagegen"}),
        "may run only on its own pool",
    ),
    (
        "affinity-to-two-pools",
        lambda s: (
            s.pop("nodeSelector"),
            s.update(
                affinity={
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {"matchExpressions": [{"key": KEY, "operator": "In", "values": [TENANT, "imagegen"]}]}
                            ]
                        }
                    }
                }
            ),
        ),
        "may run only on its own pool",
    ),
    (
        "affinity-second-term-escapes",
        lambda s: (
            s.pop("nodeSelector"),
            s.update(
                affinity={
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {"matchExpressions": [{"key": KEY, "operator": "In", "values": [TENANT]}]},
                                {"matchExpressions": [{"key": "gpufleet.io/gpu-node", "operator": "Exists"}]},
                            ]
                        }
                    }
                }
            ),
        ),
        "may run only on its own pool",
    ),
    (
        "tolerate-other-pool",
        lambda s: s["tolerations"].append({"key": KEY, "operator": "Equal", "value": "imagegen"}),
        "may tolerate the pool taint gpufleet.io/tenant only with operator Equal and value finnlp, not imagegen: "
        "that would admit it to other tenants' pools",
    ),
    (
        "tolerate-every-pool",
        lambda s: s.update(tolerations=[{"key": KEY, "operator": "Exists"}]),
        "only with operator Equal and value finnlp, not any value (operator Exists)",
    ),
    (
        "tolerate-everything",
        lambda s: s["tolerations"].append({"operator": "Exists"}),
        "a toleration without a key tolerates every taint, other tenants' pool taints included",
    ),
    (
        "node-name",
        lambda s: s.update(nodeName="hk-gpu-11"),
        "may not set spec.nodeName (hk-gpu-11): naming a node skips the scheduler and the pool taint",
    ),
    (
        "visible-devices-all",
        lambda s: (
            main_container(s).update(env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]),
            main_container(s).pop("resources"),
        ),
        "container(s) main set NVIDIA_* variables; NVIDIA_VISIBLE_DEVICES and its kin select GPUs behind the "
        "device plugin's back",
    ),
    (
        "visible-devices-init-container",
        lambda s: s.update(
            initContainers=[
                {
                    **copy.deepcopy(main_container(s)),
                    "name": "fetch",
                    "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "0,1,2,3"}],
                }
            ]
        ),
        "container(s) fetch set NVIDIA_* variables",
    ),
    (
        "mig-config-devices",
        lambda s: main_container(s).update(env=[{"name": "NVIDIA_MIG_CONFIG_DEVICES", "value": "all"}]),
        "container(s) main set NVIDIA_* variables",
    ),
    (
        "env-from-unprefixed",
        lambda s: main_container(s).update(envFrom=[{"configMapRef": {"name": "settings"}}]),
        "container(s) main use envFrom without a prefix",
    ),
    (
        "env-from-prefix-n",
        lambda s: main_container(s).update(envFrom=[{"prefix": "N", "configMapRef": {"name": "settings"}}]),
        "container(s) main use envFrom without a prefix",
    ),
    (
        "cdi-annotation",
        lambda s: None,  # the annotation is added below (metadata, not spec)
        "may not set cdi.k8s.io/ annotations",
    ),
    (
        "other-tenant-priority",
        lambda s: s.update(priorityClassName="gpufleet-inference"),
        "may not use PriorityClass gpufleet-inference: its class is gpufleet-batch",
    ),
    (
        "system-priority",
        lambda s: s.update(priorityClassName="system-cluster-critical"),
        "may not use PriorityClass system-cluster-critical",
    ),
    (
        "tolerate-unschedulable",
        lambda s: s["tolerations"].append({"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}),
        "may tolerate only its pool taint gpufleet.io/tenant=finnlp and node.kubernetes.io/not-ready, "
        "node.kubernetes.io/unreachable, nvidia.com/gpu, not node.kubernetes.io/unschedulable: "
        "node.kubernetes.io/unschedulable would put the pod on a node cordoned for a MIG change",
    ),
    (
        "tolerate-control-plane",
        lambda s: s["tolerations"].append(
            {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"}
        ),
        "may tolerate only its pool taint gpufleet.io/tenant=finnlp",
    ),
    # Pod Security `restricted` on the namespace (checked before the admission policy).
    (
        "privileged",
        lambda s: main_container(s).update(securityContext={"privileged": True, "capabilities": {"drop": ["ALL"]}}),
        'violates PodSecurity "restricted:latest": privileged (container "main" must not set '
        "securityContext.privileged=true)",
    ),
    (
        "host-path",
        lambda s: (
            s.update(volumes=[{"name": "root", "hostPath": {"path": "/"}}]),
            main_container(s).update(volumeMounts=[{"name": "root", "mountPath": "/host"}]),
        ),
        'violates PodSecurity "restricted:latest": restricted volume types (volume "root" uses restricted '
        'volume type "hostPath")',
    ),
    ("host-network", lambda s: s.update(hostNetwork=True), "host namespaces (hostNetwork=true)"),
    ("host-pid", lambda s: s.update(hostPID=True), "host namespaces (hostPID=true)"),
    (
        "sys-admin",
        lambda s: main_container(s)["securityContext"].update(capabilities={"drop": ["ALL"], "add": ["SYS_ADMIN"]}),
        'unrestricted capabilities (container "main" must not include "SYS_ADMIN"',
    ),
    (
        "run-as-root",
        lambda s: s["securityContext"].update(runAsNonRoot=False, runAsUser=0),
        'violates PodSecurity "restricted:latest": runAsNonRoot != true',
    ),
]


def wait_for_admission_policies(tenant: Tenant) -> None:
    """The bindings and the policies' compiled forms reach the apiserver's admission cache a moment after the apply:
    wait until the last policy applied (the claims policy) refuses."""

    def refused():
        pod = attack("probe-node-name-" + str(time.monotonic_ns()), lambda s: s.update(nodeName="hk-gpu-11"))
        try:
            tenant.core.create_namespaced_pod(NAMESPACE, pod, dry_run="All")
        except ApiException as err:
            if not (err.status == 403 and "may not set spec.nodeName" in (err.body or "")):
                return False
        else:
            return False
        status, text = request(tenant.api, "POST", claims_path() + "?dryRun=All", claim("probe", OTHER_CLASS))
        return status == 403 and "outside its pool" in text

    wait_for(refused, timeout=60, interval=0.5, what="the admission policies to refuse")


def wait_for_quota_status(core) -> None:
    """Quota admission refuses every pod of a namespace whose quota the controller has not computed yet."""

    def computed():
        quotas = core.list_namespaced_resource_quota(NAMESPACE).items
        return len(quotas) >= 4 and all(q.status and q.status.hard for q in quotas)

    wait_for(computed, timeout=60, what="the quota controller to compute the quotas of finnlp")


@pytest.fixture(scope="module")
def hostile(tenant, core) -> Tenant:
    wait_for_admission_policies(tenant)
    wait_for_quota_status(core)
    return tenant


def rbac_refusal(verb: str, resource: str, group: str = "") -> str:
    return f'cannot {verb} resource "{resource}" in API group "{group}" in the namespace "{NAMESPACE}"'


@pytest.mark.parametrize(("name", "change", "message"), ATTACKS, ids=[a[0] for a in ATTACKS])
def test_attack_is_refused_saying_why(hostile, name, change, message):
    pod = attack(name, change)
    if name == "cdi-annotation":
        pod["metadata"]["annotations"] = {"cdi.k8s.io/steal": "nvidia.com/gpu=all"}
    status, text = refusal(hostile.core, pod)
    assert status in (403, 422), (status, text)
    assert message in text, text


@pytest.mark.parametrize(
    ("resources", "where"),
    [
        ({"nvidia.com/gpu": "1"}, "limits"),  # a whole GPU: the pool has only MIG instances
        ({"nvidia.com/mig-3g.40gb": "1"}, "limits"),  # imagegen's profile, not finnlp's
        # requests alone: refused by validation before admission (extended resources need limits)
    ],
    ids=["whole-gpu", "other-pools-profile"],
)
def test_a_gpu_resource_the_pool_does_not_offer_is_refused_naming_the_pools_resources(hostile, resources, where):
    pod = legitimate_pod("foreign-" + next(iter(resources)).split("/")[1].replace(".", "-"))
    main_container(pod["spec"])["resources"] = {where: resources}
    status, text = refusal(hostile.core, pod)
    assert status == 403, text
    asked = next(iter(resources))
    assert (
        f"container(s) main ({asked}) ask for GPU resources its pool does not offer; "
        "pool finnlp (gpufleet.io/tenant=finnlp) offers nvidia.com/mig-1g.10gb" in text
    ), text


def test_the_quota_holds_a_resource_the_pool_lacks_at_zero(core, tenants_applied):
    """Behind the admission policy, the quota would refuse the same pod: a pool's resources are counted there too."""
    quotas = {q.metadata.name: q for q in core.list_namespaced_resource_quota(NAMESPACE).items}
    assert quotas["gpufleet-gpu"].spec.hard["requests.nvidia.com/gpu"] == "0"


def test_cpu_beyond_the_namespace_quota_is_refused(hostile):
    pod = legitimate_pod("cpu-hog")
    main_container(pod["spec"])["resources"]["requests"] = {"cpu": "5000"}
    status, text = refusal(hostile.core, pod)
    assert status == 403
    assert "exceeded quota: gpufleet-objects" in text and "requested: requests.cpu=5k" in text, text


def test_system_priority_classes_are_held_at_zero_pods_by_quota(core, tenants_applied):
    quota = core.read_namespaced_resource_quota("gpufleet-no-system-priority", NAMESPACE)
    assert quota.spec.hard == {"pods": "0"}
    expressions = quota.spec.scope_selector.match_expressions
    assert [(e.scope_name, e.operator, sorted(e.values)) for e in expressions] == [
        ("PriorityClass", "In", ["system-cluster-critical", "system-node-critical"])
    ]


def test_another_tenants_namespace_its_own_namespace_quotas_and_rbac_are_out_of_reach(hostile, core):
    status, text = refusal(hostile.core, legitimate_pod("elsewhere"), namespace=OTHER_NAMESPACE)
    assert status == 403 and 'cannot create resource "pods" in API group "" in the namespace "imagegen"' in text
    # Pod Security is a namespace label: the tenant cannot lower it.
    with pytest.raises(ApiException) as refused:
        hostile.core.patch_namespace(
            NAMESPACE, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "privileged"}}}
        )
    assert refused.value.status == 403
    assert core.read_namespace(NAMESPACE).metadata.labels["pod-security.kubernetes.io/enforce"] == "restricted"
    # Nor raise its quotas, nor grant itself more.
    status, text = request(
        hostile.api,
        "PATCH",
        f"/api/v1/namespaces/{NAMESPACE}/resourcequotas/gpufleet-objects",
        {"spec": {"hard": {"requests.cpu": "100000"}}},
    )
    assert status == 403 and rbac_refusal("patch", "resourcequotas") in text, text
    binding = {
        "metadata": {"name": hostile.name("self-admin")},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "admin"},
        "subjects": [{"kind": "Group", "apiGroup": "rbac.authorization.k8s.io", "name": "gpufleet:finnlp"}],
    }
    status, text = request(
        hostile.api, "POST", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NAMESPACE}/rolebindings", binding
    )
    assert status == 403 and rbac_refusal("create", "rolebindings", "rbac.authorization.k8s.io") in text, text


def service(name: str, **spec) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {"selector": {"app": "finbert"}, "ports": [{"port": 8080}], **spec},
    }


def pdb(name: str, **spec) -> dict:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name},
        "spec": {"selector": {"matchLabels": {"app": "finbert"}}, **spec},
    }


def claim(name: str, device_class: str, **request_extra) -> dict:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class, **request_extra}}]}
        },
    }


def claims_path(kind: str = "resourceclaims") -> str:
    return f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/{kind}"


def daemonset(name: str) -> dict:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name},
        "spec": {"selector": {"matchLabels": labels}, "template": {"metadata": {"labels": labels}, "spec": pod_spec()}},
    }


OPEN_EGRESS = {
    "apiVersion": "networking.k8s.io/v1",
    "kind": "NetworkPolicy",
    "metadata": {"name": "open-egress"},
    "spec": {"podSelector": {}, "policyTypes": ["Egress"], "egress": [{}]},
}
NETWORK_POLICIES = f"/apis/networking.k8s.io/v1/namespaces/{NAMESPACE}/networkpolicies"


# Beyond pods: (name, method, path, body, the admission policy's refusal, the RBAC verb/resource/group that refuses
# the `role` tenant first or None when its Role allows the request).
OBJECT_ATTACKS = [
    (
        "service-external-ips",
        "POST",
        f"/api/v1/namespaces/{NAMESPACE}/services",
        service("capture", externalIPs=["10.96.0.60"]),
        "Service capture may not set spec.externalIPs (10.96.0.60): kube-proxy routes those addresses to it from "
        "every node and pod",
        None,
    ),
    (
        "service-node-port",
        "POST",
        f"/api/v1/namespaces/{NAMESPACE}/services",
        service("exposed", type="NodePort"),
        "Service exposed may not be of type NodePort: the pool allows ClusterIP",
        None,
    ),
    (
        "service-load-balancer",
        "POST",
        f"/api/v1/namespaces/{NAMESPACE}/services",
        service("public", type="LoadBalancer"),
        "Service public may not be of type LoadBalancer",
        None,
    ),
    (
        "daemonset",
        "POST",
        f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets",
        daemonset("everywhere"),
        "may not create DaemonSets (everywhere): a pod on every node of the pool, which a drain leaves running",
        ("create", "daemonsets", "apps"),
    ),
    (
        "pdb-max-unavailable-0",
        "POST",
        f"/apis/policy/v1/namespaces/{NAMESPACE}/poddisruptionbudgets",
        pdb("never", maxUnavailable=0, unhealthyPodEvictionPolicy="AlwaysAllow"),
        "PodDisruptionBudget never must set maxUnavailable to at least 1 (or a percentage above 0%) and no "
        "minAvailable: a budget that can allow no eviction blocks the drain",
        None,
    ),
    (
        "pdb-min-available-100%",
        "POST",
        f"/apis/policy/v1/namespaces/{NAMESPACE}/poddisruptionbudgets",
        pdb("all-of-them", minAvailable="100%", unhealthyPodEvictionPolicy="AlwaysAllow"),
        "PodDisruptionBudget all-of-them must set maxUnavailable to at least 1",
        None,
    ),
    (
        "pdb-unhealthy-pods-hold-it",
        "POST",
        f"/apis/policy/v1/namespaces/{NAMESPACE}/poddisruptionbudgets",
        pdb("sticky", maxUnavailable=1),
        "PodDisruptionBudget sticky must set unhealthyPodEvictionPolicy: AlwaysAllow",
        None,
    ),
    (
        "networkpolicy-open-egress",
        "POST",
        NETWORK_POLICIES,
        OPEN_EGRESS,
        "NetworkPolicies in tenant namespaces are the cluster admins' (system:masters, kubeadm:cluster-admins): "
        "policies add up",
        ("create", "networkpolicies", "networking.k8s.io"),
    ),
    (
        "networkpolicy-delete-egress",
        "DELETE",
        NETWORK_POLICIES + "/gpufleet-tenant-egress",
        None,
        "NetworkPolicies in tenant namespaces are the cluster admins'",
        ("delete", "networkpolicies", "networking.k8s.io"),
    ),
    (
        "claim-other-pools-class",
        "POST",
        claims_path(),
        claim("borrowed", OTHER_CLASS),
        "ResourceClaim borrowed request(s) gpu name a DeviceClass outside its pool: it may claim devices only "
        f"through {OWN_CLASS}",
        None,
    ),
    (
        "claim-vendor-class",
        "POST",
        claims_path(),
        claim("any-gpu", "gpu.nvidia.com"),
        "ResourceClaim any-gpu request(s) gpu name a DeviceClass outside its pool",
        None,
    ),
    (
        "claim-first-available-escape",
        "POST",
        claims_path(),
        {
            **claim("fallback", OWN_CLASS),
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "either",
                            "firstAvailable": [
                                {"name": "own", "deviceClassName": OWN_CLASS},
                                {"name": "theirs", "deviceClassName": OTHER_CLASS},
                            ],
                        }
                    ]
                }
            },
        },
        "ResourceClaim fallback request(s) either name a DeviceClass outside its pool",
        None,
    ),
    (
        "claim-template-other-pools-class",
        "POST",
        claims_path("resourceclaimtemplates"),
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "per-pod"},
            "spec": {"spec": claim("x", OTHER_CLASS)["spec"]},
        },
        "ResourceClaimTemplate per-pod request(s) gpu name a DeviceClass outside its pool",
        None,
    ),
    (
        "claim-admin-access",
        "POST",
        claims_path(),
        claim("inspect", OWN_CLASS, adminAccess=True),
        # The apiserver refuses it first (admin access needs a namespace label tenants cannot set); the claims
        # policy would say "ask for adminAccess" where that label is set.
        "adminAccess",
        None,
    ),
]


@pytest.mark.parametrize(
    ("name", "method", "path", "body", "message", "rbac"), OBJECT_ATTACKS, ids=[a[0] for a in OBJECT_ATTACKS]
)
def test_object_attack_is_refused_saying_why(hostile, name, method, path, body, message, rbac):
    status, text = request(hostile.api, method, path, body)
    if hostile.identity == "role" and rbac:
        assert status == 403 and rbac_refusal(*rbac) in text, (status, text)
    else:
        assert status in (403, 422), (status, text)
        assert message in text, text


def test_the_tenants_legitimate_work_is_admitted_and_scheduled_to_its_pool(control_plane, hostile, core):
    """A Deployment and a Job with a MIG instance each, a ClusterIP Service, a claim of its pool's class and a PDB
    a drain can get through: admitted; the pods their controllers make are scheduled onto finnlp's nodes."""
    api = hostile.api
    app = hostile.name("finbert")
    labels = {"app": app}
    template = {"metadata": {"labels": labels}, "spec": pod_spec()}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": app},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": template},
    }
    job_template = copy.deepcopy(template)
    job_template["spec"]["restartPolicy"] = "Never"
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": hostile.name("embed")},
        "spec": {"backoffLimit": 0, "template": job_template},
    }
    budget = pdb(app, maxUnavailable=1, unhealthyPodEvictionPolicy="AlwaysAllow")
    budget["spec"]["selector"] = {"matchLabels": labels}
    admitted = [
        ("POST", f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments", deployment),
        ("POST", f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs", job),
        ("POST", f"/api/v1/namespaces/{NAMESPACE}/services", service(app)),
        ("POST", claims_path(), claim(hostile.name("own-instance"), OWN_CLASS)),
        ("POST", f"/apis/policy/v1/namespaces/{NAMESPACE}/poddisruptionbudgets", budget),
    ]
    for method, path, body in admitted:
        status, text = request(api, method, path, body)
        assert status == 201, (body["kind"], status, text)
    assert core.read_namespaced_service(app, NAMESPACE).spec.type == "ClusterIP"

    config = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "profiles": [{"schedulerName": SCHEDULER}],
    }
    scheduler = control_plane.start_scheduler(config, name=f"tenant-scheduler-{hostile.identity}")
    try:

        def placed():
            pods = core.list_namespaced_pod(NAMESPACE).items

            def node_of(label: str, value: str) -> str | None:
                return next((p.spec.node_name for p in pods if (p.metadata.labels or {}).get(label) == value), None)

            nodes = (node_of("app", app), node_of("job-name", hostile.name("embed")))
            return nodes if all(nodes) else None

        deployment_node, job_node = wait_for(placed, timeout=90, what="the Deployment's and the Job's pods to be bound")
        assert {deployment_node, job_node} <= POOL_NODES
    finally:
        control_plane.stop_component(scheduler)


def test_changes_after_admission_are_checked_too(hostile, core):
    """Tolerations may be added to a running pod, ephemeral containers attached later and annotations added by a
    metadata-only update: the policy checks them, whoever makes them (here the cluster admin and the tenant)."""
    later = hostile.name("later")
    hostile.core.create_namespaced_pod(NAMESPACE, legitimate_pod(later))
    with pytest.raises(ApiException) as refused:
        # A JSON patch appends (the apiserver added default not-ready/unreachable tolerations at creation).
        core.patch_namespaced_pod(
            later, NAMESPACE, [{"op": "add", "path": "/spec/tolerations/-", "value": {"operator": "Exists"}}]
        )
    assert refused.value.status == 403, refused.value.body
    assert "a toleration without a key tolerates every taint" in refused.value.body

    debug = {
        "name": "debug",
        "image": "registry.invalid/busybox:1",
        "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
    }
    with pytest.raises(ApiException) as refused:
        core.patch_namespaced_pod_ephemeralcontainers(later, NAMESPACE, {"spec": {"ephemeralContainers": [debug]}})
    assert refused.value.status == 403
    assert "container(s) debug set NVIDIA_* variables" in refused.value.body

    # A CDI annotation added to the running pod by a metadata-only update (the spec does not change).
    with pytest.raises(ApiException) as refused:
        hostile.core.patch_namespaced_pod(
            later, NAMESPACE, {"metadata": {"annotations": {"cdi.k8s.io/steal": "nvidia.com/gpu=all"}}}
        )
    assert refused.value.status == 403
    assert "may not set cdi.k8s.io/ annotations" in message_of(refused.value)
    assert "cdi.k8s.io/steal" not in (core.read_namespaced_pod(later, NAMESPACE).metadata.annotations or {})
    # A label change (no spec change, no device annotation) still goes through on the pod.
    hostile.core.patch_namespaced_pod(later, NAMESPACE, {"metadata": {"labels": {"checked": "yes"}}})


def bind(api: k8s.ApiClient, pod: str, node: str, legacy: bool = False) -> tuple[int, str]:
    """POST pods/<pod>/binding (or the legacy namespaces/<ns>/bindings) as `api`; (HTTP status, message)."""
    body = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": pod}, "target": {"kind": "Node", "name": node}}
    path = f"/api/v1/namespaces/{NAMESPACE}/" + ("bindings" if legacy else f"pods/{pod}/binding")
    return request(api, "POST", path, body)


@pytest.mark.parametrize("legacy", [False, True], ids=["pods-binding", "legacy-bindings"])
def test_binding_a_pod_to_another_pool_is_refused_and_to_its_own_allowed(hostile, core, legacy):
    """pods/binding is what a scheduler does (POST .../bindings the older way to say it); a tenant allowed to do it
    (a scheduler of its own) still binds only to its pool's nodes. The `role` tenant may not bind at all."""
    elsewhere, home = hostile.name(f"bound-elsewhere-{int(legacy)}"), hostile.name(f"bound-home-{int(legacy)}")
    for name in (elsewhere, home):
        pod = legitimate_pod(name)
        pod["spec"]["schedulerName"] = "nobody"  # stays pending: the test binds it
        hostile.core.create_namespaced_pod(NAMESPACE, pod)

    status, text = bind(hostile.api, elsewhere, "hk-gpu-11", legacy)
    assert status == 403, text
    if hostile.identity == "role":
        assert rbac_refusal("create", "bindings" if legacy else "pods/binding") in text, text
    else:
        assert (
            f"tenant finnlp (namespace finnlp): pod {elsewhere} may be bound only to a node of its pool "
            "(gpufleet.io/tenant=finnlp), not hk-gpu-11" in text
        ), text
    assert not core.read_namespaced_pod(elsewhere, NAMESPACE).spec.node_name

    status, text = bind(hostile.api, home, "hk-gpu-17", legacy)
    if hostile.identity == "role":
        assert status == 403, text
    else:
        assert status == 201, text
        assert core.read_namespaced_pod(home, NAMESPACE).spec.node_name == "hk-gpu-17"
