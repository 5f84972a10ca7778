"""A controller prepared with only what docs/controller.md says: a fresh virtual environment with requirements.txt, the
collection installed from its artifact (its Galaxy dependencies beside it) and the extender package installed from the
installed collection. It runs playbooks/site.yml of the installed collection on the Hong Kong inventory with the
lab's overrides, in render mode.

Minutes (a venv from pip's cache, then the whole site.yml): a step of its own, `make pytest-controller`."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from conftest import REPO

pytestmark = pytest.mark.controller

BIN = Path(sys.executable).parent


def _run(args: list, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=1200, check=False, **kwargs)
    assert done.returncode == 0, f"{args}:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return done


def test_a_controller_with_only_the_documented_requirements_renders_the_lab(tmp_path):
    # The collection as `ansible-galaxy collection install` leaves it; kubernetes.core and community.crypto (its
    # galaxy.yml dependencies) from this environment's copies, as Galaxy would bring them.
    _run([BIN / "ansible-galaxy", "collection", "build", "--output-path", tmp_path / "dist", REPO])
    (artifact,) = (tmp_path / "dist").glob("gpufleet-mig-*.tar.gz")
    collections = tmp_path / "collections"
    _run([BIN / "ansible-galaxy", "collection", "install", "--force", "--no-deps", "-p", collections, artifact])
    installed = collections / "ansible_collections" / "gpufleet" / "mig"
    here = Path(sysconfig.get_paths()["purelib"]) / "ansible_collections"  # the `ansible` package's collections
    for namespace, name in (("kubernetes", "core"), ("community", "crypto")):
        (collections / "ansible_collections" / namespace).mkdir(parents=True, exist_ok=True)
        (collections / "ansible_collections" / namespace / name).symlink_to(here / namespace / name)

    # The controller: requirements.txt and the extender package, nothing else.
    venv = tmp_path / "controller"
    _run([sys.executable, "-m", "venv", venv])
    python = venv / "bin" / "python"
    _run([python, "-m", "pip", "install", "--quiet", "-r", installed / "requirements.txt"])
    _run([python, "-m", "pip", "install", "--quiet", installed / "extender"])
    packages = _run([python, "-m", "pip", "list", "--format=freeze"]).stdout.lower()
    for absent in ("molecule", "pytest", "ansible-lint", "nvidia-ml-py", "grpcio", "matplotlib", "ansible=="):
        assert absent not in packages, f"{absent} came into the controller's environment"

    env = {
        "HOME": os.environ.get("HOME", str(tmp_path)),
        "PATH": f"{venv / 'bin'}:/usr/bin:/bin",
        "ANSIBLE_COLLECTIONS_PATH": str(collections),
        "ANSIBLE_HOST_KEY_CHECKING": "true",
        "ANSIBLE_STDOUT_CALLBACK": "gpufleet.mig.phases",
    }
    result = subprocess.run(
        [venv / "bin" / "ansible-playbook", "-i", installed / "inventories" / "hongkong",
         "-e", f"@{installed / 'playbooks' / 'vars' / 'lab.yml'}", installed / "playbooks" / "site.yml",
         # no kubeadm manifests on the simulated control plane here (make lab's gpufleet-lab hosts makes them)
         "-e", "kube_scheduler_mode=plugin", "-e", f"gpufleet_lab_dir={tmp_path / 'lab'}"],
        capture_output=True, text=True, timeout=1800, check=False, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert "none failed" in result.stdout
    manifests = tmp_path / "lab" / "manifests"
    for role in ("gpu_extender", "kube_scheduler", "dcgm_exporter", "tenants"):
        assert list((manifests / role).glob("*.yaml")), f"no {role} manifests rendered"
