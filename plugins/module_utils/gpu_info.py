"""Reading GPU state through the NVML interface: the instance reader shared with the planner's view
(runner.read_gpu), and the read-only facts of the nvidia_gpu_info module."""

from __future__ import annotations

from dataclasses import dataclass

from .nvml import GpuInstanceRecord, NvmlInterface
from .planner import Catalog, ProfileInfo


@dataclass(frozen=True)
class InstanceReading:
    """One GPU instance as NVML reports it, with its profile and each compute instance's MIG device UUID."""

    record: GpuInstanceRecord
    profile: ProfileInfo
    ci_uuids: dict  # compute instance id -> MIG device UUID (None when NVML lists no device for it)


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


def collect(nvml: NvmlInterface) -> list[dict]:
    gpus = []
    for index in range(nvml.device_count()):
        identity = nvml.identity(index)
        current, pending = nvml.mig_mode(index)
        catalog = Catalog(nvml.gpu_instance_profiles(index))
        processes = nvml.running_processes(index)
        instances = []
        for reading in read_instances(nvml, index, catalog) if current else []:
            record, profile = reading.record, reading.profile
            instances.append(
                {
                    "gpu_instance_id": record.gi_id,
                    "profile": profile.name,
                    "profile_id": record.profile_id,
                    "start": record.start,
                    "size": record.size,
                    "memory_mib": profile.memory_mib,
                    "compute_instances": [
                        {
                            "compute_instance_id": ci_id,
                            "compute_slices": slices,
                            "mig_device_uuid": reading.ci_uuids[ci_id],
                        }
                        for ci_id, slices in record.compute_instances
                    ],
                    "processes": sorted(p.pid for p in processes if p.gi_id == record.gi_id),
                }
            )
        gpus.append(
            {
                "index": index,
                "uuid": identity.uuid,
                "name": identity.name,
                "memory_mib": identity.memory_mib,
                "pci_device_id": None if identity.pci_device_id is None else f"0x{identity.pci_device_id:08X}",
                "pci_subsystem_id": None if not identity.pci_subsystem_id else f"0x{identity.pci_subsystem_id:08X}",
                "mig_capable": nvml.mig_capable(index),
                "mig_mode": {"current": current, "pending": pending},
                "gpu_instances": sorted(instances, key=lambda i: i["start"]),
                "processes": [
                    {
                        "pid": p.pid,
                        "used_memory_mib": p.used_memory_mib,
                        "gpu_instance_id": p.gi_id,
                        "compute_instance_id": p.ci_id,
                    }
                    for p in processes
                ],
                "mig_profiles": catalog.as_dict(),
            }
        )
    return gpus
