"""versions.yml owns every version the collection supports and deploys: the roles' defaults and argument specs,
preflight's floors, the control plane the suite runs and the docs' matrix agree with it (tools/versions.py)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import versions as tool
import yaml
from gpufleet_testsupport.collection import collections_path

collections_path()  # makes ansible_collections.gpufleet.mig importable
from ansible_collections.gpufleet.mig.plugins.module_utils import preflight  # noqa: E402

REPO = Path(__file__).resolve().parents[2]

VERSIONS = yaml.safe_load((REPO / "versions.yml").read_text())


def _run(*args: str, root: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "tools/versions.py"), "--root", str(root), *args],
        capture_output=True,
        text=True,
        check=False,
    )


def test_every_file_versions_yml_owns_agrees_with_it():
    result = _run()
    assert result.returncode == 0 and result.stdout == "", result.stdout + result.stderr


def test_every_role_default_and_argument_spec_default_is_the_files():
    bound = tool.bindings(VERSIONS, tool.collection_version(REPO))
    assert {b.variable for b in bound} >= {
        "preflight_kubelet_min_version",
        "kube_scheduler_image",
        "gpu_device_plugin_image",
        "dcgm_exporter_image",
        "descheduler_image",
        "gpu_dra_driver_chart_version",
        "gpu_dra_driver_chart_ref",
        "gpu_extender_image",
        "kube_scheduler_plugin_image",
    }
    for binding in bound:
        defaults = yaml.safe_load((REPO / f"roles/{binding.role}/defaults/main.yml").read_text())
        specs = yaml.safe_load((REPO / f"roles/{binding.role}/meta/argument_specs.yml").read_text())
        assert defaults[binding.variable] == binding.value, binding
        # The option is described in the entry point that uses it (main, or preflight's cluster).
        described = [
            e["options"][binding.variable]
            for e in specs["argument_specs"].values()
            if binding.variable in e.get("options", {})
        ]
        assert described and all(o["default"] == binding.value for o in described), binding


def test_the_stock_scheduler_is_the_tested_release_and_the_floor_admits_the_admission_policies():
    kubernetes = VERSIONS["kubernetes"]
    stock = next(c for c in VERSIONS["components"] if c["variable"] == "kube_scheduler_image")
    assert stock["version"] == f"v{kubernetes['tested']}"
    # ValidatingAdmissionPolicy (admissionregistration.k8s.io/v1), which the tenants role renders, is GA in 1.30.
    floor = tuple(int(p) for p in kubernetes["minimum"].split("."))
    assert floor >= (1, 30)
    admission = (REPO / "roles/tenants/templates/admission.yaml.j2").read_text()
    assert "kind: ValidatingAdmissionPolicy" in admission and "apiVersion: admissionregistration.k8s.io/v1" in admission


def test_preflight_refuses_a_kubelet_below_the_floor_and_the_driver_table_is_the_files():
    defaults = yaml.safe_load((REPO / "roles/preflight/defaults/main.yml").read_text())
    minor = int(VERSIONS["kubernetes"]["minimum"].split(".")[1])
    floor = defaults["preflight_kubelet_min_version"]
    below = preflight.kubelet_problem({"rc": 0, "stdout": f"Kubernetes v1.{minor - 1}.9\n"}, floor)
    assert below == f"found kubelet v1.{minor - 1}.9; needed: kubelet v1.{minor} or newer"
    assert preflight.kubelet_problem({"rc": 0, "stdout": f"Kubernetes v1.{minor}.0\n"}, floor) is None
    table = tuple((e["product"], e["branch"]) for e in VERSIONS["nvidia_driver"]["mig_minimum_branch"])
    assert table == preflight.MIN_DRIVER_BRANCH
    assert preflight.min_driver_branch("NVIDIA H200") == 550 and preflight.min_driver_branch("NVIDIA H20") == 550


def test_the_docs_matrix_lists_every_component_as_the_file_says():
    text = (REPO / "docs/versions.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| ---")]
    for component in VERSIONS["components"]:
        (row,) = [r for r in rows if f"`{component['variable']}`" in r]
        assert f"`{component['version']}`" in row and (component.get("chart") or component["image"]) in row
    (kubernetes,) = [r for r in rows if r.startswith("| Kubernetes |")]
    assert VERSIONS["kubernetes"]["minimum"] in kubernetes and VERSIONS["kubernetes"]["tested"] in kubernetes


def test_a_default_changed_by_hand_fails_the_check_and_write_puts_the_files_back(tmp_path):
    owned = ("versions.yml", "galaxy.yml", "k8s/go.mod", "plugins/module_utils/preflight.py", "docs/versions.md")
    for relative in owned:
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / relative, tmp_path / relative)
    shutil.copytree(REPO / "roles", tmp_path / "roles")
    defaults = tmp_path / "roles/kube_scheduler/defaults/main.yml"
    defaults.write_text(defaults.read_text().replace(
        f"kube_scheduler_image: registry.k8s.io/kube-scheduler:v{VERSIONS['kubernetes']['tested']}",
        "kube_scheduler_image: registry.k8s.io/kube-scheduler:v1.34.2",
    ))  # fmt: skip
    spec = tmp_path / "roles/preflight/meta/argument_specs.yml"
    spec.write_text(re.sub(r'default: "1\.\d+"', 'default: "1.29"', spec.read_text()))
    checked = _run(root=tmp_path)
    assert checked.returncode == 1
    minimum, tested = VERSIONS["kubernetes"]["minimum"], VERSIONS["kubernetes"]["tested"]
    assert checked.stdout.splitlines() == [
        "differs from versions.yml: roles/preflight/meta/argument_specs.yml: preflight_kubelet_min_version: "
        f'default "1.29" (versions.yml: {minimum})',
        "differs from versions.yml: roles/preflight/meta/argument_specs.yml: preflight_kubernetes_min_version: "
        f'default "1.29" (versions.yml: {minimum})',
        "differs from versions.yml: roles/preflight/meta/argument_specs.yml: preflight_kubernetes_max_version: "
        f'default "1.29" (versions.yml: {".".join(tested.split(".")[:2])})',
        "differs from versions.yml: roles/kube_scheduler/defaults/main.yml: kube_scheduler_image: "
        "registry.k8s.io/kube-scheduler:v1.34.2 (versions.yml: registry.k8s.io/kube-scheduler:v"
        f"{VERSIONS['kubernetes']['tested']})",
    ]
    assert _run("--write", root=tmp_path).returncode == 0
    assert _run(root=tmp_path).returncode == 0
    assert defaults.read_text() == (REPO / "roles/kube_scheduler/defaults/main.yml").read_text()
    assert spec.read_text() == (REPO / "roles/preflight/meta/argument_specs.yml").read_text()


def test_unreadable_versions_file_is_one_line(tmp_path):
    (tmp_path / "versions.yml").write_text("kubernetes: [")
    result = _run(root=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
