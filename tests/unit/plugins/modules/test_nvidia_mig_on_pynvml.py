"""The nvidia_mig and nvidia_gpu_info modules on the real NVML wrapper (PynvmlBackend), with NVML behaving as it does
below the wrapper's interface: device handles go stale when a GPU is reset (also by the driver itself when it
switches the MIG mode), the module's own NVML session keeps `nvidia-smi --gpu-reset` from resetting a GPU, graphics
processes are listed by their own call, and without privileges the GPU-wide process query on a MIG GPU is refused.

`pynvml` is the simulator-backed fake of _fake_pynvml (every call checked against the installed nvidia-ml-py), and an
`nvidia-smi` stand-in that resets GPUs in the same state file is first on PATH. Modules run in-process.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from _fake_pynvml import FakePynvml, clients_file, install_nvidia_smi
from _helpers import layout, new_sim
from ansible.module_utils.testing import patch_module_args
from ansible_collections.gpufleet.mig.plugins.module_utils.nvml_sim import SimulatedNvml
from ansible_collections.gpufleet.mig.plugins.modules import nvidia_gpu_info, nvidia_mig
from conftest import COLLECTIONS_PATH


@pytest.fixture
def host(tmp_path, monkeypatch, capsys):
    """Two H100s, MIG off, reached through the real wrapper; `run(module, args)` runs a module, returns its result."""
    sim = new_sim(tmp_path, gpus=2)
    fake = FakePynvml(sim)
    monkeypatch.setitem(sys.modules, "pynvml", fake)  # what PynvmlBackend imports
    monkeypatch.delenv("GPUFLEET_NVML_SIM", raising=False)
    log = install_nvidia_smi(tmp_path / "bin", sim.path, COLLECTIONS_PATH)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")

    def run(module, args, check_mode=False):
        with patch_module_args(dict(args, _ansible_check_mode=check_mode)), pytest.raises(SystemExit):
            module.main()
        return json.loads(capsys.readouterr().out)

    return SimpleNamespace(sim=sim, fake=fake, log=log, run=run)


def state(host) -> SimulatedNvml:
    return SimulatedNvml(host.sim.path)  # as the file holds it now


def layout_of(host, gpu: int) -> list[tuple[str, int, int]]:
    gpus = host.run(nvidia_gpu_info, {})["gpus"]
    return [(i["profile"], i["start"], i["gpu_instance_id"]) for i in gpus[gpu]["gpu_instances"]]


def test_enabling_mig_takes_a_new_device_handle_after_the_driver_reset_the_gpu(host):
    result = host.run(nvidia_mig, {"config": layout({"3g.40gb": 2}, devices=[0])})
    assert not result.get("failed"), result.get("msg")
    assert result["changed"] and not result["reboot_required"]
    # Switching the mode reset the GPU: the handle from before is stale, and the wrapper asked for a new one.
    assert state(host).state["gpus"][0]["reset_count"] == 1
    calls = host.fake.calls
    after_switch = calls[calls.index("nvmlDeviceSetMigMode") :]
    assert "nvmlDeviceGetHandleByIndex" in after_switch
    assert layout_of(host, 0) == [("3g.40gb", 0, 1), ("3g.40gb", 4, 2)]
    assert not clients_file(host.sim.path).exists()  # the module closed its NVML session


def test_a_pending_mode_change_is_completed_by_a_reset_with_nvml_released(host):
    # The driver could not reset the GPU itself (e.g. a monitoring client held it): the module resets it.
    host.sim.add_fault("nvmlDeviceSetMigMode", "IN_USE", gpu=0, as_status=True)
    result = host.run(nvidia_mig, {"config": layout({"7g.80gb": 1})})
    assert not result.get("failed"), result.get("msg")
    gpu0, gpu1 = result["gpus"]
    assert gpu0["reset"] and gpu0["reset_error"] is None and not result["reboot_required"]
    assert [step["op"] for step in gpu0["done"]] == ["enable_mig", "reset", "create"]
    assert host.log.read_text().splitlines() == ["--gpu-reset -i 0"]
    # The whole-GPU instance is GPU instance 0, created after the reset with fresh handles; GPU 1, read before the
    # NVML session was restarted for the reset, is reached through a new handle too.
    assert layout_of(host, 0) == [("7g.80gb", 0, 0)]
    assert [step["op"] for step in gpu1["done"]] == ["enable_mig", "create"]
    assert layout_of(host, 1) == [("7g.80gb", 0, 0)]


def test_a_reset_refused_by_nvidia_smi_leaves_the_mode_pending_for_a_reboot(host):
    host.sim.add_process(0, pid=777)  # a whole-GPU job: with force, the mode change stays pending
    result = host.run(nvidia_mig, {"config": layout({"7g.80gb": 1}, devices=[0]), "force": True})
    assert not result.get("failed"), result.get("msg")
    gpu = result["gpus"][0]
    assert result["reboot_required"] and gpu["mig_mode_pending"] and not gpu["reset"]
    assert "In use by another client" in gpu["reset_error"]
    assert state(host).mig_mode(0) == (False, True)


def test_a_gpu_that_cannot_be_reset_here_is_left_for_a_reboot_and_the_others_are_done(host):
    # nvidia-smi lists the GPU as "Not Supported" (a GPU of an NVLink domain), exit 255 as for a busy one.
    host.sim.state["gpus"][0]["reset_supported"] = False
    host.sim._save()
    host.sim.add_fault("nvmlDeviceSetMigMode", "IN_USE", gpu=0, as_status=True)
    result = host.run(nvidia_mig, {"config": layout({"3g.40gb": 2})})
    assert not result.get("failed"), result.get("msg")
    gpu0, gpu1 = result["gpus"]
    assert result["reboot_required"] and gpu0["mig_mode_pending"] and "Not Supported" in gpu0["reset_error"]
    assert [step["op"] for step in gpu1["done"]] == ["enable_mig", "create", "create"]


def test_a_graphics_process_makes_its_instance_busy(host):
    host.run(nvidia_mig, {"config": layout({"3g.40gb": 2}, devices=[0])})
    host.sim.add_process(0, pid=4040, gi_id=2, kind="graphics")
    before = Path(host.sim.path).read_text()
    result = host.run(nvidia_mig, {"config": layout({"7g.80gb": 1}, devices=[0])})
    assert result["failed"]
    assert "instance 3g.40gb at slice 4 (GPU instance 2" in result["msg"] and "PIDs 4040" in result["msg"]
    assert Path(host.sim.path).read_text() == before  # refused before any write
    processes = host.run(nvidia_gpu_info, {})["gpus"][0]["processes"]
    assert [(p["pid"], p["type"], p["gpu_instance_id"]) for p in processes] == [(4040, "graphics", 2)]


def test_a_process_with_both_contexts_is_listed_once(host):
    host.run(nvidia_mig, {"config": layout({"3g.40gb": 2}, devices=[0])})
    host.sim.add_process(0, pid=5050, gi_id=1, kind="compute")
    host.sim.add_process(0, pid=5050, gi_id=1, kind="graphics")
    processes = host.run(nvidia_gpu_info, {})["gpus"][0]["processes"]
    assert [(p["pid"], p["type"]) for p in processes] == [(5050, "compute+graphics")]
    # The simulator's own answer (the modules' simulator path) is the same.
    assert [(p.pid, p.kind) for p in state(host).running_processes(0)] == [(5050, "compute+graphics")]


def test_without_privileges_processes_are_read_per_mig_device_and_still_count(host):
    host.run(nvidia_mig, {"config": layout({"3g.40gb": 2}, devices=[0])})
    host.sim.add_process(0, pid=6060, gi_id=1, used_mib=None)  # another user's job: memory not reported
    host.sim.state["privileged"] = False
    host.sim._save()
    gpu = host.run(nvidia_gpu_info, {})["gpus"][0]
    assert gpu["processes"] == [
        {"pid": 6060, "used_memory_mib": None, "gpu_instance_id": 1, "compute_instance_id": 0, "type": "compute"}
    ]
    assert [i["processes"] for i in gpu["gpu_instances"]] == [[6060], []]
    # The GPU-wide query was refused (NO_PERMISSION) and each MIG device was asked instead.
    assert "nvmlDeviceGetMigDeviceHandleByIndex" in host.fake.calls
    result = host.run(nvidia_mig, {"config": layout({"7g.80gb": 1}, devices=[0])}, check_mode=True)
    assert result["failed"] and "GPU instance 1" in result["msg"] and "PIDs 6060" in result["msg"]


def test_an_unprivileged_apply_fails_with_a_hint_and_changes_nothing(host):
    host.run(nvidia_mig, {"config": layout({"3g.40gb": 2}, devices=[0])})
    host.sim.state["privileged"] = False
    host.sim._save()
    planned = host.run(nvidia_mig, {"config": layout({"7g.80gb": 1}, devices=[0])}, check_mode=True)
    assert planned["changed"] and not planned.get("failed")  # reading and planning need no privileges
    result = host.run(nvidia_mig, {"config": layout({"7g.80gb": 1}, devices=[0])})
    assert result["failed"] and not result["changed"]
    assert "NVML_ERROR_NO_PERMISSION (4): this needs root (become: true)" in result["msg"]
    assert layout_of(host, 0) == [("3g.40gb", 0, 1), ("3g.40gb", 4, 2)]


def test_when_no_query_may_list_the_processes_the_module_fails_instead_of_guessing(host):
    host.run(nvidia_mig, {"config": layout({"3g.40gb": 2}, devices=[0])})
    host.sim.state["privileged"] = False
    host.sim._save()
    # The per-MIG-device queries are refused too (as in a vGPU host): nobody can say whether the GPU is idle.
    host.sim.add_fault("nvmlDeviceGetComputeRunningProcesses", "NO_PERMISSION", gpu=0, times=2)
    result = host.run(nvidia_mig, {"config": layout({"7g.80gb": 1}, devices=[0])})
    assert result["failed"]
    assert "NVML_ERROR_NO_PERMISSION" in result["msg"] and "run as root (become: true)" in result["msg"]
    assert [(r.profile_id, r.start) for r in state(host).gpu_instances(0, [9])] == [(9, 0), (9, 4)]


def test_a_busy_whole_gpu_instance_is_gpu_instance_0_and_is_not_destroyed(host):
    host.run(nvidia_mig, {"config": layout({"7g.80gb": 1}, devices=[0])})
    host.sim.add_process(0, pid=8080, gi_id=0)
    result = host.run(nvidia_mig, {"config": layout({"3g.40gb": 2}, devices=[0])})
    assert result["failed"]
    assert "instance 7g.80gb at slice 0 (GPU instance 0" in result["msg"] and "PIDs 8080" in result["msg"]
    assert layout_of(host, 0) == [("7g.80gb", 0, 0)]


def test_a_busy_whole_gpu_instance_is_not_destroyed_on_the_simulator_path_either(tmp_path, capsys):
    sim = new_sim(tmp_path, gpus=1)

    def run(config):
        with patch_module_args({"config": config, "nvml_sim_state": sim.path}), pytest.raises(SystemExit):
            nvidia_mig.main()
        return json.loads(capsys.readouterr().out)

    run(layout({"7g.80gb": 1}))
    SimulatedNvml(sim.path).add_process(0, pid=8080, gi_id=0)
    result = run(layout({"3g.40gb": 2}))
    assert result["failed"] and "(GPU instance 0" in result["msg"] and "PIDs 8080" in result["msg"]


def test_a_simulator_named_by_the_environment_is_ignored_with_a_warning(host, tmp_path, monkeypatch):
    stray = tmp_path / "stray" / "sim.json"
    # Modules record warnings for their result only off the controller; other tests import controller code first.
    monkeypatch.setattr("ansible.module_utils._internal.is_controller", False)
    monkeypatch.setenv("GPUFLEET_NVML_SIM", str(stray))
    result = host.run(nvidia_mig, {"config": layout({"3g.40gb": 2}, devices=[0])})
    assert not result.get("failed"), result.get("msg")
    # The real wrapper did the work (the fake pynvml saw the calls), the stray file was never made, the user is told.
    assert "nvmlDeviceCreateGpuInstanceWithPlacement" in host.fake.calls
    assert not stray.exists()
    warnings = json.dumps(result.get("warnings", []))  # ansible-core 2.19 wraps each in a WarningSummary
    assert "GPUFLEET_NVML_SIM" in warnings and "is set in this host's environment and ignored" in warnings
