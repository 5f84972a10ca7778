"""What playbooks/uninstall.yml can find: every object any role renders, in the device-plugin and the DRA mode, is
marked as the collection's (label and delivering set) and of a kind the uninstall looks for. A role that started
delivering a new kind without adding it to k8s_manifests_owned_kinds would leave it behind: that fails here."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from gpufleet_testsupport.collection import REPO, try_render

OWNED_KINDS = {
    (entry["api_version"], entry["kind"])
    for entry in yaml.safe_load((REPO / "roles/k8s_manifests/vars/main.yml").read_text())["k8s_manifests_owned_kinds"]
}
ROLES = [
    "gpufleet.mig.tenants",
    "gpufleet.mig.dcgm_exporter",
    "gpufleet.mig.gpu_extender",
    {"role": "gpufleet.mig.kube_scheduler", "kube_scheduler_mode": "plugin"},
    "gpufleet.mig.descheduler",
    "gpufleet.mig.monitoring",
]
MODES = {
    "device_plugin": (["gpufleet.mig.gpu_device_plugin", *ROLES], {}),
    "dra": (["gpufleet.mig.gpu_dra_driver", *ROLES], {"gpufleet_gpu_allocation": "dra"}),
}
NOT_OBJECTS = {"kubescheduler.config.k8s.io/v1"}  # the scheduler configuration written for review beside them


@pytest.fixture(scope="module", params=sorted(MODES))
def rendered(request, tmp_path_factory) -> list[tuple[Path, dict]]:
    roles, extra = MODES[request.param]
    result, manifests = try_render(roles, tmp_path_factory.mktemp(request.param), extra_vars=extra)
    assert result.returncode == 0, result.stdout[-6000:]
    return [
        (path.relative_to(manifests), doc)
        for path in sorted(manifests.rglob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc and doc.get("apiVersion") not in NOT_OBJECTS
    ]


def test_every_rendered_kind_is_one_uninstall_looks_for(rendered):
    missing = {(d["apiVersion"], d["kind"]) for _, d in rendered if d["kind"] != "Node"} - OWNED_KINDS
    assert missing == set(), f"add these to k8s_manifests_owned_kinds (roles/k8s_manifests/vars/main.yml): {missing}"


def test_every_rendered_object_but_nodes_is_marked_with_its_set(rendered):
    for path, doc in rendered:
        metadata = doc["metadata"]
        if doc["kind"] == "Node":
            assert "app.kubernetes.io/part-of" not in (metadata.get("labels") or {}), path
            continue
        assert metadata["labels"]["app.kubernetes.io/part-of"] == "gpufleet", (path, doc["kind"], metadata["name"])
        assert metadata["annotations"]["gpufleet.io/manifest"] == str(path.with_suffix("")), (path, metadata["name"])
