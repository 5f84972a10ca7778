"""The simulated fleet: nodes, their tenant pool, and the devices each exposes to the scheduler.

Two sources give the same ``Fleet``:

- an Ansible inventory (default ``inventories/hongkong``), read with ``ansible-inventory --list``; each GPU host's
  ``mig_partition_config`` is expanded over its ``gpufleet_gpus_per_node`` GPUs the way the device plugin's mixed
  strategy advertises them (whole GPUs as ``nvidia.com/gpu``, MIG instances as ``nvidia.com/mig-<profile>``);
- a small YAML fleet file (format in docs/simulator.md).

The layout is expanded by the collection's own layout library (``mig_utils.layout.node_layout``, the code the
nvidia_mig module and the mig_layout filters run), so the simulator accepts exactly the layouts the module accepts.
A device's memory comes from its profile name (``2g.20gb`` -> 20 GB); a whole GPU's from the product name
(``NVIDIA H100 80GB HBM3`` -> 80 GB). ``replicas`` is how many pods may share one device (the device plugin's
time-slicing replicas); 1 means exclusive devices, which is what the collection deploys.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from gpufleet_extender.pods import WHOLE_GPU_RESOURCE

from gpufleet_lab.mig_utils import names
from gpufleet_lab.mig_utils.exceptions import MigError
from gpufleet_lab.mig_utils.host_gpus import host_gpus
from gpufleet_lab.mig_utils.layout import memory_gb, node_layout, product_or_default
from gpufleet_lab.simulate.errors import SimulationError

DEFAULT_INVENTORY = Path("inventories/hongkong")
DEFAULT_GPU_MEMORY_GB = 80.0  # H100 SXM 80GB, the fleet's card
_PRODUCT_MEMORY = re.compile(r"(\d+)\s*GB", re.IGNORECASE)


class FleetError(SimulationError):
    """The fleet description cannot be used; the message is meant for a person."""


@dataclass(frozen=True, slots=True)
class Device:
    """One schedulable device: a whole GPU or a MIG instance. ``key`` is unique within its node."""

    key: str
    resource: str
    memory_gb: float


# One GPU as the layout library expands its node's mig_partition_config: its MIG instances as (profile, count),
# sorted by profile; None where MIG stays off (a whole GPU).
GpuLayout = tuple[tuple[str, int], ...] | None


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    tenant: str | None  # None: a shared node any namespace may use
    devices: tuple[Device, ...]
    # What the devices were made from, for the models that work below the device (the re-layout places instances):
    # each GPU's layout and the GPUs' product (gpufleet_gpu_product). Empty for nodes built from devices alone.
    gpus: tuple[GpuLayout, ...] = ()
    product: str | None = None

    def devices_of(self, resource: str) -> tuple[Device, ...]:
        return tuple(d for d in self.devices if d.resource == resource)


@dataclass(frozen=True, slots=True)
class Fleet:
    nodes: tuple[Node, ...]
    namespace_tenants: Mapping[str, str] = field(default_factory=dict)  # namespace -> tenant
    replicas: int = 1  # pods that may share one device (time-slicing); 1 = exclusive
    source: str = ""
    # Per-pool time-slicing: (tenant, resource) -> replicas; overrides ``replicas`` for that pool's resource.
    sharing: Mapping[tuple[str | None, str], int] = field(default_factory=dict)

    def replicas_for(self, tenant: str | None, resource: str) -> int:
        """Pods that may share one device of ``resource`` in ``tenant``'s pool."""
        return self.sharing.get((tenant, resource), self.replicas)

    def shared_resources(self) -> dict[str, int]:
        """Resource -> replicas for every resource some pool time-slices (what the extender's SHARED_RESOURCES
        says); a resource shared with different counts in different pools keeps the largest."""
        shared: dict[str, int] = {}
        for (_, resource), replicas in self.sharing.items():
            if replicas > 1:
                shared[resource] = max(replicas, shared.get(resource, 1))
        if self.replicas > 1:
            for node in self.nodes:
                for device in node.devices:
                    shared.setdefault(device.resource, self.replicas)
        return dict(sorted(shared.items()))

    def with_sharing(self, sharing: Mapping[tuple[str | None, str], int]) -> Fleet:
        return Fleet(self.nodes, self.namespace_tenants, self.replicas, self.source, {**self.sharing, **sharing})

    def tenants(self) -> list[str]:
        return sorted({n.tenant for n in self.nodes if n.tenant})

    def capacity(self, tenant: str | None, resource: str) -> int:
        """Pod slots of ``resource`` in ``tenant``'s pool: devices x that pool's replicas (its ``sharing``, else
        ``replicas``), as the tenants role counts a pool's capacity."""
        devices = sum(len(n.devices_of(resource)) for n in self.nodes if n.tenant == tenant)
        return self.replicas_for(tenant, resource) * devices

    def resources_of(self, tenant: str | None) -> list[str]:
        return sorted({d.resource for n in self.nodes if n.tenant == tenant for d in n.devices})

    def namespaces_of(self, tenant: str) -> list[str]:
        return sorted(ns for ns, t in self.namespace_tenants.items() if t == tenant)

    def with_replicas(self, replicas: int) -> Fleet:
        if replicas < 1:
            raise FleetError(f"replicas must be at least 1, got {replicas}")
        return Fleet(self.nodes, self.namespace_tenants, replicas, self.source, self.sharing)


def parse_sharing(tenant: str | None, value: Any, where: str) -> dict[tuple[str | None, str], int]:
    """A pool's ``sharing`` ({resource: replicas}, short names allowed) as (tenant, resource) -> replicas; the
    rules and messages are the collection's (``mig_utils.names.parse_sharing``, as the tenants role reads it)."""
    sharing: dict[str, int]
    errors: list[str]
    sharing, errors = names.parse_sharing(value, where)
    if errors:
        raise FleetError("; ".join(errors))
    return {(tenant, resource): replicas for resource, replicas in sharing.items()}


def profile_memory_gb(profile: str) -> float:
    """GB of a MIG profile from its name: ``3g.40gb`` -> 40.0, ``1g.10gb+me`` -> 10.0."""
    try:
        return float(memory_gb(profile))
    except ValueError:
        raise FleetError(f"MIG profile {profile!r} is not a profile name like 1g.10gb, 3g.40gb or 1g.10gb+me") from None


def product_memory_gb(product: str | None) -> float:
    match = _PRODUCT_MEMORY.search(product or "")
    return float(match.group(1)) if match else DEFAULT_GPU_MEMORY_GB


def node_gpus(
    config: Any, gpu_count: int, product: str | None, where: str, product_key: str = "gpufleet_gpu_product"
) -> tuple[GpuLayout, ...]:
    """Each GPU's layout for a node's ``mig_partition_config``; None: all whole GPUs.

    The layout is validated and expanded by ``node_layout``, as the nvidia_mig module would on the node, against the
    product's profiles; a GPU no entry selects keeps MIG off (a whole GPU). A product without a profile table is
    named by its own key (``product_key``), not as a layout problem.
    """
    if config is None:
        return (None,) * gpu_count
    try:
        product_or_default(product)
    except MigError as exc:
        raise FleetError(f"{where}: {product_key}: {exc.message}") from None
    try:
        layout = node_layout(config, gpu_count, product)
    except MigError as exc:
        raise FleetError(f"{where}: mig_partition_config: {exc.message}") from None
    return tuple(None if counts is None else tuple(sorted(counts.items())) for counts in layout)


def node_devices(config: Any, gpu_count: int, product: str | None, where: str) -> tuple[Device, ...]:
    """The devices a node advertises for its ``mig_partition_config`` (mixed strategy); None: all whole GPUs."""
    return gpu_devices(node_gpus(config, gpu_count, product, where), product)


def gpu_devices(gpus: tuple[GpuLayout, ...], product: str | None) -> tuple[Device, ...]:
    """The devices the device plugin's mixed strategy advertises for these GPUs: a whole GPU as nvidia.com/gpu, each
    MIG instance as nvidia.com/mig-<profile>."""
    gpu_memory_gb = product_memory_gb(product)
    devices: list[Device] = []
    for index, instances in enumerate(gpus):
        if instances is None:
            devices.append(Device(f"gpu{index}", WHOLE_GPU_RESOURCE, gpu_memory_gb))
            continue
        number = 0
        for profile, count in instances:
            memory = profile_memory_gb(profile)
            for _ in range(count):
                devices.append(Device(f"gpu{index}/mig{number}", names.mig_resource(profile), memory))
                number += 1
    return tuple(devices)


def _gpu_count(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise FleetError(f"{where}: gpufleet_gpus_per_node must be a whole number, got {value!r}")
    return value


def fleet_from_inventory_data(data: Mapping[str, Any], source: str = "") -> Fleet:
    """A Fleet from the JSON of ``ansible-inventory --list``: every host with a ``mig_partition_config``."""
    hostvars: Mapping[str, Mapping[str, Any]] = (data.get("_meta") or {}).get("hostvars") or {}
    nodes = []
    namespace_tenants: dict[str, str] = {}
    sharing: dict[tuple[str | None, str], int] = {}
    for host in sorted(hostvars):
        hv = hostvars[host]
        for tenant, spec in (hv.get("gpufleet_tenants") or {}).items():
            for namespace in (spec or {}).get("namespaces") or []:
                namespace_tenants[str(namespace)] = str(tenant)
            sharing.update(parse_sharing(str(tenant), (spec or {}).get("sharing"), f"gpufleet_tenants.{tenant}"))
        if "mig_partition_config" not in hv:
            continue  # not a GPU node (control plane)
        # The collection's one reader of a host's GPU facts (node name, product, GPU count, layout), as the roles.
        try:
            facts = host_gpus(host, hv)
        except MigError as exc:
            raise FleetError(exc.message) from None
        gpus = tuple(None if counts is None else tuple(sorted(counts.items())) for counts in facts.layout)
        nodes.append(
            Node(facts.node_name, hv.get("gpufleet_tenant"), gpu_devices(gpus, facts.product), gpus, facts.product)
        )
    if not nodes:
        raise FleetError(f"{source or 'inventory'}: no host has a mig_partition_config (no GPU nodes to simulate)")
    return Fleet(tuple(nodes), namespace_tenants, source=source, sharing=sharing)


def ansible_inventory_command() -> str:
    """ansible-inventory next to this Python (the venv), else the one on PATH."""
    beside = Path(sys.executable).with_name("ansible-inventory")
    if beside.exists():
        return str(beside)
    found = shutil.which("ansible-inventory")
    if not found:
        raise FleetError("ansible-inventory not found: install ansible-core, or describe the fleet with --fleet FILE")
    return found


def read_inventory(inventory: str | Path) -> dict[str, Any]:
    """``ansible-inventory --list`` of an inventory (group_vars applied); every problem is one FleetError."""
    path = Path(inventory)
    if not path.exists():
        raise FleetError(f"inventory {path} does not exist (run from the repository root or pass --inventory)")
    try:
        completed = subprocess.run(
            [ansible_inventory_command(), "-i", str(path), "--list"],
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise FleetError(f"cannot run ansible-inventory on {path}: {exc}") from None
    if completed.returncode != 0:
        raise FleetError(f"ansible-inventory -i {path} failed:\n{completed.stderr.strip()}")
    try:
        data = json.loads(completed.stdout)
    except json.JSONDecodeError as exc:
        raise FleetError(f"ansible-inventory -i {path} did not print JSON: {exc}") from None
    if not isinstance(data, dict):
        raise FleetError(f"ansible-inventory -i {path} did not print a JSON object")
    return data


def fleet_from_inventory(inventory: str | Path) -> Fleet:
    return fleet_from_inventory_data(read_inventory(inventory), source=str(inventory))


def fleet_from_yaml(path: str | Path) -> Fleet:
    """A Fleet from a YAML file: ``nodes`` (name, tenant, gpus, mig_partition_config), ``namespaces``, ``replicas``."""
    file_path = Path(path)
    try:
        document = yaml.safe_load(file_path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise FleetError(f"cannot read fleet file {file_path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise FleetError(f"fleet file {file_path} is not valid YAML: {exc}") from None
    if not isinstance(document, Mapping) or not isinstance(document.get("nodes"), list) or not document["nodes"]:
        raise FleetError(f"fleet file {file_path} needs a non-empty list 'nodes'")
    product = document.get("gpu_product")
    nodes: list[Node] = []
    for position, entry in enumerate(document["nodes"]):
        where = f"{file_path}: nodes[{position}]"
        if not isinstance(entry, Mapping) or not entry.get("name"):
            raise FleetError(f"{where} needs a name")
        # count: N expands one entry into N nodes named <name>-01..N (a pool of identical nodes).
        count = entry.get("count", 1)
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise FleetError(f"{where}: count must be a whole number >= 1, got {count!r}")
        gpu_count = _gpu_count(entry.get("gpus", 8), where)
        gpus = node_gpus(entry.get("mig_partition_config"), gpu_count, product, where, "gpu_product")
        devices = gpu_devices(gpus, product)
        names = [str(entry["name"])] if count == 1 else [f"{entry['name']}-{i:02d}" for i in range(1, count + 1)]
        nodes.extend(Node(name, entry.get("tenant"), devices, gpus, product) for name in names)
    if len({n.name for n in nodes}) != len(nodes):
        raise FleetError(f"fleet file {file_path}: node names must be unique")
    namespaces = document.get("namespaces") or {}
    if not isinstance(namespaces, Mapping):
        raise FleetError(f"fleet file {file_path}: namespaces must map namespace -> tenant")
    replicas = document.get("replicas", 1)
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise FleetError(f"fleet file {file_path}: replicas must be a whole number >= 1, got {replicas!r}")
    sharing_doc = document.get("sharing") or {}
    if not isinstance(sharing_doc, Mapping):
        raise FleetError(f"fleet file {file_path}: sharing must map tenant -> {{resource: replicas}}")
    sharing: dict[tuple[str | None, str], int] = {}
    for tenant, per_resource in sharing_doc.items():
        sharing.update(parse_sharing(str(tenant), per_resource, f"fleet file {file_path}: sharing.{tenant}"))
    namespace_map = {str(k): str(v) for k, v in namespaces.items()}
    return Fleet(tuple(nodes), namespace_map, replicas, str(file_path), sharing)
