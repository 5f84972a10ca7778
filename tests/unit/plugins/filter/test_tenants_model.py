"""The tenants role's model (gpufleet.mig.tenants_model): pools, capacity, quotas and every inventory problem."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.gpufleet.mig.plugins.filter.tenants_model import tenants_model

ALL_1G = [{"devices": "all", "mig_enabled": True, "mig_devices": {"1g.10gb": 7}}]
WHOLE = [{"devices": "all", "mig_enabled": False}]


def inventory(pools: dict[str, list[str]], layout=ALL_1G, gpus: int = 8, extra_gpu_hosts=()):
    """hostvars and groups for pools tenant -> hosts (group tenant_<name>), every host a GPU node."""
    hostvars, groups = {}, {"gpu_nodes": [], "all": []}
    for tenant, hosts in pools.items():
        groups[f"tenant_{tenant}"] = list(hosts)
        for host in hosts:
            hostvars[host] = {"gpufleet_tenant": tenant, "mig_partition_config": layout, "gpufleet_gpus_per_node": gpus}
            groups["gpu_nodes"].append(host)
    for host in extra_gpu_hosts:
        hostvars[host] = {"mig_partition_config": WHOLE, "gpufleet_gpus_per_node": gpus}
        groups["gpu_nodes"].append(host)
    return hostvars, groups


def tenant(name: str, *namespaces: str, **more) -> dict:
    return {"group": f"tenant_{name}", "namespaces": list(namespaces), **more}


def test_pool_capacity_and_an_even_split_with_the_remainder_to_the_first_namespaces():
    hostvars, groups = inventory({"nlp": ["n1", "n2"]}, extra_gpu_hosts=["spare"])
    model = tenants_model(hostvars, groups, {"nlp": tenant("nlp", "a", "b", "c")})
    assert model["errors"] == []
    assert model["resources"] == ["nvidia.com/gpu", "nvidia.com/mig-1g.10gb"]
    pool = model["tenants"]["nlp"]
    assert pool["capacity"] == {"nvidia.com/gpu": 0, "nvidia.com/mig-1g.10gb": 2 * 8 * 7}
    # 112 over three namespaces: 38, 37, 37
    assert [pool["quotas"][ns]["nvidia.com/mig-1g.10gb"] for ns in "abc"] == [38, 37, 37]
    assert model["nodes"] == {"n1": "nlp", "n2": "nlp", "spare": None}


def test_explicit_quotas_are_taken_and_the_rest_is_shared():
    hostvars, groups = inventory({"nlp": ["n1"]})
    overrides = {"nlp": {"a": {"nvidia.com/mig-1g.10gb": 50}}}
    model = tenants_model(hostvars, groups, {"nlp": tenant("nlp", "a", "b", "c")}, quota_overrides=overrides)
    quotas = model["tenants"]["nlp"]["quotas"]
    assert [quotas[ns]["nvidia.com/mig-1g.10gb"] for ns in "abc"] == [50, 3, 3]
    full = tenants_model(
        hostvars, groups, {"nlp": tenant("nlp", "a", "b", "c")}, quota_overrides=overrides, quota_split="full"
    )
    assert [full["tenants"]["nlp"]["quotas"][ns]["nvidia.com/mig-1g.10gb"] for ns in "abc"] == [50, 6, 6]


def test_overcommitted_explicit_quotas_are_refused_unless_allowed():
    hostvars, groups = inventory({"nlp": ["n1"]})
    overrides = {"nlp": {"a": {"nvidia.com/mig-1g.10gb": 60}, "b": {"nvidia.com/mig-1g.10gb": 60}}}
    args = (hostvars, groups, {"nlp": tenant("nlp", "a", "b")})
    assert tenants_model(*args, quota_overrides=overrides)["errors"] == [
        "tenant nlp: the explicit nvidia.com/mig-1g.10gb quotas add up to 120, more than the pool capacity of 56; "
        "lower them or set tenants_quota_allow_overcommit"
    ]
    assert tenants_model(*args, quota_overrides=overrides, allow_overcommit=True)["errors"] == []


def test_every_inventory_problem_is_listed():
    hostvars, groups = inventory({"llm": ["g1"], "img": ["g2"]})
    groups["tenant_img"].append("g1")  # g1 in two pools
    hostvars["g2"]["gpufleet_tenant"] = "llm"  # claims another tenant
    groups["tenant_empty"] = []
    tenants = {
        "llm": tenant("llm", "shared", "Bad_NS", priority_class="gold"),
        "img": tenant("img", "shared", pod_security="privileged"),
        "Upper": tenant("llm", "x"),
        "empty": tenant("empty", "e"),
        "nogroup": {"namespaces": ["n"]},
    }
    overrides = {"ghost": {}, "img": {"shared": {"nvidia.com/mig-7g.80gb": 1}, "other": {}}}
    model = tenants_model(
        hostvars, groups, tenants, priority_classes=["silver"], quota_overrides=overrides, quota_split="half"
    )
    assert model["errors"] == [
        "tenant llm: namespace Bad_NS is not a valid namespace name (DNS label)",
        "tenant llm: priority_class gold is not one of tenants_priority_classes (silver)",
        "host g2 has gpufleet_tenant=llm but is in group tenant_img of tenant img",
        "host g1 is in two tenant groups: tenant_llm (tenant llm) and tenant_img (tenant img); a node belongs to one "
        "pool",
        "host g1 has gpufleet_tenant=llm but is in group tenant_img of tenant img",
        "namespace shared is listed by two tenants: llm and img",
        "tenant img: pod_security privileged lets its pods run privileged, with host paths and the host network, i.e. "
        "as root on the GPU nodes; set tenants_pod_security_allow_privileged to accept that",
        "tenant Upper: the name is a label value and part of object names, so it must be a DNS label "
        "(lower-case letters, digits, -)",
        "host g1 is in two tenant groups: tenant_llm (tenant llm) and tenant_llm (tenant Upper); a node belongs to one "
        "pool",
        "host g1 has gpufleet_tenant=llm but is in group tenant_llm of tenant Upper",
        "tenant empty: group tenant_empty has no hosts (a tenant pool needs at least one GPU node)",
        "tenant nogroup: needs at least `group` and `namespaces`",
        "tenants_quota_split must be even or full, not half",
        "tenants_quota_overrides: ghost is not a tenant of gpufleet_tenants",
        "tenants_quota_overrides.img.shared: nvidia.com/mig-7g.80gb is not exposed by any GPU node of the inventory "
        "(nvidia.com/gpu, nvidia.com/mig-1g.10gb)",
        "tenants_quota_overrides.img: other is not one of the tenant namespaces (shared)",
    ]


@pytest.mark.parametrize("count", ["3", -1, True, 2.5])
def test_a_quota_must_be_a_whole_number(count):
    hostvars, groups = inventory({"nlp": ["n1"]})
    overrides = {"nlp": {"a": {"nvidia.com/mig-1g.10gb": count}}}
    errors = tenants_model(hostvars, groups, {"nlp": tenant("nlp", "a")}, quota_overrides=overrides)["errors"]
    assert errors == [f"tenants_quota_overrides.nlp.a.nvidia.com/mig-1g.10gb must be a whole number >= 0, not {count}"]


def test_gpu_nodes_need_a_layout_and_a_gpu_count_and_claims_need_a_pool():
    hostvars, groups = inventory({"nlp": ["n1"]}, extra_gpu_hosts=["stray", "bare"])
    hostvars["stray"]["gpufleet_tenant"] = "nlp"
    hostvars["bare"] = {"gpufleet_tenant": "gone"}
    errors = tenants_model(hostvars, groups, {"nlp": tenant("nlp", "a")})["errors"]
    assert errors == [
        "host stray has gpufleet_tenant=nlp but is in no tenant group (tenant nlp uses group tenant_nlp)",
        "host bare has gpufleet_tenant=gone but is in no tenant group (and gpufleet_tenants has no tenant gone)",
        "host bare needs mig_partition_config and gpufleet_gpus_per_node to size its pool",
    ]
    assert tenants_model(hostvars, groups, {})["errors"][0].startswith("gpufleet_tenants must be a non-empty mapping")


def test_an_impossible_layout_fails_with_the_layout_message():
    hostvars, groups = inventory(
        {"nlp": ["n1"]}, layout=[{"devices": "all", "mig_enabled": True, "mig_devices": {"7g.80gb": 2}}]
    )
    with pytest.raises(AnsibleFilterError, match="at most 1 fit on one GPU"):
        tenants_model(hostvars, groups, {"nlp": tenant("nlp", "a")})
