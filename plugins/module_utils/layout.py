"""What a node's `mig_partition_config` makes of its GPUs, decided without a GPU: the one expansion of a layout.

The nvidia_mig module decides the same thing on the host against the catalog NVML reports; on the controller
(the mig_layout filters) and in the extender's simulator there is no GPU, so the product's profile table stands in
for that catalog. Both go through spec.parse_config / targets_for_gpus and planner.validate_target, so a layout the
module would refuse is refused here with the same message, and `devices` is required everywhere.

This module and those it imports (spec, planner, nvml's record types, profile_tables, exceptions) are pure Python
without Ansible: the extender's wheel ships them as they are (see docs/layout_library.md).
"""

from __future__ import annotations

from typing import Any

from .exceptions import SpecError
from .names import parse_profile_name
from .planner import Catalog, validate_target
from .profile_tables import DEFAULT_PRODUCT, ProductTable, product_table
from .spec import GpuSelectable, parse_config, targets_for_gpus


def product_or_default(product: str | None) -> ProductTable:
    """The profile table of a product (NVML's name; default DEFAULT_PRODUCT); SpecError when not modelled."""
    try:
        return product_table(product or DEFAULT_PRODUCT)
    except KeyError as exc:
        raise SpecError(str(exc.args[0])) from None


def node_layout(config: Any, gpu_count: Any, product: str | None = None) -> list[dict[str, int] | None]:
    """Per GPU index: the MIG instances per canonical profile name, or None where MIG stays off (a whole GPU).

    A GPU no entry selects keeps MIG off, as in a fleet laid out by this collection. Raises SpecError when the
    layout is malformed or impossible on the product's GPUs.
    """
    if isinstance(gpu_count, bool) or not isinstance(gpu_count, int):
        try:
            gpu_count = int(gpu_count)
        except (TypeError, ValueError):
            raise SpecError(f"gpu_count must be an integer, got {gpu_count!r}") from None
    if gpu_count < 0:
        raise SpecError(f"gpu_count must be >= 0, got {gpu_count}")
    table = product_or_default(product)
    catalog = Catalog.from_table(table)
    entries = parse_config(config)
    gpus = [
        GpuSelectable(i, table.pci_device_id, table.pci_subsystem_id, bool(table.profiles)) for i in range(gpu_count)
    ]
    targets = targets_for_gpus(entries, gpus)
    layout: list[dict[str, int] | None] = []
    for index in range(gpu_count):
        target = targets.get(index)
        if target is None or not target.mig_enabled:
            layout.append(None)
            continue
        validate_target(target.counts, catalog, f"config[{target.entry}]: GPU {index} ({table.product})")
        layout.append(dict(target.counts))
    return layout


def profile_slices(profile: str) -> int:
    """Slices of a profile from its name (the G of <G>g.<GB>gb): ``3g.40gb`` -> 3, ``1g.10gb+me`` -> 1.

    The one place a profile name is read for its size (descheduler weights, fleet summary); ValueError if the text
    is not a profile name.
    """
    return parse_profile_name(profile).gpu


def memory_gb(profile: str) -> int:
    """Memory of a profile from its name: ``2g.20gb`` -> 20 (ValueError if not a profile name)."""
    return parse_profile_name(profile).gb
