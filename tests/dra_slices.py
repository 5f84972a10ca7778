"""ResourceSlices shaped as NVIDIA's DRA driver (kubernetes-sigs/dra-driver-nvidia-gpu, gpu-kubelet-plugin)
publishes them for H100/H200 with DynamicMIG on Kubernetes >= 1.35, and the claims and pods the DRA tests replay.

What the driver publishes for a node (driver.go generateSplitResourceSlices, partitions.go, deviceinfo.go):
- one pool named after the node, driver gpu.nvidia.com, G + 1 slices: first one holding only the shared counters
  (one counter set gpu-<minor>-counter-set per GPU), then one slice per GPU (by PCI bus ID) with its devices
  sorted by name;
- per GPU the whole GPU gpu-<minor> and every (profile, placement) as gpu-<minor>-mig-<profile>-<id>-<start>;
- a counter set holds the GPU's largest capacity per dimension (multiprocessors, copy-engines, decoders, encoders,
  jpeg-engines, ofa-engines, memory) and memory-slice-<i> = 1 for each memory slice; the whole GPU consumes all of
  it, a MIG device its profile's capacities and the memory slices of its placement;
- attributes (bare names, the driver's domain): type (gpu|mig), uuid, productName, brand, architecture,
  cudaComputeCapability, driverVersion, cudaDriverVersion, resource.kubernetes.io/pciBusID and pcieRoot; a MIG
  device adds profile and parentUUID.
Per-profile capacities are H100 80GB HBM3's and H200's as `nvidia-smi mig -lgip` lists them (SMs, copy engines,
decoders, encoders, JPEG, OFA); memory from plugins/module_utils/profile_tables.py, which is also where the
placements come from (one source for the placement rules)."""

from __future__ import annotations

import uuid as uuidlib

from gpufleet_testsupport.collection import collections_path

collections_path()
from ansible_collections.gpufleet.mig.plugins.filter.tenants_model import dra_device_class  # noqa: E402, F401
from ansible_collections.gpufleet.mig.plugins.module_utils import dra_placement  # noqa: E402
from ansible_collections.gpufleet.mig.plugins.module_utils.profile_tables import (  # noqa: E402
    H100_80GB,
    H200_141GB,
    MEMORY_SLICES,
    ProductTable,
)

DRIVER = dra_placement.DRIVER
# Engines per profile size, H100 and H200 alike: (multiprocessors, copy engines, decoders, encoders, jpeg, ofa).
ENGINES = {
    "1g": (16, 1, 1, 0, 1, 0),
    "1g+me": (16, 1, 1, 0, 1, 1),
    "1g.wide": (26, 1, 1, 0, 1, 0),
    "2g": (32, 2, 2, 0, 2, 0),
    "3g": (60, 3, 3, 0, 3, 0),
    "4g": (64, 4, 4, 0, 4, 0),
    "7g": (132, 8, 7, 0, 7, 1),
}
CAPACITIES = ("multiprocessors", "copyEngines", "decoders", "encoders", "jpegEngines", "ofaEngines")
COUNTERS = ("multiprocessors", "copy-engines", "decoders", "encoders", "jpeg-engines", "ofa-engines")
ARCHITECTURE = {"NVIDIA H100 80GB HBM3": "Hopper", "NVIDIA H200": "Hopper"}


def _engines(profile: str) -> tuple[int, ...]:
    size = profile.split(".")[0]
    if profile.endswith("+me"):
        return ENGINES[f"{size}+me"]
    if size == "1g" and profile not in ("1g.10gb", "1g.18gb"):  # 1g.20gb / 1g.35gb: two memory slices
        return ENGINES["1g.wide"]
    return ENGINES[size]


def _capacity(profile: str, memory_mib: int) -> dict:
    values = dict(zip(CAPACITIES, _engines(profile), strict=True))
    return {**{k: {"value": str(v)} for k, v in values.items()}, "memory": {"value": f"{memory_mib}Mi"}}


def _counters(profile: str, memory_mib: int, start: int, size: int) -> dict:
    values = dict(zip(COUNTERS, _engines(profile), strict=True))
    counters = {**{k: {"value": str(v)} for k, v in values.items()}, "memory": {"value": f"{memory_mib}Mi"}}
    counters.update({f"memory-slice-{i}": {"value": "1"} for i in range(start, start + size)})
    return counters


def gpu_uuid(node: str, minor: int) -> str:
    return "GPU-" + str(uuidlib.uuid5(uuidlib.NAMESPACE_DNS, f"{node}/{minor}"))


def _attributes(table: ProductTable, node: str, minor: int) -> dict:
    bus = f"0000:{0x18 + 0x10 * minor:02x}:00.0"
    return {
        "type": {"string": "gpu"},
        "uuid": {"string": gpu_uuid(node, minor)},
        "productName": {"string": table.product},
        "brand": {"string": "Nvidia"},
        "architecture": {"string": ARCHITECTURE[table.product]},
        "cudaComputeCapability": {"version": "9.0.0"},
        "driverVersion": {"version": "580.95.5"},
        "cudaDriverVersion": {"version": "13.0.0"},
        "resource.kubernetes.io/pciBusID": {"string": bus},
        "resource.kubernetes.io/pcieRoot": {"string": f"pci0000:{0x17 + 0x10 * minor:02x}"},
    }


def gpu_devices(table: ProductTable, node: str, minor: int) -> list[dict]:
    """One GPU's devices, as its ResourceSlice lists them (sorted by name)."""
    counter_set = f"gpu-{minor}-counter-set"
    rows = {row.name: row for row in table.profiles}
    biggest = max(table.profiles, key=lambda row: row.size * 10 + row.slice_count)
    devices = []
    for name, kind, start, size in dra_placement.published_devices(minor, table):
        attributes = _attributes(table, node, minor)
        if kind == dra_placement.WHOLE_GPU:
            capacity = _capacity(biggest.name, biggest.memory_mib)
            counters = _counters(biggest.name, biggest.memory_mib, 0, MEMORY_SLICES)
        else:
            row = rows[kind]
            parent = attributes["uuid"]["string"]
            attributes.update(
                type={"string": "mig"},
                profile={"string": kind},
                parentUUID={"string": parent},
                uuid={"string": "MIG-" + str(uuidlib.uuid5(uuidlib.NAMESPACE_DNS, f"{parent}/{name}"))},
            )
            capacity = _capacity(kind, row.memory_mib)
            counters = _counters(kind, row.memory_mib, start, size)
        devices.append(
            {
                "name": name,
                "attributes": attributes,
                "capacity": capacity,
                "consumesCounters": [{"counterSet": counter_set, "counters": counters}],
            }
        )
    return devices


def node_slices(node: str, gpus: int, table: ProductTable = H100_80GB) -> list[dict]:
    """The node's ResourceSlices: the shared counters first, then one per GPU. Names sort in that order, which is
    the order the allocator walks them (the driver's are generated; this fixes one)."""
    biggest = max(table.profiles, key=lambda row: row.size * 10 + row.slice_count)
    pool = {"name": node, "generation": 1, "resourceSliceCount": gpus + 1}

    def slice_of(suffix: str, spec: dict) -> dict:
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{DRIVER}-{suffix}"},
            "spec": {"driver": DRIVER, "nodeName": node, "pool": pool, **spec},
        }

    counter_sets = [
        {"name": f"gpu-{minor}-counter-set", "counters": _counters(biggest.name, biggest.memory_mib, 0, MEMORY_SLICES)}
        for minor in range(gpus)
    ]
    slices = [slice_of("0-counters", {"sharedCounters": counter_sets})]
    slices += [slice_of(f"1-gpu-{minor:02d}", {"devices": gpu_devices(table, node, minor)}) for minor in range(gpus)]
    return slices


PRODUCTS = {"h100": H100_80GB, "h200": H200_141GB}


def replay_sequence(rounds: int = 3) -> list[tuple[str, int, str]]:
    """Allocation and release, as the issues the driver's users filed describe them (seven 1g pods scattered over
    GPUs, #932; teardown leaving holes that block larger profiles, #933): each round asks for eight 1g.10gb, then
    five whole GPUs and two 3g.40gb, releases those seven large claims and every other 1g.10gb still held.
    ("alloc", claim number, kind) or ("free", claim number, "")."""
    sequence: list[tuple[str, int, str]] = []
    held: list[int] = []
    number = 0
    for _ in range(rounds):
        for _ in range(8):
            sequence.append(("alloc", number, "1g.10gb"))
            held.append(number)
            number += 1
        large = []
        for kind in [dra_placement.WHOLE_GPU] * 5 + ["3g.40gb"] * 2:
            sequence.append(("alloc", number, kind))
            large.append(number)
            number += 1
        sequence += [("free", claim, "") for claim in large]
        released = held[::2]
        sequence += [("free", claim, "") for claim in released]
        held = [claim for claim in held if claim not in released]
    return sequence
