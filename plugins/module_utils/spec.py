"""The layout request: shape validation of `config` entries and of mig-parted `version: v1` config files.

This is pure data validation (types, keys, device selection). Whether a profile exists on a GPU, fits its maximum
count and has a placement is decided by the planner against the catalog NVML reports for that GPU.

Entry shape (mig-parted's, with underscores):
    {"devices": "all" | [0, 1], "mig_enabled": bool, "mig_devices": {"2g.20gb": 3, "1g.10gb": 1},
     "device_filter": ["0x233010DE", "0x233010DE:0x16C110DE"]}   # optional, as mig-parted's device-filter

Profile names follow go-nvlib's grammar (what mig-parted accepts), so a file valid for mig-parted parses here even
where it names profiles of other GPU models; whether a profile exists on a GPU is the planner's question.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from .exceptions import SpecError
from .names import parse_profile_name  # the grammar lives in names.py

SUPPORTED_MIG_PARTED_VERSIONS = ("v1",)
_ENTRY_KEYS = {"devices", "mig_enabled", "mig_devices", "device_filter"}
# GPU indexes and counts are small; bounding them keeps a 5,000-digit string from reaching int().
_SMALL_INT = re.compile(r"[0-9]{1,6}")
_MAX_SMALL_INT = 999_999


@dataclass(frozen=True)
class DeviceId:
    """A device-filter entry: PCI device+vendor ID, optionally with the subsystem device+vendor ID.

    As mig-parted's pkg/types/device.go: ``0xDDDDVVVV`` matches every board of that GPU model,
    ``0xDDDDVVVV:0xSSSSVVVV`` only boards whose subsystem ID matches too.
    """

    device: int
    subsystem: int | None = None

    def matches(self, device: int | None, subsystem: int | None) -> bool:
        if device != self.device:
            return False
        return self.subsystem is None or subsystem == self.subsystem


@dataclass(frozen=True)
class GpuSelectable:
    """What entries select GPUs by: index, PCI IDs, and whether the GPU can do MIG at all."""

    index: int
    pci_device_id: int | None = None
    pci_subsystem_id: int | None = None
    mig_capable: bool = True


@dataclass(frozen=True)
class LayoutEntry:
    """One validated entry of the request."""

    devices: str | tuple[int, ...]  # "all" or GPU indexes
    mig_enabled: bool
    mig_devices: dict[str, int] = field(default_factory=dict)  # canonical profile name -> count
    device_filter: tuple[DeviceId, ...] = ()  # empty = any GPU
    position: int = 0  # index of the entry in the request, for messages

    def selects(self, gpu: GpuSelectable) -> bool:
        if self.device_filter and not any(
            f.matches(gpu.pci_device_id, gpu.pci_subsystem_id) for f in self.device_filter
        ):
            return False
        return self.devices == "all" or gpu.index in self.devices


@dataclass(frozen=True)
class GpuTarget:
    """What one GPU must look like: MIG on/off and, when on, the count of instances per profile name."""

    mig_enabled: bool
    counts: dict[str, int]
    entry: int  # which request entry selected this GPU


def _fail(position: int, message: str) -> SpecError:
    return SpecError(f"config[{position}]: {message}")


def _is_int(value: object) -> bool:
    """An integer, and not a bool (YAML's true is an int to isinstance)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _show(value: object) -> str:
    # Values go into messages: a 5,000-digit string must not (and repr() of a 5,000-digit int raises).
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**40:
        return f"an integer of about {int(value.bit_length() * 0.30103)} digits"
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:40]}... ({len(text)} characters)"


def _as_int(value: object, what: str, position: int) -> int:
    # bool is an int subclass in Python; "true" must not become a count of 1. ASCII digits only: "²".isdigit()
    # is True but int() refuses it, and a huge digit string would hit int()'s limit.
    if isinstance(value, bool):
        raise _fail(position, f"{what} must be an integer, got {_show(value)}")
    if isinstance(value, int) and -_MAX_SMALL_INT <= value <= _MAX_SMALL_INT:
        return value
    if isinstance(value, str) and _SMALL_INT.fullmatch(value.strip()):
        return int(value.strip())
    if isinstance(value, (int, str)) and not isinstance(value, bool):
        raise _fail(position, f"{what} must be an integer from 0 to {_MAX_SMALL_INT}, got {_show(value)}")
    raise _fail(position, f"{what} must be an integer, got {_show(value)}")


def _as_bool(value: object, what: str, position: int) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "yes", "on", "false", "no", "off"):
        return value.lower() in ("true", "yes", "on")
    raise _fail(position, f"{what} must be a boolean, got {_show(value)}")


_PCI_ID = re.compile(r"(?:0[xX])?([0-9a-fA-F]{1,8})")


def _parse_pci_id(value: object, position: int) -> DeviceId:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 0xFFFFFFFF:
        return DeviceId(value)
    if isinstance(value, str):
        parts = value.strip().split(":")
        matches = [_PCI_ID.fullmatch(part) for part in parts]
        if len(parts) in (1, 2) and all(matches):
            ids = [int(m.group(1), 16) for m in matches if m is not None]
            return DeviceId(ids[0], ids[1] if len(ids) == 2 else None)
    raise _fail(
        position,
        "device_filter entries must be PCI IDs such as '0x233010DE' (device+vendor) or '0x233010DE:0x16C110DE' "
        f"(with the subsystem ID), got {_show(value)}",
    )


def parse_entry(raw: object, position: int) -> LayoutEntry:
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
        raise _fail(position, f"'devices' must be 'all' or a non-empty list of GPU indexes, got {_show(raw_devices)}")

    mig_enabled = _as_bool(raw["mig_enabled"], "'mig_enabled'", position)
    raw_counts = raw.get("mig_devices") or {}
    if not isinstance(raw_counts, dict):
        raise _fail(position, f"'mig_devices' must map profile names to counts, got {_show(raw_counts)}")
    if raw_counts and not mig_enabled:
        raise _fail(position, "'mig_devices' is set but 'mig_enabled' is false")
    counts: dict[str, int] = {}
    for raw_name, raw_count in raw_counts.items():
        try:
            name = parse_profile_name(str(raw_name)).canonical
        except ValueError as exc:
            raise _fail(
                position,
                f"{_show(raw_name)} is not a MIG profile name ({exc}; expected e.g. '1g.10gb', '1g.10gb+me', "
                "'3g.40gb')",
            ) from None
        count = _as_int(raw_count, f"count of {name}", position)
        if count < 0:
            raise _fail(position, f"count of {name} must be >= 0, got {count}")
        if name in counts:
            raise _fail(position, f"{name} is listed twice (as two spellings of one profile)")
        if count:
            counts[name] = count

    raw_filter = raw.get("device_filter") or ()
    if isinstance(raw_filter, (str, int)):
        raw_filter = [raw_filter]
    device_filter = tuple(_parse_pci_id(v, position) for v in raw_filter)
    return LayoutEntry(devices, mig_enabled, counts, device_filter, position)


def parse_config(config: object) -> list[LayoutEntry]:
    """Validate the whole `config` list; raises SpecError naming the entry and the problem."""
    if not isinstance(config, (list, tuple)) or not config:
        raise SpecError("config must be a non-empty list of entries ({devices, mig_enabled, mig_devices})")
    return [parse_entry(raw, position) for position, raw in enumerate(config)]


MISSING_DEVICES_CHOICES = ("fail", "skip")


def targets_for_gpus(
    entries: list[LayoutEntry], gpus: list[GpuSelectable], missing_devices: str = "fail"
) -> dict[int, GpuTarget]:
    """Map each GPU to its target. GPUs no entry selects are left alone (not in the result).

    - An index beyond the GPUs present is an error by default (a typo must not silently configure nothing);
      ``missing_devices="skip"`` ignores it, as mig-parted does (a GPU Operator file written for bigger hosts).
    - A GPU that cannot do MIG is skipped where mig-parted skips it (``devices: all``, or MIG off wanted) and is
      an error where an entry names its index and wants MIG on.
    - A GPU selected by two entries is an error (mig-parted lets the last one win; which layout would win is not
      obvious to the reader).
    """
    if missing_devices not in MISSING_DEVICES_CHOICES:
        raise SpecError(f"missing_devices must be one of {', '.join(MISSING_DEVICES_CHOICES)}, got {missing_devices!r}")
    present = {gpu.index for gpu in gpus}
    for entry in entries:
        if entry.devices != "all" and missing_devices == "fail":
            missing = sorted({int(i) for i in entry.devices} - present)
            if missing:
                raise _fail(
                    entry.position,
                    f"GPU index(es) {missing} do not exist on this host (GPUs: {sorted(present) or 'none'}; "
                    "missing_devices=skip ignores them, as mig-parted does)",
                )
    targets: dict[int, GpuTarget] = {}
    for gpu in gpus:
        selecting = [e for e in entries if e.selects(gpu)]
        if not gpu.mig_capable:
            for entry in selecting:
                if entry.devices != "all" and entry.mig_enabled:
                    raise _fail(entry.position, f"GPU {gpu.index} cannot do MIG (NVML reports no MIG mode)")
            continue  # nothing to set on it: left as it is
        if len(selecting) > 1:
            positions = ", ".join(f"config[{e.position}]" for e in selecting)
            raise SpecError(f"GPU {gpu.index} is selected by more than one entry ({positions})")
        if selecting:
            entry = selecting[0]
            targets[gpu.index] = GpuTarget(entry.mig_enabled, dict(entry.mig_devices), entry.position)
    return targets


_MIG_PARTED_KEYS = ("device-filter", "devices", "mig-enabled", "mig-devices")


def _check_mig_parted_entry(raw: object, where: str) -> None:
    """mig-parted's own rules for one entry (api/spec/v1/spec.go MigConfigSpec, pkg/types/mig_config.go)."""
    if not isinstance(raw, dict):
        raise SpecError(f"{where}: must be a mapping, got {_show(raw)}")
    unknown = sorted(str(k) for k in set(raw) - set(_MIG_PARTED_KEYS))
    if unknown:
        raise SpecError(f"{where}: unexpected field(s) {', '.join(unknown)}")
    for key in ("devices", "mig-enabled"):
        if key not in raw:
            raise SpecError(f"{where}: missing required field {key}")
    device_filter = raw.get("device-filter")
    if "device-filter" in raw and not (
        isinstance(device_filter, str)
        or (isinstance(device_filter, list) and all(isinstance(v, str) for v in device_filter))
    ):
        raise SpecError(f"{where}: device-filter must be a string or a list of strings, got {_show(device_filter)}")
    devices = raw["devices"]
    if not (devices == "all" or (isinstance(devices, list) and all(_is_int(d) for d in devices))):
        raise SpecError(f"{where}: devices must be 'all' or a list of integers, got {_show(devices)}")
    if not isinstance(raw["mig-enabled"], bool):
        raise SpecError(f"{where}: mig-enabled must be true or false, got {_show(raw['mig-enabled'])}")
    mig_devices = raw.get("mig-devices")
    if raw["mig-enabled"] and mig_devices is None:
        raise SpecError(f"{where}: missing required field 'mig-devices' when 'mig-enabled' is true (use {{}} for none)")
    if mig_devices is None:
        return
    if not isinstance(mig_devices, dict):
        raise SpecError(f"{where}: mig-devices must map profile names to counts, got {_show(mig_devices)}")
    if not raw["mig-enabled"] and mig_devices:
        raise SpecError(f"{where}: MIG devices included when 'mig-enabled' is false")
    for name, count in mig_devices.items():
        try:
            parse_profile_name(str(name))
        except ValueError as exc:
            raise SpecError(f"{where}: invalid MIG profile name {_show(name)}: {exc}") from None
        if not _is_int(count) or count < 0:
            raise SpecError(f"{where}: invalid count for {name}: {_show(count)}")
    if mig_devices and not any(mig_devices.values()):
        raise SpecError(f"{where}: all counts of mig-devices are 0")


def config_from_mig_parted(document: object, config_name: str) -> list[dict[str, Any]]:
    """Turn a parsed mig-parted config document (`version: v1`, `mig-configs:`) into our entry list.

    The whole file is checked with mig-parted's rules first, every config in it (mig-parted parses the file as a
    whole and refuses it if any part is invalid), then the selected config is returned with our key names
    (mig-parted's use dashes: mig-enabled, mig-devices, device-filter).
    """
    if not isinstance(document, dict):
        raise SpecError("mig-parted config: the file must contain a mapping with 'version' and 'mig-configs'")
    version = document.get("version")
    if version not in SUPPORTED_MIG_PARTED_VERSIONS:
        supported = ", ".join(SUPPORTED_MIG_PARTED_VERSIONS)
        raise SpecError(f"mig-parted config: unsupported version {_show(version)} (supported: {supported})")
    unknown = sorted(str(k) for k in set(document) - {"version", "mig-configs"})
    if unknown:
        raise SpecError(f"mig-parted config: unexpected field(s) {', '.join(unknown)}")
    configs = document.get("mig-configs")
    if not isinstance(configs, dict) or not configs:
        raise SpecError("mig-parted config: 'mig-configs' must be a non-empty mapping of config names to entries")
    for name, raw_entries in configs.items():
        if not isinstance(raw_entries, list) or not raw_entries:
            raise SpecError(f"mig-parted config: {str(name)!r} must be a non-empty list of entries")
        for position, raw in enumerate(raw_entries):
            _check_mig_parted_entry(raw, f"mig-parted config: {str(name)!r} entry {position}")
    if config_name not in configs:
        raise SpecError(
            f"mig-parted config: no config named {config_name!r} (available: {', '.join(sorted(map(str, configs)))})"
        )
    return [{key.replace("-", "_"): value for key, value in raw.items()} for raw in configs[config_name]]
