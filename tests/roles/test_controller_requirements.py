"""What the controller needs beyond requirements.txt: the collection's extender package, which roles run on the
controller (gpu_extender's settings check, kube_scheduler's GPUScore args check; preflight's Prometheus probe is
tested with the role). Without it each role fails before rendering anything, saying which
Python lacks it and the one command that installs it from the collection the role runs from."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from gpufleet_testsupport.collection import try_render


@pytest.mark.parametrize(
    ("role", "python_variable", "refusal"),
    [
        ("gpu_extender", "gpu_extender_check_python", "gpu_extender: invalid settings"),
        ("kube_scheduler", "kube_scheduler_check_python", "kube_scheduler: GPUScore would refuse its args at start"),
    ],
)
def test_a_controller_without_the_extender_package_is_told_what_to_install(tmp_path, role, python_variable, refusal):
    python = tmp_path / "python"
    # A Python that cannot import gpufleet_extender: no site-packages (-S), no PYTHONPATH (-I).
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" -I -S "$@"\n')
    python.chmod(0o755)
    # kube_scheduler checks GPUScore's args in plugin mode (Hong Kong's static_pod mode runs on its control plane).
    mode = {"kube_scheduler_mode": "plugin"} if role == "kube_scheduler" else {}
    result, manifests = try_render([role], tmp_path, extra_vars={python_variable: str(python), **mode})
    assert result.returncode != 0
    output = " ".join(result.stdout.split())
    assert refusal in output and "No module named gpufleet_extender" in output, output[-3000:]
    hint = re.search(
        rf"\(install the collection's extender package for that Python: {re.escape(str(python))}"
        r" -m pip install (\S+)\)",
        output,
    )
    assert hint, output[-3000:]
    # The path it names is the extender of the collection that ran: pip installs it as it is.
    extender = hint.group(1)
    assert extender.endswith("/extender")
    assert 'name = "gpufleet-extender"' in Path(extender, "pyproject.toml").read_text()
    assert "Traceback" not in result.stdout + result.stderr
    assert not manifests.exists() or not any(manifests.rglob("*.yaml"))
