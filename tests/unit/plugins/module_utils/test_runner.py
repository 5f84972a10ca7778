"""runner: catalog fallback, and every NVML failure kind mid-apply reported with progress, then converging."""

from __future__ import annotations

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
