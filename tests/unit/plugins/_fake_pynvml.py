"""NVML at the level of nvidia-ml-py's calls, served from a simulator state file, for running the real wrapper
(PynvmlBackend) and the modules on it; and an `nvidia-smi` stand-in that resets GPUs in the same state file.

What NVML does below the wrapper's interface, and the simulator's state records (docs/nvml_simulator.md):
- every call is checked against the installed pynvml: the function must exist and the arguments bind to it;
- nvmlInit / nvmlShutdown: calls outside a session fail with UNINITIALIZED, and while a session is open it counts as
  a client of the GPUs, so the stand-in `nvidia-smi --gpu-reset` refuses ("In use by another client") as the real
  tool does for any NVML client (mig-parted releases NVML across its reset for that reason);
- device handles are stale once their GPU was reset (state `reset_count`), and once the NVML session they were taken
  in ended (nvmlShutdown releases "all GPU resources previously allocated"): a call with one fails INVALID_ARGUMENT,
  nvml.h's answer for an invalid device;
- compute and graphics processes are listed by their own calls; usedGpuMemory is None where the state has null
  (pynvml's translation of NVML_VALUE_NOT_AVAILABLE);
- with `privileged: false` and MIG on, the process calls on a GPU's handle fail NO_PERMISSION (nvml.h: in MIG mode the
  device handle gives aggregate information "only if the caller has appropriate privileges"); on a MIG device's
  handle they list that instance's processes.
"""

from __future__ import annotations

import ctypes
import inspect
import os
import stat
import sys
from pathlib import Path
from types import SimpleNamespace

import pynvml
from ansible_collections.gpufleet.mig.plugins.module_utils.exceptions import NvmlError
from ansible_collections.gpufleet.mig.plugins.module_utils.nvml_sim import SimulatedNvml, load_state

NO_INSTANCE = 0xFFFFFFFF
# One CI profile per compute-slice count: enum 0..4 -> 1, 2, 3, 4, 7 slices (ids equal to enums here).
CI_SLICES = {0: 1, 1: 2, 2: 3, 3: 4, 4: 7}


def clients_file(state_path: str) -> Path:
    """Present while an NVML session is open on the simulated host (what a GPU reset checks for)."""
    return Path(f"{state_path}.nvml-clients")


class FakePynvml:
    """Just enough of pynvml over a SimulatedNvml; every call is checked against the real pynvml."""

    NVMLError = pynvml.NVMLError
    NVML_DEVICE_MIG_ENABLE = pynvml.NVML_DEVICE_MIG_ENABLE
    NVML_DEVICE_MIG_DISABLE = pynvml.NVML_DEVICE_MIG_DISABLE
    c_nvmlGpuInstancePlacement_t = pynvml.c_nvmlGpuInstancePlacement_t
    c_nvmlGpuInstance_t = pynvml.c_nvmlGpuInstance_t
    c_nvmlComputeInstance_t = pynvml.c_nvmlComputeInstance_t

    def __init__(self, sim: SimulatedNvml):
        self.sim = sim
        self.calls: list[str] = []
        self.initialised = False
        self.session = 0  # counts nvmlInit calls: handles belong to the session they were taken in

    def __getattribute__(self, name):
        if name.startswith("nvml"):
            real = getattr(pynvml, name, None)
            assert callable(real), f"pynvml has no function {name}"
            impl = object.__getattribute__(self, "_" + name)
            this = self

            def checked(*args):
                inspect.signature(real).bind(*args)  # TypeError if the wrapper calls it wrongly
                this.calls.append(name)
                try:
                    if name != "nvmlInit" and not this.initialised:
                        raise NvmlError(name, 1, "UNINITIALIZED")
                    # Another process (the nvidia-smi stand-in) may have changed the state since the last call.
                    this.sim.state = load_state(this.sim.path)
                    for arg in args:
                        this._check_handle(name, arg)
                    return impl(*args)
                except NvmlError as exc:
                    raise pynvml.NVMLError(exc.code) from None

            return checked
        return object.__getattribute__(self, name)

    # -- sessions and handles ------------------------------------------------------------------------------------
    def _check_handle(self, call, arg):
        if isinstance(arg, SimpleNamespace) and hasattr(arg, "reset_count"):
            if arg.reset_count != self.sim.state["gpus"][arg.index].get("reset_count", 0):
                raise NvmlError(call, 2, "INVALID_ARGUMENT", "stale device handle: the GPU was reset since")
            if arg.session != self.session:
                raise NvmlError(call, 2, "INVALID_ARGUMENT", "device handle of an NVML session that has ended")

    def _device(self, index, mig=None):
        reset_count = self.sim.state["gpus"][index].get("reset_count", 0)
        return SimpleNamespace(index=index, reset_count=reset_count, session=self.session, mig=mig)

    # GI/CI handles are ctypes pointers carrying (gpu, gi, ci) in their address (gi 0 is the whole GPU's instance)
    @staticmethod
    def _pointer(kind, gpu, gi, ci=0):
        return ctypes.cast(ctypes.c_void_p((gpu << 24) | (gi << 12) | (ci + 1)), kind)

    @staticmethod
    def _unpack(pointer):
        value = ctypes.cast(pointer, ctypes.c_void_p).value
        return value >> 24, (value >> 12) & 0xFFF, (value & 0xFFF) - 1

    def _nvmlInit(self):
        self.initialised = True
        self.session += 1
        clients_file(self.sim.path).write_text(f"{os.getpid()}\n")

    def _nvmlShutdown(self):
        self.initialised = False
        clients_file(self.sim.path).unlink(missing_ok=True)

    # -- devices -------------------------------------------------------------------------------------------------
    def _nvmlDeviceGetCount(self):
        return self.sim.device_count()

    def _nvmlDeviceGetHandleByIndex(self, index):
        self.sim.identity(index)  # injected faults, INVALID_ARGUMENT for a missing GPU
        return self._device(index)

    def _nvmlDeviceGetUUID(self, handle):
        if handle.mig:
            return handle.mig.uuid
        return self.sim.identity(handle.index).uuid

    def _nvmlDeviceGetName(self, handle):
        return self.sim.identity(handle.index).name.encode()  # older pynvml returns bytes

    def _nvmlDeviceGetMemoryInfo(self, handle):
        if handle.mig:
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

    # -- profiles and instances ----------------------------------------------------------------------------------
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
        slices = CI_SLICES.get(profile)
        if slices is None:
            raise NvmlError("nvmlGpuInstanceGetComputeInstanceProfileInfo", 3, "NOT_SUPPORTED")
        return SimpleNamespace(id=profile, sliceCount=slices, instanceCount=1)

    def _nvmlGpuInstanceGetComputeInstances(self, gi, profileId, computeInstancesRef, countRef):
        gpu, record = self._gi_record(gi)
        matching = [ci for ci, s in record.compute_instances if s == CI_SLICES[profileId]]
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
        ci_id = self.sim.create_compute_instance(gpu, gi_id, CI_SLICES[profileId])
        return self._pointer(pynvml.c_nvmlComputeInstance_t, gpu, gi_id, ci_id)

    def _nvmlComputeInstanceDestroy(self, ci):
        gpu, gi_id, ci_id = self._unpack(ci)
        self.sim.destroy_compute_instance(gpu, gi_id, ci_id)

    def _nvmlGpuInstanceDestroy(self, gi):
        gpu, gi_id, _ = self._unpack(gi)
        self.sim.destroy_gpu_instance(gpu, gi_id)

    # -- processes and MIG devices -------------------------------------------------------------------------------
    def _processes(self, handle, kind, call):
        records = self.sim.running_processes(handle.index)
        if handle.mig is not None:
            records = [p for p in records if (p.gi_id, p.ci_id) == (handle.mig.gi_id, handle.mig.ci_id)]
        elif self.sim.mig_mode(handle.index)[0] and not self.sim.state.get("privileged", True):
            raise NvmlError(call, 4, "NO_PERMISSION")
        return [
            SimpleNamespace(
                pid=p.pid,
                usedGpuMemory=None if p.used_memory_mib is None else p.used_memory_mib * 1024 * 1024,
                gpuInstanceId=NO_INSTANCE if p.gi_id is None else p.gi_id,
                computeInstanceId=NO_INSTANCE if p.ci_id is None else p.ci_id,
            )
            for p in records
            if kind in p.kind.split("+")
        ]

    def _nvmlDeviceGetComputeRunningProcesses(self, handle):
        return self._processes(handle, "compute", "nvmlDeviceGetComputeRunningProcesses")

    def _nvmlDeviceGetGraphicsRunningProcesses(self, handle):
        return self._processes(handle, "graphics", "nvmlDeviceGetGraphicsRunningProcesses")

    def _nvmlDeviceGetMaxMigDeviceCount(self, handle):
        return 7

    def _nvmlDeviceGetMigDeviceHandleByIndex(self, handle, index):
        devices = self.sim.mig_devices(handle.index)
        if index >= len(devices):
            raise NvmlError("nvmlDeviceGetMigDeviceHandleByIndex", 6, "NOT_FOUND")
        return self._device(handle.index, mig=devices[index])

    def _nvmlDeviceGetGpuInstanceId(self, handle):
        return handle.mig.gi_id

    def _nvmlDeviceGetComputeInstanceId(self, handle):
        return handle.mig.ci_id


# What nvidia-smi prints when a reset is refused because the GPU is held (exit 255), for bus id {bus}.
IN_USE_TEXT = (
    "The following GPUs could not be reset:\n  GPU {bus}: In use by another client\n\n1 device is currently being used "
    "by one or more other processes (e.g., Fabric Manager, CUDA application, graphics application such as an X "
    "server, or a monitoring application such as another instance of nvidia-smi). Please first kill all processes "
    "using this device and all compute applications running in the system.\n"
)
NOT_SUPPORTED_TEXT = "The following GPUs could not be reset:\n  GPU {bus}: Not Supported\n"
SUCCESS_TEXT = "GPU {bus} was successfully reset.\nAll done.\n"

_STAND_IN = """#!{python}
# nvidia-smi stand-in: `--gpu-reset -i N` resets GPU N of the NVML simulator's state, answering as nvidia-smi does.
import sys
sys.path.insert(0, {collections!r})
from pathlib import Path
from ansible_collections.gpufleet.mig.plugins.module_utils.exceptions import NvmlError
from ansible_collections.gpufleet.mig.plugins.module_utils.nvml_sim import SimulatedNvml

state, log = {state!r}, {log!r}
with open(log, "a") as handle:
    handle.write(" ".join(sys.argv[1:]) + "\\n")
index = int(sys.argv[sys.argv.index("-i") + 1])
bus = "00000000:%02X:00.0" % (0x18 + index)
if Path(state + ".nvml-clients").exists():  # an open NVML session holds the GPU
    sys.stdout.write({in_use!r}.format(bus=bus))
    sys.exit(255)
try:
    SimulatedNvml(state).reset_gpu(index)
except NvmlError as exc:
    if exc.code_name == "NOT_SUPPORTED":
        sys.stdout.write({not_supported!r}.format(bus=bus))
        sys.exit(255)
    sys.stdout.write({in_use!r}.format(bus=bus))
    sys.exit(255)
sys.stdout.write({success!r}.format(bus=bus))
"""


def install_nvidia_smi(bin_dir: Path, state_path: str, collections: str) -> Path:
    """Write the stand-in `nvidia-smi` into bin_dir (put it first on PATH); returns the log of its arguments."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    log = bin_dir / "nvidia-smi.log"
    log.write_text("")
    script = bin_dir / "nvidia-smi"
    script.write_text(
        _STAND_IN.format(
            python=sys.executable,
            collections=collections,
            state=state_path,
            log=str(log),
            in_use=IN_USE_TEXT,
            not_supported=NOT_SUPPORTED_TEXT,
            success=SUCCESS_TEXT,
        )
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return log
