"""gpufleet.mig.fleet_summary: per-tenant report lines from the nvidia_mig results and the inventory layouts."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.gpufleet.mig.plugins.filter.fleet_summary import fleet_summary

IMAGEGEN = [
    {"devices": [0], "mig_enabled": True, "mig_devices": {"3g.40gb": 2}},
    {"devices": [1], "mig_enabled": True, "mig_devices": {"2g.20gb": 3, "1g.10gb": 1}},
]


def result(*gpus) -> dict:
    """An nvidia_mig result: per GPU a list of profiles (MIG on) or None (MIG off)."""
    return {
        "gpus": [
            {"mig_enabled": {"after": profiles is not None}, "after": [{"profile": p} for p in profiles or []]}
            for profiles in gpus
        ]
    }


TENANTS = {"img": {"group": "tenant_img", "description": "image generation"}}


def test_configured_nodes_report_what_their_gpus_hold_largest_profiles_first():
    hostvars = {
        "g1": {
            "mig_partition_config": IMAGEGEN,
            "gpufleet_gpus_per_node": 3,
            "mig_partition_result": result(["3g.40gb", "3g.40gb"], ["2g.20gb"] * 3 + ["1g.10gb"], None),
        },
        "g2": {"mig_partition_config": IMAGEGEN, "gpufleet_gpus_per_node": 3},
    }
    lines = fleet_summary(hostvars, {"tenant_img": ["g2", "g1"]}, TENANTS)
    assert lines == [
        "tenant img (tenant_img): 2 nodes - image generation",
        "  g1           1 x whole GPU, 2 x 3g.40gb, 3 x 2g.20gb, 1 x 1g.10gb",
        "  g2           1 x whole GPU, 2 x 3g.40gb, 3 x 2g.20gb, 1 x 1g.10gb"
        "  (not configured in this run: from the layout)",
        "  pool total   2 x whole GPU, 4 x 3g.40gb, 6 x 2g.20gb, 2 x 1g.10gb",
    ]


def test_a_node_that_disagrees_with_its_layout_is_flagged():
    hostvars = {
        "g1": {
            "mig_partition_config": IMAGEGEN,
            "gpufleet_gpus_per_node": 2,
            "mig_partition_result": {**result(None, None), "reboot_required": True},
        }
    }
    lines = fleet_summary(hostvars, {"tenant_img": ["g1"]}, TENANTS)
    assert lines[1] == (
        "  g1           2 x whole GPU  (!) layout implies 2 x 3g.40gb, 3 x 2g.20gb, 1 x 1g.10gb"
        "  (MIG mode change pending a reboot)"
    )


def test_tenants_must_be_given():
    with pytest.raises(AnsibleFilterError, match="gpufleet_tenants must be a non-empty dict"):
        fleet_summary({}, {}, {})
