"""Reading one GPU's state through the NVML interface: `read_gpu_state` is the one reader, shared by the planner's
view (runner.read_gpu) and the read-only facts of the nvidia_gpu_info module (`collect`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .nvml import DeviceIdentity, GpuInstanceRecord, NvmlInterface, ProcessRecord, ProfileInfo
from .planner import Catalog


@dataclass(frozen=True)
class InstanceReading:
    """One GPU instance as NVML reports it, with its profile and each compute instance's MIG device UUID."""

    record: GpuInstanceRecord
    profile: ProfileInfo
    ci_uuids: dict[int, str | None]  # compute instance id -> MIG device UUID (None when NVML lists no device for it)


@dataclass(frozen=True)
class GpuReading:
    """Everything read from one GPU: identity, MIG mode (current, pending), processes and, with MIG on, instances."""

    identity: DeviceIdentity
    mig_current: bool
    mig_pending: bool
    processes: list[ProcessRecord]
    instances: list[InstanceReading] = field(default_factory=list)

    def pids_in(self, gi_id: int | None) -> tuple[int, ...]:
        """PIDs running in GPU instance `gi_id` (None: on the GPU outside any instance)."""
        return tuple(sorted(p.pid for p in self.processes if p.gi_id == gi_id))


def read_instances(nvml: NvmlInterface, index: int, catalog: Catalog) -> list[InstanceReading]:
    """The GPU instances of a MIG-enabled GPU, over every profile of its catalog."""
    uuids = {(d.gi_id, d.ci_id): d.uuid for d in nvml.mig_devices(index)}
    return [
        InstanceReading(
            record,
            catalog.by_id[record.profile_id],
            {ci_id: uuids.get((record.gi_id, ci_id)) for ci_id, _slices in record.compute_instances},
        )
        for record in nvml.gpu_instances(index, [p.id for p in catalog.profiles])
    ]


def read_gpu_state(nvml: NvmlInterface, index: int, catalog: Catalog) -> GpuReading:
    """Read one GPU; instances are only listed while MIG mode is on (NVML refuses the query otherwise)."""
    identity = nvml.identity(index)
    current, pending = nvml.mig_mode(index)
    processes = nvml.running_processes(index)
    instances = read_instances(nvml, index, catalog) if current else []
    return GpuReading(identity, current, pending, processes, sorted(instances, key=lambda i: i.record.start))


def _hex(value: int | None) -> str | None:
    return None if not value else f"0x{value:08X}"


def collect(nvml: NvmlInterface) -> list[dict[str, Any]]:
    """The facts of every GPU (the nvidia_gpu_info module's `gpus`)."""
    gpus = []
    for index in range(nvml.device_count()):
        catalog = Catalog(nvml.gpu_instance_profiles(index))
        reading = read_gpu_state(nvml, index, catalog)
        identity = reading.identity
        instances = [
            {
                "gpu_instance_id": instance.record.gi_id,
                "profile": instance.profile.name,
                "profile_id": instance.record.profile_id,
                "start": instance.record.start,
                "size": instance.record.size,
                "memory_mib": instance.profile.memory_mib,
                "compute_instances": [
                    {
                        "compute_instance_id": ci_id,
                        "compute_slices": slices,
                        "mig_device_uuid": instance.ci_uuids[ci_id],
                    }
                    for ci_id, slices in instance.record.compute_instances
                ],
                "processes": list(reading.pids_in(instance.record.gi_id)),
            }
            for instance in reading.instances
        ]
        gpus.append(
            {
                "index": index,
                "uuid": identity.uuid,
                "name": identity.name,
                "memory_mib": identity.memory_mib,
                "pci_device_id": None if identity.pci_device_id is None else f"0x{identity.pci_device_id:08X}",
                "pci_subsystem_id": _hex(identity.pci_subsystem_id),
                "mig_capable": nvml.mig_capable(index),
                "mig_mode": {"current": reading.mig_current, "pending": reading.mig_pending},
                "gpu_instances": instances,
                "processes": [
                    {
                        "pid": p.pid,
                        "used_memory_mib": p.used_memory_mib,
                        "gpu_instance_id": p.gi_id,
                        "compute_instance_id": p.ci_id,
                        "type": p.kind,
                    }
                    for p in reading.processes
                ],
                "mig_profiles": catalog.as_dict(),
            }
        )
    return gpus
