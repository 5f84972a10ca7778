"""The small NVML interface the rest of module_utils uses, and its implementation on nvidia-ml-py (pynvml).

This is the only module that imports pynvml. The record types the interface returns live here too, so the simulator
(nvml_sim.SimulatedNvml, the same interface with NVML's semantics: profile enum vs profile id, pending MIG mode,
IN_USE on busy instances, errors as NVML codes) and the planner depend on this module and never the other way
round. Choosing a backend (real or simulated) is nvml_backend.open_nvml's job.
"""

from __future__ import annotations

import contextlib
import ctypes
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from .exceptions import NvmlError, NvmlUnavailableError

SIM_ENV = "GPUFLEET_NVML_SIM"  # no longer selects the simulator: nvml_backend warns when it is set and ignored

# nvmlReturn_t values (nvml.h), shared by the real wrapper and the simulator so messages read the same.
SUCCESS = 0
ERROR_NAMES = {
    1: "UNINITIALIZED",
    2: "INVALID_ARGUMENT",
    3: "NOT_SUPPORTED",
    4: "NO_PERMISSION",
    6: "NOT_FOUND",
    7: "INSUFFICIENT_SIZE",
    9: "DRIVER_NOT_LOADED",
    12: "LIBRARY_NOT_FOUND",
    13: "FUNCTION_NOT_FOUND",
    15: "GPU_IS_LOST",
    16: "RESET_REQUIRED",
    17: "OPERATING_SYSTEM",
    19: "IN_USE",
    20: "MEMORY",
    23: "INSUFFICIENT_RESOURCES",
    29: "INVALID_STATE",
    999: "UNKNOWN",
}
ERROR_CODES = {name: code for code, name in ERROR_NAMES.items()}

GPU_INSTANCE_PROFILE_COUNT = 0x12  # NVML_GPU_INSTANCE_PROFILE_COUNT
COMPUTE_INSTANCE_PROFILE_COUNT = 0x9  # NVML_COMPUTE_INSTANCE_PROFILE_COUNT
COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED = 0x0
# NVML reports "not in a MIG instance" as 0xFFFFFFFF in process records.
NO_INSTANCE = 0xFFFFFFFF
_MIB = 1024 * 1024
# nvidia-smi's exit codes (nvidia-smi(1), RETURN VALUE) as the NVML errors they stand for; 255 is "other error".
_RESET_EXIT_CODES = {3: "NOT_SUPPORTED", 4: "NO_PERMISSION", 6: "NOT_FOUND", 9: "DRIVER_NOT_LOADED", 15: "GPU_IS_LOST"}
# The two NVML calls that list a GPU's processes, and the kind of process each lists.
_PROCESS_CALLS = (
    ("nvmlDeviceGetComputeRunningProcesses", "compute"),
    ("nvmlDeviceGetGraphicsRunningProcesses", "graphics"),
)


def error_name(code: int) -> str:
    return ERROR_NAMES.get(code, f"CODE_{code}")


@dataclass(frozen=True)
class DeviceIdentity:
    index: int
    uuid: str
    name: str
    memory_mib: int
    pci_device_id: int | None
    pci_subsystem_id: int | None = None  # subsystem device << 16 | subsystem vendor (mig-parted's device-filter)


@dataclass(frozen=True)
class ProfileInfo:
    """A GPU-instance profile as NVML reports it for one GPU."""

    enum: int  # NVML_GPU_INSTANCE_PROFILE_* it was queried with
    id: int  # profile id: what placements and creation take
    name: str  # e.g. "1g.10gb", "1g.10gb+me"
    slice_count: int  # compute slices
    instance_count: int  # maximum instances on an empty GPU
    memory_mib: int
    placements: tuple[tuple[int, int], ...]  # (start, size) over the memory slices


@dataclass(frozen=True)
class GpuInstanceRecord:
    gi_id: int
    profile_id: int
    start: int
    size: int
    compute_instances: tuple[tuple[int, int], ...]  # (compute instance id, compute slices)


@dataclass(frozen=True)
class MigDeviceRecord:
    gi_id: int
    ci_id: int
    uuid: str
    memory_mib: int


@dataclass(frozen=True)
class ProcessRecord:
    pid: int
    used_memory_mib: int | None
    gi_id: int | None  # None: not inside a MIG instance
    ci_id: int | None
    kind: str = "compute"  # "compute", "graphics" or "compute+graphics" (NVML lists each kind by its own call)


class NvmlInterface(Protocol):
    """What module_utils needs from NVML, injected: PynvmlBackend (the real library), nvml_sim.SimulatedNvml (the
    simulator) or a test's fake. Indexes are NVML device indexes; IDs are NVML's GI/CI ids."""

    def device_count(self) -> int: ...

    def identity(self, index: int) -> DeviceIdentity: ...

    def mig_mode(self, index: int) -> tuple[bool, bool]:
        """(current, pending); (False, False) on a GPU that cannot do MIG."""

    def mig_capable(self, index: int) -> bool:
        """Whether the GPU has a MIG mode at all (NVML answers NOT_SUPPORTED for its mode otherwise)."""

    def set_mig_mode(self, index: int, enabled: bool) -> int:
        """Returns NVML's activation status (SUCCESS, or e.g. IN_USE when the change stays pending until reset)."""

    def reset_gpu(self, index: int) -> None: ...

    def gpu_instance_profiles(self, index: int) -> list[ProfileInfo]:
        """ProfileInfo for every profile enum NVML supports on this GPU, with placements by profile id."""

    def gpu_instances(self, index: int, profile_ids: list[int]) -> list[GpuInstanceRecord]: ...

    def mig_devices(self, index: int) -> list[MigDeviceRecord]: ...

    def running_processes(self, index: int) -> list[ProcessRecord]: ...

    def create_gpu_instance(self, index: int, profile_id: int, start: int, size: int) -> int:
        """nvmlDeviceCreateGpuInstanceWithPlacement; returns the new GPU instance id."""

    def create_compute_instance(self, index: int, gi_id: int, slice_count: int) -> int:
        """Create the compute instance spanning the whole GPU instance; returns its id."""

    def destroy_compute_instance(self, index: int, gi_id: int, ci_id: int) -> None: ...

    def destroy_gpu_instance(self, index: int, gi_id: int) -> None: ...

    def close(self) -> None: ...


def merge_processes(records: list[ProcessRecord]) -> list[ProcessRecord]:
    """One record per process and instance: a process with a compute and a graphics context is listed by both calls."""
    merged: dict[tuple[int, int | None, int | None], ProcessRecord] = {}
    for record in records:
        key = (record.pid, record.gi_id, record.ci_id)
        seen = merged.get(key)
        if seen is None:
            merged[key] = record
        elif record.kind not in seen.kind.split("+"):
            kind = f"{seen.kind}+{record.kind}"
            merged[key] = ProcessRecord(seen.pid, seen.used_memory_mib, seen.gi_id, seen.ci_id, kind)
    return list(merged.values())


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class PynvmlBackend:
    """NvmlInterface on nvidia-ml-py. `lib` is the pynvml module (injectable for tests)."""

    def __init__(self, lib: Any = None) -> None:
        if lib is None:
            try:
                import pynvml  # the one pynvml import of the collection
            except ImportError as exc:
                raise NvmlUnavailableError(
                    f"nvidia-ml-py (pynvml) is not installed for this Python ({exc}); install it, or set "
                    "nvml_sim_state to use the simulator"
                ) from None
            lib = pynvml
        self._lib = lib
        self._handles: dict[int, object] = {}
        self._call("nvmlInit")

    def _call(self, name: str, *args: Any) -> Any:
        try:
            return getattr(self._lib, name)(*args)
        except self._lib.NVMLError as exc:
            code = getattr(exc, "value", 999)
            # Changing MIG mode or instances "requires root user" / "privileged user" (nvml.h).
            hint = "this needs root (become: true)" if error_name(code) == "NO_PERMISSION" else ""
            raise NvmlError(name, code, error_name(code), hint) from None

    def _handle(self, index: int) -> Any:
        if index not in self._handles:
            self._handles[index] = self._call("nvmlDeviceGetHandleByIndex", index)
        return self._handles[index]

    def _gi(self, index: int, gi_id: int) -> Any:
        return self._call("nvmlDeviceGetGpuInstanceById", self._handle(index), gi_id)

    def device_count(self) -> int:
        return int(self._call("nvmlDeviceGetCount"))

    def identity(self, index: int) -> DeviceIdentity:
        handle = self._handle(index)
        memory = self._call("nvmlDeviceGetMemoryInfo", handle)
        pci = self._call("nvmlDeviceGetPciInfo", handle)
        return DeviceIdentity(
            index,
            _text(self._call("nvmlDeviceGetUUID", handle)),
            _text(self._call("nvmlDeviceGetName", handle)),
            int(memory.total) // _MIB,
            int(pci.pciDeviceId),
            int(pci.pciSubSystemId),
        )

    def mig_mode(self, index: int) -> tuple[bool, bool]:
        try:
            current, pending = self._call("nvmlDeviceGetMigMode", self._handle(index))
        except NvmlError as exc:
            if exc.code_name == "NOT_SUPPORTED":  # not MIG-capable
                return False, False
            raise
        return bool(current), bool(pending)

    def mig_capable(self, index: int) -> bool:
        try:
            self._call("nvmlDeviceGetMigMode", self._handle(index))
        except NvmlError as exc:
            if exc.code_name == "NOT_SUPPORTED":
                return False
            raise
        return True

    def set_mig_mode(self, index: int, enabled: bool) -> int:
        mode = self._lib.NVML_DEVICE_MIG_ENABLE if enabled else self._lib.NVML_DEVICE_MIG_DISABLE
        try:
            return int(self._call("nvmlDeviceSetMigMode", self._handle(index), mode))
        finally:
            # nvml.h: the call "may unbind or reset the device", so the caller must query the device again.
            self._handles.pop(index, None)

    def reset_gpu(self, index: int) -> None:
        """Reset the GPU with nvidia-smi (NVML has no public reset; mig-parted does the same).

        NVML is released across the reset and initialised again after it: this process's own NVML session counts as a
        client that keeps the GPU busy ("In use by another client"), and every handle taken before the reset is stale
        afterwards (nvml.h: instance handles "become invalid" when the parent device is reset).
        """
        self._call("nvmlShutdown")
        self._handles.clear()
        try:
            proc = subprocess.run(
                ["nvidia-smi", "--gpu-reset", "-i", str(index)], capture_output=True, text=True, check=False
            )
        finally:
            self._call("nvmlInit")
        if proc.returncode != 0:
            output = (proc.stdout + proc.stderr).strip().replace("\n", " ")
            name = _RESET_EXIT_CODES.get(proc.returncode, "UNKNOWN")
            # "The following GPUs could not be reset: GPU …: <reason>" comes with 255 whatever the reason, so the
            # reason decides: "In use by another client" (processes or NVML clients hold the GPU), or "Not Supported"
            # (e.g. a GPU of an NVLink domain that can only be reset as a whole).
            lowered = output.lower()
            if "in use" in lowered:
                name = "IN_USE"
            elif "not supported" in lowered:
                name = "NOT_SUPPORTED"
            raise NvmlError("nvidia-smi --gpu-reset", ERROR_CODES[name], name, output)

    def gpu_instance_profiles(self, index: int) -> list[ProfileInfo]:
        handle = self._handle(index)
        profiles, seen = [], set()
        for enum in range(GPU_INSTANCE_PROFILE_COUNT):
            try:
                info = self._call("nvmlDeviceGetGpuInstanceProfileInfo", handle, enum)
            except NvmlError as exc:
                if exc.code_name in ("NOT_SUPPORTED", "INVALID_ARGUMENT"):
                    continue  # this profile does not exist on this GPU
                raise
            if info.id in seen:
                continue
            seen.add(info.id)
            placements = (self._lib.c_nvmlGpuInstancePlacement_t * 32)()
            count = ctypes.c_uint(32)
            self._call("nvmlDeviceGetGpuInstancePossiblePlacements", handle, info.id, placements, ctypes.byref(count))
            name = _text(info.name).removeprefix("MIG ")
            profiles.append(
                ProfileInfo(
                    enum,
                    int(info.id),
                    name,
                    int(info.sliceCount),
                    int(info.instanceCount),
                    int(info.memorySizeMB),
                    tuple((int(placements[i].start), int(placements[i].size)) for i in range(count.value)),
                )
            )
        return profiles

    def _compute_instance_profiles(self, gi: Any) -> list[Any]:
        found = []
        for enum in range(COMPUTE_INSTANCE_PROFILE_COUNT):
            try:
                found.append(
                    self._call(
                        "nvmlGpuInstanceGetComputeInstanceProfileInfo", gi, enum, COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
                    )
                )
            except NvmlError as exc:
                if exc.code_name not in ("NOT_SUPPORTED", "INVALID_ARGUMENT"):
                    raise
        return found

    def gpu_instances(self, index: int, profile_ids: list[int]) -> list[GpuInstanceRecord]:
        handle = self._handle(index)
        records = []
        for profile_id in profile_ids:
            array = (self._lib.c_nvmlGpuInstance_t * 8)()
            count = ctypes.c_uint(0)
            self._call("nvmlDeviceGetGpuInstances", handle, profile_id, array, ctypes.byref(count))
            for i in range(count.value):
                gi = array[i]
                info = self._call("nvmlGpuInstanceGetInfo", gi)
                cis = []
                for ci_profile in self._compute_instance_profiles(gi):
                    ci_array = (self._lib.c_nvmlComputeInstance_t * 8)()
                    ci_count = ctypes.c_uint(0)
                    self._call(
                        "nvmlGpuInstanceGetComputeInstances", gi, ci_profile.id, ci_array, ctypes.byref(ci_count)
                    )
                    for j in range(ci_count.value):
                        ci_info = self._call("nvmlComputeInstanceGetInfo", ci_array[j])
                        cis.append((int(ci_info.id), int(ci_profile.sliceCount)))
                records.append(
                    GpuInstanceRecord(
                        int(info.id),
                        int(info.profileId),
                        int(info.placement.start),
                        int(info.placement.size),
                        tuple(sorted(cis)),
                    )
                )
        return records

    def _mig_handles(self, handle: Any) -> Iterator[Any]:
        """The handles of the GPU's MIG devices (slots without one answer NOT_FOUND and are skipped)."""
        for i in range(int(self._call("nvmlDeviceGetMaxMigDeviceCount", handle))):
            try:
                yield self._call("nvmlDeviceGetMigDeviceHandleByIndex", handle, i)
            except NvmlError as exc:
                if exc.code_name != "NOT_FOUND":
                    raise

    def mig_devices(self, index: int) -> list[MigDeviceRecord]:
        return [
            MigDeviceRecord(
                int(self._call("nvmlDeviceGetGpuInstanceId", mig)),
                int(self._call("nvmlDeviceGetComputeInstanceId", mig)),
                _text(self._call("nvmlDeviceGetUUID", mig)),
                int(self._call("nvmlDeviceGetMemoryInfo", mig).total) // _MIB,
            )
            for mig in self._mig_handles(self._handle(index))
        ]

    def running_processes(self, index: int) -> list[ProcessRecord]:
        """Compute and graphics processes of the GPU, with the MIG instance each runs in.

        With MIG on, NVML answers the query on the GPU's handle only to a privileged caller (NO_PERMISSION otherwise);
        the per-instance answer comes from each MIG device's handle, so that is asked instead. Should that be refused
        too, the error stands: the GPU may be busy and nobody can tell.
        """
        handle = self._handle(index)
        try:
            return merge_processes(self._processes(handle))
        except NvmlError as exc:
            if exc.code_name != "NO_PERMISSION" or not self.mig_mode(index)[0]:
                raise
        found: list[ProcessRecord] = []
        for mig in self._mig_handles(handle):
            gi_id = int(self._call("nvmlDeviceGetGpuInstanceId", mig))
            ci_id = int(self._call("nvmlDeviceGetComputeInstanceId", mig))
            try:
                in_instance = self._processes(mig)
            except NvmlError as exc:
                if exc.code_name == "NO_PERMISSION":
                    raise NvmlError(
                        exc.call,
                        exc.code,
                        exc.code_name,
                        f"the processes on GPU {index} cannot be listed by this user, so whether its instances are "
                        "busy is unknown; run as root (become: true)",
                    ) from None
                raise
            found.extend(ProcessRecord(p.pid, p.used_memory_mib, gi_id, ci_id, p.kind) for p in in_instance)
        return merge_processes(found)

    def _processes(self, handle: Any) -> list[ProcessRecord]:
        records = []
        for call, kind in _PROCESS_CALLS:
            for proc in self._call(call, handle):
                used = getattr(proc, "usedGpuMemory", None)  # pynvml turns NVML_VALUE_NOT_AVAILABLE into None
                gi_id = getattr(proc, "gpuInstanceId", NO_INSTANCE)
                ci_id = getattr(proc, "computeInstanceId", NO_INSTANCE)
                records.append(
                    ProcessRecord(
                        int(proc.pid),
                        int(used) // _MIB if used is not None else None,
                        None if gi_id in (None, NO_INSTANCE) else int(gi_id),
                        None if ci_id in (None, NO_INSTANCE) else int(ci_id),
                        kind,
                    )
                )
        return records

    def create_gpu_instance(self, index: int, profile_id: int, start: int, size: int) -> int:
        placement = self._lib.c_nvmlGpuInstancePlacement_t()
        placement.start, placement.size = start, size
        gi = self._call(
            "nvmlDeviceCreateGpuInstanceWithPlacement", self._handle(index), profile_id, ctypes.byref(placement)
        )
        return int(self._call("nvmlGpuInstanceGetInfo", gi).id)

    def create_compute_instance(self, index: int, gi_id: int, slice_count: int) -> int:
        gi = self._gi(index, gi_id)
        for ci_profile in self._compute_instance_profiles(gi):
            if int(ci_profile.sliceCount) == slice_count:
                ci = self._call("nvmlGpuInstanceCreateComputeInstance", gi, ci_profile.id)
                return int(self._call("nvmlComputeInstanceGetInfo", ci).id)
        code = ERROR_CODES["NOT_SUPPORTED"]
        raise NvmlError(
            "nvmlGpuInstanceCreateComputeInstance", code, error_name(code), f"no {slice_count}-slice compute profile"
        )

    def destroy_compute_instance(self, index: int, gi_id: int, ci_id: int) -> None:
        gi = self._gi(index, gi_id)
        ci = self._call("nvmlGpuInstanceGetComputeInstanceById", gi, ci_id)
        self._call("nvmlComputeInstanceDestroy", ci)

    def destroy_gpu_instance(self, index: int, gi_id: int) -> None:
        self._call("nvmlGpuInstanceDestroy", self._gi(index, gi_id))

    def close(self) -> None:
        # Shutting down is best effort: the process exits right after.
        with contextlib.suppress(NvmlError):
            self._call("nvmlShutdown")
