"""The layout request: shape validation of `config` entries and of mig-parted `version: v1` config files.

This is pure data validation (types, keys, device selection). Whether a profile exists on a GPU, fits its maximum
count and has a placement is decided by the planner against the catalog NVML reports for that GPU.

Entry shape (mig-parted's, with underscores):
    {"devices": "all" | [0, 1], "mig_enabled": bool, "mig_devices": {"2g.20gb": 3, "1g.10gb": 1},
     "device_filter": ["0x233010DE"]}        # optional, as mig-parted's device-filter (PCI device IDs)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .exceptions import SpecError

# "1g.10gb", "1g.10gb+me", "7g.141gb", "1c.3g.40gb" is a CI profile (not supported: we create full-size CIs).
PROFILE_NAME_RE = re.compile(r"^[1-8]g\.[0-9]+gb(\+[a-z]+)?$")
SUPPORTED_MIG_PARTED_VERSIONS = ("v1",)
_ENTRY_KEYS = {"devices", "mig_enabled", "mig_devices", "device_filter"}


@dataclass(frozen=True)
class LayoutEntry:
    """One validated entry of the request."""

    devices: str | tuple[int, ...]  # "all" or GPU indexes
    mig_enabled: bool
    mig_devices: dict[str, int] = field(default_factory=dict)
    device_filter: tuple[int, ...] = ()  # PCI device IDs (nvmlPciInfo.pciDeviceId); empty = any GPU
    position: int = 0  # index of the entry in the request, for messages

    def selects(self, index: int, pci_device_id: int | None) -> bool:
        if self.device_filter and pci_device_id not in self.device_filter:
            return False
        return self.devices == "all" or index in self.devices


@dataclass(frozen=True)
class GpuTarget:
    """What one GPU must look like: MIG on/off and, when on, the count of instances per profile name."""

    mig_enabled: bool
    counts: dict[str, int]
    entry: int  # which request entry selected this GPU


def _fail(position: int, message: str) -> SpecError:
    return SpecError(f"config[{position}]: {message}")


def _as_int(value, what: str, position: int) -> int:
    # bool is an int subclass in Python; "true" must not become a count of 1.
    if isinstance(value, bool):
        raise _fail(position, f"{what} must be an integer, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    raise _fail(position, f"{what} must be an integer, got {value!r}")


def _as_bool(value, what: str, position: int) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "yes", "on", "false", "no", "off"):
        return value.lower() in ("true", "yes", "on")
    raise _fail(position, f"{what} must be a boolean, got {value!r}")


def _parse_pci_id(value, position: int) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        try:
            return int(value, 16)
        except ValueError:
            pass
    raise _fail(position, f"device_filter entries must be PCI device IDs such as '0x233010DE', got {value!r}")


def parse_entry(raw, position: int) -> LayoutEntry:
    """Validate one entry's shape and normalise it."""
    if not isinstance(raw, dict):
        raise _fail(position, f"each entry must be a mapping, got {type(raw).__name__}")
    unknown = sorted(set(raw) - _ENTRY_KEYS)
    if unknown:
        raise _fail(position, f"unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(_ENTRY_KEYS))}")
    if "devices" not in raw:
        raise _fail(position, "'devices' is required ('all' or a list of GPU indexes)")
    if "mig_enabled" not in raw:
        raise _fail(position, "'mig_enabled' is required (true or false)")

    raw_devices = raw["devices"]
    if raw_devices == "all":
        devices: str | tuple[int, ...] = "all"
    elif isinstance(raw_devices, (list, tuple)) and raw_devices:
        indexes = [_as_int(d, "devices[]", position) for d in raw_devices]
        if any(i < 0 for i in indexes):
            raise _fail(position, f"GPU indexes must be >= 0, got {indexes}")
        if len(set(indexes)) != len(indexes):
            raise _fail(position, f"GPU indexes are listed twice in {indexes}")
        devices = tuple(sorted(indexes))
    else:
        raise _fail(position, f"'devices' must be 'all' or a non-empty list of GPU indexes, got {raw_devices!r}")

    mig_enabled = _as_bool(raw["mig_enabled"], "'mig_enabled'", position)
    raw_counts = raw.get("mig_devices") or {}
    if not isinstance(raw_counts, dict):
        raise _fail(position, f"'mig_devices' must map profile names to counts, got {raw_counts!r}")
    if raw_counts and not mig_enabled:
        raise _fail(position, "'mig_devices' is set but 'mig_enabled' is false")
    counts: dict[str, int] = {}
    for name, raw_count in raw_counts.items():
        name = str(name)
        if not PROFILE_NAME_RE.match(name):
            raise _fail(position, f"{name!r} is not a GPU-instance profile name (expected e.g. '1g.10gb', '3g.40gb')")
        count = _as_int(raw_count, f"count of {name}", position)
        if count < 0:
            raise _fail(position, f"count of {name} must be >= 0, got {count}")
        if count:
            counts[name] = count

    raw_filter = raw.get("device_filter") or ()
    if isinstance(raw_filter, (str, int)):
        raw_filter = [raw_filter]
    device_filter = tuple(_parse_pci_id(v, position) for v in raw_filter)
    return LayoutEntry(devices, mig_enabled, counts, device_filter, position)


def parse_config(config) -> list[LayoutEntry]:
    """Validate the whole `config` list; raises SpecError naming the entry and the problem."""
    if not isinstance(config, (list, tuple)) or not config:
        raise SpecError("config must be a non-empty list of entries ({devices, mig_enabled, mig_devices})")
    return [parse_entry(raw, position) for position, raw in enumerate(config)]


def targets_for_gpus(entries: list[LayoutEntry], gpus: list[tuple[int, int | None]]) -> dict[int, GpuTarget]:
    """Map each GPU (index, PCI device id) to its target. GPUs no entry selects are left alone (not in the result).

    An index beyond the GPUs present is an error (a typo must not silently configure nothing), as is a GPU selected
    by two entries (which layout would win is not obvious to the reader).
    """
    present = {index for index, _device_id in gpus}
    for entry in entries:
        if entry.devices != "all":
            missing = sorted(set(entry.devices) - present)
            if missing:
                raise _fail(
                    entry.position,
                    f"GPU index(es) {missing} do not exist on this host (GPUs: {sorted(present) or 'none'})",
                )
    targets: dict[int, GpuTarget] = {}
    for index, pci_device_id in gpus:
        selecting = [e for e in entries if e.selects(index, pci_device_id)]
        if len(selecting) > 1:
            positions = ", ".join(f"config[{e.position}]" for e in selecting)
            raise SpecError(f"GPU {index} is selected by more than one entry ({positions})")
        if selecting:
            entry = selecting[0]
            targets[index] = GpuTarget(entry.mig_enabled, dict(entry.mig_devices), entry.position)
    return targets


def config_from_mig_parted(document, config_name: str) -> list[dict]:
    """Turn a parsed mig-parted config document (`version: v1`, `mig-configs:`) into our entry list.

    mig-parted's keys use dashes (mig-enabled, mig-devices, device-filter); ours use underscores.
    """
    if not isinstance(document, dict):
        raise SpecError("mig-parted config: the file must contain a mapping with 'version' and 'mig-configs'")
    version = document.get("version")
    if version not in SUPPORTED_MIG_PARTED_VERSIONS:
        supported = ", ".join(SUPPORTED_MIG_PARTED_VERSIONS)
        raise SpecError(f"mig-parted config: unsupported version {version!r} (supported: {supported})")
    configs = document.get("mig-configs")
    if not isinstance(configs, dict) or not configs:
        raise SpecError("mig-parted config: 'mig-configs' must be a non-empty mapping of config names to entries")
    if config_name not in configs:
        raise SpecError(
            f"mig-parted config: no config named {config_name!r} (available: {', '.join(sorted(map(str, configs)))})"
        )
    raw_entries = configs[config_name]
    if not isinstance(raw_entries, list):
        raise SpecError(f"mig-parted config: {config_name!r} must be a list of entries")
    entries = []
    for raw in raw_entries:
        if not isinstance(raw, dict):
            raise SpecError(f"mig-parted config: entries of {config_name!r} must be mappings, got {raw!r}")
        entries.append({key.replace("-", "_"): value for key, value in raw.items()})
    return entries
