"""The real NVML wrapper (PynvmlBackend) against nvidia-ml-py's actual API.

A fake `pynvml` serves the simulator's state through the real function names, and checks every call the wrapper
makes against the installed pynvml: the function must exist and the arguments must bind to its signature. The real
ctypes structures and arrays are used. So the wrapper and the library cannot drift apart unnoticed, and the wrapper
produces the same plans and results as the simulator path.
"""

from __future__ import annotations

import ctypes
import inspect
from types import SimpleNamespace

import pynvml
import pytest
from _helpers import layout, new_sim
from ansible_collections.gpufleet.mig.plugins.module_utils import runner
from ansible_collections.gpufleet.mig.plugins.module_utils.exceptions import NvmlError
from ansible_collections.gpufleet.mig.plugins.module_utils.nvml import PynvmlBackend


class FakePynvml:
    """Just enough of pynvml, backed by a SimulatedNvml; every call is checked against the real pynvml."""

    NVMLError = pynvml.NVMLError
    NVML_DEVICE_MIG_ENABLE = pynvml.NVML_DEVICE_MIG_ENABLE
    NVML_DEVICE_MIG_DISABLE = pynvml.NVML_DEVICE_MIG_DISABLE
    c_nvmlGpuInstancePlacement_t = pynvml.c_nvmlGpuInstancePlacement_t
    c_nvmlGpuInstance_t = pynvml.c_nvmlGpuInstance_t
    c_nvmlComputeInstance_t = pynvml.c_nvmlComputeInstance_t

    def __init__(self, sim):
        self.sim = sim
        self.calls = []

    def __getattribute__(self, name):
        if name.startswith("nvml"):
            real = getattr(pynvml, name, None)
            assert callable(real), f"pynvml has no function {name}"
            impl = object.__getattribute__(self, "_" + name)

            def checked(*args):
                inspect.signature(real).bind(*args)  # TypeError if the wrapper calls it wrongly
                object.__getattribute__(self, "calls").append(name)
                try:
                    return impl(*args)
                except NvmlError as exc:
                    raise pynvml.NVMLError(exc.code) from None

            return checked
        return object.__getattribute__(self, name)

    # handles: devices are namespaces; GI/CI handles are ctypes pointers carrying (gpu, gi, ci) in their address
    @staticmethod
    def _pointer(kind, gpu, gi, ci=0):
        return ctypes.cast(ctypes.c_void_p((gpu << 24) | (gi << 12) | (ci + 1)), kind)

    @staticmethod
    def _unpack(pointer):
        value = ctypes.cast(pointer, ctypes.c_void_p).value
        return value >> 24, (value >> 12) & 0xFFF, (value & 0xFFF) - 1

    def _nvmlInit(self):
        return None

    def _nvmlShutdown(self):
        return None

    def _nvmlDeviceGetCount(self):
        return self.sim.device_count()

    def _nvmlDeviceGetHandleByIndex(self, index):
        return SimpleNamespace(index=index)

    def _nvmlDeviceGetUUID(self, handle):
        if getattr(handle, "mig", None):
            return handle.mig.uuid
        return self.sim.identity(handle.index).uuid

    def _nvmlDeviceGetName(self, handle):
        return self.sim.identity(handle.index).name.encode()  # older pynvml returns bytes

    def _nvmlDeviceGetMemoryInfo(self, handle):
        if getattr(handle, "mig", None):
            return SimpleNamespace(total=handle.mig.memory_mib * 1024 * 1024)
        return SimpleNamespace(total=self.sim.identity(handle.index).memory_mib * 1024 * 1024)

    def _nvmlDeviceGetPciInfo(self, handle):
        identity = self.sim.identity(handle.index)
        return SimpleNamespace(pciDeviceId=identity.pci_device_id, pciSubSystemId=identity.pci_subsystem_id or 0)

    def _nvmlDeviceGetMigMode(self, handle):
        if not self.sim.mig_capable(handle.index):
            raise NvmlError("nvmlDeviceGetMigMode", 3, "NOT_SUPPORTED")
        return list(map(int, self.sim.mig_mode(handle.index)))

    def _nvmlDeviceSetMigMode(self, handle, mode):
        return self.sim.set_mig_mode(handle.index, mode == pynvml.NVML_DEVICE_MIG_ENABLE)

    def _nvmlDeviceGetGpuInstanceProfileInfo(self, handle, profile, version=2):
        for info in self.sim.gpu_instance_profiles(handle.index):
            if info.enum == profile:
                return SimpleNamespace(
                    id=info.id,
                    sliceCount=info.slice_count,
                    instanceCount=info.instance_count,
                    memorySizeMB=info.memory_mib,
                    name=f"MIG {info.name}".encode(),
                )
        raise NvmlError("nvmlDeviceGetGpuInstanceProfileInfo", 3, "NOT_SUPPORTED")

    def _nvmlDeviceGetGpuInstancePossiblePlacements(self, handle, profileId, placementsRef, countRef):
        info = next(p for p in self.sim.gpu_instance_profiles(handle.index) if p.id == profileId)
        for i, (start, size) in enumerate(info.placements):
            placementsRef[i].start, placementsRef[i].size = start, size
        countRef._obj.value = len(info.placements)

    def _nvmlDeviceGetGpuInstances(self, handle, profileId, gpuInstancesRef, countRef):
        records = self.sim.gpu_instances(handle.index, [profileId])
        for i, record in enumerate(records):
            gpuInstancesRef[i] = self._pointer(pynvml.c_nvmlGpuInstance_t, handle.index, record.gi_id)
        countRef._obj.value = len(records)

    def _gi_record(self, gi):
        gpu, gi_id, _ = self._unpack(gi)
        profile_ids = [p.id for p in self.sim.gpu_instance_profiles(gpu)]
        return gpu, next(r for r in self.sim.gpu_instances(gpu, profile_ids) if r.gi_id == gi_id)

    def _nvmlGpuInstanceGetInfo(self, gi):
        _, record = self._gi_record(gi)
        return SimpleNamespace(
            id=record.gi_id,
            profileId=record.profile_id,
            placement=SimpleNamespace(start=record.start, size=record.size),
        )

    def _nvmlGpuInstanceGetComputeInstanceProfileInfo(self, gi, profile, engProfile, version=2):
        # One CI profile per compute-slice count: enum 0..4 -> 1, 2, 3, 4, 7 slices (ids equal to enums here).
        slices = {0: 1, 1: 2, 2: 3, 3: 4, 4: 7}.get(profile)
        if slices is None:
            raise NvmlError("nvmlGpuInstanceGetComputeInstanceProfileInfo", 3, "NOT_SUPPORTED")
        return SimpleNamespace(id=profile, sliceCount=slices, instanceCount=1)

    def _nvmlGpuInstanceGetComputeInstances(self, gi, profileId, computeInstancesRef, countRef):
        gpu, record = self._gi_record(gi)
        slices = {0: 1, 1: 2, 2: 3, 3: 4, 4: 7}[profileId]
        matching = [ci for ci, s in record.compute_instances if s == slices]
        for i, ci_id in enumerate(matching):
            computeInstancesRef[i] = self._pointer(pynvml.c_nvmlComputeInstance_t, gpu, record.gi_id, ci_id)
        countRef._obj.value = len(matching)

    def _nvmlComputeInstanceGetInfo(self, ci):
        return SimpleNamespace(id=self._unpack(ci)[2])

    def _nvmlDeviceGetGpuInstanceById(self, handle, gi_id):
        return self._pointer(pynvml.c_nvmlGpuInstance_t, handle.index, gi_id)

    def _nvmlGpuInstanceGetComputeInstanceById(self, gi, ci_id):
        gpu, gi_id, _ = self._unpack(gi)
        return self._pointer(pynvml.c_nvmlComputeInstance_t, gpu, gi_id, ci_id)

    def _nvmlDeviceCreateGpuInstanceWithPlacement(self, handle, profileId, placement):
        value = placement._obj
        gi_id = self.sim.create_gpu_instance(handle.index, profileId, value.start, value.size)
        return self._pointer(pynvml.c_nvmlGpuInstance_t, handle.index, gi_id)

    def _nvmlGpuInstanceCreateComputeInstance(self, gi, profileId):
        gpu, gi_id, _ = self._unpack(gi)
        slices = {0: 1, 1: 2, 2: 3, 3: 4, 4: 7}[profileId]
        return self._pointer(
            pynvml.c_nvmlComputeInstance_t, gpu, gi_id, self.sim.create_compute_instance(gpu, gi_id, slices)
        )

    def _nvmlComputeInstanceDestroy(self, ci):
        gpu, gi_id, ci_id = self._unpack(ci)
        self.sim.destroy_compute_instance(gpu, gi_id, ci_id)

    def _nvmlGpuInstanceDestroy(self, gi):
        gpu, gi_id, _ = self._unpack(gi)
        self.sim.destroy_gpu_instance(gpu, gi_id)

    def _nvmlDeviceGetComputeRunningProcesses(self, handle):
        return [
            SimpleNamespace(
                pid=p.pid,
                usedGpuMemory=(p.used_memory_mib or 0) * 1024 * 1024,
                gpuInstanceId=0xFFFFFFFF if p.gi_id is None else p.gi_id,
                computeInstanceId=0xFFFFFFFF if p.ci_id is None else p.ci_id,
            )
            for p in self.sim.running_processes(handle.index)
        ]

    def _nvmlDeviceGetMaxMigDeviceCount(self, handle):
        return 7

    def _nvmlDeviceGetMigDeviceHandleByIndex(self, handle, index):
        devices = self.sim.mig_devices(handle.index)
        if index >= len(devices):
            raise NvmlError("nvmlDeviceGetMigDeviceHandleByIndex", 6, "NOT_FOUND")
        return SimpleNamespace(index=handle.index, mig=devices[index])

    def _nvmlDeviceGetGpuInstanceId(self, handle):
        return handle.mig.gi_id

    def _nvmlDeviceGetComputeInstanceId(self, handle):
        return handle.mig.ci_id


@pytest.fixture
def pair(tmp_path):
    """(wrapper over the fake pynvml, its simulator)."""
    sim = new_sim(tmp_path, gpus=2)
    fake = FakePynvml(sim)
    backend = PynvmlBackend(fake)
    backend.reset_gpu = sim.reset_gpu  # the real one shells out to nvidia-smi
    return backend, sim, fake


def test_wrapper_reads_what_the_simulator_holds(pair):
    backend, sim, _ = pair
    assert backend.identity(1) == sim.identity(1)
    assert backend.gpu_instance_profiles(0) == sim.gpu_instance_profiles(0)
    assert backend.mig_mode(0) == (False, False)
    assert backend.mig_capable(0) is True


def test_wrapper_sees_a_gpu_without_mig(pair):
    backend, sim, _ = pair
    sim.state["gpus"][1]["mig_capable"] = False
    assert backend.mig_capable(1) is False and backend.mig_mode(1) == (False, False)
    # devices: all skips it, as mig-parted does; GPU 0 is laid out
    result = runner.apply(backend, layout({"3g.40gb": 2}))
    assert [g["index"] for g in result["gpus"]] == [0]


def test_wrapper_applies_a_layout_and_reads_it_back(pair):
    backend, sim, fake = pair
    config = layout({"3g.40gb": 1, "2g.20gb": 2})
    result = runner.apply(backend, config)
    assert result["changed"]
    after = [(i["profile"], i["start"]) for i in result["gpus"][0]["after"]]
    assert after == [("2g.20gb", 0), ("2g.20gb", 2), ("3g.40gb", 4)]
    # The simulator agrees on what exists, and the wrapper's own read-back sees it complete (idempotent).
    profile_ids = [p.id for p in sim.gpu_instance_profiles(0)]
    assert sorted((r.start, r.profile_id) for r in sim.gpu_instances(0, profile_ids)) == [(0, 14), (2, 14), (4, 9)]
    assert backend.gpu_instances(0, profile_ids) == sim.gpu_instances(0, profile_ids)
    assert backend.mig_devices(0) == sim.mig_devices(0)
    assert not runner.apply(backend, config)["changed"]
    assert "nvmlDeviceCreateGpuInstanceWithPlacement" in fake.calls
    assert "nvmlDeviceCreateGpuInstance" not in fake.calls  # always with an explicit placement


def test_wrapper_minimal_change_and_processes(pair):
    backend, sim, _ = pair
    runner.apply(backend, layout({"3g.40gb": 2}))
    sim.add_process(0, pid=9001, gi_id=1)
    assert [(p.pid, p.gi_id) for p in backend.running_processes(0)] == [(9001, 1)]
    result = runner.apply(backend, layout({"3g.40gb": 1, "1g.10gb": 3}, devices=[0]))
    assert result["gpus"][0]["actions"][0] == {"op": "destroy", "profile": "3g.40gb", "start": 4}


def test_nvml_errors_become_nvml_error_with_the_code_name(pair):
    backend, sim, _ = pair
    runner.apply(backend, layout({"7g.80gb": 1}))
    sim.add_process(0, pid=5, gi_id=1)
    with pytest.raises(NvmlError, match="nvmlComputeInstanceDestroy failed: NVML_ERROR_IN_USE"):
        backend.destroy_compute_instance(0, 1, 0)


def test_every_function_the_wrapper_uses_exists_in_pynvml():
    source = inspect.getsource(PynvmlBackend)
    import re

    used = set(re.findall(r'"(nvml[A-Za-z_0-9]+)"', source))
    assert used, "no NVML calls found"
    missing = sorted(name for name in used if not callable(getattr(pynvml, name, None)))
    assert missing == []
