"""A host's GPU facts, read from its inventory variables in one place.

Every reader of what a GPU host is - its Kubernetes node name, its GPU product, how many GPUs it has, what its
``mig_partition_config`` makes of them - goes through here: the filters (tenants_model, fleet_summary, host_gpus,
node_name, fleet_problems), the roles through those filters, the lab's simulator set-up and the extender's
placement simulator. A layout is judged against the host's own product, never another's table, and every problem
is one SpecError naming the host and the variable.

The variables:
- ``gpufleet_node_name``: the host's Kubernetes node name; the inventory name when not set.
- ``gpufleet_gpu_product``: the GPUs' product as NVML names it (``NVIDIA H100 80GB HBM3``, ``NVIDIA H200``,
  ``NVIDIA L4``); DEFAULT_PRODUCT (profile_tables) when not set.
- ``gpufleet_gpus_per_node``: how many GPUs the host has (required, at least 1).
- ``mig_partition_config``: the host's layout (required).

Pure Python, no Ansible: the extender's wheel ships it with the layout library (docs/layout_library.md).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .exceptions import MigError, SpecError
from .layout import node_layout
from .names import WHOLE_GPU_RESOURCE, mig_resource
from .profile_tables import DEFAULT_PRODUCT, ProductTable, product_table
from .spec import parse_config

NODE_NAME_VAR = "gpufleet_node_name"
PRODUCT_VAR = "gpufleet_gpu_product"
GPU_COUNT_VAR = "gpufleet_gpus_per_node"
LAYOUT_VAR = "mig_partition_config"
# A Node's name: a DNS subdomain (lower-case labels joined by dots, 253 characters at most).
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


@dataclass(frozen=True)
class HostGpus:
    """What one GPU host is, from its inventory variables."""

    host: str  # the inventory name
    node_name: str  # the Kubernetes node name
    product: str  # the product's NVML name (its profile table's)
    gpu_count: int
    mig_capable: bool
    layout: tuple[dict[str, int] | None, ...]  # per GPU index: instances per profile, None = MIG off (whole GPU)

    def instances(self) -> dict[str, int]:
        """Instances per profile over the host's GPUs, "gpu" for whole GPUs, sorted by name."""
        counts: Counter[str] = Counter()
        for gpu in self.layout:
            if gpu is None:
                counts["gpu"] += 1
            else:
                counts.update(gpu)
        return {name: counts[name] for name in sorted(counts)}

    def resources(self, replicas: Mapping[str, int] | None = None) -> dict[str, int]:
        """The extended resources the device plugin's mixed strategy advertises (a time-sliced resource, named in
        ``replicas``, devices x replicas times)."""
        shared = replicas or {}
        found = {
            (WHOLE_GPU_RESOURCE if name == "gpu" else mig_resource(name)): count
            for name, count in self.instances().items()
        }
        return {name: count * int(shared.get(name, 1)) for name, count in sorted(found.items())}

    def as_dict(self, replicas: Mapping[str, int] | None = None) -> dict[str, Any]:
        return {
            "host": self.host,
            "node_name": self.node_name,
            "product": self.product,
            "gpu_count": self.gpu_count,
            "mig_capable": self.mig_capable,
            "layout": [None if gpu is None else dict(sorted(gpu.items())) for gpu in self.layout],
            "instances": self.instances(),
            "resources": self.resources(replicas),
        }


def node_name(host: str, hostvars: Mapping[str, Any]) -> str:
    """The host's Kubernetes node name: gpufleet_node_name, else the inventory name."""
    value = hostvars.get(NODE_NAME_VAR)
    if value is None or value == "":
        value = host
    if not isinstance(value, str) or len(value) > 253 or not _DNS_SUBDOMAIN.fullmatch(value):
        which = NODE_NAME_VAR if hostvars.get(NODE_NAME_VAR) else f"{NODE_NAME_VAR} (not set: the inventory name)"
        raise SpecError(
            f"host {host}: {which} {value!r} is no Kubernetes node name (lower-case letters, digits, '-' and '.')"
        )
    return value


def host_product(host: str, hostvars: Mapping[str, Any]) -> ProductTable:
    """The profile table of the host's GPUs: gpufleet_gpu_product, DEFAULT_PRODUCT when not set."""
    value = hostvars.get(PRODUCT_VAR)
    if value is None or value == "":
        value = DEFAULT_PRODUCT
    if not isinstance(value, str):
        raise SpecError(f"host {host}: {PRODUCT_VAR} must be a GPU product name, got {value!r}")
    try:
        return product_table(value)
    except KeyError as exc:
        raise SpecError(f"host {host}: {PRODUCT_VAR}: {exc.args[0]}") from None


def gpu_count(host: str, hostvars: Mapping[str, Any]) -> int:
    """How many GPUs the host has: gpufleet_gpus_per_node, a whole number >= 1."""
    if GPU_COUNT_VAR not in hostvars or hostvars[GPU_COUNT_VAR] is None:
        raise SpecError(f"host {host}: {GPU_COUNT_VAR} is not set (how many GPUs the host has)")
    value = hostvars[GPU_COUNT_VAR]
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SpecError(f"host {host}: {GPU_COUNT_VAR} must be a whole number of GPUs >= 1, got {value!r}")
    return value


def host_gpus(host: str, hostvars: Mapping[str, Any]) -> HostGpus:
    """Everything about the host's GPUs; SpecError naming the host and the variable at the first problem.

    The layout is validated and expanded against the host's own product, as nvidia_mig does on the host against
    the catalog NVML reports.
    """
    name = node_name(host, hostvars)
    table = host_product(host, hostvars)
    count = gpu_count(host, hostvars)
    if LAYOUT_VAR not in hostvars or hostvars[LAYOUT_VAR] is None:
        raise SpecError(f"host {host}: {LAYOUT_VAR} is not set (the host's MIG layout)")
    try:
        layout = node_layout(hostvars[LAYOUT_VAR], count, table.product)
        # `devices: all` passes over GPUs that cannot do MIG (a mixed host); a host none of whose GPUs can is told.
        if not table.profiles and any(entry.mig_enabled for entry in parse_config(hostvars[LAYOUT_VAR])):
            raise SpecError(f"it enables MIG, but {table.product} cannot do MIG (a layout with mig_enabled: false)")
    except MigError as exc:
        raise SpecError(f"host {host}: {LAYOUT_VAR}: {exc.message}") from None
    return HostGpus(host, name, table.product, count, bool(table.profiles), tuple(layout))
