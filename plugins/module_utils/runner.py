"""Read the GPUs through the NVML interface, plan every GPU, then apply the plans unless in check mode.

Order of work (mig-parted's "assert, then apply"):
1. read every GPU, 2. validate and plan every selected GPU (SpecError / BusyInstanceError before any write),
3. per GPU: destroy what must go, set the MIG mode, reset the GPU if its mode change is pending (and `reset`),
   create the missing instances with explicit placements (GPU instance, then its full-size compute instance).
An NVML failure in step 3 raises ApplyError carrying the per-GPU results so far; a rerun re-reads and converges.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .exceptions import ApplyError, BusyInstanceError, NvmlError, SpecError
from .gpu_info import read_gpu_state
from .nvml import ERROR_CODES, SUCCESS, NvmlInterface, error_name
from .planner import BUSY_HINT, Catalog, GpuPlan, GpuState, Instance, busy_problems, plan_gpu
from .profile_tables import product_table
from .spec import GpuSelectable, parse_config, targets_for_gpus

Progress = Callable[[str], None]


def _quiet(_message: str) -> None:
    pass


def read_catalog(nvml: NvmlInterface, index: int, required: bool) -> Catalog:
    """The GPU-instance profiles NVML reports for this GPU.

    Should a driver answer NOT_SUPPORTED for every profile while MIG is still disabled, the catalog of a known product
    (the simulator's tables) stands in, so that the request can still be validated before MIG is enabled; an unknown
    product then fails validation clearly instead of being planned against nothing.
    """
    profiles = nvml.gpu_instance_profiles(index)
    if profiles or not required:
        return Catalog(profiles)
    name = nvml.identity(index).name
    try:
        return Catalog.from_table(product_table(name))
    except KeyError:
        raise SpecError(f"GPU {index} ({name}): NVML reports no MIG profiles; this GPU is not MIG-capable") from None


def read_gpu(nvml: NvmlInterface, index: int, catalog: Catalog) -> GpuState:
    """The planner's view of one GPU (gpu_info.read_gpu_state's reading, instances collapsed to what we manage)."""
    reading = read_gpu_state(nvml, index, catalog)
    instances = []
    for instance in reading.instances:
        record, profile = instance.record, instance.profile
        full_ci = [ci_id for ci_id, slices in record.compute_instances if slices == profile.slice_count]
        # We manage exactly one full-size compute instance per GPU instance; anything else is rebuilt.
        complete = len(record.compute_instances) == 1 and bool(full_ci)
        instances.append(
            Instance(
                gi_id=record.gi_id,
                profile=profile.name,
                start=record.start,
                size=record.size,
                pids=reading.pids_in(record.gi_id),
                complete=complete,
                uuid=instance.ci_uuids[full_ci[0]] if full_ci else None,
                compute_instance_ids=tuple(ci_id for ci_id, _slices in record.compute_instances),
            )
        )
    return GpuState(
        index=index,
        uuid=reading.identity.uuid,
        name=reading.identity.name,
        mig_current=reading.mig_current,
        mig_pending=reading.mig_pending,
        instances=instances,
        gpu_pids=reading.pids_in(None),
    )


def plan(
    nvml: NvmlInterface, config: list[Any], force: bool, missing_devices: str = "fail"
) -> list[tuple[GpuPlan, Catalog]]:
    """Validate the whole request and plan every selected GPU; raises before anything is written.

    Busy GPUs (without force) are all named in one BusyInstanceError, not only the first one met.
    """
    entries = parse_config(config)
    gpus = []
    for index in range(nvml.device_count()):
        identity = nvml.identity(index)
        gpus.append(GpuSelectable(index, identity.pci_device_id, identity.pci_subsystem_id, nvml.mig_capable(index)))
    targets = targets_for_gpus(entries, gpus, missing_devices)
    plans = []
    busy: list[str] = []
    for index in sorted(targets):
        catalog = read_catalog(nvml, index, required=targets[index].mig_enabled)
        state = read_gpu(nvml, index, catalog)
        try:
            plans.append((plan_gpu(state, targets[index], catalog, force), catalog))
        except BusyInstanceError as exc:
            busy.append(exc.message.removesuffix(BUSY_HINT))
    if busy:
        raise BusyInstanceError("; ".join(busy) + BUSY_HINT)
    return plans


def gpu_result(gpu_plan: GpuPlan) -> dict[str, Any]:
    """The per-GPU entry of the module's `gpus` return value (before anything is done)."""
    return {
        "index": gpu_plan.index,
        "uuid": gpu_plan.uuid,
        "name": gpu_plan.name,
        "mig_enabled": {"before": gpu_plan.mig_before, "after": gpu_plan.mig_after},
        "before": [s.as_dict() for s in gpu_plan.before],
        "after": [s.as_dict() for s in gpu_plan.after],
        "actions": gpu_plan.actions(),
        "changed": gpu_plan.changed,
        "disruptive": gpu_plan.disruptive,
        "done": [],
        "mig_mode_pending": False,
        "reset": False,
        "reset_error": None,
    }


class _Applier:
    """Applies one GPU's plan, recording each finished step in `result["done"]`."""

    def __init__(self, nvml: NvmlInterface, catalog: Catalog, result: dict[str, Any], reset: bool, progress: Progress):
        self.nvml, self.catalog, self.result, self.reset, self.progress = nvml, catalog, result, reset, progress

    def _done(self, step: dict[str, Any]) -> None:
        self.result["done"].append(step)
        detail = f" {step['profile']}@{step['start']}" if "profile" in step else ""
        self.progress(f"GPU {self.result['index']}: {step['op']}{detail}")

    def run(self, gpu_plan: GpuPlan) -> None:
        index = gpu_plan.index
        for instance in gpu_plan.destroy:
            removed: list[int] = []
            try:
                for ci_id in instance.compute_instance_ids:
                    self.nvml.destroy_compute_instance(index, instance.gi_id, ci_id)
                    removed.append(ci_id)
                self.nvml.destroy_gpu_instance(index, instance.gi_id)
            except NvmlError:
                if removed:  # half of a destroy is still a change on the GPU: report it
                    self._done(
                        {
                            "op": "destroy_compute_instances",
                            "profile": instance.profile,
                            "start": instance.start,
                            "compute_instance_ids": removed,
                        }
                    )
                raise
            self._done({"op": "destroy", "profile": instance.profile, "start": instance.start})
        if gpu_plan.set_mode and not self._set_mode(gpu_plan):
            return  # mode change pending: instances can only be created once it is active
        for slot in gpu_plan.create:
            profile = self.catalog.by_name[slot.profile]
            gi_id = self.nvml.create_gpu_instance(index, profile.id, slot.start, slot.size)
            self.nvml.create_compute_instance(index, gi_id, profile.slice_count)
            self._done({"op": "create", "profile": slot.profile, "start": slot.start})

    def _reset(self, index: int) -> bool:
        """Reset the GPU; False when it cannot be reset here, which leaves its mode change for a reboot.

        NOT_SUPPORTED (e.g. a GPU of an NVLink domain, a passthrough VM) and IN_USE (processes still hold the GPU,
        as with force) are what a reboot resolves: the mode stays pending, reboot_required is returned, and the
        other GPUs are still processed. Any other failure is a failure.
        """
        try:
            self.nvml.reset_gpu(index)
        except NvmlError as exc:
            if exc.code_name not in ("NOT_SUPPORTED", "IN_USE"):
                raise
            self.result["reset_error"] = exc.message
            self.progress(f"GPU {index}: reset not possible here ({exc.message})")
            return False
        self.result["reset"] = True
        self._done({"op": "reset"})
        return True

    def _set_mode(self, gpu_plan: GpuPlan) -> bool:
        """Set the MIG mode; reset the GPU when the change stays pending. True when the new mode is active."""
        index = gpu_plan.index
        status = self.nvml.set_mig_mode(index, gpu_plan.mig_after)
        self._done(
            {
                "op": "enable_mig" if gpu_plan.mig_after else "disable_mig",
                "activation": error_name(status) if status != SUCCESS else "SUCCESS",
            }
        )
        if status == SUCCESS:
            return True
        # IN_USE: the driver could not reset the busy GPU itself; RESET_REQUIRED: it cannot here (e.g. passthrough).
        # Both leave the change pending. Anything else is a failure.
        if status not in (ERROR_CODES["IN_USE"], ERROR_CODES["RESET_REQUIRED"]):
            raise NvmlError("nvmlDeviceSetMigMode (activation status)", status, error_name(status))
        if self.reset and status == ERROR_CODES["IN_USE"] and self._reset(index):
            current, _pending = self.nvml.mig_mode(index)
            if current == gpu_plan.mig_after:
                return True
        self.result["mig_mode_pending"] = True
        self.progress(f"GPU {index}: MIG mode change pending until the GPU is reset or the host reboots")
        return False


def apply(
    nvml: NvmlInterface,
    config: list[Any],
    force: bool = False,
    reset: bool = True,
    check_mode: bool = False,
    progress: Progress = _quiet,
    missing_devices: str = "fail",
) -> dict[str, Any]:
    """Plan and (unless check_mode) apply. Returns {"gpus": [...], "changed": bool, "reboot_required": bool}."""
    plans = plan(nvml, config, force, missing_devices)
    results = [gpu_result(p) for p, _catalog in plans]
    for (gpu_plan, catalog), result in zip(plans, results, strict=True):
        if check_mode or not gpu_plan.changed:
            continue
        try:
            _Applier(nvml, catalog, result, reset, progress).run(gpu_plan)
        except NvmlError as exc:
            result["failed"] = True
            busy = [problem for other, _catalog in plans for problem in busy_problems(other)]
            raise ApplyError(_failure_message(result, exc, results, busy), results) from None
    return summarize(results)


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "gpus": results,
        "changed": any(r["changed"] for r in results),
        "disruptive": any(r["disruptive"] for r in results),
        "reboot_required": any(r["mig_mode_pending"] for r in results),
    }


def _failure_message(
    failed: dict[str, Any], exc: NvmlError, results: list[dict[str, Any]], busy: Sequence[str] = ()
) -> str:
    def describe(step: dict[str, Any]) -> str:
        if "profile" in step:
            return f"{step['op']} {step['profile']}@{step['start']}"
        return str(step["op"])

    done = ", ".join(describe(s) for s in failed["done"]) or "nothing"
    finished = [str(r["index"]) for r in results if r["changed"] and not r.get("failed") and r["done"]]
    message = f"GPU {failed['index']} ({failed['uuid']}): {exc.message}; already done on GPU {failed['index']}: {done}"
    if finished:
        message += f"; GPUs completed before it: {', '.join(finished)}"
    untouched = [str(r["index"]) for r in results if r["changed"] and r["index"] > failed["index"]]
    if untouched:
        message += f"; GPUs not attempted: {', '.join(untouched)}"
    if busy:  # with force: every GPU where processes were in the way, not only the one that failed
        message += f"; processes in the way (force): {'; '.join(busy)}"
    return message + "; rerun to converge"
