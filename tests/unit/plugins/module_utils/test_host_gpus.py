"""The one reader of a host's GPU facts: node name, product (one default), GPU count and the layout, judged against
the host's own product; every problem one SpecError naming the host and the variable."""

from __future__ import annotations

import pytest
from ansible_collections.gpufleet.mig.plugins.module_utils.exceptions import SpecError
from ansible_collections.gpufleet.mig.plugins.module_utils.host_gpus import host_gpus, node_name
from ansible_collections.gpufleet.mig.plugins.module_utils.profile_tables import DEFAULT_PRODUCT

H200_MIXED = [
    {"devices": [0, 1], "mig_enabled": True, "mig_devices": {"3g.71gb": 2}},
    {"devices": [2], "mig_enabled": True, "mig_devices": {"1g.18gb": 7}},
]
MIG_OFF = [{"devices": "all", "mig_enabled": False}]


def test_an_h200_host_is_laid_out_with_h200_profiles():
    hostvars = {"gpufleet_gpu_product": "NVIDIA H200", "gpufleet_gpus_per_node": 4, "mig_partition_config": H200_MIXED}
    facts = host_gpus("h200-a", hostvars)
    assert (facts.node_name, facts.product, facts.gpu_count, facts.mig_capable) == ("h200-a", "NVIDIA H200", 4, True)
    assert facts.layout == ({"3g.71gb": 2}, {"3g.71gb": 2}, {"1g.18gb": 7}, None)
    assert facts.instances() == {"1g.18gb": 7, "3g.71gb": 4, "gpu": 1}
    assert facts.resources({"nvidia.com/mig-1g.18gb": 4}) == {
        "nvidia.com/gpu": 1,
        "nvidia.com/mig-1g.18gb": 28,
        "nvidia.com/mig-3g.71gb": 4,
    }


def test_the_product_defaults_in_one_place_and_node_name_to_the_inventory_name():
    facts = host_gpus("gpu-1", {"gpufleet_gpus_per_node": 2, "mig_partition_config": MIG_OFF})
    assert facts.product == DEFAULT_PRODUCT == "NVIDIA H100 80GB HBM3"
    assert node_name("gpu-1", {"gpufleet_node_name": "gpu-1.dc1.internal"}) == "gpu-1.dc1.internal"


def test_a_product_without_mig_takes_whole_gpus_only():
    facts = host_gpus(
        "l4-1", {"gpufleet_gpu_product": "NVIDIA L4", "gpufleet_gpus_per_node": 2, "mig_partition_config": MIG_OFF}
    )
    assert (facts.mig_capable, facts.resources()) == (False, {"nvidia.com/gpu": 2})


@pytest.mark.parametrize(
    ("hostvars", "message"),
    [
        (
            {"gpufleet_gpus_per_node": 8, "mig_partition_config": H200_MIXED},
            r"^host h: mig_partition_config: config\[0\]: GPU 0 \(NVIDIA H100 80GB HBM3\): unknown MIG profile\(s\) "
            r"3g\.71gb",
        ),
        (
            {"gpufleet_gpu_product": "NVIDIA B200", "gpufleet_gpus_per_node": 8, "mig_partition_config": MIG_OFF},
            r"^host h: gpufleet_gpu_product: no MIG profile table for GPU product 'NVIDIA B200'",
        ),
        ({"gpufleet_gpus_per_node": 0, "mig_partition_config": MIG_OFF}, r"^host h: gpufleet_gpus_per_node must be"),
        ({"mig_partition_config": MIG_OFF}, r"^host h: gpufleet_gpus_per_node is not set"),
        ({"gpufleet_gpus_per_node": 4}, r"^host h: mig_partition_config is not set"),
        (
            {"gpufleet_gpus_per_node": 4, "mig_partition_config": [{"devices": [4], "mig_enabled": False}]},
            r"^host h: mig_partition_config: ",
        ),
        (
            {
                "gpufleet_gpu_product": "NVIDIA L4",
                "gpufleet_gpus_per_node": 2,
                "mig_partition_config": [{"devices": "all", "mig_enabled": True, "mig_devices": {"1g.10gb": 1}}],
            },
            r"^host h: mig_partition_config: ",
        ),
        (
            {"gpufleet_node_name": "Node_1", "gpufleet_gpus_per_node": 2, "mig_partition_config": MIG_OFF},
            r"^host h: gpufleet_node_name 'Node_1' is no Kubernetes node name",
        ),
    ],
)
def test_each_problem_names_the_host_and_the_variable(hostvars, message):
    with pytest.raises(SpecError, match=message):
        host_gpus("h", hostvars)
