"""Read-only facts about every GPU (used by the nvidia_gpu_info module)."""

from __future__ import annotations

from .nvml import NvmlInterface
from .planner import Catalog


def collect(nvml: NvmlInterface) -> list[dict]:
    gpus = []
    for index in range(nvml.device_count()):
        identity = nvml.identity(index)
        current, pending = nvml.mig_mode(index)
        catalog = Catalog(nvml.gpu_instance_profiles(index))
        processes = nvml.running_processes(index)
        instances = []
        if current:
            uuids = {(d.gi_id, d.ci_id): d.uuid for d in nvml.mig_devices(index)}
            for record in nvml.gpu_instances(index, [p.id for p in catalog.profiles]):
                profile = catalog.by_id[record.profile_id]
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
                                "mig_device_uuid": uuids.get((record.gi_id, ci_id)),
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
