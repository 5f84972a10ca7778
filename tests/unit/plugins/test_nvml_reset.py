"""The wrapper's GPU reset against a stand-in `nvidia-smi` on PATH that answers like the real tool.

NVML has no public reset, so PynvmlBackend.reset_gpu runs `nvidia-smi --gpu-reset -i N` and reads its exit code and
text. The stand-in records its arguments and prints what nvidia-smi prints in each case, with nvidia-smi's
documented return codes (0 success, 3 operation not available on the device, 4 insufficient permissions,
15 GPU lost, 255 other error, which covers a GPU still held by processes or NVML clients). The runner treats IN_USE
and NOT_SUPPORTED as "reset not possible here, reboot instead" and anything else as a failure (test_runner.py), so
the mapping matters. The wrapper's own NVML session is such a client, so it is released across the reset.
"""

from __future__ import annotations

import os
import stat
import types

import pytest
from ansible_collections.gpufleet.mig.plugins.module_utils.exceptions import NvmlError
from ansible_collections.gpufleet.mig.plugins.module_utils.nvml import PynvmlBackend

BUS = "00000000:18:00.0"
ANSWERS = {
    "success": (0, f"GPU {BUS} was successfully reset.\nAll done.\n"),
    "in-use": (
        255,
        f"The following GPUs could not be reset:\n  GPU {BUS}: In use by another client\n\n1 device is currently "
        "being used by one or more other processes (e.g., Fabric Manager, CUDA application, graphics application "
        "such as an X server, or a monitoring application such as another instance of nvidia-smi). Please first kill "
        "all processes using this device and all compute applications running in the system.\n",
    ),
    "not-supported": (3, f"GPU {BUS}: Resetting GPU is not supported on this device.\n"),
    # What `nvidia-smi -r` prints for GPUs with NVLink active: the same list as for a busy GPU, another reason.
    "not-supported-listed": (255, f"The following GPUs could not be reset:\n  GPU {BUS}: Not Supported\n"),
    "no-permission": (4, "Unable to reset GPU: Insufficient Permissions\n"),
    "gpu-lost": (15, f"Unable to determine the device handle for GPU {BUS}: GPU is lost.\n"),
    "other": (255, f"GPU {BUS}: Unknown Error\n"),
}


class FakeLib(types.SimpleNamespace):
    """Just enough pynvml for a reset: the NVML session, whose start and end go into the stand-in's log."""

    NVMLError = RuntimeError

    def __init__(self, log):
        super().__init__(log=log)

    def nvmlInit(self):
        with open(self.log, "a") as handle:
            handle.write("nvmlInit\n")

    def nvmlShutdown(self):
        with open(self.log, "a") as handle:
            handle.write("nvmlShutdown\n")


@pytest.fixture
def nvidia_smi(tmp_path, monkeypatch):
    """Put a stand-in nvidia-smi first on PATH; returns a function choosing its answer, and the log of its calls."""
    log = tmp_path / "calls.log"
    script = tmp_path / "bin" / "nvidia-smi"
    script.parent.mkdir()

    def answer(case: str) -> None:
        code, text = ANSWERS[case]
        script.write_text(f'#!/bin/sh\necho "$@" >> "{log}"\ncat <<\'EOF\'\n{text}EOF\nexit {code}\n')
        script.chmod(script.stat().st_mode | stat.S_IXUSR)

    monkeypatch.setenv("PATH", f"{script.parent}{os.pathsep}{os.environ['PATH']}")
    return answer, log


def test_reset_runs_nvidia_smi_for_that_gpu_only(nvidia_smi):
    answer, log = nvidia_smi
    answer("success")
    PynvmlBackend(FakeLib(log)).reset_gpu(3)
    # NVML is released while nvidia-smi resets the GPU (its session would hold the GPU), then opened again.
    assert log.read_text().splitlines() == ["nvmlInit", "nvmlShutdown", "--gpu-reset -i 3", "nvmlInit"]


@pytest.mark.parametrize(
    ("case", "code_name"),
    [
        ("in-use", "IN_USE"),
        ("not-supported", "NOT_SUPPORTED"),
        ("not-supported-listed", "NOT_SUPPORTED"),
        ("no-permission", "NO_PERMISSION"),
        ("gpu-lost", "GPU_IS_LOST"),
        ("other", "UNKNOWN"),
    ],
)
def test_reset_failures_carry_nvidia_smis_words_and_a_code_the_runner_acts_on(nvidia_smi, case, code_name):
    answer, log = nvidia_smi
    answer(case)
    with pytest.raises(NvmlError) as raised:
        PynvmlBackend(FakeLib(log)).reset_gpu(0)
    assert raised.value.code_name == code_name
    # The whole answer, on one line, goes into the error the user reads.
    assert ANSWERS[case][1].strip().replace("\n", " ") in str(raised.value)
    # A failed reset leaves NVML open again for the rest of the run.
    assert log.read_text().splitlines() == ["nvmlInit", "nvmlShutdown", "--gpu-reset -i 0", "nvmlInit"]
