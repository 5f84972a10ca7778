"""The boot-time entry point the mig_partition role's systemd unit runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _helpers import layout, new_sim
from ansible_collections.gpufleet.mig.plugins.module_utils import boot_apply
from ansible_collections.gpufleet.mig.plugins.module_utils.nvml_sim import SimulatedNvml
from conftest import COLLECTIONS_PATH


def _request(tmp_path, body) -> str:
    path = tmp_path / "layout.json"
    path.write_text(body if isinstance(body, str) else json.dumps(body))
    return str(path)


def test_reapplies_the_layout_after_a_reboot_wiped_it(tmp_path, capsys):
    sim = new_sim(tmp_path, gpus=2)
    request = _request(tmp_path, {"config": layout({"3g.40gb": 2})})
    assert boot_apply.main(["--config", request, "--nvml-sim-state", sim.path]) == 0
    SimulatedNvml(sim.path).reboot()
    assert SimulatedNvml(sim.path).mig_devices(0) == []
    capsys.readouterr()
    assert boot_apply.main(["--config", request, "--nvml-sim-state", sim.path]) == 0
    out = capsys.readouterr().out
    assert "GPU 1: create 3g.40gb@4" in out and "changed: 0, 1" in out
    assert len(SimulatedNvml(sim.path).mig_devices(1)) == 2
    assert boot_apply.main(["--config", request, "--nvml-sim-state", sim.path]) == 0
    assert "changed: none" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("body", "code", "message"),
    [
        ("{not json", boot_apply.EXIT_BAD_INPUT, "is not valid JSON"),
        ({"layout": []}, boot_apply.EXIT_BAD_INPUT, 'with a "config" list'),
        ({"config": layout({"5g.50gb": 1})}, boot_apply.EXIT_BAD_INPUT, "unknown MIG profile(s) 5g.50gb"),
        (
            {"config": layout({"1g.10gb": 1}), "force": "yes"},
            boot_apply.EXIT_BAD_INPUT,
            "'force' must be true or false",
        ),
    ],
)
def test_bad_input_is_one_line_on_stderr(tmp_path, capsys, body, code, message):
    sim = new_sim(tmp_path, gpus=1)
    assert boot_apply.main(["--config", _request(tmp_path, body), "--nvml-sim-state", sim.path]) == code
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_nvml_failure_and_pending_mode_exit_codes(tmp_path, capsys):
    sim = new_sim(tmp_path, gpus=1)
    request = _request(tmp_path, {"config": layout({"7g.80gb": 1}), "reset": False})
    sim.add_fault("nvmlDeviceCreateGpuInstanceWithPlacement", "INSUFFICIENT_RESOURCES")
    assert boot_apply.main(["--config", request, "--nvml-sim-state", sim.path]) == boot_apply.EXIT_FAILED
    assert "INSUFFICIENT_RESOURCES" in capsys.readouterr().err
    (tmp_path / "b").mkdir()
    other = new_sim(tmp_path / "b", gpus=1)
    other.add_fault("nvmlDeviceSetMigMode", "IN_USE", as_status=True)
    assert boot_apply.main(["--config", request, "--nvml-sim-state", other.path]) == boot_apply.EXIT_PENDING
    assert "pending on GPU(s) 0" in capsys.readouterr().err


def test_runs_as_python_module_with_the_documented_command(tmp_path):
    state = tmp_path / "sim.json"
    request = _request(tmp_path, {"config": layout({"1g.20gb": 4})})
    env = dict(os.environ, PYTHONPATH=COLLECTIONS_PATH, GPUFLEET_NVML_SIM_GPUS="1")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ansible_collections.gpufleet.mig.plugins.module_utils.boot_apply",
            "--config",
            request,
            "--nvml-sim-state",
            str(state),
        ],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "MIG layout in place on 1 GPU(s); changed: 0"


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ('{"version": 1, "gpus": [', "is not valid JSON: Expecting value: line 1 column 25"),
        ('{"version": 99, "gpus": []}', "unsupported version 99 (supported: 1)"),
        ("[1, 2]", "must be a JSON object, not list"),
        ('{"version": 1}', "'gpus' must be a list"),
    ],
    ids=["corrupt", "version", "not-an-object", "no-gpus"],
)
def test_a_bad_simulator_state_file_is_one_line_not_a_traceback(tmp_path, capsys, state, message):
    path = tmp_path / "state.json"
    path.write_text(state)
    request = _request(tmp_path, {"config": layout({"3g.40gb": 2})})
    assert boot_apply.main(["--config", request, "--nvml-sim-state", str(path)]) == boot_apply.EXIT_FAILED
    err = capsys.readouterr().err
    assert err.startswith(f"gpufleet-mig-boot-apply: simulator state {path}")
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_boot_unit_refuses_the_simulator_where_an_nvidia_driver_is_loaded(tmp_path, monkeypatch, capsys):
    from ansible_collections.gpufleet.mig.plugins.module_utils import nvml_backend

    marker = tmp_path / "version"
    marker.write_text("NVRM version: 570.124.06\n")
    monkeypatch.setattr(nvml_backend, "DRIVER_MARKERS", (str(marker),))
    sim = new_sim(tmp_path, gpus=1)
    before = Path(sim.path).read_text()
    request = _request(tmp_path, {"config": layout({"1g.20gb": 4})})
    assert boot_apply.main(["--config", request, "--nvml-sim-state", sim.path]) == boot_apply.EXIT_FAILED
    assert "refusing the NVML simulator" in capsys.readouterr().err
    assert Path(sim.path).read_text() == before
    argv = ["--config", request, "--nvml-sim-state", sim.path, "--nvml-sim-on-gpu-host"]
    assert boot_apply.main(argv) == 0
    assert len(SimulatedNvml(sim.path).state["gpus"][0]["gpu_instances"]) == 4
