"""MIG GPU-instance profile tables of the products the NVML simulator models (H100 80GB, H200 141GB).

These tables are data for the simulator (and for offline validation by the `mig_layout` filters, which run on the
controller where no GPU exists). The planner never reads them: on a host it uses the catalog NVML reports.

NVML has two ID spaces for GPU-instance profiles, and they must not be mixed:
- the profile *enum* (NVML_GPU_INSTANCE_PROFILE_1_SLICE = 0, ..._1_SLICE_REV1 = 7, ...) that
  nvmlDeviceGetGpuInstanceProfileInfo takes, and
- the profile *id* that the returned info carries (1g.10gb = 19 on H100) and that
  nvmlDeviceGetGpuInstancePossiblePlacements / nvmlDeviceCreateGpuInstanceWithPlacement take.
Memory sizes are as NVML reports them in MiB ("memorySizeMB"), rounded to the values nvidia-smi shows.
"""

from __future__ import annotations

from dataclasses import dataclass

# NVML_GPU_INSTANCE_PROFILE_* enum values (nvml.h; identical in nvidia-ml-py's pynvml).
PROFILE_1_SLICE = 0x0
PROFILE_2_SLICE = 0x1
PROFILE_3_SLICE = 0x2
PROFILE_4_SLICE = 0x3
PROFILE_7_SLICE = 0x4
PROFILE_8_SLICE = 0x5
PROFILE_6_SLICE = 0x6
PROFILE_1_SLICE_REV1 = 0x7  # 1 compute slice + all media engines ("+me")
PROFILE_2_SLICE_REV1 = 0x8
PROFILE_1_SLICE_REV2 = 0x9  # 1 compute slice, 2 memory slices (1g.20gb on H100)
PROFILE_COUNT = 0x12  # NVML_GPU_INSTANCE_PROFILE_COUNT: the enum values NVML can be asked about

# Memory slices of a Hopper GPU: placements are (start, size) over these.
MEMORY_SLICES = 8


@dataclass(frozen=True)
class ProfileRow:
    """One GPU-instance profile of one product, as NVML describes it."""

    enum: int  # NVML_GPU_INSTANCE_PROFILE_* value
    id: int  # profile id (what placements and creation take)
    name: str  # without the "MIG " prefix NVML puts in front
    slice_count: int  # compute slices (of 7)
    instance_count: int  # how many such instances fit on an empty GPU
    memory_mib: int
    starts: tuple[int, ...]  # possible placement starts
    size: int  # placement size in memory slices


@dataclass(frozen=True)
class ProductTable:
    product: str  # nvmlDeviceGetName
    memory_mib: int  # total memory (nvmlDeviceGetMemoryInfo)
    pci_device_id: int  # nvmlDeviceGetPciInfo().pciDeviceId (device << 16 | vendor), as mig-parted's device-filter
    profiles: tuple[ProfileRow, ...]  # empty: the GPU cannot do MIG
    # nvmlPciInfo_t.pciSubSystemId (subsystem device << 16 | subsystem vendor): it depends on the board, so this is
    # one board's value (the simulator's default), for device-filter entries written with a subsystem ID.
    pci_subsystem_id: int | None = None
    # An SXM module on an HGX baseboard (NVLink between the GPUs, NVSwitch on the 8-GPU board); False: a PCIe card.
    sxm: bool = False


# Placement geometry shared by H100 and H200 (start:size over the 8 memory slices).
_HOPPER_GEOMETRY = {
    "1g": ((0, 1, 2, 3, 4, 5, 6), 1),
    "1g.wide": ((0, 2, 4, 6), 2),
    "2g": ((0, 2, 4), 2),
    "3g": ((0, 4), 4),
    "4g": ((0,), 4),
    "7g": ((0,), 8),
}


def _hopper(
    product: str, memory_mib: int, pci_device_id: int, sizes: dict[str, tuple[str, int]], subsystem: int | None = None
) -> ProductTable:
    """Build a Hopper table; `sizes` maps geometry key -> (profile name, memory MiB)."""
    rows = []
    for enum, profile_id, geometry, slice_count, count, name_key in (
        (PROFILE_1_SLICE, 19, "1g", 1, 7, "1g"),
        (PROFILE_1_SLICE_REV1, 20, "1g", 1, 1, "1g+me"),
        (PROFILE_1_SLICE_REV2, 15, "1g.wide", 1, 4, "1g.wide"),
        (PROFILE_2_SLICE, 14, "2g", 2, 3, "2g"),
        (PROFILE_3_SLICE, 9, "3g", 3, 2, "3g"),
        (PROFILE_4_SLICE, 5, "4g", 4, 1, "4g"),
        (PROFILE_7_SLICE, 0, "7g", 7, 1, "7g"),
    ):
        starts, size = _HOPPER_GEOMETRY[geometry]
        name, memory = sizes[name_key]
        rows.append(ProfileRow(enum, profile_id, name, slice_count, count, memory, starts, size))
    return ProductTable(product, memory_mib, pci_device_id, tuple(rows), subsystem, sxm=True)


H100_80GB = _hopper(
    "NVIDIA H100 80GB HBM3",
    81559,
    0x233010DE,
    {
        "1g": ("1g.10gb", 9856),
        "1g+me": ("1g.10gb+me", 9856),
        "1g.wide": ("1g.20gb", 19968),
        "2g": ("2g.20gb", 19968),
        "3g": ("3g.40gb", 40192),
        "4g": ("4g.40gb", 40192),
        "7g": ("7g.80gb", 80384),
    },
    subsystem=0x16C110DE,  # an H100 SXM5 board
)

H200_141GB = _hopper(
    "NVIDIA H200",
    143771,
    0x233510DE,
    {
        "1g": ("1g.18gb", 16384),
        "1g+me": ("1g.18gb+me", 16384),
        "1g.wide": ("1g.35gb", 32768),
        "2g": ("2g.35gb", 32768),
        "3g": ("3g.71gb", 70144),
        "4g": ("4g.71gb", 70144),
        "7g": ("7g.141gb", 140288),
    },
)

# A GPU without MIG (nvmlDeviceGetMigMode answers NOT_SUPPORTED), for mixed hosts in the simulator.
L4 = ProductTable("NVIDIA L4", 23034, 0x27B810DE, ())

PRODUCTS = (H100_80GB, H200_141GB, L4)


def nvswitches(table: ProductTable, gpu_count: int) -> int:
    """NVSwitch chips on a host's GPU board: an HGX H100/H200 8-GPU board has 4 (NVLink 4 through third-generation
    NVSwitch, which nvidia-fabricmanager must run for); a 4-GPU HGX board links its GPUs directly, and PCIe cards
    (L4) have no NVLink fabric."""
    return 4 if table.sxm and gpu_count == 8 else 0


# The product of a host whose inventory does not name one (gpufleet_gpu_product), and of a simulated host: the one
# default, read by the layout library, the host facts (host_gpus) and the NVML simulator.
DEFAULT_PRODUCT = H100_80GB.product


def product_table(product: str) -> ProductTable:
    """Table for a product name as NVML reports it (exact, then by model: "H100 ... 80GB", "H200").

    Raises KeyError naming the known products when the product is not modelled.
    """
    for table in PRODUCTS:
        if table.product == product:
            return table
    upper = product.upper()
    if "H100" in upper and "80GB" in upper.replace(" ", ""):
        return H100_80GB
    if "H200" in upper:
        return H200_141GB
    known = ", ".join(t.product for t in PRODUCTS if t.profiles)
    raise KeyError(f"no MIG profile table for GPU product {product!r} (known: {known})")
