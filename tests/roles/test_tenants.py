"""The tenants role: what it renders for the real inventories, the quotas/labels/taints it derives for small
hand-made inventories, the inventory errors it refuses, and the arguments of its apply path."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO, closed_port_kubeconfig, load_manifests, validate_manifests
from gpufleet_testsupport.collection import render_roles, run_playbook, write_inventory

TENANT_KEY = "gpufleet.io/tenant"
DEVICE_PLUGIN_CONFIG_LABEL = "nvidia.com/device-plugin.config"
MIG_OFF = [{"devices": "all", "mig_enabled": False}]


def mig_all(**profiles: int) -> list[dict]:
    """A layout giving every GPU the same MIG instances, e.g. mig_all(**{"1g.10gb": 7})."""
    return [{"devices": "all", "mig_enabled": True, "mig_devices": profiles}]


def tenant_inventory(tmp_path, pools: dict, tenants: dict, extra_gpu_hosts: dict | None = None, all_vars=None) -> str:
    """An inventory with one group per pool: pools = {group: {"tenant": t, "hosts": [...], "layout": [...],
    "gpus": n}}; extra_gpu_hosts = {host: hostvars} for GPU nodes outside any pool. Returns its path."""
    children = {}
    for group, pool in pools.items():
        group_vars = {"mig_partition_config": pool["layout"], "gpufleet_gpus_per_node": pool.get("gpus", 8)}
        if pool.get("tenant") is not None:
            group_vars["gpufleet_tenant"] = pool["tenant"]
        children[group] = {"hosts": {h: pool.get("hostvars", {}).get(h) for h in pool["hosts"]}, "vars": group_vars}
    if extra_gpu_hosts:
        children["untenanted"] = {"hosts": extra_gpu_hosts}
    inventory = {
        "all": {
            "vars": {"gpufleet_namespace": "gpufleet-system", "gpufleet_tenants": tenants, **(all_vars or {})},
            "children": {"gpu_nodes": {"children": children}},
        }
    }
    return write_inventory(tmp_path, inventory)


def by_kind(documents: dict[str, list[dict]], kind: str) -> dict[tuple[str | None, str], dict]:
    """Objects of one kind across the rendered files, keyed by (namespace, name)."""
    return {
        (doc["metadata"].get("namespace"), doc["metadata"]["name"]): doc
        for docs in documents.values()
        for doc in docs
        if doc["kind"] == kind
    }


def quotas(documents) -> dict[str, dict[str, int]]:
    """namespace -> {resource: hard limit} with the `requests.` prefix removed."""
    return {
        ns: {key.removeprefix("requests."): int(value) for key, value in doc["spec"]["hard"].items()}
        for (ns, name), doc in by_kind(documents, "ResourceQuota").items()
        if name == "gpufleet-gpu"
    }


def render_tenants(tmp_path, inventory: str, extra_vars=None) -> dict[str, list[dict]]:
    manifests = render_roles(["tenants"], tmp_path, inventory=inventory, extra_vars=extra_vars)
    validate_manifests(manifests)
    return load_manifests(manifests)


def run_tenants(tmp_path, inventory: str, extra_vars: dict):
    """Run the role and return the finished process (for the runs expected to fail)."""
    playbook = tmp_path / "tenants.yml"
    playbook.write_text(
        yaml.safe_dump([{"name": "Tenants", "hosts": "localhost", "gather_facts": False, "roles": ["tenants"]}])
    )
    base = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    return run_playbook(str(playbook), inventory, {**base, **extra_vars}, tmp_path)


# --- the real inventories ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lab_documents(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("tenants-lab")
    manifests = render_roles(["tenants"], tmp_path, inventory="inventories/hongkong+lab")
    assert validate_manifests(manifests) > 0
    return load_manifests(manifests)


def test_lab_renders_one_file_per_concern(lab_documents):
    assert set(lab_documents) == {
        "tenants/priority-classes.yaml",
        "tenants/namespaces.yaml",
        "tenants/quotas.yaml",
        "tenants/network-policies.yaml",
        "tenants/nodes.yaml",
        "tenants/admission.yaml",
        "tenants/rbac.yaml",
    }


def test_lab_quotas_are_the_pool_capacity(lab_documents):
    per_namespace = quotas(lab_documents)
    resources = {"nvidia.com/gpu", "nvidia.com/mig-3g.40gb", "nvidia.com/mig-2g.20gb", "nvidia.com/mig-1g.10gb"}
    # Every namespace names every GPU resource of the fleet: what its pool lacks is 0.
    assert all(set(q) == resources for q in per_namespace.values())
    # llm: 10 nodes x 8 whole GPUs.
    assert per_namespace["llm-inference"] == {
        "nvidia.com/gpu": 10 * 8,
        "nvidia.com/mig-3g.40gb": 0,
        "nvidia.com/mig-2g.20gb": 0,
        "nvidia.com/mig-1g.10gb": 0,
    }
    # imagegen: 6 nodes; GPUs 0-3 two 3g.40gb each, GPUs 4-7 three 2g.20gb and one 1g.10gb each.
    assert per_namespace["imagegen"] == {
        "nvidia.com/gpu": 0,
        "nvidia.com/mig-3g.40gb": 6 * 4 * 2,
        "nvidia.com/mig-2g.20gb": 6 * 4 * 3,
        "nvidia.com/mig-1g.10gb": 6 * 4 * 1,
    }
    # finnlp: 4 nodes x 8 GPUs x 7 instances, each time-sliced 4 ways (the pool's sharing), split evenly over its
    # two namespaces. imagegen's 1g.10gb above stays exclusive: sharing is per pool.
    for ns in ("finnlp", "finnlp-batch"):
        assert per_namespace[ns]["nvidia.com/mig-1g.10gb"] == 4 * 8 * 7 * 4 // 2
        assert per_namespace[ns]["nvidia.com/gpu"] == 0


def test_lab_nodes_are_labelled_and_tainted_by_pool(lab_documents):
    nodes = {name: doc for (_, name), doc in by_kind(lab_documents, "Node").items()}
    assert len(nodes) == 20
    expected_tenant = {
        f"hk-gpu-{i:02d}": "llm" if i <= 10 else "imagegen" if i <= 16 else "finnlp" for i in range(1, 21)
    }
    for name, node in nodes.items():
        tenant = expected_tenant[name]
        # Partial objects for server-side apply: nothing but the labels and taints the role owns.
        assert set(node) == {"apiVersion", "kind", "metadata", "spec"}
        assert set(node["metadata"]) == {"name", "labels"}
        labels = {"gpufleet.io/gpu-node": "true", TENANT_KEY: tenant}
        if tenant == "finnlp":  # the device plugin's config-manager picks the pool's time-slicing config by it
            labels[DEVICE_PLUGIN_CONFIG_LABEL] = "time-sliced-mig-1g.10gb-x4"
        assert node["metadata"]["labels"] == labels
        assert node["spec"] == {"taints": [{"key": TENANT_KEY, "value": tenant, "effect": "NoExecute"}]}


def test_lab_namespaces_priorities_and_isolation(lab_documents):
    namespaces = {name: doc for (_, name), doc in by_kind(lab_documents, "Namespace").items()}
    assert {n: d["metadata"]["labels"][TENANT_KEY] for n, d in namespaces.items()} == {
        "llm-inference": "llm",
        "imagegen": "imagegen",
        "finnlp": "finnlp",
        "finnlp-batch": "finnlp",
    }
    classes = {name: doc for (_, name), doc in by_kind(lab_documents, "PriorityClass").items()}
    assert classes["gpufleet-inference"]["value"] > classes["gpufleet-batch"]["value"]
    assert classes["gpufleet-batch"]["preemptionPolicy"] == "Never"
    assert namespaces["finnlp"]["metadata"]["annotations"]["gpufleet.io/priority-class"] == "gpufleet-batch"

    policies = by_kind(lab_documents, "NetworkPolicy")
    assert {ns for ns, _ in policies} == set(namespaces)
    policy = policies[("finnlp", "gpufleet-tenant-isolation")]["spec"]
    assert policy["podSelector"] == {} and policy["policyTypes"] == ["Ingress"]
    peers = policy["ingress"][0]["from"]
    assert {"podSelector": {}} in peers
    assert {"namespaceSelector": {"matchLabels": {TENANT_KEY: "finnlp"}}} in peers
    allowed = [p["namespaceSelector"]["matchExpressions"][0]["values"] for p in peers if "matchExpressions" in str(p)]
    assert allowed == [["gpufleet-system", "monitoring"]]


def test_lab_admission_policy_per_tenant(lab_documents):
    """One policy and one Deny binding per tenant, matching its namespaces' pods by name, with the tenant's own
    pool and class in the expressions and a message expression on every rule (the real refusals are tested
    against the apiserver in tests/integration/k8s/test_hostile_tenant.py)."""
    policies = {name: doc for (_, name), doc in by_kind(lab_documents, "ValidatingAdmissionPolicy").items()}
    bindings = {name: doc for (_, name), doc in by_kind(lab_documents, "ValidatingAdmissionPolicyBinding").items()}
    tenants = ("llm", "imagegen", "finnlp")
    kinds = ("", "-binding", "-objects", "-claims")
    assert set(policies) == set(bindings) == {f"gpufleet-tenant-{t}{s}" for t in tenants for s in kinds}
    for name, binding in bindings.items():
        assert binding["spec"] == {"policyName": name, "validationActions": ["Deny"]}
    # pods/binding: only to the pool's nodes (the lab's finnlp pool is hk-gpu-17..20).
    binding_policy = policies["gpufleet-tenant-finnlp-binding"]["spec"]
    assert binding_policy["matchConstraints"]["resourceRules"][0]["resources"] == ["pods/binding", "bindings"]
    (rule,) = binding_policy["validations"]
    assert rule["expression"] == 'object.target.name in ["hk-gpu-17", "hk-gpu-18", "hk-gpu-19", "hk-gpu-20"]'

    spec = policies["gpufleet-tenant-finnlp"]["spec"]
    assert spec["failurePolicy"] == "Fail"
    selector = spec["matchConstraints"]["namespaceSelector"]["matchExpressions"]
    assert selector == [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["finnlp", "finnlp-batch"]}]
    rules = spec["matchConstraints"]["resourceRules"]
    assert rules[0]["resources"] == ["pods", "pods/ephemeralcontainers"]
    assert rules[0]["operations"] == ["CREATE", "UPDATE"]
    assert all(rule.get("messageExpression") and rule["reason"] == "Forbidden" for rule in spec["validations"])
    expressions = " ".join(v["expression"] for v in spec["variables"] + spec["validations"])
    assert 'object.spec.nodeSelector["gpufleet.io/tenant"] == "finnlp"' in expressions
    assert 't.value == "finnlp"' in expressions
    assert "object.spec.nodeName" in expressions
    assert "e.name.startsWith('NVIDIA_')" in expressions
    assert "ephemeralContainers" in expressions and "initContainers" in expressions
    assert "cdi.k8s.io/" in expressions
    assert 'object.spec.priorityClassName == "gpufleet-batch"' in expressions
    assert '"imagegen"' not in expressions and '"gpufleet-inference"' not in expressions
    # Metadata-only updates are checked when the pod carries a device-granting annotation.
    assert "cdi.k8s.io/" in spec["matchConditions"][0]["expression"]

    # Claims: only the pool's own DeviceClasses, named by tenants_model's dra_device_class.
    claims = policies["gpufleet-tenant-finnlp-claims"]["spec"]
    assert [r["resources"] for r in claims["matchConstraints"]["resourceRules"]] == [
        ["resourceclaims", "resourceclaimtemplates"]
    ]
    claim_expressions = " ".join(v["expression"] for v in claims["variables"])
    assert '["gpufleet-finnlp-mig-1g.10gb"]' in claim_expressions and "imagegen" not in claim_expressions
    objects = policies["gpufleet-tenant-finnlp-objects"]["spec"]
    assert [r["resources"] for r in objects["matchConstraints"]["resourceRules"]] == [
        ["services"],
        ["daemonsets"],
        ["poddisruptionbudgets"],
        ["networkpolicies"],
    ]
    assert '["ClusterIP"]' in " ".join(v["expression"] for v in objects["validations"])


def test_lab_tenant_role_is_least_privilege_and_bound_to_the_tenants_group(lab_documents):
    roles = by_kind(lab_documents, "Role")
    bindings = by_kind(lab_documents, "RoleBinding")
    namespaces = {"llm-inference": "llm", "imagegen": "imagegen", "finnlp": "finnlp", "finnlp-batch": "finnlp"}
    assert set(roles) == set(bindings) == {(ns, "gpufleet-tenant") for ns in namespaces}
    for ns, tenant in namespaces.items():
        assert bindings[(ns, "gpufleet-tenant")]["subjects"] == [
            {"kind": "Group", "apiGroup": "rbac.authorization.k8s.io", "name": f"gpufleet:{tenant}"}
        ]
        assert bindings[(ns, "gpufleet-tenant")]["roleRef"]["kind"] == "Role"
    granted = {
        (group, resource): set(rule["verbs"])
        for rule in roles[("finnlp", "gpufleet-tenant")]["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    for wanted in [("", "pods"), ("apps", "deployments"), ("batch", "jobs"), ("", "services")]:
        assert {"create", "delete"} <= granted[wanted]
    assert {"create"} <= granted[("resource.k8s.io", "resourceclaims")]
    for kept_out in [
        ("apps", "daemonsets"),
        ("", "pods/binding"),
        ("", "bindings"),
        ("", "serviceaccounts"),
        ("", "endpoints"),
        ("networking.k8s.io", "networkpolicies"),
        ("rbac.authorization.k8s.io", "rolebindings"),
        ("", "namespaces"),
    ]:
        assert kept_out not in granted
    assert granted[("", "resourcequotas")] == {"get", "list", "watch"}
    assert all("*" not in verbs for verbs in granted.values())


def test_lab_object_cpu_memory_and_dra_quotas(lab_documents):
    quotas_by_name = by_kind(lab_documents, "ResourceQuota")
    objects = quotas_by_name[("finnlp", "gpufleet-objects")]["spec"]["hard"]
    assert objects["pods"] == "1000" and objects["requests.cpu"] == "1024" and objects["requests.memory"] == "8Ti"
    assert {"services", "configmaps", "secrets", "count/resourceclaims.resource.k8s.io"} <= set(objects)
    limits = by_kind(lab_documents, "LimitRange")[("finnlp", "gpufleet-defaults")]["spec"]["limits"]
    assert limits == [{"type": "Container", "defaultRequest": {"cpu": "100m", "memory": "256Mi"}}]
    # finnlp's 224 1g.10gb instances in devices (DRA counts devices, not time-slicing replicas), half per namespace;
    # every other pool's class is 0.
    dra = quotas_by_name[("finnlp", "gpufleet-dra")]["spec"]["hard"]
    assert dra == {
        "gpufleet-finnlp-mig-1g.10gb.deviceclass.resource.k8s.io/devices": 112,
        "gpufleet-imagegen-mig-1g.10gb.deviceclass.resource.k8s.io/devices": 0,
        "gpufleet-imagegen-mig-2g.20gb.deviceclass.resource.k8s.io/devices": 0,
        "gpufleet-imagegen-mig-3g.40gb.deviceclass.resource.k8s.io/devices": 0,
        "gpufleet-llm-gpu.deviceclass.resource.k8s.io/devices": 0,
    }
    assert (
        quotas_by_name[("llm-inference", "gpufleet-dra")]["spec"]["hard"][
            "gpufleet-llm-gpu.deviceclass.resource.k8s.io/devices"
        ]
        == 80
    )


def test_lab_pod_security_and_system_priority_quota(lab_documents):
    namespaces = {name: doc for (_, name), doc in by_kind(lab_documents, "Namespace").items()}
    for doc in namespaces.values():
        labels = doc["metadata"]["labels"]
        for mode in ("enforce", "audit", "warn"):
            assert labels[f"pod-security.kubernetes.io/{mode}"] == "restricted"
    quota = by_kind(lab_documents, "ResourceQuota")[("finnlp", "gpufleet-no-system-priority")]["spec"]
    assert quota["hard"] == {"pods": "0"}
    assert quota["scopeSelector"]["matchExpressions"] == [
        {"scopeName": "PriorityClass", "operator": "In", "values": ["system-cluster-critical", "system-node-critical"]}
    ]
    assert {ns for (ns, name) in by_kind(lab_documents, "ResourceQuota") if name == "gpufleet-no-system-priority"} == (
        set(namespaces)
    )


def test_hongkong_renders_what_the_lab_renders(lab_documents, tmp_path):
    """The lab is the Hong Kong fleet's twin: the same tenant objects come out of both inventories."""
    manifests = render_roles(["tenants"], tmp_path, inventory="inventories/hongkong")
    assert validate_manifests(manifests) == sum(len(docs) for docs in lab_documents.values())
    assert load_manifests(manifests) == lab_documents


# --- derived values on small inventories ------------------------------------------------------------------------


def test_the_config_label_names_a_config_of_the_device_plugin(tmp_path):
    # The two roles are rendered together as site.yml runs them: each time-sliced node's label must name one of the
    # device plugin's configs (config-manager fails on a name it does not have), and the config must slice that
    # pool's resource as the quota counts it.
    tenants = yaml.safe_load((REPO / "inventories/hongkong/group_vars/all/fleet.yml").read_text())["gpufleet_tenants"]
    tenants["llm"]["sharing"] = {"nvidia.com/gpu": 2}
    manifests = render_roles(
        ["gpufleet.mig.tenants", "gpufleet.mig.gpu_device_plugin"], tmp_path, extra_vars={"gpufleet_tenants": tenants}
    )
    documents = load_manifests(manifests)
    (config_map,) = by_kind(documents, "ConfigMap").values()
    configs = {name: yaml.safe_load(text) for name, text in config_map["data"].items()}
    nodes = {name: doc["metadata"]["labels"] for (_, name), doc in by_kind(documents, "Node").items()}
    chosen = {labels[TENANT_KEY]: labels.get(DEVICE_PLUGIN_CONFIG_LABEL) for labels in nodes.values()}
    assert chosen == {"llm": "time-sliced-gpu-x2", "imagegen": None, "finnlp": "time-sliced-mig-1g.10gb-x4"}
    assert set(configs) == {"default", "time-sliced-gpu-x2", "time-sliced-mig-1g.10gb-x4"}
    per_namespace = quotas(documents)
    for tenant, namespaces, resource, devices in (
        ("llm", ["llm-inference"], "nvidia.com/gpu", 10 * 8),
        ("finnlp", ["finnlp", "finnlp-batch"], "nvidia.com/mig-1g.10gb", 4 * 8 * 7),
    ):
        (entry,) = configs[chosen[tenant]]["sharing"]["timeSlicing"]["resources"]
        assert entry["name"] == resource
        assert sum(per_namespace[ns][resource] for ns in namespaces) == devices * entry["replicas"]


def test_uneven_split_overrides_and_untenanted_node(tmp_path):
    tenants = {
        "nlp": {"group": "pool_nlp", "namespaces": ["a", "b", "c"], "priority_class": "gpufleet-batch"},
        "vision": {"group": "pool_vision", "namespaces": ["v1", "v2"], "priority_class": "gpufleet-inference"},
    }
    pools = {
        # 1 node x 1 GPU x 7 instances = 7, three namespaces: 3, 2, 2 (remainder to the first).
        "pool_nlp": {"tenant": "nlp", "hosts": ["n1"], "layout": mig_all(**{"1g.10gb": 7}), "gpus": 1},
        # 2 nodes x 2 GPUs (one 3g.40gb + one 4g.40gb each) and 2 nodes x 2 whole GPUs.
        "pool_vision": {
            "tenant": "vision",
            "hosts": ["v-1", "v-2"],
            "layout": mig_all(**{"3g.40gb": 1, "4g.40gb": 1}),
            "gpus": 2,
        },
        "pool_vision_whole": {"tenant": "vision", "hosts": ["v-3", "v-4"], "layout": MIG_OFF, "gpus": 2},
    }
    # pool_vision_whole is a second inventory group of tenant vision's nodes: make the pool group its parent.
    inventory_path = tenant_inventory(tmp_path, pools, tenants, extra_gpu_hosts={"spare": None})
    inventory = yaml.safe_load(Path(inventory_path).read_text())
    children = inventory["all"]["children"]["gpu_nodes"]["children"]
    children["pool_vision"]["children"] = {"pool_vision_whole": children.pop("pool_vision_whole")}
    children["untenanted"]["vars"] = {"mig_partition_config": MIG_OFF, "gpufleet_gpus_per_node": 4}
    Path(inventory_path).write_text(yaml.safe_dump(inventory, sort_keys=False))

    overrides = {"vision": {"v2": {"nvidia.com/mig-3g.40gb": 1}}}
    documents = render_tenants(tmp_path, inventory_path, {"tenants_quota_overrides": overrides})
    per_namespace = quotas(documents)

    assert [per_namespace[ns]["nvidia.com/mig-1g.10gb"] for ns in ("a", "b", "c")] == [3, 2, 2]
    assert all(per_namespace[ns]["nvidia.com/gpu"] == 0 for ns in ("a", "b", "c"))
    # vision: 3g.40gb capacity 2 nodes x 2 GPUs = 4; v2 is pinned at 1, so v1 gets the 3 left.
    assert per_namespace["v1"]["nvidia.com/mig-3g.40gb"] == 3
    assert per_namespace["v2"]["nvidia.com/mig-3g.40gb"] == 1
    # 4g.40gb capacity 4 -> 2 + 2; whole GPUs: v-3, v-4 x 2 = 4 -> 2 + 2. The spare node's GPUs are nobody's.
    assert [per_namespace[ns]["nvidia.com/mig-4g.40gb"] for ns in ("v1", "v2")] == [2, 2]
    assert [per_namespace[ns]["nvidia.com/gpu"] for ns in ("v1", "v2")] == [2, 2]

    nodes = {name: doc for (_, name), doc in by_kind(documents, "Node").items()}
    assert set(nodes) == {"n1", "v-1", "v-2", "v-3", "v-4", "spare"}
    assert nodes["v-3"]["metadata"]["labels"][TENANT_KEY] == "vision"
    assert nodes["v-3"]["spec"]["taints"] == [{"key": TENANT_KEY, "value": "vision", "effect": "NoExecute"}]
    # A GPU node in no pool: selected by the device plugin, not tainted, no tenant.
    assert nodes["spare"]["metadata"]["labels"] == {"gpufleet.io/gpu-node": "true"}
    assert "spec" not in nodes["spare"]


def test_full_split_and_taints_kept_from_the_cluster(tmp_path):
    tenants = {"nlp": {"group": "pool_nlp", "namespaces": ["a", "b"], "priority_class": "gpufleet-batch"}}
    pools = {"pool_nlp": {"tenant": "nlp", "hosts": ["n1", "n2"], "layout": mig_all(**{"2g.20gb": 3}), "gpus": 2}}
    inventory = tenant_inventory(tmp_path, pools, tenants)
    foreign = {"key": "example.com/maintenance", "value": "yes", "effect": "NoExecute"}
    documents = render_tenants(
        tmp_path,
        inventory,
        {
            "tenants_quota_split": "full",
            "tenants_taint_effect": "PreferNoSchedule",
            # What apply mode reads from the cluster (read_nodes.yml): other managers' taints on n1.
            "tenants_cluster_foreign_taints": {"n1": [foreign]},
        },
    )
    # full: each namespace may use the whole pool (2 nodes x 2 GPUs x 3).
    assert quotas(documents)["a"]["nvidia.com/mig-2g.20gb"] == 12
    assert quotas(documents)["b"]["nvidia.com/mig-2g.20gb"] == 12
    nodes = {name: doc for (_, name), doc in by_kind(documents, "Node").items()}
    own = {"key": TENANT_KEY, "value": "nlp", "effect": "PreferNoSchedule"}
    assert nodes["n1"]["spec"]["taints"] == [foreign, own]
    assert nodes["n2"]["spec"]["taints"] == [own]


def test_pod_security_per_tenant_and_admission_switches(tmp_path):
    tenants = {
        "nlp": {"group": "pool_nlp", "namespaces": ["a"], "priority_class": "gpufleet-batch"},
        "cv": {
            "group": "pool_cv",
            "namespaces": ["c"],
            "pod_security": "baseline",
            "access": {"groups": ["team-cv"], "users": ["ana@example.org"]},
            "service_types": ["ClusterIP", "LoadBalancer"],
            "namespace_quota": {"pods": 20, "requests.cpu": "8"},
        },
        "ops": {"group": "pool_ops", "namespaces": ["o"], "pod_security": "privileged"},
    }
    pools = {
        "pool_nlp": {"tenant": "nlp", "hosts": ["n1"], "layout": MIG_OFF, "gpus": 1},
        "pool_cv": {"tenant": "cv", "hosts": ["c1"], "layout": MIG_OFF, "gpus": 1},
        "pool_ops": {"tenant": "ops", "hosts": ["o1"], "layout": MIG_OFF, "gpus": 1},
    }
    inventory = tenant_inventory(tmp_path, pools, tenants)
    documents = render_tenants(
        tmp_path,
        inventory,
        {
            "tenants_pod_security_allow_privileged": True,
            "tenants_admission_validation_actions": ["Warn", "Audit"],
            "tenants_system_priority_classes": [],
            "tenants_admission_allow_unprefixed_env_from": True,
            # The role's levels win over extra labels.
            "tenants_namespace_extra_labels": {"pod-security.kubernetes.io/enforce": "privileged", "team": "x"},
        },
    )
    enforce = {
        name: doc["metadata"]["labels"]["pod-security.kubernetes.io/enforce"]
        for (_, name), doc in by_kind(documents, "Namespace").items()
    }
    assert enforce == {"a": "restricted", "c": "baseline", "o": "privileged"}
    assert by_kind(documents, "Namespace")[(None, "a")]["metadata"]["labels"]["team"] == "x"
    bindings = by_kind(documents, "ValidatingAdmissionPolicyBinding")
    assert bindings[(None, "gpufleet-tenant-cv")]["spec"]["validationActions"] == ["Warn", "Audit"]
    assert {name for _, name in by_kind(documents, "ResourceQuota")} == {
        "gpufleet-gpu",
        "gpufleet-objects",
        "gpufleet-dra",
    }
    # The inventory's access, Service types and namespace quota (merged over tenants_namespace_quota).
    assert by_kind(documents, "RoleBinding")[("c", "gpufleet-tenant")]["subjects"] == [
        {"kind": "Group", "apiGroup": "rbac.authorization.k8s.io", "name": "team-cv"},
        {"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "ana@example.org"},
    ]
    cv_objects = by_kind(documents, "ResourceQuota")[("c", "gpufleet-objects")]["spec"]["hard"]
    assert cv_objects["pods"] == "20" and cv_objects["requests.cpu"] == "8" and cv_objects["secrets"] == "500"
    cv_types = by_kind(documents, "ValidatingAdmissionPolicy")[(None, "gpufleet-tenant-cv-objects")]["spec"]
    assert '["ClusterIP", "LoadBalancer"]' in " ".join(v["expression"] for v in cv_types["validations"])
    cv = by_kind(documents, "ValidatingAdmissionPolicy")[(None, "gpufleet-tenant-cv")]["spec"]
    assert not any("envFrom" in v["expression"] for v in cv["validations"])
    # A tenant without a PriorityClass may use none.
    priority_rule = next(v for v in cv["validations"] if "priorityClassName" in v["expression"])
    assert priority_rule["expression"] == "!has(object.spec.priorityClassName) || object.spec.priorityClassName == ''"

    # Switched off, the policies are not rendered (and deleted in apply mode).
    manifests = render_roles(
        ["tenants"],
        tmp_path / "off",
        inventory=inventory,
        extra_vars={"tenants_pod_security_allow_privileged": True, "tenants_admission_enabled": False},
    )
    assert not (manifests / "tenants" / "admission.yaml").exists()


def test_privileged_tenants_need_the_override(tmp_path):
    tenants = {
        "ops": {"group": "pool_ops", "namespaces": ["o"], "pod_security": "privileged"},
        "odd": {"group": "pool_odd", "namespaces": ["d"], "pod_security": "lenient"},
    }
    pools = {
        "pool_ops": {"tenant": "ops", "hosts": ["o1"], "layout": MIG_OFF, "gpus": 1},
        "pool_odd": {"tenant": "odd", "hosts": ["d1"], "layout": MIG_OFF, "gpus": 1},
    }
    result = run_tenants(tmp_path, tenant_inventory(tmp_path, pools, tenants), {"gpufleet_k8s_mode": "render"})
    output = " ".join(result.stdout.split())
    assert result.returncode != 0
    assert "tenant ops: pod_security privileged lets its pods run privileged" in output
    assert "set tenants_pod_security_allow_privileged to accept that" in output
    assert "tenant odd: pod_security must be restricted, baseline or privileged, not lenient" in output


# --- inventory errors -------------------------------------------------------------------------------------------


def test_inconsistent_pools_fail_naming_every_problem(tmp_path):
    tenants = {
        "llm": {"group": "pool_llm", "namespaces": ["shared"], "priority_class": "gpufleet-inference"},
        "cv": {"group": "pool_cv", "namespaces": ["shared", "cv"], "priority_class": "gpufleet-inference"},
        "ghost": {"group": "pool_empty", "namespaces": ["ghost"], "priority_class": "no-such-class"},
    }
    pools = {
        "pool_llm": {"tenant": "llm", "hosts": ["g1", "g2"], "layout": MIG_OFF},
        # g2 is also in pool_cv; g3 says it belongs to llm.
        "pool_cv": {
            "tenant": "cv",
            "hosts": ["g2", "g3"],
            "layout": MIG_OFF,
            "hostvars": {"g3": {"gpufleet_tenant": "llm"}},
        },
        "pool_empty": {"tenant": "ghost", "hosts": [], "layout": MIG_OFF},
    }
    result = run_tenants(tmp_path, tenant_inventory(tmp_path, pools, tenants), {"gpufleet_k8s_mode": "render"})
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "Traceback" not in output
    assert "host g2 is in two tenant groups: pool_llm (tenant llm) and pool_cv (tenant cv)" in output
    assert "host g3 has gpufleet_tenant=llm but is in group pool_cv of tenant cv" in output
    assert "tenant ghost: group pool_empty" in output
    assert "namespace shared is listed by two tenants: llm and cv" in output
    assert "priority_class no-such-class is not one of tenants_priority_classes" in output


def test_host_claiming_a_tenant_outside_its_group_fails(tmp_path):
    tenants = {"llm": {"group": "pool_llm", "namespaces": ["llm"], "priority_class": "gpufleet-inference"}}
    pools = {"pool_llm": {"tenant": "llm", "hosts": ["g1"], "layout": MIG_OFF}}
    inventory = tenant_inventory(
        tmp_path,
        pools,
        tenants,
        extra_gpu_hosts={
            "stray": {"gpufleet_tenant": "llm", "mig_partition_config": MIG_OFF, "gpufleet_gpus_per_node": 8}
        },
    )
    result = run_tenants(tmp_path, inventory, {"gpufleet_k8s_mode": "render"})
    assert result.returncode != 0
    assert (
        "host stray has gpufleet_tenant=llm but is in no tenant group (tenant llm uses group pool_llm)" in result.stdout
    )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"nlp": {"a": {"nvidia.com/mig-1g.10gb": 10}}},
            "tenant nlp: the explicit nvidia.com/mig-1g.10gb quotas add up to 10, more than the pool capacity of 7",
        ),
        ({"nlp": {"zz": {"nvidia.com/mig-1g.10gb": 1}}}, "tenants_quota_overrides.nlp: zz is not one of the tenant"),
        ({"nlp": {"a": {"nvidia.com/mig-7g.80gb": 1}}}, "nvidia.com/mig-7g.80gb is not exposed by any GPU node"),
        ({"other": {"a": {"nvidia.com/gpu": 1}}}, "tenants_quota_overrides: other is not a tenant"),
    ],
)
def test_bad_quota_overrides_fail(tmp_path, overrides, message):
    tenants = {"nlp": {"group": "pool_nlp", "namespaces": ["a", "b"], "priority_class": "gpufleet-batch"}}
    pools = {"pool_nlp": {"tenant": "nlp", "hosts": ["n1"], "layout": mig_all(**{"1g.10gb": 7}), "gpus": 1}}
    inventory = tenant_inventory(tmp_path, pools, tenants)
    result = run_tenants(tmp_path, inventory, {"gpufleet_k8s_mode": "render", "tenants_quota_overrides": overrides})
    assert result.returncode != 0
    assert message in result.stdout


def test_overcommit_is_accepted_when_asked_for(tmp_path):
    tenants = {"nlp": {"group": "pool_nlp", "namespaces": ["a", "b"], "priority_class": "gpufleet-batch"}}
    pools = {"pool_nlp": {"tenant": "nlp", "hosts": ["n1"], "layout": mig_all(**{"1g.10gb": 7}), "gpus": 1}}
    overrides = {"nlp": {"a": {"nvidia.com/mig-1g.10gb": 10}}}
    documents = render_tenants(
        tmp_path,
        tenant_inventory(tmp_path, pools, tenants),
        {"tenants_quota_overrides": overrides, "tenants_quota_allow_overcommit": True},
    )
    assert quotas(documents)["a"]["nvidia.com/mig-1g.10gb"] == 10
    assert quotas(documents)["b"]["nvidia.com/mig-1g.10gb"] == 0


# --- apply mode -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("read_nodes_first", "failing_task"),
    [
        (True, "Read the cluster's nodes"),
        (False, "Apply the objects with server-side apply (tenants/priority-classes)"),
    ],
)
def test_apply_mode_reaches_the_api_server(tmp_path, read_nodes_first, failing_task):
    """Check mode against a closed port: the kubernetes.core tasks accept their arguments and fail connecting."""
    tenants = {"nlp": {"group": "pool_nlp", "namespaces": ["a"], "priority_class": "gpufleet-batch"}}
    pools = {"pool_nlp": {"tenant": "nlp", "hosts": ["n1"], "layout": MIG_OFF, "gpus": 1}}
    playbook = tmp_path / "apply.yml"
    playbook.write_text(
        yaml.safe_dump(
            [{"name": "Apply", "hosts": "localhost", "gather_facts": False, "check_mode": True, "roles": ["tenants"]}]
        )
    )
    inventory = tenant_inventory(tmp_path, pools, tenants)
    extra = {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        "gpufleet_k8s_mode": "apply",
        "gpufleet_kubeconfig": closed_port_kubeconfig(tmp_path),
        "tenants_read_nodes_first": read_nodes_first,
    }
    result = run_playbook(str(playbook), inventory, extra, tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert f"TASK [{failing_task}]" in output.replace("gpufleet.mig.k8s_manifests : ", "").replace("tenants : ", "")
    assert "Connection refused" in output or "Max retries exceeded" in output
    for argument_error in ("Unsupported parameters", "missing required arguments", "is not a valid", "argument spec"):
        assert argument_error not in output


def test_invalid_layout_fails_with_the_filter_message(tmp_path):
    tenants = {"cv": {"group": "pool_cv", "namespaces": ["cv"], "priority_class": "gpufleet-inference"}}
    # Three 3g.40gb instances need 12 of a GPU's 8 memory slices.
    pools = {"pool_cv": {"tenant": "cv", "hosts": ["c1"], "layout": mig_all(**{"3g.40gb": 3}), "gpus": 1}}
    result = run_tenants(tmp_path, tenant_inventory(tmp_path, pools, tenants), {"gpufleet_k8s_mode": "render"})
    assert result.returncode != 0
    # One line naming the host and the variable, judged against the host's product (the default H100 80GB).
    assert (
        "host c1: mig_partition_config: config[0]: GPU 0 (NVIDIA H100 80GB HBM3): 3 x 3g.40gb requested, at most 2 fit"
        in " ".join(result.stdout.split())
    )
    assert "Traceback" not in result.stdout + result.stderr
