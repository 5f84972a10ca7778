"""node_layout: the one expansion of a node's layout, shared by the mig_layout filters and the lab's simulator."""

from __future__ import annotations

import pytest
from ansible_collections.gpufleet.mig.plugins.module_utils.exceptions import SpecError
from ansible_collections.gpufleet.mig.plugins.module_utils.layout import memory_gb, node_layout, profile_slices


def test_selected_gpus_get_their_instances_and_the_others_stay_whole():
    config = [
        {"devices": [0, 1], "mig_enabled": True, "mig_devices": {"3g.40gb": 2}},
        {"devices": [2], "mig_enabled": False},
    ]
    assert node_layout(config, 4) == [{"3g.40gb": 2}, {"3g.40gb": 2}, None, None]


def test_profile_spellings_become_the_canonical_name_and_string_counts_are_numbers():
    config = [{"devices": "all", "mig_enabled": True, "mig_devices": {"3c.3g.40gb": "1", "1g.10gb": 4}}]
    assert node_layout(config, 1) == [{"3g.40gb": 1, "1g.10gb": 4}]


def test_the_product_decides_the_catalog():
    config = [{"devices": "all", "mig_enabled": True, "mig_devices": {"1g.18gb": 7}}]
    assert node_layout(config, 1, "NVIDIA H200") == [{"1g.18gb": 7}]
    with pytest.raises(SpecError, match=r"GPU 0 \(NVIDIA H100 80GB HBM3\): unknown MIG profile\(s\) 1g.18gb"):
        node_layout(config, 1)
    with pytest.raises(SpecError, match="no MIG profile table for GPU product 'NVIDIA A10'"):
        node_layout(config, 1, "NVIDIA A10")


@pytest.mark.parametrize(
    ("config", "gpu_count", "message"),
    [
        ([{"mig_enabled": False}], 8, r"config\[0\]: 'devices' is required"),
        ([], 8, "config must be a non-empty list"),
        ([{"devices": "all", "mig_enabled": True, "mig_devices": {"7g.80gb": 2}}], 8, "at most 1 fit"),
        ([{"devices": [8], "mig_enabled": False}], 8, r"GPU index\(es\) \[8\] do not exist"),
        ([{"devices": "all", "mig_enabled": False}], "eight", "gpu_count must be an integer"),
        ([{"devices": "all", "mig_enabled": False}], -1, "gpu_count must be >= 0"),
    ],
)
def test_what_the_module_refuses_is_refused(config, gpu_count, message):
    with pytest.raises(SpecError, match=message):
        node_layout(config, gpu_count)


@pytest.mark.parametrize(
    ("profile", "slices", "gb"),
    [("1g.10gb", 1, 10), ("1g.10gb+me", 1, 10), ("3g.40gb", 3, 40), ("1c.3g.40gb", 3, 40), ("7g.80gb", 7, 80)],
)
def test_slices_and_memory_from_profile_names(profile, slices, gb):
    assert (profile_slices(profile), memory_gb(profile)) == (slices, gb)


def test_a_name_that_is_no_profile_is_a_value_error():
    with pytest.raises(ValueError, match=r"expected \[<C>c.\]<G>g.<GB>gb"):
        profile_slices("whole")
