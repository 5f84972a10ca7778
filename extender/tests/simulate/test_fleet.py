"""Fleet from inventory layouts and from YAML files: the devices each node advertises."""

from __future__ import annotations

import os
import shutil
from collections import Counter
from pathlib import Path

import pytest

from gpufleet_extender.simulate.fleet import (
    FleetError,
    expand_layout,
    fleet_from_inventory,
    fleet_from_inventory_data,
    fleet_from_yaml,
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
    devices = expand_layout(IMAGEGEN_LAYOUT, 8, 80.0, "node")
    assert resources(devices) == {
        "nvidia.com/mig-3g.40gb": 8,
        "nvidia.com/mig-2g.20gb": 12,
        "nvidia.com/mig-1g.10gb": 4,
    }
    memory = {d.resource: d.memory_gb for d in devices}
    assert memory == {"nvidia.com/mig-3g.40gb": 40, "nvidia.com/mig-2g.20gb": 20, "nvidia.com/mig-1g.10gb": 10}
    assert len({d.key for d in devices}) == len(devices)


def test_mig_off_and_unselected_gpus_are_whole_gpus():
    devices = expand_layout([{"devices": [0], "mig_enabled": True, "mig_devices": {"7g.80gb": 1}}], 3, 80.0, "n")
    assert [(d.key, d.resource, d.memory_gb) for d in devices] == [
        ("gpu0/mig0", "nvidia.com/mig-7g.80gb", 80),
        ("gpu1", "nvidia.com/gpu", 80),
        ("gpu2", "nvidia.com/gpu", 80),
    ]
    assert resources(expand_layout([{"devices": "all", "mig_enabled": False}], 8, 80.0, "n")) == {"nvidia.com/gpu": 8}


@pytest.mark.parametrize(
    ("layout", "message"),
    [
        ([{"devices": [0]}, {"devices": [0, 1]}], "GPU 0 is selected by more than one entry"),
        ([{"devices": [9], "mig_enabled": False}], r"GPU index\(es\) \[9\] do not exist"),
        ([{"devices": "all", "mig_enabled": True, "mig_devices": {"big": 1}}], "'big' is not a profile name"),
        ([{"devices": "all", "mig_enabled": True, "mig_devices": {"1g.10gb": -1}}], "must be a whole number"),
    ],
)
def test_bad_layouts_are_named(layout, message):
    with pytest.raises(FleetError, match=message):
        expand_layout(layout, 8, 80.0, "hk-gpu-01")


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
    assert fleet.capacity("finnlp", "nvidia.com/mig-1g.10gb") == 4 * 8 * 7
    assert fleet.capacity("imagegen", "nvidia.com/mig-3g.40gb") == 6 * 8
    assert fleet.namespace_tenants["finnlp-batch"] == "finnlp"
    assert fleet.replicas == 1
