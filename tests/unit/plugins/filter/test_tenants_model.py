"""The tenants role's model (gpufleet.mig.tenants_model): pools, capacity, quotas and every inventory problem."""

from __future__ import annotations

import pytest
from ansible_collections.gpufleet.mig.plugins.filter.tenants_model import (
    dra_device_class,
    tenants_model,
    tenants_sharing,
)

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
        "host bare: gpufleet_gpus_per_node is not set (how many GPUs the host has)",
    ]
    assert tenants_model(hostvars, groups, {})["errors"][0].startswith("gpufleet_tenants must be a non-empty mapping")


def test_an_impossible_layout_is_one_error_naming_the_host_and_the_variable():
    hostvars, groups = inventory(
        {"nlp": ["n1"]}, layout=[{"devices": "all", "mig_enabled": True, "mig_devices": {"7g.80gb": 2}}]
    )
    errors = tenants_model(hostvars, groups, {"nlp": tenant("nlp", "a")})["errors"]
    assert len(errors) == 1 and errors[0].startswith("host n1: mig_partition_config: config[0]: GPU 0")
    assert errors[0].endswith("at most 1 fit on one GPU")


def test_a_layout_is_judged_against_the_hosts_own_product():
    h200 = [{"devices": "all", "mig_enabled": True, "mig_devices": {"3g.71gb": 2}}]
    hostvars, groups = inventory({"nlp": ["n1"]}, layout=h200)
    errors = tenants_model(hostvars, groups, {"nlp": tenant("nlp", "a")})["errors"]
    assert len(errors) == 1
    assert errors[0].startswith(
        "host n1: mig_partition_config: config[0]: GPU 0 (NVIDIA H100 80GB HBM3): unknown MIG profile(s) 3g.71gb"
    )
    hostvars["n1"]["gpufleet_gpu_product"] = "NVIDIA H200"
    model = tenants_model(hostvars, groups, {"nlp": tenant("nlp", "a")})
    assert model["errors"] == [] and model["tenants"]["nlp"]["capacity"]["nvidia.com/mig-3g.71gb"] == 2 * 8


def test_node_names_come_from_gpufleet_node_name_and_reserved_namespaces_are_refused():
    hostvars, groups = inventory({"nlp": ["n1"]})
    hostvars["n1"]["gpufleet_node_name"] = "node-1.example.internal"
    tenants = {"nlp": tenant("nlp", "a", "kube-system", "gpufleet-system")}
    model = tenants_model(hostvars, groups, tenants, reserved_namespaces=["gpufleet-system"])
    assert model["nodes"] == {"node-1.example.internal": "nlp"}
    assert model["tenants"]["nlp"]["node_names"] == ["node-1.example.internal"]
    assert [e.split(" (")[0] for e in model["errors"]] == [
        "tenant nlp: namespace kube-system is reserved",
        "tenant nlp: namespace gpufleet-system is reserved",
    ]


# --- time-slicing (a pool's `sharing`) -----------------------------------------------------------------------------

MIXED = [
    {"devices": [0, 1, 2, 3], "mig_enabled": True, "mig_devices": {"1g.10gb": 7}},
    {"devices": [4, 5, 6, 7], "mig_enabled": False},
]


def test_a_time_sliced_resource_counts_devices_times_replicas_in_capacity_and_quotas():
    hostvars, groups = inventory({"nlp": ["n1", "n2"], "img": ["i1"]}, layout=MIXED)
    tenants = {
        "nlp": tenant("nlp", "a", "b", "c", sharing={"nvidia.com/mig-1g.10gb": 4}),
        "img": tenant("img", "x"),
    }
    model = tenants_model(hostvars, groups, tenants)
    assert model["errors"] == []
    nlp, img = model["tenants"]["nlp"], model["tenants"]["img"]
    # 2 nodes x 4 GPUs x 7 instances = 56 devices, 4 replicas each; the whole GPUs stay exclusive.
    assert nlp["capacity"] == {"nvidia.com/gpu": 8, "nvidia.com/mig-1g.10gb": 224}
    assert [nlp["quotas"][ns]["nvidia.com/mig-1g.10gb"] for ns in "abc"] == [75, 75, 74]
    assert [nlp["quotas"][ns]["nvidia.com/gpu"] for ns in "abc"] == [3, 3, 2]
    assert nlp["sharing"] == {"nvidia.com/mig-1g.10gb": 4}
    assert nlp["device_plugin_config"] == "time-sliced-mig-1g.10gb-x4"
    # The same resource in a pool without sharing is counted once per device.
    assert img["capacity"] == {"nvidia.com/gpu": 4, "nvidia.com/mig-1g.10gb": 28}
    assert img["sharing"] == {} and img["device_plugin_config"] is None


def test_explicit_quotas_are_checked_against_the_replicated_capacity():
    hostvars, groups = inventory({"nlp": ["n1"]})  # 56 x 1g.10gb
    tenants = {"nlp": tenant("nlp", "a", "b", sharing={"1g.10gb": 2})}
    fits = {"nlp": {"a": {"nvidia.com/mig-1g.10gb": 100}}}
    model = tenants_model(hostvars, groups, tenants, quota_overrides=fits)
    assert model["errors"] == []
    assert model["tenants"]["nlp"]["quotas"]["b"]["nvidia.com/mig-1g.10gb"] == 12
    too_many = {"nlp": {"a": {"nvidia.com/mig-1g.10gb": 113}}}
    assert tenants_model(hostvars, groups, tenants, quota_overrides=too_many)["errors"] == [
        "tenant nlp: the explicit nvidia.com/mig-1g.10gb quotas add up to 113, more than the pool capacity of 112; "
        "lower them or set tenants_quota_allow_overcommit"
    ]


def test_pools_with_the_same_sharing_share_one_named_config():
    tenants = {
        "nlp": tenant("nlp", "a", sharing={"nvidia.com/mig-1g.10gb": 4}),
        "emb": tenant("emb", "e", sharing={"mig-1g.10gb": 4}),  # the simulator's short forms name the same
        "dev": tenant("dev", "d", sharing={"gpu": 2, "1g.10gb": 8}),
        "off": tenant("off", "o", sharing={"nvidia.com/gpu": 1}),  # 1 replica: exclusive, no config
        "none": tenant("none", "n"),
    }
    sharing = tenants_sharing(tenants)
    assert sharing["errors"] == []
    assert sharing["configs"] == {
        "time-sliced-gpu-x2_mig-1g.10gb-x8": {"nvidia.com/gpu": 2, "nvidia.com/mig-1g.10gb": 8},
        "time-sliced-mig-1g.10gb-x4": {"nvidia.com/mig-1g.10gb": 4},
    }
    assert sharing["labels"] == {
        "nlp": "time-sliced-mig-1g.10gb-x4",
        "emb": "time-sliced-mig-1g.10gb-x4",
        "dev": "time-sliced-gpu-x2_mig-1g.10gb-x8",
    }
    # The extender takes one count per resource: the largest any pool uses.
    assert sharing["resources"] == {"nvidia.com/gpu": 2, "nvidia.com/mig-1g.10gb": 8}
    assert tenants_sharing({"none": tenant("none", "n")})["configs"] == {}


def test_a_config_name_that_is_no_label_value_becomes_a_digest():
    sharing = tenants_sharing({"me": tenant("me", "m", sharing={"nvidia.com/mig-1g.10gb+me": 3})})
    (name,) = sharing["configs"]
    assert name.startswith("time-sliced-") and "+" not in name and len(name) <= 63
    assert sharing["labels"] == {"me": name}
    assert sharing["configs"][name] == {"nvidia.com/mig-1g.10gb+me": 3}


def test_every_sharing_problem_is_listed():
    hostvars, groups = inventory({"nlp": ["n1"], "img": ["i1"], "llm": ["l1"]})
    tenants = {
        "nlp": tenant("nlp", "a", sharing={"nvidia.com/mig-2g.20gb": 2, "amd.com/gpu": 2, "1g.10gb": 0}),
        "img": tenant("img", "b", sharing=[{"name": "nvidia.com/mig-1g.10gb", "replicas": 4}]),
        "llm": tenant("llm", "c", sharing={"1g.10gb": 65, "nvidia.com/gpu": True}),
    }
    assert tenants_model(hostvars, groups, tenants)["errors"] == [
        "tenant nlp: sharing names amd.com/gpu, which is not nvidia.com/gpu or nvidia.com/mig-<profile>",
        "tenant nlp: sharing of nvidia.com/mig-1g.10gb must be a whole number of replicas from 1 (exclusive) to 64, "
        "not 0",
        "tenant img: sharing must map a resource to its time-slicing replicas (for example "
        "{nvidia.com/mig-1g.10gb: 4}), not [{'name': 'nvidia.com/mig-1g.10gb', 'replicas': 4}]",
        "tenant llm: sharing of nvidia.com/mig-1g.10gb must be a whole number of replicas from 1 (exclusive) to 64, "
        "not 65",
        "tenant llm: sharing of nvidia.com/gpu must be a whole number of replicas from 1 (exclusive) to 64, not True",
        "tenant nlp: sharing names nvidia.com/mig-2g.20gb, which no node of its pool has (nvidia.com/mig-1g.10gb)",
    ]


@pytest.mark.parametrize(
    ("resource", "expected"),
    [
        ("nvidia.com/gpu", "gpufleet-llm-gpu"),
        ("nvidia.com/mig-1g.10gb", "gpufleet-llm-mig-1g.10gb"),
        ("mig-3g.40gb", "gpufleet-llm-mig-3g.40gb"),
        ("nvidia.com/mig-1g.10gb+me", "gpufleet-llm-mig-1g.10gb-me"),
    ],
)
def test_dra_device_class_names_one_class_per_pool_and_device_kind(resource, expected):
    assert dra_device_class("llm", resource) == expected


def test_dra_device_class_refuses_what_is_no_gpu_resource():
    with pytest.raises(ValueError, match=r"'example\.com/fpga' is not nvidia\.com/gpu"):
        dra_device_class("llm", "example.com/fpga")


def test_access_defaults_to_the_tenants_group_and_takes_the_inventorys_groups_and_users():
    hostvars, groups = inventory({"nlp": ["n1"], "cv": ["c1"]})
    tenants = {"nlp": tenant("nlp", "a"), "cv": tenant("cv", "c", access={"groups": ["team-cv"], "users": ["ana"]})}
    model = tenants_model(hostvars, groups, tenants, access_group_prefix="corp:")
    assert model["errors"] == []
    assert model["tenants"]["nlp"]["access"] == {"groups": ["corp:nlp"], "users": []}
    assert model["tenants"]["cv"]["access"] == {"groups": ["team-cv"], "users": ["ana"]}
    assert model["tenants"]["nlp"]["service_types"] == ["ClusterIP"]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"access": ["team"]}, "tenant nlp: access must be a mapping with groups and/or users"),
        ({"access": {"groups": "team"}}, "tenant nlp: access.groups must be a list of names"),
        ({"access": {"groups": ["system:authenticated"]}}, "access.groups names system:authenticated"),
        ({"access": {"groups": [], "users": []}}, "tenant nlp: access names no group and no user"),
        ({"service_types": ["NodePort", "Ingress"]}, "tenant nlp: service_types must be a non-empty list of"),
        ({"namespace_quota": {"pods": "lots"}}, "tenant nlp: namespace_quota.pods must be a quantity"),
        ({"namespace_quota": {"requests.nvidia.com/gpu": 1}}, "'requests.nvidia.com/gpu' is no ResourceQuota key"),
        ({"namespace_quota": [1]}, "tenant nlp: namespace_quota must be a mapping"),
    ],
)
def test_bad_access_service_types_and_namespace_quotas_are_listed(spec, message):
    hostvars, groups = inventory({"nlp": ["n1"]})
    model = tenants_model(hostvars, groups, {"nlp": tenant("nlp", "a", **spec)})
    assert any(message in error for error in model["errors"]), model["errors"]


def test_namespace_quota_merges_the_tenants_own_over_the_defaults():
    hostvars, groups = inventory({"nlp": ["n1"]})
    defaults = {"pods": "100", "requests.cpu": "64", "requests.memory": "1Ti"}
    model = tenants_model(
        hostvars, groups, {"nlp": tenant("nlp", "a", namespace_quota={"pods": 500})}, namespace_quota=defaults
    )
    assert model["errors"] == []
    assert model["tenants"]["nlp"]["namespace_quota"] == {"pods": "500", "requests.cpu": "64", "requests.memory": "1Ti"}


def test_dra_classes_come_from_dra_device_class_and_quotas_count_devices_not_replicas():
    hostvars, groups = inventory({"nlp": ["n1"], "llm": ["l1"]})
    hostvars["l1"]["mig_partition_config"] = WHOLE
    tenants = {"nlp": tenant("nlp", "a", "b", sharing={"nvidia.com/mig-1g.10gb": 4}), "llm": tenant("llm", "x")}
    model = tenants_model(hostvars, groups, tenants)
    assert model["errors"] == []
    nlp, llm = model["tenants"]["nlp"], model["tenants"]["llm"]
    assert nlp["dra_classes"] == {"nvidia.com/mig-1g.10gb": dra_device_class("nlp", "nvidia.com/mig-1g.10gb")}
    assert llm["dra_classes"] == {"nvidia.com/gpu": dra_device_class("llm", "nvidia.com/gpu")}
    assert model["dra_classes_fleet"] == sorted([*nlp["dra_classes"].values(), *llm["dra_classes"].values()])
    # 56 instances x 4 replicas = 224 quota, 112 per namespace = 28 devices each; the other pool's class is 0.
    assert nlp["dra_quotas"]["a"] == {"gpufleet-nlp-mig-1g.10gb": 28, "gpufleet-llm-gpu": 0}
    assert llm["dra_quotas"]["x"] == {"gpufleet-nlp-mig-1g.10gb": 0, "gpufleet-llm-gpu": 8}
