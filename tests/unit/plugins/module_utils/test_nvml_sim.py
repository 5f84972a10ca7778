"""The simulator behaves like NVML where the planner and runner could be fooled."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _helpers import new_sim
from ansible_collections.gpufleet.mig.plugins.module_utils.exceptions import NvmlError
from ansible_collections.gpufleet.mig.plugins.module_utils.nvml import ERROR_CODES, SUCCESS
from ansible_collections.gpufleet.mig.plugins.module_utils.nvml_backend import open_nvml
from ansible_collections.gpufleet.mig.plugins.module_utils.nvml_sim import SimulatedNvml, main


def test_missing_state_file_is_created_as_eight_h100_with_mig_off(tmp_path, monkeypatch):
    monkeypatch.delenv("GPUFLEET_NVML_SIM_GPUS", raising=False)
    monkeypatch.delenv("GPUFLEET_NVML_SIM_PRODUCT", raising=False)
    path = tmp_path / "sub" / "state.json"
    nvml = open_nvml(str(path))
    assert isinstance(nvml, SimulatedNvml) and path.exists()
    assert nvml.device_count() == 8
    assert {nvml.identity(i).name for i in range(8)} == {"NVIDIA H100 80GB HBM3"}
    assert {nvml.mig_mode(i) for i in range(8)} == {(False, False)}
    assert len({nvml.identity(i).uuid for i in range(8)}) == 8


def test_default_product_and_count_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUFLEET_NVML_SIM_GPUS", "4")
    monkeypatch.setenv("GPUFLEET_NVML_SIM_PRODUCT", "NVIDIA H200")
    nvml = open_nvml(str(tmp_path / "h200.json"))
    assert nvml.device_count() == 4
    names = [p.name for p in nvml.gpu_instance_profiles(0)]
    assert names == ["1g.18gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb", "1g.18gb+me", "1g.35gb"]


def test_profile_enum_and_profile_id_are_different_spaces(tmp_path):
    nvml = new_sim(tmp_path)
    profiles = {p.name: p for p in nvml.gpu_instance_profiles(0)}
    expected = {
        "1g.10gb": (0, 19),
        "1g.10gb+me": (7, 20),
        "1g.20gb": (9, 15),
        "2g.20gb": (1, 14),
        "3g.40gb": (2, 9),
        "4g.40gb": (3, 5),
        "7g.80gb": (4, 0),
    }
    assert {n: (p.enum, p.id) for n, p in profiles.items()} == expected
    assert profiles["1g.20gb"].placements == ((0, 2), (2, 2), (4, 2), (6, 2))
    assert profiles["3g.40gb"].placements == ((0, 4), (4, 4))
    nvml.set_mig_mode(0, True)
    # Passing the 1g.10gb *enum* (0) where NVML wants a profile *id* names 7g.80gb, whose only placement is 0:8.
    with pytest.raises(NvmlError, match="INVALID_ARGUMENT"):
        nvml.create_gpu_instance(0, profiles["1g.10gb"].enum, 0, 1)
    gi = nvml.create_gpu_instance(0, profiles["1g.10gb"].id, 0, 1)
    assert [r.profile_id for r in nvml.gpu_instances(0, [19])] == [19] and gi == 7  # the driver's id for 0:1


def test_creation_respects_memory_compute_and_maximum(tmp_path):
    nvml = new_sim(tmp_path)
    nvml.set_mig_mode(0, True)
    nvml.create_gpu_instance(0, 5, 0, 4)  # 4g.40gb at 0
    with pytest.raises(NvmlError, match="INSUFFICIENT_RESOURCES"):
        nvml.create_gpu_instance(0, 19, 2, 1)  # overlaps the 4g.40gb
    nvml.create_gpu_instance(0, 9, 4, 4)  # 3g.40gb at 4: 7 compute slices used
    nvml.set_mig_mode(1, True)
    nvml.create_gpu_instance(1, 20, 0, 1)  # 1g.10gb+me: at most one per GPU
    with pytest.raises(NvmlError, match="INSUFFICIENT_RESOURCES"):
        nvml.create_gpu_instance(1, 20, 1, 1)


def test_mig_mode_stays_pending_while_busy_until_reset(tmp_path):
    nvml = new_sim(tmp_path)
    nvml.add_process(0, pid=777)
    assert nvml.set_mig_mode(0, True) == ERROR_CODES["IN_USE"]
    assert nvml.mig_mode(0) == (False, True)
    with pytest.raises(NvmlError, match="IN_USE"):
        nvml.reset_gpu(0)
    nvml.state["gpus"][0]["processes"] = []
    nvml.reset_gpu(0)
    assert nvml.mig_mode(0) == (True, True)
    assert nvml.set_mig_mode(1, True) == SUCCESS and nvml.mig_mode(1) == (True, True)


def test_destroying_busy_instances_is_in_use(tmp_path):
    nvml = new_sim(tmp_path)
    nvml.set_mig_mode(0, True)
    gi = nvml.create_gpu_instance(0, 9, 0, 4)
    ci = nvml.create_compute_instance(0, gi, 3)
    nvml.add_process(0, pid=4242, gi_id=gi)
    with pytest.raises(NvmlError, match="IN_USE"):
        nvml.destroy_compute_instance(0, gi, ci)
    with pytest.raises(NvmlError, match="IN_USE"):
        nvml.destroy_gpu_instance(0, gi)  # still has its compute instance (and a process)
    assert [p.pid for p in nvml.running_processes(0)] == [4242]


def test_reset_and_reboot_wipe_instances(tmp_path):
    nvml = new_sim(tmp_path)
    nvml.set_mig_mode(0, True)
    nvml.create_compute_instance(0, nvml.create_gpu_instance(0, 0, 0, 8), 7)
    assert main(["--state", nvml.path, "reboot"]) == 0
    again = SimulatedNvml(nvml.path)
    assert again.mig_mode(0) == (True, True) and again.gpu_instances(0, [0]) == []


def test_injected_fault_fires_at_the_chosen_call_once_and_is_persisted(tmp_path):
    nvml = new_sim(tmp_path)
    nvml.set_mig_mode(0, True)
    nvml.add_fault("nvmlDeviceCreateGpuInstanceWithPlacement", "INSUFFICIENT_RESOURCES", gpu=0, skip=1)
    nvml.create_gpu_instance(0, 19, 0, 1)  # skipped
    with pytest.raises(NvmlError, match=r"nvmlDeviceCreateGpuInstanceWithPlacement failed: .*INSUFFICIENT_RESOURCES"):
        nvml.create_gpu_instance(0, 19, 1, 1)
    assert json.loads(Path(nvml.path).read_text())["faults"] == []
    assert nvml.create_gpu_instance(0, 19, 1, 1) == 8


def test_activation_status_fault_is_returned_not_raised(tmp_path):
    nvml = new_sim(tmp_path)
    nvml.add_fault("nvmlDeviceSetMigMode", "RESET_REQUIRED", gpu=1, as_status=True)
    assert nvml.set_mig_mode(1, True) == ERROR_CODES["RESET_REQUIRED"]
    assert nvml.mig_mode(1) == (False, True)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["fault", "--call", "nvmlDoesNotExist", "--error", "IN_USE"], "unknown NVML call"),
        (["fault", "--call", "nvmlGpuInstanceDestroy", "--error", "OOPS"], "unknown NVML error"),
    ],
)
def test_cli_rejects_unknown_faults(tmp_path, capsys, argv, message):
    assert main(["--state", str(tmp_path / "s.json"), *argv]) == 1
    assert message in capsys.readouterr().err


def test_gpu_instance_ids_are_the_drivers_placement_ids(tmp_path):
    # H100 80GB as nvidia-smi mig -lgi shows it: 7 x 1g.10gb at 0..6 are GPU instances 7..13, whatever the order of
    # creation; destroyed and re-created at the same place, an instance gets its id back (not the lowest free one).
    nvml = new_sim(tmp_path)
    nvml.set_mig_mode(0, True)
    created = {start: nvml.create_gpu_instance(0, 19, start, 1) for start in (6, 4, 5, 0, 1, 2, 3)}
    assert created == {start: 7 + start for start in range(7)}
    nvml.destroy_gpu_instance(0, 9)
    nvml.destroy_gpu_instance(0, 7)
    assert nvml.create_gpu_instance(0, 19, 2, 1) == 9
    for gi in [r.gi_id for r in nvml.gpu_instances(0, [19])]:
        nvml.destroy_gpu_instance(0, gi)
    # Halves 1/2, quarters 3..6 (2g.20gb and 1g.20gb alike), the whole GPU 0.
    assert [nvml.create_gpu_instance(0, 9, 4, 4), nvml.create_gpu_instance(0, 14, 0, 2)] == [2, 3]
    assert nvml.create_gpu_instance(0, 15, 2, 2) == 4
    for gi in (2, 3, 4):
        nvml.destroy_gpu_instance(0, gi)
    assert nvml.create_gpu_instance(0, 5, 0, 4) == 1
    nvml.destroy_gpu_instance(0, 1)
    assert nvml.create_gpu_instance(0, 0, 0, 8) == 0


def test_resets_are_counted_so_older_device_handles_are_stale(tmp_path):
    nvml = new_sim(tmp_path)
    assert nvml.state["gpus"][0]["reset_count"] == 0
    assert nvml.set_mig_mode(0, True) == SUCCESS  # the driver reset the GPU to switch the mode
    assert nvml.state["gpus"][0]["reset_count"] == 1
    nvml.set_mig_mode(0, True)  # nothing to switch: no reset
    assert nvml.state["gpus"][0]["reset_count"] == 1
    nvml.add_fault("nvmlDeviceSetMigMode", "IN_USE", gpu=1, as_status=True)
    assert nvml.set_mig_mode(1, True) == ERROR_CODES["IN_USE"]  # pending: not reset yet
    assert nvml.state["gpus"][1]["reset_count"] == 0
    nvml.reset_gpu(1)
    assert nvml.state["gpus"][1]["reset_count"] == 1 and nvml.mig_mode(1) == (True, True)
    nvml.reboot()
    assert [g["reset_count"] for g in nvml.state["gpus"]] == [2, 2]


def test_an_unprivileged_caller_may_read_but_not_change(tmp_path):
    nvml = new_sim(tmp_path)
    nvml.set_mig_mode(0, True)
    gi = nvml.create_gpu_instance(0, 9, 0, 4)
    nvml.state["privileged"] = False
    with pytest.raises(NvmlError, match="nvmlDeviceSetMigMode failed: NVML_ERROR_NO_PERMISSION"):
        nvml.set_mig_mode(1, True)
    with pytest.raises(NvmlError, match="NO_PERMISSION"):
        nvml.create_gpu_instance(0, 9, 4, 4)
    with pytest.raises(NvmlError, match="NO_PERMISSION"):
        nvml.destroy_gpu_instance(0, gi)
    assert [r.gi_id for r in nvml.gpu_instances(0, [9])] == [gi]


def test_processes_carry_their_kind_and_may_hide_their_memory(tmp_path):
    nvml = new_sim(tmp_path)
    nvml.add_process(0, pid=1, used_mib=None, kind="graphics")
    assert main(["--state", nvml.path, "add-process", "--gpu", "0", "--pid", "2", "--type", "graphics"]) == 0
    assert [(p.pid, p.used_memory_mib, p.kind) for p in SimulatedNvml(nvml.path).running_processes(0)] == [
        (1, None, "graphics"),
        (2, 1024, "graphics"),
    ]
    with pytest.raises(ValueError, match="unknown process type"):
        nvml.add_process(0, pid=3, kind="video")


def test_a_state_file_numbered_in_creation_order_is_renumbered_by_placement(tmp_path):
    # A lab written by an older simulator: 7 x 1g.10gb numbered 1..7 in creation order, a process in the one at
    # slice 0 (old id 1). A 3g.40gb at 4:4 is GPU instance 2, an id the old file gives the 1g.10gb at slice 1.
    nvml = new_sim(tmp_path, gpus=1)
    nvml.set_mig_mode(0, True)
    for start in range(7):
        nvml.create_compute_instance(0, nvml.create_gpu_instance(0, 19, start, 1), 1)
    nvml.add_process(0, 4242, gi_id=7)
    state = json.loads(Path(nvml.path).read_text())
    for gi in state["gpus"][0]["gpu_instances"]:
        gi["id"] = gi["start"] + 1
    state["gpus"][0]["processes"][0]["gpu_instance_id"] = 1
    Path(nvml.path).write_text(json.dumps(state))

    nvml = SimulatedNvml(nvml.path)
    assert sorted((r.start, r.gi_id) for r in nvml.gpu_instances(0, [19])) == [(s, 7 + s) for s in range(7)]
    assert [(p.pid, p.gi_id) for p in nvml.running_processes(0)] == [(4242, 7)]
    for gi in (11, 12, 13):  # slices 4..6
        nvml.destroy_compute_instance(0, gi, 0)
        nvml.destroy_gpu_instance(0, gi)
    assert nvml.create_gpu_instance(0, 9, 4, 4) == 2
    nvml.create_compute_instance(0, 2, 3)  # the lab's failure: "GPU instance 2 has no room" on the old file
    assert sorted(r.gi_id for r in nvml.gpu_instances(0, [19, 9])) == [2, 7, 8, 9, 10]
