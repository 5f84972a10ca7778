"""The DRA mode in the roles: gpu_dra_driver renders the pinned driver release, a DeviceClass per tenant pool and
device kind (named by tenants_model's dra_device_class) and the tenants' ResourceClaimTemplates; mig_partition
leaves DRA-managed GPUs to the driver; a bad switch or chart version changes nothing. The classes' CEL selectors
are exercised against ResourceSlices by the real kube-scheduler in tests/integration/k8s/test_dra_allocation.py."""

from __future__ import annotations

import pytest
import yaml
from conftest import REPO, load_manifests, validate_manifests
from gpufleet_testsupport.collection import collections_path, render_roles, run_playbook, try_render

collections_path()  # ansible_collections.gpufleet.mig importable
from ansible_collections.gpufleet.mig.plugins.filter.tenants_model import dra_device_class  # noqa: E402

DRA = {"gpufleet_gpu_allocation": "dra"}
# The Hong Kong pools' device kinds (README: llm whole GPUs, imagegen 3g/2g/1g, finnlp 1g.10gb).
POOL_KINDS = {
    "llm": ["nvidia.com/gpu"],
    "imagegen": ["nvidia.com/mig-1g.10gb", "nvidia.com/mig-2g.20gb", "nvidia.com/mig-3g.40gb"],
    "finnlp": ["nvidia.com/mig-1g.10gb"],
}
NAMESPACES = {"llm": ["llm-inference"], "imagegen": ["imagegen"], "finnlp": ["finnlp", "finnlp-batch"]}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    manifests = render_roles(
        ["gpufleet.mig.gpu_dra_driver"], tmp_path_factory.mktemp("dra"), "inventories/hongkong", DRA
    )
    return manifests, load_manifests(manifests)


def test_one_device_class_per_pool_and_kind_selecting_the_drivers_devices(rendered):
    manifests, documents = rendered
    assert set(documents) == {"gpu_dra_driver/device-classes.yaml", "gpu_dra_driver/claim-templates.yaml"}
    # DeviceClass and ResourceClaimTemplate of resource.k8s.io/v1, strictly.
    assert validate_manifests(manifests) == 5 + 6
    classes = {d["metadata"]["name"]: d for d in documents["gpu_dra_driver/device-classes.yaml"]}
    expected = {dra_device_class(t, r): (t, r) for t, kinds in POOL_KINDS.items() for r in kinds}
    assert set(classes) == set(expected)
    for name, (tenant, resource) in expected.items():
        spec = classes[name]
        assert spec["metadata"]["labels"]["gpufleet.io/tenant"] == tenant
        (selector,) = spec["spec"]["selectors"]
        expression = " ".join(selector["cel"]["expression"].split())
        assert expression.startswith("device.driver == 'gpu.nvidia.com' && ")
        if resource == "nvidia.com/gpu":
            assert expression.endswith("device.attributes['gpu.nvidia.com'].type == 'gpu'")
        else:
            profile = resource.removeprefix("nvidia.com/mig-")
            assert "device.attributes['gpu.nvidia.com'].type == 'mig'" in expression
            assert expression.endswith(f"device.attributes['gpu.nvidia.com'].profile == '{profile}'")


def test_claim_templates_in_each_tenant_namespace_name_their_pools_class(rendered):
    _, documents = rendered
    templates = documents["gpu_dra_driver/claim-templates.yaml"]
    found = {(d["metadata"]["namespace"], d["metadata"]["name"]) for d in templates}
    assert found == {
        (ns, dra_device_class(t, r)) for t, kinds in POOL_KINDS.items() for ns in NAMESPACES[t] for r in kinds
    }
    for template in templates:
        (request,) = template["spec"]["spec"]["devices"]["requests"]
        # One device of the pool's class, and no other class a tenant could slip in.
        assert request["exactly"] == {"deviceClassName": template["metadata"]["name"]}


def test_the_release_is_pinned_with_dynamic_mig_on_the_fleets_gpu_nodes(tmp_path):
    manifests = render_roles(
        ["gpufleet.mig.gpu_dra_driver"],
        tmp_path,
        "inventories/hongkong+lab",
        {**DRA, "gpu_dra_driver_extra_values": {"logVerbosity": "6", "featureGates": {"DynamicMIG": False}}},
    )
    release = yaml.safe_load((manifests / "gpu_dra_driver/helm-release.yml").read_text())
    assert release["version"] == "0.4.1"
    assert release["chart"].endswith("/dra-driver-nvidia-gpu")
    assert release["namespace"] == "gpufleet-node-agents"
    values = release["values"]
    # Extra values pass through, but never over what the fleet relies on.
    assert values["logVerbosity"] == "6"
    assert values["featureGates"] == {"DynamicMIG": True}
    assert values["resources"] == {"gpus": {"enabled": True}, "computeDomains": {"enabled": False}}
    assert values["kubeletPlugin"]["nodeSelector"] == {"gpufleet.io/gpu-node": "true"}
    assert {"key": "gpufleet.io/tenant", "operator": "Exists"} in values["kubeletPlugin"]["tolerations"]
    assert "image" not in values and "imagePullSecrets" not in values  # the pinned chart's own image


DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize(
    ("image", "digest", "repository", "tag"),
    [
        (
            "registry.example:5000/nvidia/dra-driver-nvidia-gpu:v25.8.0",
            None,
            "registry.example:5000/nvidia/dra-driver-nvidia-gpu",
            "v25.8.0",
        ),
        (
            "mirror.example/dra-driver-nvidia-gpu:v25.8.0",
            DIGEST,
            "mirror.example/dra-driver-nvidia-gpu",
            f"v25.8.0@{DIGEST}",
        ),
    ],
)
def test_the_image_variables_become_the_charts_image_values(tmp_path, image, digest, repository, tag):
    extra = {"gpu_dra_driver_image": image, "gpu_dra_driver_image_digest": digest}
    extra["gpu_dra_driver_image_pull_secrets"] = ["regcred"]
    manifests = render_roles(["gpufleet.mig.gpu_dra_driver"], tmp_path, "inventories/hongkong+lab", {**DRA, **extra})
    values = yaml.safe_load((manifests / "gpu_dra_driver/helm-release.yml").read_text())["values"]
    assert values["image"] == {"repository": repository, "tag": tag}
    assert values["imagePullSecrets"] == [{"name": "regcred"}]


def test_without_helm_the_apply_mode_stops_before_any_change_saying_what_to_install(tmp_path):
    missing = tmp_path / "no-helm-here"
    result, _ = try_render(
        ["gpufleet.mig.gpu_dra_driver"],
        tmp_path,
        "inventories/hongkong+lab",
        {**DRA, "gpufleet_k8s_mode": "apply", "gpu_dra_driver_helm_binary": str(missing)},
    )
    assert result.returncode != 0
    output = " ".join(result.stdout.split())
    assert (
        "gpu_dra_driver: the DRA mode installs NVIDIA's DRA driver chart with helm 3 on the controller, and"
        f" {missing} did not run" in output
    ), output[-3000:]
    assert "or set gpu_dra_driver_helm_binary to its path. Nothing was changed." in output
    assert "Install or upgrade the driver's Helm release" not in result.stdout
    assert "Traceback" not in result.stdout + result.stderr


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"gpu_dra_driver_chart_version": "latest"}, 'must pin one release of the chart (X.Y.Z), got "latest"'),
        ({"gpu_dra_driver_extra_values": ["DynamicMIG"]}, "argument 'gpu_dra_driver_extra_values' is of type list"),
        ({"gpu_dra_driver_image_digest": DIGEST}, "with that image named"),
        ({"gpu_dra_driver_image": "mirror.example/dra-driver-nvidia-gpu"}, 'must be "<registry>/<path>:<tag>"'),
        (
            {"gpu_dra_driver_image": "mirror.example/d:v1", "gpu_dra_driver_image_digest": "sha256:short"},
            '"sha256:<64 hex>"',
        ),
    ],
)
def test_bad_settings_are_refused_before_anything_is_rendered(tmp_path, extra, message):
    result, manifests = try_render(
        ["gpufleet.mig.gpu_dra_driver"], tmp_path, "inventories/hongkong+lab", {**DRA, **extra}
    )
    assert result.returncode != 0
    assert message in " ".join(result.stdout.split())
    assert "Traceback" not in result.stdout + result.stderr
    assert not manifests.exists()


def lab_host_files(tmp_path):
    """A lab GPU host's boot unit and layout file as the device plugin mode leaves them, and its NVML state path."""
    host = tmp_path / "hosts/hk-gpu-17/etc"
    unit = host / "systemd/system/gpufleet-mig-layout.service"
    layout = host / "gpufleet/mig-layout.json"
    for path in (unit, layout):
        path.parent.mkdir(parents=True)
        path.write_text("written by the device plugin mode\n")
    return unit, layout, tmp_path / "nvml/hk-gpu-17.json"


def test_mig_partition_leaves_dra_managed_gpus_to_the_driver(tmp_path):
    unit, layout, nvml_state = lab_host_files(tmp_path)
    extra = {**DRA, "gpufleet_lab_dir": str(tmp_path)}
    result = run_playbook("playbooks/mig.yml", "inventories/hongkong+lab", extra, tmp_path, ("--limit", "hk-gpu-17"))
    assert result.returncode == 0, result.stdout[-3000:]
    # The boot unit would re-apply a layout the driver destroys at start: gone, with its layout file.
    assert not unit.exists()
    assert not layout.exists()
    # The GPUs were never opened: the simulator's state file was not even created.
    assert not nvml_state.exists()
    assert "changed=1" in result.stdout


def test_an_unknown_allocation_mode_changes_nothing(tmp_path):
    unit, layout, nvml_state = lab_host_files(tmp_path)
    extra = {"gpufleet_gpu_allocation": "DRA", "gpufleet_lab_dir": str(tmp_path)}
    result = run_playbook("playbooks/mig.yml", "inventories/hongkong+lab", extra, tmp_path, ("--limit", "hk-gpu-17"))
    assert result.returncode != 0
    assert "value of gpufleet_gpu_allocation must be one of: device_plugin, dra, got: DRA" in result.stdout
    assert unit.exists() and layout.exists() and not nvml_state.exists()


def test_the_dra_playbook_refuses_a_fleet_in_device_plugin_mode(tmp_path):
    manifests = tmp_path / "manifests"
    extra = {"gpufleet_manifests_dir": str(manifests), "gpufleet_k8s_mode": "render"}
    result = run_playbook("playbooks/dra.yml", "inventories/hongkong+lab", extra, tmp_path)
    assert result.returncode != 0
    assert "would both hand out the same GPUs" in " ".join(result.stdout.split())
    assert not manifests.exists()


def test_site_runs_the_driver_instead_of_the_device_plugin_in_dra_mode():
    plays = yaml.safe_load((REPO / "playbooks/site.yml").read_text())
    play = next(p for p in plays if any(r.get("role") == "gpufleet.mig.gpu_dra_driver" for r in p.get("roles", [])))
    conditions = {r["role"]: r.get("when") for r in play["roles"]}
    assert conditions["gpufleet.mig.gpu_device_plugin"] == "gpufleet_gpu_allocation == 'device_plugin'"
    assert conditions["gpufleet.mig.gpu_dra_driver"] == "gpufleet_gpu_allocation == 'dra'"
    # Without a word in the inventory, the device plugin (roles/gpufleet, the fleet-wide defaults).
    fleet = yaml.safe_load((REPO / "roles/gpufleet/defaults/main.yml").read_text())
    assert fleet["gpufleet_gpu_allocation"] == "device_plugin"
    assert conditions["gpufleet.mig.dcgm_exporter"] is None
