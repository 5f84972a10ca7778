"""A faithful NVML simulator behind the same NvmlInterface as the real wrapper, persisted in a JSON state file.

Faithful where the planner and runner could be fooled:
- profile tables of H100 80GB / H200 141GB with NVML's two ID spaces: gpu_instance_profiles() walks the profile
  *enum* and reports each profile's *id*; creation and placement queries take the id (an enum value passed as an id
  creates the wrong profile or fails, as on a real GPU);
- nvmlDeviceCreateGpuInstanceWithPlacement only accepts NVML's possible placements, fails with
  INSUFFICIENT_RESOURCES on overlapping memory slices, exhausted compute slices or the profile's maximum;
- nvmlDeviceSetMigMode returns an activation status: IN_USE (mode stays pending) while processes run on the GPU or
  GPU instances exist when disabling, else SUCCESS; a GPU reset (or a reboot) applies the pending mode, and wipes
  every GPU/compute instance, as MIG instances do not survive a reset;
- destroying a compute instance with processes, or a GPU instance that still has compute instances or processes,
  fails with IN_USE;
- GPU-instance ids are the driver's: derived from the placement (gpu_instance_id), not handed out in order;
- every reset of a GPU (nvidia-smi --gpu-reset, a MIG mode change the driver activated by resetting the GPU itself,
  a reboot) is counted in `reset_count`: device handles taken before it are stale (see docs/nvml_simulator.md);
- processes are compute or graphics ones (two NVML calls), their memory may be unavailable (null), and a caller
  without privileges (`privileged: false`) may not change MIG mode or instances (NO_PERMISSION).
Processes and NVML errors can be injected (state keys `processes`, `faults`); see docs/nvml_simulator.md.
Every mutating call is saved to the state file before it returns, so a failure mid-apply leaves the state as far as
it got, like a real GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import uuid as uuidlib
from typing import Any

from .exceptions import MigError, NvmlError, SimulatorStateError
from .nvml import (
    ERROR_CODES,
    SUCCESS,
    DeviceIdentity,
    GpuInstanceRecord,
    MigDeviceRecord,
    ProcessRecord,
    ProfileInfo,
    merge_processes,
)
from .profile_tables import DEFAULT_PRODUCT, MEMORY_SLICES, PROFILE_COUNT, ProductTable, ProfileRow, product_table

STATE_VERSION = 1
DEFAULT_GPUS = 8
PRODUCT_ENV = "GPUFLEET_NVML_SIM_PRODUCT"
GPUS_ENV = "GPUFLEET_NVML_SIM_GPUS"
# nvmlDeviceGetComputeRunningProcesses and nvmlDeviceGetGraphicsRunningProcesses each list one kind.
PROCESS_TYPES = ("compute", "graphics")

# The NVML function each simulated operation stands for: faults are injected by these names.
CALLS = {
    "identity": "nvmlDeviceGetHandleByIndex",
    "mig_mode": "nvmlDeviceGetMigMode",
    "set_mig_mode": "nvmlDeviceSetMigMode",
    "reset_gpu": "nvidia-smi --gpu-reset",
    "gpu_instance_profiles": "nvmlDeviceGetGpuInstanceProfileInfo",
    "gpu_instances": "nvmlDeviceGetGpuInstances",
    "mig_devices": "nvmlDeviceGetMigDeviceHandleByIndex",
    "running_processes": "nvmlDeviceGetComputeRunningProcesses",
    "create_gpu_instance": "nvmlDeviceCreateGpuInstanceWithPlacement",
    "create_compute_instance": "nvmlGpuInstanceCreateComputeInstance",
    "destroy_compute_instance": "nvmlComputeInstanceDestroy",
    "destroy_gpu_instance": "nvmlGpuInstanceDestroy",
}


def gpu_instance_id(start: int, size: int) -> int:
    """The GPU-instance id the driver gives an instance placed at start:size (sizes 1, 2, 4 or 8 memory slices).

    The id is the placement's node in the binary tree over the 8 memory slices, numbered breadth first: the whole GPU
    is 0, the halves at 0/4 are 1/2, the quarters 3..6, the eighths 7..14. So it depends on where an instance sits, not
    on the order of creation, and an instance re-created at the same place gets the same id. H100 80GB as nvidia-smi
    shows it: 7 x 1g.10gb at 0..6 are GPU instances 7..13; a 3g.40gb at 4:4 is 2, a 2g.20gb at 0:2 is 3, a 7g.80gb 0.
    """
    return MEMORY_SLICES // size - 1 + start // size


def new_gpu(index: int, product: str) -> dict[str, Any]:
    table = product_table(product)
    return {
        "index": index,
        "uuid": f"GPU-{uuidlib.uuid4()}",
        "name": table.product if product == table.product else product,
        "memory_mib": table.memory_mib,
        "pci_device_id": f"0x{table.pci_device_id:08X}",
        "pci_subsystem_id": None if table.pci_subsystem_id is None else f"0x{table.pci_subsystem_id:08X}",
        "mig_capable": bool(table.profiles),
        "mig_mode": {"current": False, "pending": False},
        "reset_supported": True,
        "reset_count": 0,
        "gpu_instances": [],
        "processes": [],
    }


def new_state(gpus: int | None = None, product: str | None = None) -> dict[str, Any]:
    gpus = gpus if gpus is not None else int(os.environ.get(GPUS_ENV, DEFAULT_GPUS))
    product = product or os.environ.get(PRODUCT_ENV, DEFAULT_PRODUCT)
    return {
        "version": STATE_VERSION,
        "privileged": True,
        "gpus": [new_gpu(i, product) for i in range(gpus)],
        "faults": [],
    }


def load_state(path: str) -> dict[str, Any]:
    """Read a state file; every problem with it is one SimulatorStateError naming the file."""
    try:
        with open(path, encoding="utf-8") as handle:
            state = json.load(handle)
    except OSError as exc:
        raise SimulatorStateError(f"cannot read simulator state {path}: {exc.strerror}") from None
    except ValueError as exc:  # json.JSONDecodeError, or bytes that are not UTF-8
        raise SimulatorStateError(f"simulator state {path} is not valid JSON: {exc}") from None
    if not isinstance(state, dict):
        raise SimulatorStateError(f"simulator state {path} must be a JSON object, not {type(state).__name__}")
    if state.get("version") != STATE_VERSION:
        raise SimulatorStateError(
            f"simulator state {path}: unsupported version {state.get('version')!r} (supported: {STATE_VERSION})"
        )
    if not isinstance(state.get("gpus"), list):
        raise SimulatorStateError(f"simulator state {path}: 'gpus' must be a list")
    for gpu in state["gpus"]:
        if isinstance(gpu, dict):
            _renumber_gpu_instances(gpu)
    return state


def _renumber_gpu_instances(gpu: dict[str, Any]) -> None:
    """Give each GPU instance its placement's id, and its processes with it: state files written before the
    simulator followed the driver's numbering hold ids in creation order, which a new instance's id can collide
    with (a fleet like the lab's keeps its state across upgrades)."""
    renumbered = {}
    for gi in gpu.get("gpu_instances") or []:
        if not isinstance(gi, dict) or not {"id", "start", "size"} <= gi.keys():
            continue  # left for the checks that read it to report
        placed = gpu_instance_id(gi["start"], gi["size"])
        if gi["id"] != placed:
            renumbered[gi["id"]] = placed
            gi["id"] = placed
    if not renumbered:
        return
    for process in gpu.get("processes") or []:
        if isinstance(process, dict) and process.get("gpu_instance_id") in renumbered:
            process["gpu_instance_id"] = renumbered[process["gpu_instance_id"]]


def _error(call: str, name: str, detail: str = "") -> NvmlError:
    return NvmlError(call, ERROR_CODES[name], name, detail)


class SimulatedNvml:
    """NvmlInterface over a JSON state file (created as 8 x H100 80GB, MIG disabled, when missing)."""

    def __init__(self, path: str):
        self.path = path
        if os.path.exists(path):
            self.state = load_state(path)
        else:
            self.state = new_state()
            self._save()

    # -- persistence and fault injection --------------------------------------------------------------------------
    def _save(self) -> None:
        directory = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".nvml-sim-")
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(self.state, handle, indent=2, sort_keys=True)
            handle.write("\n")
        os.replace(tmp, self.path)

    def _maybe_fail(self, operation: str, index: int | None = None) -> int | None:
        """Fire the first matching injected fault: raise it, or return it for `as: activation_status` faults."""
        call = CALLS[operation]
        for fault in self.state.get("faults", []):
            if fault.get("call") != call or fault.get("gpu", index) != index:
                continue
            if fault.get("skip", 0) > 0:
                fault["skip"] -= 1
                self._save()
                continue
            fault["times"] = fault.get("times", 1) - 1
            if fault["times"] <= 0:
                self.state["faults"].remove(fault)
            self._save()
            if fault.get("as") == "kill":  # the process dies before the call, as under SIGKILL or a crash
                os.kill(os.getpid(), signal.SIGKILL)
            name = fault.get("error", "UNKNOWN")
            if fault.get("as") == "activation_status":
                return ERROR_CODES[name]
            raise _error(call, name, "injected by the simulator")
        return None

    def _gpu(self, index: int, operation: str) -> dict[str, Any]:
        gpus = self.state["gpus"]
        if not 0 <= index < len(gpus):
            raise _error(CALLS[operation], "INVALID_ARGUMENT", f"no GPU {index}")
        gpu: dict[str, Any] = gpus[index]
        return gpu

    def _table(self, gpu: dict[str, Any]) -> ProductTable:
        return product_table(gpu["name"])

    def _row_by_id(self, gpu: dict[str, Any], profile_id: int) -> ProfileRow | None:
        for row in self._table(gpu).profiles:
            if row.id == profile_id:
                return row
        return None

    def _instance_row(self, gpu: dict[str, Any], gi: dict[str, Any]) -> ProfileRow:
        """The profile of an existing GPU instance (one the state file names with an unknown profile is corrupt)."""
        row = self._row_by_id(gpu, gi["profile_id"])
        if row is None:
            raise SimulatorStateError(
                f"simulator state {self.path}: GPU {gpu['index']} instance {gi['id']} has unknown profile id "
                f"{gi['profile_id']}"
            )
        return row

    def _require_privileges(self, operation: str) -> None:
        # nvml.h: nvmlDeviceSetMigMode "Requires root user"; creating and destroying instances "Requires privileged
        # user".
        if not self.state.get("privileged", True):
            raise _error(CALLS[operation], "NO_PERMISSION", "the NVML caller is not privileged (root)")

    def _require_mig(self, gpu: dict[str, Any], operation: str) -> None:
        if not gpu["mig_mode"]["current"]:
            raise _error(CALLS[operation], "NOT_SUPPORTED", f"MIG mode is not enabled on GPU {gpu['index']}")

    def _find_gi(self, gpu: dict[str, Any], gi_id: int, operation: str) -> dict[str, Any]:
        for gi in gpu["gpu_instances"]:
            if gi["id"] == gi_id:
                found: dict[str, Any] = gi
                return found
        raise _error(CALLS[operation], "NOT_FOUND", f"no GPU instance {gi_id} on GPU {gpu['index']}")

    # -- NvmlInterface -------------------------------------------------------------------------------------------
    def device_count(self) -> int:
        return len(self.state["gpus"])

    def identity(self, index: int) -> DeviceIdentity:
        self._maybe_fail("identity", index)
        gpu = self._gpu(index, "identity")
        subsystem = gpu.get("pci_subsystem_id")
        return DeviceIdentity(
            index,
            gpu["uuid"],
            gpu["name"],
            gpu["memory_mib"],
            int(gpu["pci_device_id"], 16),
            None if subsystem is None else int(subsystem, 16),
        )

    def mig_capable(self, index: int) -> bool:
        self._maybe_fail("mig_mode", index)
        gpu = self._gpu(index, "mig_mode")
        return bool(gpu.get("mig_capable", bool(self._table(gpu).profiles)))

    def mig_mode(self, index: int) -> tuple[bool, bool]:
        self._maybe_fail("mig_mode", index)
        mode = self._gpu(index, "mig_mode")["mig_mode"]
        return bool(mode["current"]), bool(mode["pending"])

    def set_mig_mode(self, index: int, enabled: bool) -> int:
        injected = self._maybe_fail("set_mig_mode", index)
        gpu = self._gpu(index, "set_mig_mode")
        self._require_privileges("set_mig_mode")
        if not self.mig_capable(index):
            raise _error(CALLS["set_mig_mode"], "NOT_SUPPORTED", f"GPU {index} cannot do MIG")
        gpu["mig_mode"]["pending"] = enabled
        status = injected
        if status is None and gpu["mig_mode"]["current"] != enabled:
            busy = bool(gpu["processes"]) or (not enabled and bool(gpu["gpu_instances"]))
            status = ERROR_CODES["IN_USE"] if busy else SUCCESS
        if status in (None, SUCCESS):
            if gpu["mig_mode"]["current"] != enabled:
                gpu["reset_count"] = gpu.get("reset_count", 0) + 1  # the driver reset the GPU to switch the mode
            gpu["mig_mode"]["current"] = enabled
            status = SUCCESS
        self._save()
        return status

    def _apply_reset(self, gpu: dict[str, Any]) -> None:
        # MIG instances do not survive a reset; the pending mode becomes current; handles taken before are stale.
        gpu["mig_mode"]["current"] = gpu["mig_mode"]["pending"]
        gpu["gpu_instances"] = []
        gpu["reset_count"] = gpu.get("reset_count", 0) + 1

    def reset_gpu(self, index: int) -> None:
        self._maybe_fail("reset_gpu", index)
        gpu = self._gpu(index, "reset_gpu")
        if not gpu.get("reset_supported", True):
            raise _error(CALLS["reset_gpu"], "NOT_SUPPORTED", "GPU reset is not supported here (reboot required)")
        if gpu["processes"]:
            pids = ", ".join(str(p["pid"]) for p in gpu["processes"])
            raise _error(CALLS["reset_gpu"], "IN_USE", f"processes are using GPU {index} (PIDs {pids})")
        self._apply_reset(gpu)
        self._save()

    def reboot(self) -> None:
        """Simulate a host reboot: processes gone, pending modes applied, every MIG instance wiped."""
        for gpu in self.state["gpus"]:
            gpu["processes"] = []
            self._apply_reset(gpu)
        self._save()

    def gpu_instance_profiles(self, index: int) -> list[ProfileInfo]:
        self._maybe_fail("gpu_instance_profiles", index)
        gpu = self._gpu(index, "gpu_instance_profiles")
        by_enum = {row.enum: row for row in self._table(gpu).profiles}
        profiles = []
        for enum in range(PROFILE_COUNT):  # NVML answers NOT_SUPPORTED for enums the GPU lacks
            row = by_enum.get(enum)
            if row is None:
                continue
            placements = tuple((start, row.size) for start in row.starts)
            profiles.append(
                ProfileInfo(enum, row.id, row.name, row.slice_count, row.instance_count, row.memory_mib, placements)
            )
        return profiles

    def gpu_instances(self, index: int, profile_ids: list[int]) -> list[GpuInstanceRecord]:
        self._maybe_fail("gpu_instances", index)
        gpu = self._gpu(index, "gpu_instances")
        self._require_mig(gpu, "gpu_instances")
        records = []
        for gi in sorted(gpu["gpu_instances"], key=lambda g: g["id"]):
            if gi["profile_id"] not in profile_ids:
                continue
            row = self._instance_row(gpu, gi)
            cis = tuple((ci["id"], row.slice_count) for ci in gi["compute_instances"])
            records.append(GpuInstanceRecord(gi["id"], gi["profile_id"], gi["start"], gi["size"], cis))
        return records

    def mig_devices(self, index: int) -> list[MigDeviceRecord]:
        self._maybe_fail("mig_devices", index)
        gpu = self._gpu(index, "mig_devices")
        if not gpu["mig_mode"]["current"]:
            return []
        records = []
        for gi in sorted(gpu["gpu_instances"], key=lambda g: g["id"]):
            row = self._instance_row(gpu, gi)
            for ci in gi["compute_instances"]:
                records.append(MigDeviceRecord(gi["id"], ci["id"], ci["uuid"], row.memory_mib))
        return records

    def running_processes(self, index: int) -> list[ProcessRecord]:
        self._maybe_fail("running_processes", index)
        gpu = self._gpu(index, "running_processes")
        return merge_processes(
            [
                ProcessRecord(
                    p["pid"],
                    p.get("used_memory_mib"),
                    p.get("gpu_instance_id"),
                    p.get("compute_instance_id"),
                    p.get("type", "compute"),
                )
                for p in gpu["processes"]
            ]
        )

    def create_gpu_instance(self, index: int, profile_id: int, start: int, size: int) -> int:
        operation = "create_gpu_instance"
        self._maybe_fail(operation, index)
        gpu = self._gpu(index, operation)
        self._require_privileges(operation)
        self._require_mig(gpu, operation)
        row = self._row_by_id(gpu, profile_id)
        if row is None:
            raise _error(CALLS[operation], "INVALID_ARGUMENT", f"no GPU-instance profile id {profile_id}")
        if start not in row.starts or size != row.size:
            raise _error(CALLS[operation], "INVALID_ARGUMENT", f"{start}:{size} is not a placement of {row.name}")
        existing = gpu["gpu_instances"]
        used: set[int] = set()
        compute = 0
        same_profile = 0
        for gi in existing:
            used.update(range(gi["start"], gi["start"] + gi["size"]))
            other = self._instance_row(gpu, gi)
            compute += other.slice_count
            same_profile += gi["profile_id"] == profile_id
        full = self._table(gpu).profiles[-1].slice_count
        if (
            used & set(range(start, start + size))
            or compute + row.slice_count > full
            or same_profile >= row.instance_count
        ):
            raise _error(CALLS[operation], "INSUFFICIENT_RESOURCES", f"{row.name} does not fit at {start}:{size}")
        gi_id = gpu_instance_id(start, size)
        existing.append({"id": gi_id, "profile_id": profile_id, "start": start, "size": size, "compute_instances": []})
        self._save()
        return gi_id

    def create_compute_instance(self, index: int, gi_id: int, slice_count: int) -> int:
        operation = "create_compute_instance"
        self._maybe_fail(operation, index)
        gpu = self._gpu(index, operation)
        self._require_privileges(operation)
        gi = self._find_gi(gpu, gi_id, operation)
        row = self._instance_row(gpu, gi)
        if slice_count != row.slice_count or gi["compute_instances"]:
            raise _error(CALLS[operation], "INSUFFICIENT_RESOURCES", f"GPU instance {gi_id} has no room")
        gi["compute_instances"].append({"id": 0, "uuid": f"MIG-{uuidlib.uuid4()}"})
        self._save()
        return 0

    def destroy_compute_instance(self, index: int, gi_id: int, ci_id: int) -> None:
        operation = "destroy_compute_instance"
        self._maybe_fail(operation, index)
        gpu = self._gpu(index, operation)
        self._require_privileges(operation)
        gi = self._find_gi(gpu, gi_id, operation)
        ci = next((c for c in gi["compute_instances"] if c["id"] == ci_id), None)
        if ci is None:
            raise _error(CALLS[operation], "NOT_FOUND", f"no compute instance {ci_id} in GPU instance {gi_id}")
        pids = [
            p["pid"]
            for p in gpu["processes"]
            if (p.get("gpu_instance_id"), p.get("compute_instance_id")) == (gi_id, ci_id)
        ]
        if pids:
            raise _error(CALLS[operation], "IN_USE", f"PIDs {', '.join(map(str, pids))} run on it")
        gi["compute_instances"].remove(ci)
        self._save()

    def destroy_gpu_instance(self, index: int, gi_id: int) -> None:
        operation = "destroy_gpu_instance"
        self._maybe_fail(operation, index)
        gpu = self._gpu(index, operation)
        self._require_privileges(operation)
        gi = self._find_gi(gpu, gi_id, operation)
        pids = [p["pid"] for p in gpu["processes"] if p.get("gpu_instance_id") == gi_id]
        if gi["compute_instances"] or pids:
            raise _error(CALLS[operation], "IN_USE", f"GPU instance {gi_id} still has compute instances or processes")
        gpu["gpu_instances"].remove(gi)
        self._save()

    def close(self) -> None:
        """Nothing to release: every change is already saved."""

    # -- test/lab helpers (not part of NvmlInterface) -------------------------------------------------------------
    def add_process(
        self,
        index: int,
        pid: int,
        gi_id: int | None = None,
        ci_id: int | None = 0,
        used_mib: int | None = 1024,
        kind: str = "compute",
    ) -> None:
        """A process on GPU `index` (in GPU instance `gi_id`, or on the whole GPU); `kind` compute or graphics;
        `used_mib` None: NVML reports its memory as not available."""
        if kind not in PROCESS_TYPES:
            raise ValueError(f"unknown process type {kind!r}; known: {', '.join(PROCESS_TYPES)}")
        gpu = self._gpu(index, "running_processes")
        if gi_id is not None:
            self._find_gi(gpu, gi_id, "running_processes")
        gpu["processes"].append(
            {
                "pid": pid,
                "used_memory_mib": used_mib,
                "gpu_instance_id": gi_id,
                "compute_instance_id": ci_id if gi_id is not None else None,
                "type": kind,
            }
        )
        self._save()

    def add_fault(
        self,
        call: str,
        error: str,
        gpu: int | None = None,
        skip: int = 0,
        times: int = 1,
        as_status: bool = False,
        kill: bool = False,
    ) -> None:
        """Make `call` fail with `error` (after `skip` matching calls, `times` times); `kill`: the calling process is
        killed with SIGKILL instead, before the call (the fault is used up first, so the next run goes through)."""
        if call not in CALLS.values():
            raise ValueError(f"unknown NVML call {call!r}; known: {', '.join(sorted(CALLS.values()))}")
        if error not in ERROR_CODES:
            raise ValueError(f"unknown NVML error {error!r}; known: {', '.join(sorted(ERROR_CODES))}")
        fault = {"call": call, "error": error, "skip": skip, "times": times}
        if gpu is not None:
            fault["gpu"] = gpu
        if as_status:
            fault["as"] = "activation_status"
        if kill:
            fault["as"] = "kill"
        self.state.setdefault("faults", []).append(fault)
        self._save()


def main(argv: list[str] | None = None) -> int:
    """Small CLI for the lab and molecule: inspect a state file, reboot, inject processes or faults."""
    parser = argparse.ArgumentParser(prog="nvml_sim", description=__doc__.splitlines()[0])
    parser.add_argument("--state", required=True, help="simulator state file (created when missing)")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("show", help="print the state")
    sub.add_parser("reboot", help="wipe MIG instances and processes, apply pending MIG modes")
    proc = sub.add_parser("add-process", help="start a fake process on a GPU or MIG instance")
    proc.add_argument("--gpu", type=int, required=True)
    proc.add_argument("--pid", type=int, required=True)
    proc.add_argument("--gi", type=int, help="GPU instance id (omit for a whole-GPU process)")
    proc.add_argument("--type", choices=PROCESS_TYPES, default="compute", help="compute (default) or graphics")
    fault = sub.add_parser("fault", help="make an NVML call fail")
    fault.add_argument("--call", required=True)
    fault.add_argument("--error", required=True)
    fault.add_argument("--gpu", type=int)
    fault.add_argument("--skip", type=int, default=0)
    fault.add_argument("--times", type=int, default=1)
    fault.add_argument("--kill", action="store_true", help="SIGKILL the calling process instead of failing the call")
    args = parser.parse_args(argv)
    try:
        sim = SimulatedNvml(args.state)
        if args.command == "reboot":
            sim.reboot()
        elif args.command == "add-process":
            sim.add_process(args.gpu, args.pid, args.gi, kind=args.type)
        elif args.command == "fault":
            sim.add_fault(args.call, args.error, args.gpu, args.skip, args.times, kill=args.kill)
        else:
            sys.stdout.write(json.dumps(sim.state, indent=2, sort_keys=True) + "\n")
    except (MigError, ValueError, KeyError) as exc:
        sys.stderr.write(f"nvml_sim: {exc}\n")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
