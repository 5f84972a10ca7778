"""Filters that turn a `mig_partition_config` layout into what a node exposes: gpufleet.mig.mig_node_resources and
gpufleet.mig.mig_node_instances. They run on the controller (no GPU), so they validate the layout against the
profile table of the product named (default: the fleet's H100 80GB), with the same checks the nvidia_mig module
makes against the catalog NVML reports on the host.
"""

from __future__ import annotations

from collections import Counter

from ansible.errors import AnsibleFilterError
from ansible_collections.gpufleet.mig.plugins.module_utils.exceptions import MigError
from ansible_collections.gpufleet.mig.plugins.module_utils.layout import node_layout, profile_slices
from ansible_collections.gpufleet.mig.plugins.module_utils.names import WHOLE_GPU_RESOURCE, mig_resource

DOCUMENTATION_NOTE = """
Resource names follow the NVIDIA device plugin's mixed strategy: every MIG profile whose compute instance spans the
whole GPU instance (the only kind nvidia_mig creates) is advertised as nvidia.com/mig-<profile>, "+me" included
(nvidia.com/mig-1g.10gb+me); GPUs with MIG disabled are advertised as nvidia.com/gpu.
"""


def _instance_counts(config, gpu_count, product=None) -> Counter:
    """Count instances per profile over the node's GPUs ("gpu" for whole GPUs); raise AnsibleFilterError if invalid."""
    try:
        layout = node_layout(config, gpu_count, product)
    except MigError as exc:
        raise AnsibleFilterError(f"mig_layout: invalid MIG layout: {exc.message}") from None
    counts: Counter = Counter()
    for instances in layout:
        if instances is None:
            counts["gpu"] += 1
        else:
            counts.update(instances)
    return counts


def mig_node_instances(config, gpu_count, product=None) -> dict:
    """{"2g.20gb": 12, "1g.10gb": 4} or {"gpu": 8}: instances per profile over the node's GPUs."""
    counts = _instance_counts(config, gpu_count, product)
    return {name: counts[name] for name in sorted(counts)}


def mig_node_resources(config, gpu_count, product=None, replicas=None) -> dict:
    """Extended resources the node exposes under the device plugin's mixed strategy; a resource the plugin
    time-slices (`replicas`, resource -> replicas per device) is advertised devices x replicas times."""
    counts = _instance_counts(config, gpu_count, product)
    resources = {(WHOLE_GPU_RESOURCE if name == "gpu" else mig_resource(name)): counts[name] for name in counts}
    shared = replicas or {}
    return {name: count * int(shared.get(name, 1)) for name, count in sorted(resources.items())}


def mig_profile_slices(profile) -> int:
    """3 for "3g.40gb" (the weight of an instance in a node's load); AnsibleFilterError for what is no profile."""
    try:
        return profile_slices(str(profile))
    except ValueError as exc:
        raise AnsibleFilterError(f"mig_profile_slices: {profile!r} is not a MIG profile name ({exc})") from None


class FilterModule:
    def filters(self):
        return {
            "mig_node_resources": mig_node_resources,
            "mig_node_instances": mig_node_instances,
            "mig_profile_slices": mig_profile_slices,
        }
