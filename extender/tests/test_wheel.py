"""The extender's wheel is the server alone: its own modules, and of the collection's library (plugins/module_utils)
only the two rules the server shares with it (the GPU resource names, a pod's GPU request), nothing of the lab
(gpufleet-lab: the simulator, the decision-vector generator) or of the rest of the library (the planner, NVML, its
simulator, the kubelet's gRPC stubs). The wheel is built here, from a copy of its sources, as `make extender-image`
builds it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

EXTENDER = Path(__file__).resolve().parents[1]
LIBRARY = EXTENDER.parent / "plugins" / "module_utils"
SHARED = {"__init__.py", "names.py", "pod_requests.py"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp_path = tmp_path_factory.mktemp("wheel")
    # A copy laid out as the repository is (extender/ beside plugins/module_utils): nothing is written into the
    # checkout, so that the suite's steps running side by side never share a build directory.
    source = tmp_path / "src" / "extender"
    shutil.copytree(EXTENDER / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(EXTENDER / name, source / name)
    shutil.copytree(
        LIBRARY, tmp_path / "src" / "plugins" / "module_utils", ignore=shutil.ignore_patterns("__pycache__")
    )
    ran = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--wheel-dir",
         str(tmp_path / "dist"), str(source)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    (built,) = (tmp_path / "dist").glob("gpufleet_extender-*.whl")
    return built


def test_the_wheel_is_the_server_alone(wheel):
    with zipfile.ZipFile(wheel) as archive:
        files = [name for name in archive.namelist() if ".dist-info/" not in name]
    server = {
        path.relative_to(EXTENDER / "src").as_posix()
        for path in (EXTENDER / "src" / "gpufleet_extender").rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }
    library = {name for name in files if name.startswith("gpufleet_extender/mig_utils/")}
    lab = [name for name in files if any(part in name for part in ("simulate", "conformance", "gpufleet_lab"))]
    assert lab == [], f"the lab is in the extender's wheel: {lab}"
    assert library == {f"gpufleet_extender/mig_utils/{name}" for name in SHARED}, (
        f"the extender's wheel ships more of the collection's library than its two shared rules: {sorted(library)}"
    )
    # Everything else is the server's own source, all of it, and nothing else (no other top-level package); the
    # settings contract among it, since the extender reads it at import (an install without it would not start).
    assert sorted(set(files) - library) == sorted(server)
    assert "gpufleet_extender/settings_contract.json" in files


def test_the_shared_rules_are_the_collections_own_files(wheel):
    # One copy of the code: the wheel's names.py and pod_requests.py are plugins/module_utils', byte for byte, not a
    # second module kept beside them.
    with zipfile.ZipFile(wheel) as archive:
        for name in sorted(SHARED):
            assert archive.read(f"gpufleet_extender/mig_utils/{name}") == (LIBRARY / name).read_bytes()
    assert not (EXTENDER / "src" / "gpufleet_extender" / "mig_utils").exists()
