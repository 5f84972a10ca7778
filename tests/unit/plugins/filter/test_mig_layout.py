"""gpufleet.mig.mig_node_resources / mig_node_instances: counts, resource names, and clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from ansible.errors import AnsibleFilterError
from ansible_collections.gpufleet.mig.plugins.filter.mig_layout import FilterModule

REPO = Path(__file__).resolve().parents[4]
FILTERS = FilterModule().filters()
resources = FILTERS["mig_node_resources"]
instances = FILTERS["mig_node_instances"]


def _tenant_layout(group: str) -> list:
    path = REPO / "inventories" / "hongkong" / "group_vars" / group / "fleet.yml"
    return yaml.safe_load(path.read_text())["mig_partition_config"]


@pytest.mark.parametrize(
    ("group", "expected"),
    [
        ("tenant_llm", {"nvidia.com/gpu": 8}),
        ("tenant_finnlp", {"nvidia.com/mig-1g.10gb": 56}),
        (
            "tenant_imagegen",
            {"nvidia.com/mig-3g.40gb": 8, "nvidia.com/mig-2g.20gb": 12, "nvidia.com/mig-1g.10gb": 4},
        ),
    ],
)
def test_inventory_layouts(group, expected):
    assert resources(_tenant_layout(group), 8) == expected


@pytest.mark.parametrize(
    ("config", "gpu_count", "expected"),
    [
        # GPUs no entry selects stay whole.
        ([{"devices": [0], "mig_enabled": True, "mig_devices": {"7g.80gb": 1}}], 2, {"7g.80gb": 1, "gpu": 1}),
        # Only placeable away from slot 0 for the 1g.10gb (4g.40gb can only start at 0).
        (
            [{"devices": "all", "mig_enabled": True, "mig_devices": {"1g.10gb": 3, "4g.40gb": 1}}],
            1,
            {"1g.10gb": 3, "4g.40gb": 1},
        ),
        (
            [{"devices": "all", "mig_enabled": True, "mig_devices": {"1g.10gb+me": 1, "1g.10gb": 6}}],
            2,
            {"1g.10gb": 12, "1g.10gb+me": 2},
        ),
        ([{"devices": "all", "mig_enabled": True}], 3, {}),  # MIG on, no instances: nothing to advertise
    ],
)
def test_instance_counts(config, gpu_count, expected):
    assert instances(config, gpu_count) == expected


def test_plus_me_resource_name_follows_device_plugin():
    config = [{"devices": "all", "mig_enabled": True, "mig_devices": {"1g.10gb+me": 1}}]
    assert resources(config, 1) == {"nvidia.com/mig-1g.10gb+me": 1}


def test_h200_product_table():
    config = [{"devices": "all", "mig_enabled": True, "mig_devices": {"3g.71gb": 2}}]
    assert resources(config, 4, "NVIDIA H200") == {"nvidia.com/mig-3g.71gb": 8}
    with pytest.raises(AnsibleFilterError, match=r"unknown MIG profile.*3g.40gb.*valid profiles: 1g.18gb"):
        resources([{"devices": "all", "mig_enabled": True, "mig_devices": {"3g.40gb": 1}}], 1, "NVIDIA H200")


@pytest.mark.parametrize(
    ("mig_devices", "message"),
    [
        ({"1g.5gb": 1}, r"unknown MIG profile\(s\) 1g.5gb .*valid profiles: 1g.10gb"),
        ({"1g.10gb": 8}, "8 x 1g.10gb requested, at most 7"),
        ({"4g.40gb": 1, "3g.40gb": 1, "1g.10gb": 1}, "needs 8 compute slices"),
        ({"1g.20gb": 3, "3g.40gb": 1}, "needs 10 memory slices"),
        # valid: 2g at 0/2/4, 1g.20gb at 6 (a zero count is no resource)
        ({"2g.20gb": 3, "1g.20gb": 1, "1g.10gb": 0}, {"nvidia.com/mig-2g.20gb": 3, "nvidia.com/mig-1g.20gb": 1}),
        # valid only with 3g.40gb at 4 (largest-first greedy puts it at 0)
        ({"3g.40gb": 1, "2g.20gb": 2}, {"nvidia.com/mig-3g.40gb": 1, "nvidia.com/mig-2g.20gb": 2}),
        ({"foo": 1}, "not a MIG profile name"),
        ({"1g.10gb": -1}, "must be >= 0"),
        ({"1g.10gb": True}, "must be an integer"),
    ],
)
def test_validation_messages(mig_devices, message):
    config = [{"devices": "all", "mig_enabled": True, "mig_devices": mig_devices}]
    if isinstance(message, dict):  # a valid layout: exactly these resources
        assert resources(config, 1) == message
        return
    with pytest.raises(AnsibleFilterError, match=message):
        resources(config, 1)


@pytest.mark.parametrize(
    ("config", "gpu_count", "message"),
    [
        ([{"devices": [8], "mig_enabled": False}], 8, r"GPU index\(es\) \[8\] do not exist"),
        ([{"devices": "all", "mig_enabled": False}, {"devices": [1], "mig_enabled": False}], 2, "more than one"),
        ([], 8, "non-empty list"),
        ([{"devices": "all"}], 8, "'mig_enabled' is required"),
        ([{"devices": "all", "mig_enabled": False, "mig_devices": {"1g.10gb": 1}}], 8, "'mig_enabled' is false"),
        ([{"devices": "all", "mig_enabled": True}], "eight", "gpu_count must be an integer"),
        ([{"devices": "all", "mig_enabled": True, "migdevices": {}}], 1, "unknown key"),
    ],
)
def test_request_errors(config, gpu_count, message):
    with pytest.raises(AnsibleFilterError, match=message):
        resources(config, gpu_count)


def test_a_gpu_level_error_names_the_config_entry_that_asks_for_it():
    config = [
        {"devices": [0, 1], "mig_enabled": True, "mig_devices": {"3g.40gb": 2}},
        {"devices": [2, 3], "mig_enabled": True, "mig_devices": {"1g.20gb": 3, "3g.40gb": 1}},
    ]
    with pytest.raises(AnsibleFilterError) as refused:
        resources(config, 4)
    assert "config[1]: GPU 2 (NVIDIA H100 80GB HBM3): the layout needs 10 memory slices" in str(refused.value)


def test_time_sliced_resources_count_devices_times_replicas():
    layout = _tenant_layout("tenant_imagegen")
    replicas = {"nvidia.com/mig-1g.10gb": 4, "nvidia.com/mig-7g.80gb": 2}  # a resource the node lacks adds nothing
    assert resources(layout, 8, replicas=replicas) == {
        "nvidia.com/mig-1g.10gb": 16,
        "nvidia.com/mig-2g.20gb": 12,
        "nvidia.com/mig-3g.40gb": 8,
    }
