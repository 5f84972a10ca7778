"""Filters that turn a `mig_partition_config` layout into what a node exposes: gpufleet.mig.mig_node_resources and
gpufleet.mig.mig_node_instances. They run on the controller (no GPU), so they validate the layout against the
profile table of the product named (default: the fleet's H100 80GB), with the same checks the nvidia_mig module
makes against the catalog NVML reports on the host.
"""

from __future__ import annotations

from collections import Counter

from ansible.errors import AnsibleFilterError
from ansible_collections.gpufleet.mig.plugins.module_utils.exceptions import MigError
from ansible_collections.gpufleet.mig.plugins.module_utils.planner import Catalog, validate_target
from ansible_collections.gpufleet.mig.plugins.module_utils.profile_tables import H100_80GB, product_table
from ansible_collections.gpufleet.mig.plugins.module_utils.spec import GpuSelectable, parse_config, targets_for_gpus

DOCUMENTATION_NOTE = """
Resource names follow the NVIDIA device plugin's mixed strategy: every MIG profile whose compute instance spans the
whole GPU instance (the only kind nvidia_mig creates) is advertised as nvidia.com/mig-<profile>, "+me" included
(nvidia.com/mig-1g.10gb+me); GPUs with MIG disabled are advertised as nvidia.com/gpu.
"""


def _instance_counts(config, gpu_count, product=None) -> Counter:
    """Count instances per profile over the node's GPUs ("gpu" for whole GPUs); raise AnsibleFilterError if invalid."""
    if isinstance(gpu_count, bool) or not isinstance(gpu_count, int):
        try:
            gpu_count = int(gpu_count)
        except (TypeError, ValueError):
            raise AnsibleFilterError(f"mig_layout: gpu_count must be an integer, got {gpu_count!r}") from None
    if gpu_count < 0:
        raise AnsibleFilterError(f"mig_layout: gpu_count must be >= 0, got {gpu_count}")
    try:
        table = product_table(product) if product else H100_80GB
    except KeyError as exc:
        raise AnsibleFilterError(f"mig_layout: {exc.args[0]}") from None
    catalog = Catalog.from_table(table)
    try:
        entries = parse_config(config)
        gpus = [
            GpuSelectable(i, table.pci_device_id, table.pci_subsystem_id, bool(table.profiles))
            for i in range(gpu_count)
        ]
        targets = targets_for_gpus(entries, gpus)
        counts: Counter = Counter()
        for index in range(gpu_count):
            target = targets.get(index)
            if target is None or not target.mig_enabled:
                # GPUs no entry selects keep MIG off in a fleet laid out by this collection: whole GPUs.
                counts["gpu"] += 1
                continue
            validate_target(target.counts, catalog, f"config[{target.entry}]: GPU {index} ({table.product})")
            counts.update(target.counts)
        return counts
    except MigError as exc:
        raise AnsibleFilterError(f"mig_layout: invalid MIG layout: {exc.message}") from None


def mig_node_instances(config, gpu_count, product=None) -> dict:
    """{"2g.20gb": 12, "1g.10gb": 4} or {"gpu": 8}: instances per profile over the node's GPUs."""
    counts = _instance_counts(config, gpu_count, product)
    return {name: counts[name] for name in sorted(counts)}


def mig_node_resources(config, gpu_count, product=None) -> dict:
    """Extended resources the node exposes under the device plugin's mixed strategy."""
    counts = _instance_counts(config, gpu_count, product)
    return {("nvidia.com/gpu" if name == "gpu" else f"nvidia.com/mig-{name}"): counts[name] for name in sorted(counts)}


class FilterModule:
    def filters(self):
        return {
            "mig_node_resources": mig_node_resources,
            "mig_node_instances": mig_node_instances,
        }
