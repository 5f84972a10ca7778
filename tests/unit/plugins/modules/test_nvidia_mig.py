"""The nvidia_mig and nvidia_gpu_info modules driven through the simulator: check mode, diff, idempotence,
failure mid-apply and convergence, busy refusal, validation, mig-parted files. Modules are imported and run
in-process with AnsibleModule's test hook (fast); one test runs the real `ansible` CLI end to end."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from _helpers import layout, new_sim
from ansible.module_utils.testing import patch_module_args
from ansible_collections.gpufleet.mig.plugins.module_utils import nvml_backend
from ansible_collections.gpufleet.mig.plugins.module_utils.nvml_sim import SimulatedNvml
from ansible_collections.gpufleet.mig.plugins.modules import nvidia_gpu_info, nvidia_mig
from conftest import COLLECTIONS_PATH, REPO

IMAGEGEN = [
    {"devices": [0], "mig_enabled": True, "mig_devices": {"3g.40gb": 2}},
    {"devices": [1], "mig_enabled": True, "mig_devices": {"2g.20gb": 3, "1g.10gb": 1}},
]


def run_module(module, args: dict, check_mode=False, diff=False) -> dict:
    args = dict(args, _ansible_check_mode=check_mode, _ansible_diff=diff)
    with patch_module_args(args), pytest.raises(SystemExit) as exit_info:
        module.main()
    del exit_info
    return json.loads(run_module.capsys.readouterr().out)


@pytest.fixture(autouse=True)
def _capture(capsys):
    run_module.capsys = capsys


@pytest.fixture
def sim(tmp_path):
    return new_sim(tmp_path, gpus=2)


def mig(sim, config, **kwargs) -> dict:
    return run_module(nvidia_mig, {"config": config, "nvml_sim_state": sim.path}, **kwargs)


def test_check_mode_plans_and_writes_nothing(sim):
    before = Path(sim.path).read_text()
    result = mig(sim, IMAGEGEN, check_mode=True)
    assert result["changed"] and Path(sim.path).read_text() == before
    assert result["gpus"][1]["actions"] == [
        {"op": "create", "profile": "2g.20gb", "start": 0},
        {"op": "create", "profile": "2g.20gb", "start": 2},
        {"op": "create", "profile": "2g.20gb", "start": 4},
        {"op": "create", "profile": "1g.10gb", "start": 6},
    ]
    assert all(g["done"] == [] for g in result["gpus"])


def test_apply_is_idempotent_and_check_mode_plan_matches_apply(sim):
    planned = mig(sim, IMAGEGEN, check_mode=True)
    applied = mig(sim, IMAGEGEN)
    assert [g["actions"] for g in planned["gpus"]] == [g["actions"] for g in applied["gpus"]]
    assert applied["changed"] and not applied["reboot_required"]
    again = mig(sim, IMAGEGEN)
    assert not again["changed"] and all(g["actions"] == [] for g in again["gpus"])
    info = run_module(nvidia_gpu_info, {"nvml_sim_state": sim.path})
    assert [(i["profile"], i["start"]) for i in info["gpus"][0]["gpu_instances"]] == [("3g.40gb", 0), ("3g.40gb", 4)]
    assert all(
        ci["mig_device_uuid"].startswith("MIG-")
        for i in info["gpus"][1]["gpu_instances"]
        for ci in i["compute_instances"]
    )


def test_diff_shows_before_and_after_per_changed_gpu(sim):
    mig(sim, IMAGEGEN)
    result = mig(sim, layout({"3g.40gb": 1, "2g.20gb": 2}, devices=[0]), diff=True)
    assert result["diff"]["before"].endswith("MIG enabled: 3g.40gb@0, 3g.40gb@4\n")
    assert result["diff"]["after"].endswith("MIG enabled: 2g.20gb@0, 2g.20gb@2, 3g.40gb@4\n")
    assert "GPU 1" not in result["diff"]["after"]  # untouched GPUs are not in the diff


def test_only_the_instances_that_change_are_destroyed(sim):
    mig(sim, IMAGEGEN)
    uuids_before = {
        i["start"]: i["compute_instances"][0]["mig_device_uuid"]
        for i in run_module(nvidia_gpu_info, {"nvml_sim_state": sim.path})["gpus"][1]["gpu_instances"]
    }
    result = mig(sim, [{"devices": [1], "mig_enabled": True, "mig_devices": {"2g.20gb": 2, "1g.10gb": 3}}])
    assert result["gpus"][0]["actions"] == [
        {"op": "destroy", "profile": "2g.20gb", "start": 4},
        {"op": "create", "profile": "1g.10gb", "start": 4},
        {"op": "create", "profile": "1g.10gb", "start": 5},
    ]
    after = {
        i["start"]: i["compute_instances"][0]["mig_device_uuid"]
        for i in run_module(nvidia_gpu_info, {"nvml_sim_state": sim.path})["gpus"][1]["gpu_instances"]
    }
    assert after[0] == uuids_before[0] and after[2] == uuids_before[2] and after[6] == uuids_before[6]


def test_busy_instance_is_refused_before_any_write(sim):
    mig(sim, IMAGEGEN)
    SimulatedNvml(sim.path).add_process(0, pid=31337, gi_id=2)
    state = Path(sim.path).read_text()
    result = mig(sim, [*IMAGEGEN[1:], {"devices": [0], "mig_enabled": True, "mig_devices": {"7g.80gb": 1}}])
    assert result["failed"]
    assert "GPU 0: instance 3g.40gb at slice 4 (GPU instance 2" in result["msg"] and "PIDs 31337" in result["msg"]
    assert Path(sim.path).read_text() == state


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (layout({"1g.5gb": 1}), "unknown MIG profile(s) 1g.5gb for this GPU; valid profiles: 1g.10gb, 1g.10gb+me"),
        (layout({"2g.20gb": 4}), "4 x 2g.20gb requested, at most 3 fit"),
        (layout({"4g.40gb": 1, "3g.40gb": 1, "1g.10gb": 1}), "needs 8 compute slices"),
        ([{"devices": [5], "mig_enabled": False}], "GPU index(es) [5] do not exist"),
    ],
)
def test_invalid_requests_fail_with_the_constraint_and_write_nothing(sim, config, message):
    # GPU 0 valid, GPU 1 invalid: GPU 0 must not be written either.
    config = [{"devices": [0], "mig_enabled": True, "mig_devices": {"7g.80gb": 1}}] + [
        dict(entry, devices=[1]) if entry["devices"] == "all" else entry for entry in config
    ]
    state = Path(sim.path).read_text()
    result = mig(sim, config)
    assert result["failed"] and message in result["msg"], result["msg"]
    assert Path(sim.path).read_text() == state


def test_failure_mid_apply_reports_progress_and_rerun_converges(sim):
    SimulatedNvml(sim.path).add_fault(
        "nvmlDeviceCreateGpuInstanceWithPlacement", "INSUFFICIENT_RESOURCES", gpu=1, skip=2
    )
    result = mig(sim, IMAGEGEN)
    assert result["failed"] and result["changed"]
    assert "GPU 1" in result["msg"] and "INSUFFICIENT_RESOURCES" in result["msg"]
    assert "already done on GPU 1: enable_mig, create 2g.20gb@0, create 2g.20gb@2" in result["msg"]
    assert "GPUs completed before it: 0" in result["msg"]
    assert [len(g["done"]) for g in result["gpus"]] == [3, 3]
    rerun = mig(sim, IMAGEGEN)
    assert rerun["gpus"][0]["actions"] == []
    assert rerun["gpus"][1]["actions"] == [
        {"op": "create", "profile": "2g.20gb", "start": 4},
        {"op": "create", "profile": "1g.10gb", "start": 6},
    ]
    assert not mig(sim, IMAGEGEN)["changed"]


def test_compute_instance_failure_leaves_an_incomplete_instance_that_is_rebuilt(sim):
    SimulatedNvml(sim.path).add_fault("nvmlGpuInstanceCreateComputeInstance", "UNKNOWN", gpu=0)
    assert mig(sim, layout({"7g.80gb": 1}, devices=[0]))["failed"]
    rerun = mig(sim, layout({"7g.80gb": 1}, devices=[0]))
    assert [a["op"] for a in rerun["gpus"][0]["actions"]] == ["destroy", "create"]


def test_pending_mode_change_is_reset_only_on_that_gpu(sim):
    nvml = SimulatedNvml(sim.path)
    nvml.add_process(1, pid=77)  # GPU 1 busy: activation stays pending, and the reset is refused
    result = mig(
        sim,
        layout({"7g.80gb": 1}),
    )
    assert result["failed"] and "PIDs 77" in result["msg"]  # no force: refused before any write
    nvml = SimulatedNvml(sim.path)
    nvml.add_fault("nvmlDeviceSetMigMode", "IN_USE", gpu=0, as_status=True)
    nvml.state["gpus"][1]["processes"] = []
    nvml._save()
    result = mig(sim, layout({"7g.80gb": 1}))
    assert [g["reset"] for g in result["gpus"]] == [True, False]
    assert not result["reboot_required"]


def test_reboot_required_when_reset_is_off(sim):
    SimulatedNvml(sim.path).add_fault("nvmlDeviceSetMigMode", "IN_USE", gpu=0, as_status=True)
    result = run_module(nvidia_mig, {"config": layout({"3g.40gb": 2}), "nvml_sim_state": sim.path, "reset": False})
    assert result["reboot_required"] and result["gpus"][0]["mig_mode_pending"]
    assert [s["op"] for s in result["gpus"][0]["done"]] == ["enable_mig"]
    SimulatedNvml(sim.path).reboot()
    after = mig(sim, layout({"3g.40gb": 2}))
    assert not after["reboot_required"] and [a["op"] for a in after["gpus"][0]["actions"]] == ["create", "create"]


def test_mig_parted_file(sim, tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(
        "version: v1\nmig-configs:\n  all-disabled:\n    - devices: all\n      mig-enabled: false\n"
        "  custom:\n    - devices: [0]\n      mig-enabled: true\n      mig-devices:\n        '1g.10gb': 7\n"
        "    - devices: [1]\n      device-filter: ['0x233010DE']\n      mig-enabled: true\n"
        "      mig-devices:\n        '4g.40gb': 1\n        '3g.40gb': 1\n"
    )
    args = {"mig_parted_file": str(path), "mig_parted_config": "custom", "nvml_sim_state": sim.path}
    result = run_module(nvidia_mig, args)
    assert [len(g["after"]) for g in result["gpus"]] == [7, 2]
    result = run_module(nvidia_mig, dict(args, mig_parted_config="nope"))
    assert "no config named 'nope' (available: all-disabled, custom)" in result["msg"]
    path.write_text("version: v2\nmig-configs: {}\n")
    assert "unsupported version 'v2'" in run_module(nvidia_mig, args)["msg"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("version: v1\n# caf\xe9\n".encode("latin-1"), "is not UTF-8 text (byte 0xe9 at offset 17)"),
        (b"\x7fELF\x02\x01\x01\x00\x00\x00", "is not valid YAML"),  # valid UTF-8, but NUL bytes
        (bytes(range(256)), "is not UTF-8 text (byte 0x80 at offset 128)"),
    ],
    ids=["latin-1", "elf-header", "binary"],
)
def test_a_mig_parted_file_that_is_not_utf8_text_fails_cleanly_and_writes_nothing(sim, tmp_path, content, message):
    path = tmp_path / "config.yaml"
    path.write_bytes(content)
    before = Path(sim.path).read_text()
    args = {"mig_parted_file": str(path), "mig_parted_config": "custom", "nvml_sim_state": sim.path}
    result = run_module(nvidia_mig, args)
    assert result["failed"] and not result["changed"], result
    assert f"mig_parted_file {path} {message}" in result["msg"], result["msg"]
    assert "Traceback" not in json.dumps(result)
    assert Path(sim.path).read_text() == before


def test_config_and_mig_parted_file_are_mutually_exclusive(sim):
    result = run_module(
        nvidia_mig, {"config": IMAGEGEN, "mig_parted_file": "/x", "mig_parted_config": "y", "nvml_sim_state": sim.path}
    )
    assert "mutually exclusive" in result["msg"]


def test_ansible_cli_end_to_end(tmp_path):
    state = tmp_path / "cli.json"
    env = dict(
        os.environ,
        ANSIBLE_COLLECTIONS_PATH=COLLECTIONS_PATH,
        GPUFLEET_NVML_SIM_GPUS="1",
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_STDOUT_CALLBACK="json",
        ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
        ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
    )
    args = json.dumps({"config": layout({"1g.10gb+me": 1, "1g.10gb": 6}), "nvml_sim_state": str(state)})
    ansible = Path(sys.executable).with_name("ansible")
    cmd = [
        str(ansible),
        "localhost",
        "-i",
        "localhost,",
        "-c",
        "local",
        "-m",
        "gpufleet.mig.nvidia_mig",
        "-a",
        args,
        "-e",
        f"ansible_python_interpreter={sys.executable}",
    ]
    first = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=REPO, check=False)
    assert first.returncode == 0, first.stdout + first.stderr
    second = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=REPO, check=False)
    host = json.loads(second.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]
    assert host["changed"] is False and len(host["gpus"][0]["after"]) == 7


# (A 5,000-digit int cannot reach a module: module arguments travel as JSON. test_spec checks it below that.)
ODD_NUMBERS = ["²", "٣", "9" * 5000, 10**12, "1.5", 1.5, "0x1", True, "", None, [1]]


@pytest.mark.parametrize(
    "value",
    ODD_NUMBERS,
    ids=lambda v: f"{type(v).__name__}-{repr(v)[:6] if not isinstance(v, int) or abs(v) < 10**9 else 'huge'}",
)
@pytest.mark.parametrize("where", ["count", "index"])
def test_odd_counts_and_indexes_are_refused_naming_the_entry(sim, value, where):
    if where == "count":
        entry = {"devices": [1], "mig_enabled": True, "mig_devices": {"1g.10gb": value}}
    else:
        entry = {"devices": [value], "mig_enabled": True, "mig_devices": {"1g.10gb": 1}}
    state = Path(sim.path).read_text()
    result = mig(sim, [{"devices": [0], "mig_enabled": False}, entry])
    assert result["failed"] and result["msg"].startswith("config[1]: "), result["msg"]
    assert ("count of 1g.10gb" if where == "count" else "devices[]") in result["msg"]
    assert "invalid literal" not in result["msg"] and len(result["msg"]) < 300
    assert Path(sim.path).read_text() == state


def test_gpu_that_cannot_be_reset_needs_a_reboot_and_later_gpus_are_still_processed(tmp_path):
    sim = new_sim(tmp_path, gpus=3)
    sim.state["gpus"][0]["reset_supported"] = False  # e.g. a GPU of an NVLink domain
    sim._save()
    sim.add_process(0, pid=4242)  # whole-GPU process: the mode change stays pending
    sim.add_process(2, pid=4343)  # resettable, but still in use (force does not stop processes)
    args = {"config": layout({"3g.40gb": 2}), "nvml_sim_state": sim.path, "force": True}
    result = run_module(nvidia_mig, args)
    assert not result.get("failed"), result.get("msg")
    assert result["changed"] and result["reboot_required"]
    gpu0, gpu1, gpu2 = result["gpus"]
    assert gpu0["mig_mode_pending"] and not gpu0["reset"] and "NVML_ERROR_NOT_SUPPORTED" in gpu0["reset_error"]
    assert gpu2["mig_mode_pending"] and "NVML_ERROR_IN_USE" in gpu2["reset_error"]
    assert [s["op"] for s in gpu0["done"]] == ["enable_mig"] and gpu0["done"][0]["activation"] == "IN_USE"
    assert [s["op"] for s in gpu1["done"]] == ["enable_mig", "create", "create"]  # processed after GPU 0
    assert not gpu1["mig_mode_pending"] and gpu1["reset_error"] is None
    # After the reboot the docs promise, a rerun creates the instances on GPUs 0 and 2.
    SimulatedNvml(sim.path).reboot()
    after = run_module(nvidia_mig, args)
    assert not after["reboot_required"]
    assert [[a["op"] for a in g["actions"]] for g in after["gpus"]] == [["create", "create"]] * 3  # reboot wipes all
    assert not run_module(nvidia_mig, args)["changed"]


def test_failed_destroy_reports_the_compute_instance_already_removed(sim):
    mig(sim, IMAGEGEN)
    SimulatedNvml(sim.path).add_fault("nvmlGpuInstanceDestroy", "UNKNOWN", gpu=1)
    target = [IMAGEGEN[0], {"devices": [1], "mig_enabled": True, "mig_devices": {"7g.80gb": 1}}]
    result = mig(sim, target)
    assert result["failed"] and result["changed"]
    gpu1 = result["gpus"][1]
    assert gpu1["done"] == [
        {"op": "destroy_compute_instances", "profile": "2g.20gb", "start": 0, "compute_instance_ids": [0]}
    ]
    assert "already done on GPU 1: destroy_compute_instances 2g.20gb@0" in result["msg"]
    rerun = mig(sim, target)
    assert not rerun.get("failed") and not mig(sim, target)["changed"]


def test_failure_names_the_gpus_not_attempted(tmp_path):
    sim = new_sim(tmp_path, gpus=3)
    sim.add_fault("nvmlDeviceCreateGpuInstanceWithPlacement", "INSUFFICIENT_RESOURCES", gpu=1)
    result = run_module(nvidia_mig, {"config": layout({"7g.80gb": 1}), "nvml_sim_state": sim.path})
    assert result["failed"]
    assert "GPUs completed before it: 0" in result["msg"] and "GPUs not attempted: 2" in result["msg"]


def test_every_busy_gpu_is_named(sim):
    mig(sim, IMAGEGEN)
    nvml = SimulatedNvml(sim.path)
    nvml.add_process(0, pid=101, gi_id=1)
    nvml.add_process(1, pid=202, gi_id=3)  # 2g.20gb at 0:2 is GPU instance 3
    state = Path(sim.path).read_text()
    result = mig(sim, layout({"7g.80gb": 1}))
    assert result["failed"] and "PIDs 101" in result["msg"] and "PIDs 202" in result["msg"]
    assert result["msg"].count("stop them or set force=true") == 1
    assert Path(sim.path).read_text() == state


def test_forced_apply_that_fails_names_every_busy_gpu(sim):
    mig(sim, IMAGEGEN)
    nvml = SimulatedNvml(sim.path)
    nvml.add_process(0, pid=101, gi_id=1)
    nvml.add_process(1, pid=202, gi_id=3)  # 2g.20gb at 0:2 is GPU instance 3
    # force skips the pre-check; NVML itself refuses to destroy GPU 0's busy instance (IN_USE) and stops the apply.
    result = run_module(nvidia_mig, {"config": layout({"7g.80gb": 1}), "nvml_sim_state": sim.path, "force": True})
    assert result["failed"] and "NVML_ERROR_IN_USE" in result["msg"]
    assert "GPUs not attempted: 1" in result["msg"]
    assert "processes in the way (force): GPU 0: instance 3g.40gb at slice 0" in result["msg"]
    assert "GPU 1: instance 2g.20gb at slice 0 (GPU instance 3" in result["msg"] and "PIDs 202" in result["msg"]
    # One entry per busy GPU, "; " between them.
    assert re.search(r"PIDs 101\)[^;]*; GPU 1: instance 2g\.20gb", result["msg"]), result["msg"]


def test_gpu_info_reports_what_device_filters_match(sim):
    nvml = SimulatedNvml(sim.path)
    nvml.state["gpus"][1].update(name="NVIDIA L4", pci_device_id="0x27B810DE", pci_subsystem_id=None, mig_capable=False)
    nvml._save()
    gpus = run_module(nvidia_gpu_info, {"nvml_sim_state": sim.path})["gpus"]
    assert (gpus[0]["pci_device_id"], gpus[0]["pci_subsystem_id"], gpus[0]["mig_capable"]) == (
        "0x233010DE",
        "0x16C110DE",
        True,
    )
    assert (gpus[1]["pci_subsystem_id"], gpus[1]["mig_capable"], gpus[1]["mig_profiles"]) == (None, False, [])
    # What it reports is what a device-filter with a subsystem ID selects.
    entry = {"devices": "all", "mig_enabled": True, "mig_devices": {"7g.80gb": 1}}
    result = mig(sim, [dict(entry, device_filter=[f"{gpus[0]['pci_device_id']}:{gpus[0]['pci_subsystem_id']}"])])
    assert [g["index"] for g in result["gpus"]] == [0]
    assert mig(sim, [dict(entry, device_filter=["0x233010DE:0x17A610DE"])])["gpus"] == []


def test_a_gpu_level_error_names_the_config_entry_that_asks_for_it(sim):
    # GPU 1's layout comes from the second entry: the message points at config[1], as entry-level errors do.
    config = [
        {"devices": [0], "mig_enabled": True, "mig_devices": {"7g.80gb": 1}},
        {"devices": [1], "mig_enabled": True, "mig_devices": {"2g.20gb": 4}},
    ]
    result = mig(sim, config)
    assert result["failed"]
    assert "config[1]: GPU 1 (NVIDIA H100 80GB HBM3): 4 x 2g.20gb requested, at most 3 fit on one GPU" in result["msg"]


@pytest.fixture
def driver_loaded(tmp_path, monkeypatch):
    """This host as one with the NVIDIA driver loaded: the driver's version file exists."""
    marker = tmp_path / "proc-driver-nvidia-version"
    marker.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.124.06\n")
    monkeypatch.setattr(nvml_backend, "DRIVER_MARKERS", (str(marker),))
    return marker


@pytest.mark.parametrize("module", [nvidia_mig, nvidia_gpu_info], ids=["nvidia_mig", "nvidia_gpu_info"])
def test_simulator_is_refused_on_a_host_with_an_nvidia_driver(sim, driver_loaded, module):
    before = Path(sim.path).read_text()
    args = {"config": IMAGEGEN} if module is nvidia_mig else {}
    result = run_module(module, dict(args, nvml_sim_state=sim.path))
    assert result["failed"] and "refusing the NVML simulator" in result["msg"]
    assert str(driver_loaded) in result["msg"] and "nvml_sim_on_gpu_host" in result["msg"]
    assert Path(sim.path).read_text() == before


def test_simulator_on_a_gpu_host_when_the_task_says_so(sim, driver_loaded):
    result = run_module(nvidia_mig, {"config": IMAGEGEN, "nvml_sim_state": sim.path, "nvml_sim_on_gpu_host": True})
    assert not result.get("failed"), result.get("msg")
    assert result["changed"] and SimulatedNvml(sim.path).gpu_instances(0, [9]) != []
