"""A hostile tenant against the real apiserver: the tenants role's objects for the lab inventory applied (admission
policies, Pod Security labels, quotas, pool labels and taints), then a tenant identity that may only create, get and
list pods in its own namespace tries each way out of its pool. Every attempt must be refused with a message that
says why; the tenant's legitimate GPU pod must be admitted and scheduled to its own pool.

The tenant is finnlp (namespace finnlp): its pool shares the mig-1g.10gb resource with imagegen's, so the quota
alone cannot keep it off imagegen's nodes; the admission policy and the NoExecute pool taint do."""

from __future__ import annotations

import copy
import json
import time

import pytest
from conftest import FakeKubelet, kubeconfig_for_token, lab_hostvars, lab_node_resources, wait_for
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.rest import ApiException
from support import try_render

pytestmark = pytest.mark.integration

TENANT, NAMESPACE, OTHER_NAMESPACE = "finnlp", "finnlp", "imagegen"
POOL_NODES = {f"hk-gpu-{i}" for i in range(17, 21)}
KEY = "gpufleet.io/tenant"
SCHEDULER = "gpufleet-test-tenant-scheduler"


@pytest.fixture(scope="module")
def tenants_applied(control_plane, core, tmp_path_factory):
    """The lab's 20 GPU nodes registered, then the tenants role applied to them."""
    hostvars = lab_hostvars()
    gpu_hosts = {host: vars_ for host, vars_ in hostvars.items() if "mig_partition_config" in vars_}
    kubelet = FakeKubelet(core, {host: lab_node_resources(vars_) for host, vars_ in gpu_hosts.items()}).register()
    extra = {"gpufleet_k8s_mode": "apply", "gpufleet_kubeconfig": str(control_plane.kubeconfig)}
    result, _ = try_render(["gpufleet.mig.tenants"], tmp_path_factory.mktemp("tenants"), extra_vars=extra)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    yield
    kubelet.stop()


@pytest.fixture(scope="module")
def tenant(control_plane, api, core, tenants_applied, tmp_path_factory) -> k8s.CoreV1Api:
    """A client for a ServiceAccount of the tenant namespace allowed to create, get and list pods there, and to bind
    them (as a tenant running a scheduler of its own would), and no more."""
    rbac = k8s.RbacAuthorizationV1Api(api)
    core.create_namespaced_service_account(NAMESPACE, {"metadata": {"name": "hostile"}})
    rules = [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "list"]},
        {"apiGroups": [""], "resources": ["pods/binding"], "verbs": ["create"]},
    ]
    rbac.create_namespaced_role(NAMESPACE, {"metadata": {"name": "pod-creator"}, "rules": rules})
    rbac.create_namespaced_role_binding(
        NAMESPACE,
        {
            "metadata": {"name": "pod-creator"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-creator"},
            "subjects": [{"kind": "ServiceAccount", "name": "hostile", "namespace": NAMESPACE}],
        },
    )
    request = {"spec": {"audiences": ["https://kubernetes.default.svc.cluster.local"], "expirationSeconds": 3600}}
    token = core.create_namespaced_service_account_token("hostile", NAMESPACE, request).status.token
    path = kubeconfig_for_token(control_plane, token, tmp_path_factory.mktemp("tenant") / "kubeconfig")
    return k8s.CoreV1Api(k8s_config.new_client_from_config(config_file=str(path)))


def legitimate_pod(name: str, resources: dict | None = None) -> dict:
    """What finnlp is meant to run: its pool selected and tolerated, its class, one 1g.10gb instance, and a
    container that passes Pod Security `restricted`."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
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
        },
    }


def refusal(client: k8s.CoreV1Api, pod: dict, namespace: str = NAMESPACE) -> tuple[int, str]:
    """Create the pod as `client`; return the refusal's status and message. An admitted pod fails the test."""
    try:
        client.create_namespaced_pod(namespace, pod)
    except ApiException as err:
        body = json.loads(err.body) if err.body else {}
        return err.status, " ".join(body.get("message", str(err)).split())
    pytest.fail(f"pod {pod['metadata']['name']} was admitted: {pod['spec']}")


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


def wait_for_admission_policies(tenant: k8s.CoreV1Api) -> None:
    """The binding and the policy's compiled form reach the apiserver's admission cache a moment after the apply."""

    def refused():
        pod = attack("probe-node-name-" + str(time.monotonic_ns()), lambda s: s.update(nodeName="hk-gpu-11"))
        try:
            tenant.create_namespaced_pod(NAMESPACE, pod, dry_run="All")
        except ApiException as err:
            return err.status == 403 and "may not set spec.nodeName" in (err.body or "")
        return False

    wait_for(refused, timeout=60, interval=0.5, what="the admission policy to refuse a pod with spec.nodeName")


def wait_for_quota_status(core) -> None:
    """Quota admission refuses every pod of a namespace whose quota the controller has not computed yet."""

    def computed():
        quota = core.read_namespaced_resource_quota("gpufleet-gpu", NAMESPACE)
        return quota.status and quota.status.hard

    wait_for(computed, timeout=60, what="the quota controller to compute the gpufleet-gpu quota of finnlp")


@pytest.fixture(scope="module")
def hostile(tenant, core):
    wait_for_admission_policies(tenant)
    wait_for_quota_status(core)
    return tenant


@pytest.mark.parametrize(("name", "change", "message"), ATTACKS, ids=[a[0] for a in ATTACKS])
def test_attack_is_refused_saying_why(hostile, name, change, message):
    pod = attack(name, change)
    if name == "cdi-annotation":
        pod["metadata"]["annotations"] = {"cdi.k8s.io/steal": "nvidia.com/gpu=all"}
    status, text = refusal(hostile, pod)
    assert status in (403, 422), (status, text)
    assert message in text, text


def test_whole_gpu_in_a_mig_only_namespace_is_refused_by_the_quota(hostile):
    status, text = refusal(hostile, legitimate_pod("whole-gpu", {"nvidia.com/gpu": "1"}))
    assert status == 403
    assert "exceeded quota: gpufleet-gpu" in text and "limited: requests.nvidia.com/gpu=0" in text, text


def test_system_priority_classes_are_held_at_zero_pods_by_quota(core, tenants_applied):
    quota = core.read_namespaced_resource_quota("gpufleet-no-system-priority", NAMESPACE)
    assert quota.spec.hard == {"pods": "0"}
    expressions = quota.spec.scope_selector.match_expressions
    assert [(e.scope_name, e.operator, sorted(e.values)) for e in expressions] == [
        ("PriorityClass", "In", ["system-cluster-critical", "system-node-critical"])
    ]


def test_another_tenants_namespace_and_the_own_namespace_labels_are_out_of_reach(hostile, core):
    status, text = refusal(hostile, legitimate_pod("elsewhere"), namespace=OTHER_NAMESPACE)
    assert status == 403 and 'cannot create resource "pods" in API group "" in the namespace "imagegen"' in text
    # Pod Security is a namespace label: the tenant cannot lower it.
    with pytest.raises(ApiException) as refused:
        hostile.patch_namespace(
            NAMESPACE, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "privileged"}}}
        )
    assert refused.value.status == 403
    labels = core.read_namespace(NAMESPACE).metadata.labels
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"


def test_the_legitimate_pod_is_admitted_and_scheduled_to_its_own_pool(control_plane, hostile, core):
    config = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "profiles": [{"schedulerName": SCHEDULER}],
    }
    scheduler = control_plane.start_scheduler(config, name="tenant-scheduler")
    try:
        hostile.create_namespaced_pod(NAMESPACE, legitimate_pod("finbert"))

        def bound():
            return core.read_namespaced_pod("finbert", NAMESPACE).spec.node_name

        node = wait_for(bound, timeout=60, what="the scheduler to bind the legitimate pod")
        assert node in POOL_NODES
    finally:
        control_plane.stop_component(scheduler)


def test_spec_changes_after_admission_are_checked_too(hostile, core, api):
    """Tolerations may be added to a running pod and ephemeral containers attached later: the policy checks
    updates that change the spec, whoever makes them (here the cluster admin)."""
    hostile.create_namespaced_pod(NAMESPACE, legitimate_pod("later"))
    with pytest.raises(ApiException) as refused:
        # A JSON patch appends (the apiserver added default not-ready/unreachable tolerations at creation).
        core.patch_namespaced_pod(
            "later", NAMESPACE, [{"op": "add", "path": "/spec/tolerations/-", "value": {"operator": "Exists"}}]
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
        core.patch_namespaced_pod_ephemeralcontainers("later", NAMESPACE, {"spec": {"ephemeralContainers": [debug]}})
    assert refused.value.status == 403
    assert "container(s) debug set NVIDIA_* variables" in refused.value.body
    # A label change (no spec change) still goes through on the pod.
    core.patch_namespaced_pod("later", NAMESPACE, {"metadata": {"labels": {"checked": "yes"}}})


def bind(client: k8s.CoreV1Api, pod: str, node: str) -> tuple[int, str]:
    """POST pods/<pod>/binding as `client`; (HTTP status, message). The client's own model cannot read the answer
    (a Status, not a Binding), hence the raw response."""
    body = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": pod}, "target": {"kind": "Node", "name": node}}
    try:
        answer = client.create_namespaced_pod_binding(pod, NAMESPACE, body, _preload_content=False)
    except ApiException as err:
        return err.status, " ".join(json.loads(err.body).get("message", "").split())
    return answer.status, ""


def test_binding_a_pod_to_another_pool_is_refused_and_to_its_own_allowed(hostile, core):
    """pods/binding is what a scheduler does; a tenant allowed to do it (a scheduler of its own) still binds only
    to its pool's nodes."""
    for name in ("bound-elsewhere", "bound-home"):
        pod = legitimate_pod(name)
        pod["spec"]["schedulerName"] = "nobody"  # stays pending: the test binds it
        hostile.create_namespaced_pod(NAMESPACE, pod)

    status, text = bind(hostile, "bound-elsewhere", "hk-gpu-11")
    assert status == 403, text
    assert (
        "tenant finnlp (namespace finnlp): pod bound-elsewhere may be bound only to a node of its pool "
        "(gpufleet.io/tenant=finnlp), not hk-gpu-11" in text
    )
    assert not core.read_namespaced_pod("bound-elsewhere", NAMESPACE).spec.node_name

    status, text = bind(hostile, "bound-home", "hk-gpu-17")
    assert status == 201, text
    assert core.read_namespaced_pod("bound-home", NAMESPACE).spec.node_name == "hk-gpu-17"
