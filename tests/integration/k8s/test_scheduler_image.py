"""gpufleet-scheduler's container image, built with podman from the binary `make k8s-assets` built.

`make scheduler-image` (k8s/Containerfile.prebuilt) needs no registry; the image must run the binary as the
unprivileged user the role's Deployment expects, with nothing else in it but the CA bundle.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid

import pytest
from conftest import REPO

pytestmark = pytest.mark.integration


def podman(*args: str) -> subprocess.CompletedProcess:
    # The same containers.conf molecule uses (runc, cgroupfs): the only one that works on the CI machines.
    command = 'source tests/molecule/podman-env.sh && podman "$@"'
    return subprocess.run(
        ["bash", "-c", command, "podman", *args], cwd=REPO, capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def image():
    if shutil.which("podman") is None:
        pytest.fail("podman is not installed: `make system-deps` installs it")
    tag = f"localhost/gpufleet-scheduler:test-{uuid.uuid4().hex[:8]}"
    built = subprocess.run(
        ["make", "--no-print-directory", "scheduler-image", f"SCHEDULER_IMAGE={tag}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    try:
        yield tag
    finally:
        podman("rmi", "--force", tag)


def test_the_image_runs_the_plugin_scheduler_at_the_modules_kubernetes_version(image):
    go_mod = (REPO / "k8s" / "go.mod").read_text().split()
    version = go_mod[go_mod.index("k8s.io/kubernetes") + 1]
    ran = podman("run", "--rm", "--network", "none", image, "--version")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == f"Kubernetes {version}"


def test_the_image_is_the_binary_alone_as_an_unprivileged_user(image):
    inspected = json.loads(podman("image", "inspect", image).stdout)[0]
    assert inspected["Config"]["User"] == "65532:65532"
    assert inspected["Config"]["Entrypoint"] == ["gpufleet-scheduler"]
    assert len(inspected["RootFS"]["Layers"]) == 2  # the CA bundle and the binary: no base image below them


def test_the_plugin_refuses_bad_args_inside_the_image(image):
    # The scheduler must stop with a clear message, not crash-loop silently, when its config is unreadable.
    ran = podman("run", "--rm", "--network", "none", image, "--config", "/absent.yaml")
    assert ran.returncode != 0
    assert "absent.yaml" in ran.stderr
