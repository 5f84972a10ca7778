"""The real NVML wrapper (PynvmlBackend) against nvidia-ml-py's actual API.

A fake `pynvml` serves the simulator's state through the real function names, and checks every call the wrapper
makes against the installed pynvml: the function must exist and the arguments must bind to its signature. The real
ctypes structures and arrays are used. So the wrapper and the library cannot drift apart unnoticed, and the wrapper
produces the same plans and results as the simulator path.
"""

from __future__ import annotations

import inspect
import os

import pynvml
import pytest
from _fake_pynvml import FakePynvml, install_nvidia_smi
from _helpers import layout, new_sim
from ansible_collections.gpufleet.mig.plugins.module_utils import runner
from ansible_collections.gpufleet.mig.plugins.module_utils.exceptions import NvmlError
from ansible_collections.gpufleet.mig.plugins.module_utils.nvml import PynvmlBackend
from conftest import COLLECTIONS_PATH


@pytest.fixture
def pair(tmp_path, monkeypatch):
    """(wrapper over the fake pynvml, its simulator, the fake); the nvidia-smi stand-in is first on PATH."""
    sim = new_sim(tmp_path, gpus=2)
    install_nvidia_smi(tmp_path / "bin", sim.path, COLLECTIONS_PATH)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    fake = FakePynvml(sim)
    backend = PynvmlBackend(fake)
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
    sim._save()
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

    # NVML lists instances profile by profile; the order carries no meaning.
    def by_id(records):
        return sorted(records, key=lambda r: r.gi_id)

    assert by_id(backend.gpu_instances(0, profile_ids)) == by_id(sim.gpu_instances(0, profile_ids))
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
    sim.add_process(0, pid=5, gi_id=0)  # the whole-GPU instance is GPU instance 0
    with pytest.raises(NvmlError, match="nvmlComputeInstanceDestroy failed: NVML_ERROR_IN_USE"):
        backend.destroy_compute_instance(0, 0, 0)


def test_every_function_the_wrapper_uses_exists_in_pynvml():
    source = inspect.getsource(PynvmlBackend)
    import re

    used = set(re.findall(r'"(nvml[A-Za-z_0-9]+)"', source))
    assert used, "no NVML calls found"
    missing = sorted(name for name in used if not callable(getattr(pynvml, name, None)))
    assert missing == []
