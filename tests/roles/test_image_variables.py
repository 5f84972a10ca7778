"""Every role that runs an image takes the same three variables: `<role>_image`, `<role>_image_digest` and
`<role>_image_pull_secrets` (kube_scheduler: one list for its Deployment, whichever image it runs). Rendered on the
lab: the pull Secrets land on every pod the role deploys, and nowhere when the list is empty."""

from __future__ import annotations

import pytest
import yaml
from conftest import REPO, load_manifests
from gpufleet_testsupport.collection import render_roles, try_render

# role -> the image variables it declares (kube_scheduler runs the stock image or gpufleet-scheduler).
IMAGE_ROLES = {
    "dcgm_exporter": ["dcgm_exporter_image"],
    "descheduler": ["descheduler_image"],
    "gpu_device_plugin": ["gpu_device_plugin_image"],
    "gpu_extender": ["gpu_extender_image"],
    "kube_scheduler": ["kube_scheduler_image", "kube_scheduler_plugin_image"],
}
POD_OWNERS = {"Deployment", "DaemonSet", "StatefulSet", "Job"}


def _pod_specs(manifests, role: str) -> list[tuple[str, dict]]:
    found = []
    for name, documents in load_manifests(manifests / role).items():
        for document in documents:
            if document.get("kind") in POD_OWNERS:
                found.append((f"{name}: {document['kind']}/{document['metadata']['name']}",
                              document["spec"]["template"]["spec"]))  # fmt: skip
    return found


@pytest.mark.parametrize("role", sorted(IMAGE_ROLES))
def test_every_image_role_declares_image_digest_and_pull_secrets(role):
    defaults = yaml.safe_load((REPO / f"roles/{role}/defaults/main.yml").read_text())
    options = yaml.safe_load((REPO / f"roles/{role}/meta/argument_specs.yml").read_text())["argument_specs"]["main"][
        "options"
    ]
    for image in IMAGE_ROLES[role]:
        for variable in (image, f"{image}_digest"):
            assert variable in defaults and variable in options, variable
    assert defaults[f"{role}_image_pull_secrets"] == []
    spec = options[f"{role}_image_pull_secrets"]
    assert (spec["type"], spec["elements"], spec["default"]) == ("list", "str", [])


def test_pull_secrets_land_on_every_pod_of_every_image_role_and_only_when_set(tmp_path):
    roles = [f"gpufleet.mig.{role}" for role in sorted(IMAGE_ROLES)]
    secrets = {f"{role}_image_pull_secrets": [f"{role.replace('_', '-')}-pull", "shared-pull"] for role in IMAGE_ROLES}
    # plugin mode: the scheduler Deployment with gpufleet-scheduler (a static pod takes no pull Secret, below).
    plugin = {"kube_scheduler_mode": "plugin"}
    with_secrets = render_roles(roles, tmp_path / "with", extra_vars={**secrets, **plugin})
    without = render_roles(roles, tmp_path / "without", extra_vars=plugin)
    for role in IMAGE_ROLES:
        pods = _pod_specs(with_secrets, role)
        assert pods, f"{role} rendered no pod"
        for where, pod in pods:
            expected = [{"name": f"{role.replace('_', '-')}-pull"}, {"name": "shared-pull"}]
            assert pod.get("imagePullSecrets") == expected, where
        for where, pod in _pod_specs(without, role):
            assert "imagePullSecrets" not in pod, where


def test_a_static_pod_scheduler_refuses_pull_secrets_saying_why(tmp_path):
    result, manifests = try_render(
        ["gpufleet.mig.kube_scheduler"],
        tmp_path,
        extra_vars={"kube_scheduler_mode": "static_pod", "kube_scheduler_image_pull_secrets": ["regcred"]},
    )
    assert result.returncode != 0
    output = " ".join(result.stdout.split())
    assert (
        "kube_scheduler: kube_scheduler_image_pull_secrets (regcred) cannot apply in static_pod mode - a static pod"
        " cannot reference a Secret" in output
    ), output[-3000:]
    assert not manifests.exists() or not any(manifests.rglob("*.yaml"))
