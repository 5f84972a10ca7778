"""Fleet from inventory layouts and from YAML files: the devices each node advertises."""

from __future__ import annotations

import os
import shutil
from collections import Counter
from pathlib import Path

import pytest

from gpufleet_lab.simulate.fleet import (
    FleetError,
    fleet_from_inventory,
    fleet_from_inventory_data,
    fleet_from_yaml,
    node_devices,
    product_memory_gb,
    profile_memory_gb,
)

REPO = Path(__file__).resolve().parents[3]

IMAGEGEN_LAYOUT = [
    {"devices": [0, 1, 2, 3], "mig_enabled": True, "mig_devices": {"3g.40gb": 2}},
    {"devices": [4, 5, 6, 7], "mig_enabled": True, "mig_devices": {"2g.20gb": 3, "1g.10gb": 1}},
]


def resources(devices) -> Counter:
    return Counter(d.resource for d in devices)


def test_mig_layout_expands_to_instances_per_profile_with_their_memory():
    devices = node_devices(IMAGEGEN_LAYOUT, 8, None, "node")
    assert resources(devices) == {
        "nvidia.com/mig-3g.40gb": 8,
        "nvidia.com/mig-2g.20gb": 12,
        "nvidia.com/mig-1g.10gb": 4,
    }
    memory = {d.resource: d.memory_gb for d in devices}
    assert memory == {"nvidia.com/mig-3g.40gb": 40, "nvidia.com/mig-2g.20gb": 20, "nvidia.com/mig-1g.10gb": 10}
    assert len({d.key for d in devices}) == len(devices)


def test_mig_off_and_unselected_gpus_are_whole_gpus():
    devices = node_devices([{"devices": [0], "mig_enabled": True, "mig_devices": {"7g.80gb": 1}}], 3, None, "n")
    assert [(d.key, d.resource, d.memory_gb) for d in devices] == [
        ("gpu0/mig0", "nvidia.com/mig-7g.80gb", 80),
        ("gpu1", "nvidia.com/gpu", 80),
        ("gpu2", "nvidia.com/gpu", 80),
    ]
    assert resources(node_devices([{"devices": "all", "mig_enabled": False}], 8, None, "n")) == {"nvidia.com/gpu": 8}


@pytest.mark.parametrize(
    ("layout", "message"),
    [
        (
            [{"devices": [0], "mig_enabled": False}, {"devices": [0, 1], "mig_enabled": False}],
            r"GPU 0 is selected by more than one entry",
        ),
        ([{"devices": [9], "mig_enabled": False}], r"GPU index\(es\) \[9\] do not exist"),
        ([{"devices": "all", "mig_enabled": True, "mig_devices": {"big": 1}}], "'big' is not a MIG profile name"),
        ([{"devices": "all", "mig_enabled": True, "mig_devices": {"1g.10gb": -1}}], "must be >= 0"),
    ],
)
def test_bad_layouts_are_named(layout, message):
    with pytest.raises(FleetError, match=rf"^hk-gpu-01: mig_partition_config: .*{message}"):
        node_devices(layout, 8, None, "hk-gpu-01")


# Layouts the nvidia_mig module refuses on the node; the simulator's own expansion used to accept them, so it
# simulated fleets that could never be laid out.
@pytest.mark.parametrize(
    ("layout", "message"),
    [
        # `devices` is required by the module (it defaulted to all GPUs in the simulator)
        ([{"mig_enabled": True, "mig_devices": {"3g.40gb": 2}}], "'devices' is required"),
        # more compute slices than an H100 has
        ([{"devices": "all", "mig_enabled": True, "mig_devices": {"3g.40gb": 3}}], "at most 2 fit on one GPU"),
        # a name that parses but is no H100 profile
        ([{"devices": "all", "mig_enabled": True, "mig_devices": {"2g.40gb": 1}}], "unknown MIG profile"),
        # compute slices fit (6 of 7) but the memory slices do not (10 of 8)
        ([{"devices": "all", "mig_enabled": True, "mig_devices": {"1g.20gb": 4, "2g.20gb": 1}}], "memory slices"),
    ],
)
def test_simulator_refuses_what_the_module_refuses(layout, message):
    with pytest.raises(FleetError, match=message):
        node_devices(layout, 8, None, "hk-gpu-01")


def test_simulator_takes_what_the_module_takes():
    # String counts and a device filter are the module's shape too (the simulator's expansion refused the first
    # and ignored the second).
    layout = [
        {"devices": "all", "mig_enabled": True, "mig_devices": {"3g.40gb": "2"}, "device_filter": ["0x233010DE"]},
    ]
    assert resources(node_devices(layout, 2, "NVIDIA H100 80GB HBM3", "n")) == {"nvidia.com/mig-3g.40gb": 4}


def test_memory_from_names():
    assert profile_memory_gb("1g.10gb+me") == 10
    assert product_memory_gb("NVIDIA H100 80GB HBM3") == 80
    assert product_memory_gb("NVIDIA H200 141GB HBM3e") == 141
    assert product_memory_gb(None) == 80


def test_inventory_data_gives_gpu_hosts_their_tenant_and_namespaces():
    tenants = {"llm": {"group": "tenant_llm", "namespaces": ["llm-inference"]}}
    data = {
        "_meta": {
            "hostvars": {
                "cp-01": {"gpufleet_tenants": tenants},
                "gpu-01": {
                    "gpufleet_tenants": tenants,
                    "gpufleet_tenant": "llm",
                    "gpufleet_gpus_per_node": 4,
                    "mig_partition_config": [{"devices": "all", "mig_enabled": False}],
                },
            }
        }
    }
    fleet = fleet_from_inventory_data(data)
    assert [(n.name, n.tenant, len(n.devices)) for n in fleet.nodes] == [("gpu-01", "llm", 4)]
    # What the devices were made from, for the re-layout model: each GPU's layout (None: MIG off) and the product
    # (the one default when the inventory names none).
    assert fleet.nodes[0].gpus == (None,) * 4 and fleet.nodes[0].product == "NVIDIA H100 80GB HBM3"
    hostvars = data["_meta"]["hostvars"]
    hostvars["gpu-01"]["mig_partition_config"] = [
        {"devices": [1], "mig_enabled": True, "mig_devices": {"2g.20gb": 1, "1g.10gb": 2}}
    ]
    hostvars["gpu-01"]["gpufleet_gpu_product"] = "NVIDIA H100 80GB HBM3"
    (node,) = fleet_from_inventory_data(data).nodes
    assert node.gpus == (None, (("1g.10gb", 2), ("2g.20gb", 1)), None, None)
    assert node.product == "NVIDIA H100 80GB HBM3"
    # A product without a profile table is named as the product, not as a layout problem.
    hostvars["gpu-01"]["gpufleet_gpu_product"] = "NVIDIA T4"
    with pytest.raises(FleetError, match=r"^host gpu-01: gpufleet_gpu_product: "):
        fleet_from_inventory_data(data)
    assert fleet.namespace_tenants == {"llm-inference": "llm"}
    with pytest.raises(FleetError, match="no host has a mig_partition_config"):
        fleet_from_inventory_data({"_meta": {"hostvars": {"cp-01": {}}}})


def test_yaml_fleet_with_pools_of_identical_nodes(tmp_path):
    path = tmp_path / "fleet.yml"
    path.write_text(
        """
replicas: 2
namespaces: {team-a: a}
nodes:
  - name: big
    tenant: a
    count: 2
    gpus: 2
  - name: mig
    gpus: 1
    mig_partition_config:
      - devices: all
        mig_enabled: true
        mig_devices: {1g.10gb: 7}
"""
    )
    fleet = fleet_from_yaml(path)
    assert [(n.name, n.tenant, len(n.devices)) for n in fleet.nodes] == [
        ("big-01", "a", 2),
        ("big-02", "a", 2),
        ("mig", None, 7),
    ]
    assert fleet.replicas == 2
    assert fleet.capacity("a", "nvidia.com/gpu") == 8
    path.write_text("nodes: []\n")
    with pytest.raises(FleetError, match="needs a non-empty list 'nodes'"):
        fleet_from_yaml(path)


def test_hong_kong_inventory(monkeypatch):
    if shutil.which("ansible-inventory") is None and not (REPO / ".venv/bin/ansible-inventory").exists():
        # `make venv` installs it; in CI a skip would hide that the inventory was never read.
        if os.environ.get("CI"):
            pytest.fail("ansible-inventory is not installed (make venv); CI is set, so this is a failure")
        pytest.skip("ansible-inventory not installed (make venv)")
    monkeypatch.chdir(REPO)  # ansible.cfg at the repository root
    fleet = fleet_from_inventory(REPO / "inventories/hongkong")
    per_tenant = Counter(n.tenant for n in fleet.nodes)
    assert per_tenant == {"llm": 10, "imagegen": 6, "finnlp": 4}
    assert fleet.capacity("llm", "nvidia.com/gpu") == 80
    # finnlp time-slices its 1g.10gb instances four ways (gpufleet_tenants' sharing): 4 nodes x 8 GPUs x 7 x 4.
    assert fleet.replicas_for("finnlp", "nvidia.com/mig-1g.10gb") == 4
    assert fleet.capacity("finnlp", "nvidia.com/mig-1g.10gb") == 4 * 8 * 7 * 4
    assert fleet.capacity("imagegen", "nvidia.com/mig-3g.40gb") == 6 * 8
    assert fleet.with_replicas(2).capacity("imagegen", "nvidia.com/mig-3g.40gb") == 6 * 8 * 2
    assert fleet.namespace_tenants["finnlp-batch"] == "finnlp"
    assert fleet.replicas == 1
