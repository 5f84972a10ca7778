"""runner: catalog fallback, and every NVML failure kind mid-apply reported with progress, then converging."""

from __future__ import annotations

from dataclasses import replace

import pytest
from _helpers import layout, new_sim
from ansible_collections.gpufleet.mig.plugins.module_utils import runner
from ansible_collections.gpufleet.mig.plugins.module_utils.exceptions import ApplyError, SpecError
from ansible_collections.gpufleet.mig.plugins.module_utils.nvml import DeviceIdentity
from ansible_collections.gpufleet.mig.plugins.module_utils.nvml_sim import SimulatedNvml


class NoCatalogWhileMigOff(SimulatedNvml):
    """A driver that answers NOT_SUPPORTED for every profile until MIG is enabled."""

    def gpu_instance_profiles(self, index):
        return super().gpu_instance_profiles(index) if self.mig_mode(index)[0] else []


def test_known_product_catalog_stands_in_while_mig_is_off(tmp_path):
    path = new_sim(tmp_path, gpus=1).path
    result = runner.apply(NoCatalogWhileMigOff(path), layout({"3g.40gb": 2}))
    assert [(i["profile"], i["start"]) for i in result["gpus"][0]["after"]] == [("3g.40gb", 0), ("3g.40gb", 4)]


def test_gpu_without_mig_profiles_fails_validation_only_when_mig_is_wanted(tmp_path):
    sim = new_sim(tmp_path, gpus=1)

    class NotMigCapable(NoCatalogWhileMigOff):
        def identity(self, index):
            return DeviceIdentity(index, "GPU-x", "Tesla V100-SXM2-16GB", 16160, 0x1DB110DE)

    # MIG off wanted: nothing to validate, nothing to do.
    assert not runner.apply(NotMigCapable(sim.path), [{"devices": "all", "mig_enabled": False}])["changed"]
    with pytest.raises(SpecError, match=r"GPU 0 \(Tesla V100-SXM2-16GB\): NVML reports no MIG profiles"):
        runner.apply(NotMigCapable(sim.path), layout({"1g.10gb": 1}))


@pytest.mark.parametrize("error", ["IN_USE", "INSUFFICIENT_RESOURCES", "RESET_REQUIRED", "NOT_SUPPORTED"])
@pytest.mark.parametrize(
    "call", ["nvmlGpuInstanceDestroy", "nvmlComputeInstanceDestroy", "nvmlDeviceCreateGpuInstanceWithPlacement"]
)
def test_nvml_failures_mid_apply_report_progress_and_converge(tmp_path, call, error):
    sim = new_sim(tmp_path, gpus=2)
    runner.apply(sim, layout({"1g.10gb": 7}))
    target = layout({"1g.10gb": 3, "4g.40gb": 1})  # destroys four 1g.10gb, creates one 4g.40gb, per GPU
    SimulatedNvml(sim.path).add_fault(call, error, gpu=1, skip=1 if "Destroy" in call else 0)
    with pytest.raises(ApplyError) as failure:
        runner.apply(SimulatedNvml(sim.path), target)
    message = failure.value.message
    assert "GPU 1 (GPU-" in message and f"{call} failed: NVML_ERROR_{error}" in message
    assert "GPUs completed before it: 0" in message and message.endswith("rerun to converge")
    done = {r["index"]: r["done"] for r in failure.value.results}
    assert len(done[0]) == 5  # GPU 0 finished: 4 destroys + 1 create
    rerun = runner.apply(SimulatedNvml(sim.path), target)
    assert rerun["gpus"][0]["actions"] == [] and rerun["gpus"][1]["actions"]
    assert not runner.apply(SimulatedNvml(sim.path), target)["changed"]


def test_failure_at_the_first_step_says_nothing_was_done_and_the_failed_gpu_is_not_completed(tmp_path):
    sim = new_sim(tmp_path, gpus=3)
    runner.apply(sim, layout({"1g.10gb": 7}))
    SimulatedNvml(sim.path).add_fault("nvmlComputeInstanceDestroy", "UNKNOWN", gpu=0)
    with pytest.raises(ApplyError) as failure:
        runner.apply(SimulatedNvml(sim.path), layout({"7g.80gb": 1}))
    uuid = failure.value.results[0]["uuid"]
    assert failure.value.message == (
        f"GPU 0 ({uuid}): nvmlComputeInstanceDestroy failed: NVML_ERROR_UNKNOWN (999): injected by the simulator; "
        "already done on GPU 0: nothing; "
        "GPUs not attempted: 1, 2; rerun to converge"
    )
    # Later in the same GPU: its own finished steps are listed, and it is not among the GPUs completed before it.
    (tmp_path / "second").mkdir()
    sim2 = new_sim(tmp_path / "second", gpus=2)
    runner.apply(sim2, layout({"1g.10gb": 7}))
    SimulatedNvml(sim2.path).add_fault("nvmlDeviceCreateGpuInstanceWithPlacement", "UNKNOWN", gpu=1)
    with pytest.raises(ApplyError) as failure:
        runner.apply(SimulatedNvml(sim2.path), layout({"7g.80gb": 1}))
    message = failure.value.message
    assert "; already done on GPU 1: destroy 1g.10gb@0, destroy 1g.10gb@1," in message
    assert "; GPUs completed before it: 0; rerun to converge" in message
    # Several GPUs completed before the failing one: listed with ", ".
    (tmp_path / "third").mkdir()
    sim3 = new_sim(tmp_path / "third", gpus=3)
    runner.apply(sim3, layout({"1g.10gb": 7}))
    SimulatedNvml(sim3.path).add_fault("nvmlDeviceCreateGpuInstanceWithPlacement", "UNKNOWN", gpu=2)
    with pytest.raises(ApplyError) as failure:
        runner.apply(SimulatedNvml(sim3.path), layout({"7g.80gb": 1}))
    assert "; GPUs completed before it: 0, 1; rerun to converge" in failure.value.message


def test_a_gpu_that_cannot_be_reset_says_why_in_the_progress_and_waits_for_a_reboot(tmp_path):
    sim = new_sim(tmp_path, gpus=1)
    sim.state["gpus"][0]["reset_supported"] = False
    sim._save()
    sim.add_process(0, pid=4242)
    said = []
    result = runner.apply(SimulatedNvml(sim.path), layout({"3g.40gb": 2}), force=True, progress=said.append)
    gpu = result["gpus"][0]
    assert result["reboot_required"] and gpu["mig_mode_pending"] and not gpu["reset"]
    assert said == [
        "GPU 0: enable_mig",
        f"GPU 0: reset not possible here ({gpu['reset_error']})",
        "GPU 0: MIG mode change pending until the GPU is reset or the host reboots",
    ]
    assert "NVML_ERROR_NOT_SUPPORTED" in gpu["reset_error"]


def test_a_reset_that_activates_the_mode_is_a_step_and_the_instances_follow(tmp_path):
    sim = new_sim(tmp_path, gpus=1)
    sim.add_fault("nvmlDeviceSetMigMode", "IN_USE", gpu=0, as_status=True)
    said = []
    result = runner.apply(SimulatedNvml(sim.path), layout({"3g.40gb": 2}), progress=said.append)
    gpu = result["gpus"][0]
    assert gpu["reset"] and not gpu["mig_mode_pending"] and not result["reboot_required"]
    assert [step["op"] for step in gpu["done"]] == ["enable_mig", "reset", "create", "create"]
    assert said == ["GPU 0: enable_mig", "GPU 0: reset", "GPU 0: create 3g.40gb@0", "GPU 0: create 3g.40gb@4"]


def test_an_activation_status_other_than_in_use_or_reset_required_fails_naming_the_status(tmp_path):
    sim = new_sim(tmp_path, gpus=1)
    sim.add_fault("nvmlDeviceSetMigMode", "UNKNOWN", gpu=0, as_status=True)
    with pytest.raises(ApplyError) as failure:
        runner.apply(SimulatedNvml(sim.path), layout({"3g.40gb": 2}))
    uuid = failure.value.results[0]["uuid"]
    assert failure.value.message == (
        f"GPU 0 ({uuid}): nvmlDeviceSetMigMode (activation status) failed: NVML_ERROR_UNKNOWN (999); "
        "already done on GPU 0: enable_mig; rerun to converge"
    )
    assert failure.value.results[0]["done"] == [{"op": "enable_mig", "activation": "UNKNOWN"}]


def test_mode_steps_and_results_name_what_was_done(tmp_path):
    sim = new_sim(tmp_path, gpus=2)
    enabled = runner.apply(sim, layout({"3g.40gb": 2}))
    assert enabled["gpus"][0]["done"][0] == {"op": "enable_mig", "activation": "SUCCESS"}
    assert enabled["gpus"][0]["name"] == "NVIDIA H100 80GB HBM3" and enabled["disruptive"]
    disabled = runner.apply(SimulatedNvml(sim.path), [{"devices": [1], "mig_enabled": False}])
    gpu = next(g for g in disabled["gpus"] if g["index"] == 1)
    assert [step["op"] for step in gpu["done"]][-1] == "disable_mig"
    assert gpu["done"][-1]["activation"] == "SUCCESS" and disabled["disruptive"]
    assert not runner.apply(SimulatedNvml(sim.path), layout({"3g.40gb": 2}, devices=[0]))["disruptive"]


class PartialComputeInstanceAtZero(SimulatedNvml):
    """A driver showing the GPU instance at slice 0 with a 1-slice compute instance (made by hand with nvidia-smi
    mig -cci; the simulator itself only makes full-size ones)."""

    def gpu_instances(self, index, profile_ids):
        records = super().gpu_instances(index, profile_ids)
        return [replace(r, compute_instances=((0, 1),)) if r.start == 0 else r for r in records]


def test_read_gpu_counts_an_instance_complete_only_with_one_full_size_compute_instance(tmp_path):
    sim = new_sim(tmp_path, gpus=1)
    runner.apply(sim, layout({"3g.40gb": 2}))
    nvml = PartialComputeInstanceAtZero(sim.path)
    state = runner.read_gpu(nvml, 0, runner.read_catalog(nvml, 0, required=True))
    by_start = {instance.start: instance for instance in state.instances}
    assert (by_start[0].complete, by_start[0].uuid) == (False, None)
    assert by_start[4].complete and by_start[4].uuid.startswith("MIG-")
    # The partial one is rebuilt, the complete one kept.
    result = runner.apply(nvml, layout({"3g.40gb": 2}), check_mode=True)
    assert [(a["op"], a["start"]) for a in result["gpus"][0]["actions"]] == [("destroy", 0), ("create", 0)]
