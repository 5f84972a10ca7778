"""The one grammar of profile and resource names, and of a pool's time-slicing (names.py)."""

from __future__ import annotations

import pytest
from ansible_collections.gpufleet.mig.plugins.module_utils.names import (
    is_device_profile,
    mig_resource,
    parse_sharing,
    resource_name,
)


@pytest.mark.parametrize(
    ("name", "resource"),
    [
        ("nvidia.com/gpu", "nvidia.com/gpu"),
        ("gpu", "nvidia.com/gpu"),
        (" nvidia.com/mig-3g.40gb ", "nvidia.com/mig-3g.40gb"),
        ("mig-1g.10gb", "nvidia.com/mig-1g.10gb"),
        ("1g.10gb+me", "nvidia.com/mig-1g.10gb+me"),
        ("7g.80gb", "nvidia.com/mig-7g.80gb"),
        # No resource: partial compute, a non-canonical spelling, 8 GPU slices, other attributes, not a name at all.
        ("1c.3g.40gb", None),
        ("3c.3g.40gb", None),
        ("8g.80gb", None),
        ("1g.10gb+gfx", None),
        ("1g.10gb-me", None),
        ("nvidia.com/mig-", None),
        ("mig-gpu", None),
        ("amd.com/gpu", None),
        (3, None),
        (None, None),
    ],
)
def test_resource_name_takes_full_and_short_forms_of_what_the_device_plugin_advertises(name, resource):
    assert resource_name(name) == resource


def test_device_profiles_and_their_resource():
    assert is_device_profile("2g.20gb") and is_device_profile("1g.10gb+me")
    assert not is_device_profile("0g.10gb") and not is_device_profile("2g.020gb")
    assert mig_resource("2g.20gb") == "nvidia.com/mig-2g.20gb"


def test_parse_sharing_lists_every_problem_and_keeps_the_good_entries():
    sharing, errors = parse_sharing(
        {
            "1g.10gb": 4,
            "gpu": 1,
            "nvidia.com/mig-2g.20gb": 64,
            "3g.40gb": 65,
            "mig-1g.10gb": 2,
            "x": 2,
            "7g.80gb": True,
        },
        "tenant t",
    )
    assert sharing == {"nvidia.com/mig-1g.10gb": 4, "nvidia.com/gpu": 1, "nvidia.com/mig-2g.20gb": 64}
    assert errors == [
        "tenant t: sharing of nvidia.com/mig-3g.40gb must be a whole number of replicas from 1 (exclusive) to 64, "
        "not 65",
        "tenant t: sharing names nvidia.com/mig-1g.10gb twice",
        "tenant t: sharing names x, which is not nvidia.com/gpu or nvidia.com/mig-<profile>",
        "tenant t: sharing of nvidia.com/mig-7g.80gb must be a whole number of replicas from 1 (exclusive) to 64, "
        "not True",
    ]
    assert parse_sharing(None, "w") == ({}, [])
    not_a_map = "w: sharing must map a resource to its time-slicing replicas (for example {nvidia.com/mig-1g.10gb: 4})"
    assert parse_sharing([4], "w") == ({}, [f"{not_a_map}, not [4]"])
