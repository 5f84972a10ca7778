"""The fleet matrix: small fleets other than Hong Kong's (H100 80GB, H200 141GB and a product without MIG x MIG off /
mixed layouts / time-sliced pools, nodes of 2, 4 and 8 GPUs, several products in one fleet), written as inventories.
tests/roles/test_fleets.py runs site.yml on each in the lab; tests/integration/k8s/test_dry_run.py puts
every object the roles render for each through the real apiserver's strict server-side dry-run."""

from __future__ import annotations

from pathlib import Path

import yaml

H100, H200, L4 = "NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA L4"
OFF = [{"devices": "all", "mig_enabled": False}]


def mig(devices, **profiles):
    return {"devices": devices, "mig_enabled": True, "mig_devices": profiles}


def pool(tenant, hosts, product, gpus, layout, sharing=None, namespaces=None):
    return {
        "tenant": tenant,
        "hosts": hosts,
        "vars": {
            "gpufleet_tenant": tenant,
            "gpufleet_gpu_product": product,
            "gpufleet_gpus_per_node": gpus,
            "mig_partition_config": layout,
        },
        "sharing": sharing,
        "namespaces": namespaces or [tenant],
    }


# name -> (pools, fleet-wide vars). Two or three tiny hosts each: the matrix, not the scale, is what is tested.
FLEETS = {
    # H100 only: MIG off on a 4-GPU node, a mixed layout (MIG on two profiles, two GPUs whole) on an 8-GPU node; the
    # scheduler as kubeadm's static pod, patched in the control-plane host's tree.
    "h100": (
        [
            pool("whole", ["h100-whole-1"], H100, 4, OFF),
            pool(
                "mixed",
                ["h100-mixed-1"],
                H100,
                8,
                [mig([0, 1, 2], **{"3g.40gb": 2}), mig([3, 4, 5], **{"2g.20gb": 3, "1g.10gb": 1})],
                namespaces=["mixed", "mixed-batch"],
            ),
        ],
        {
            "kube_scheduler_mode": "static_pod",
            "gpu_extender_cluster_ip": "10.96.0.50",
            "gpu_extender_scheduler_host_cidrs": ["192.0.2.10/32"],
        },
    ),
    # H200 only: a mixed layout of H200 profiles on an 8-GPU node, a time-sliced pool on a 4-GPU node.
    "h200": (
        [
            pool("gen", ["h200-gen-1"], H200, 8, [mig([0, 1, 2, 3], **{"3g.71gb": 2}), mig([4], **{"7g.141gb": 1})]),
            pool("nlp", ["h200-nlp-1"], H200, 4, [mig("all", **{"1g.18gb": 7})], {"nvidia.com/mig-1g.18gb": 3}),
        ],
        {"kube_scheduler_mode": "plugin"},
    ),
    # Three products in one fleet: H200 whole GPUs, H100 time-sliced 1g.20gb, L4 (no MIG) time-sliced whole GPUs.
    "mixed": (
        [
            pool("llm", ["h200-llm-1"], H200, 8, OFF),
            pool("emb", ["h100-emb-1"], H100, 4, [mig("all", **{"1g.20gb": 4})], {"nvidia.com/mig-1g.20gb": 2}),
            pool("video", ["l4-video-1", "l4-video-2"], L4, 2, OFF, {"nvidia.com/gpu": 2}),
        ],
        {"kube_scheduler_mode": "secondary"},
    ),
}


def write_fleet(directory: Path, pools, fleet_vars) -> Path:
    """An inventory directory: hosts.yml with each pool's group and vars, the tenants in group all."""
    tenants = {}
    children = {}
    for spec in pools:
        group = f"pool_{spec['tenant']}"
        children[group] = {"hosts": dict.fromkeys(spec["hosts"]), "vars": spec["vars"]}
        tenants[spec["tenant"]] = {
            "group": group,
            "namespaces": spec["namespaces"],
            "priority_class": "gpufleet-inference",
            **({"sharing": spec["sharing"]} if spec["sharing"] else {}),
        }
    inventory = {
        "all": {
            "vars": {
                "gpufleet_k8s_mode": "apply",
                "gpufleet_namespace": "gpufleet-system",
                "gpufleet_node_agents_namespace": "gpufleet-node-agents",
                "gpufleet_tenants": tenants,
                **fleet_vars,
            },
            "children": {"control_plane": {"hosts": {"cp-1": None}}, "gpu_nodes": {"children": children}},
        }
    }
    directory.mkdir(parents=True)
    (directory / "hosts.yml").write_text(yaml.safe_dump(inventory, sort_keys=False))
    return directory
