"""`playbooks/site.yml` on the lab inventory in apply mode, against the real apiserver: what a user runs in
production, with the lab's simulated GPUs. The first run creates everything, a second run changes nothing, and
a feature switched off takes its object away (apply) or its file (render)."""

from __future__ import annotations

import re

import pytest
from conftest import FakeKubelet, lab_hostvars, lab_node_resources
from kubernetes import dynamic
from kubernetes.client.rest import ApiException
from support import run_playbook, try_render

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def lab_nodes(core):
    """The lab's 20 GPU nodes, registered with the allocatable their layouts imply (the device plugin's
    after-repartition check then finds them right at once)."""
    hostvars = lab_hostvars()
    gpu_hosts = {host: vars_ for host, vars_ in hostvars.items() if "mig_partition_config" in vars_}
    kubelet = FakeKubelet(core, {host: lab_node_resources(vars_) for host, vars_ in gpu_hosts.items()}).register()
    yield {host: vars_.get("gpufleet_tenant") for host, vars_ in gpu_hosts.items()}
    kubelet.stop()


@pytest.fixture(scope="module")
def site_run(control_plane, lab_nodes, tmp_path_factory):
    """Run site.yml in apply mode; the lab's state (simulated GPUs, host files) in a directory of its own."""
    lab_dir = tmp_path_factory.mktemp("lab")

    def run(extra: dict | None = None, playbook: str = "playbooks/site.yml"):
        extra_vars = {
            "gpufleet_k8s_mode": "apply",
            "gpufleet_kubeconfig": str(control_plane.kubeconfig),
            "gpufleet_lab_dir": str(lab_dir),
            "mig_partition_serial": "100%",
            # No cert-manager on the test cluster: the extender's TLS Secret counts as provided.
            "gpu_extender_tls_source": "secret",
            **(extra or {}),
        }
        result = run_playbook(playbook, "inventories/hongkong+lab", extra_vars, lab_dir)
        assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-3000:]
        return result.stdout

    return run


def recap(output: str) -> dict[str, dict[str, int]]:
    """PLAY RECAP counters per host."""
    counters = {}
    for host, fields in re.findall(r"^(\S+)\s+:\s+(ok=.*)$", output, re.MULTILINE):
        counters[host] = {key: int(value) for key, value in re.findall(r"(\w+)=(\d+)", fields)}
    return counters


def changed_tasks(output: str) -> list[str]:
    """The tasks a run reports changed, for the failure message (the default callback's TASK banners)."""
    names, task = [], None
    for line in output.splitlines():
        if banner := re.match(r"^TASK \[(.*)\]", line):
            task = banner.group(1)
        elif line.startswith("changed:") and task not in names:
            names.append(task)
    return names


def exists(api, api_version: str, kind: str, name: str, namespace: str | None = None) -> bool:
    resource = dynamic.DynamicClient(api).resources.get(api_version=api_version, kind=kind)
    try:
        resource.get(name=name, namespace=namespace)
    except ApiException as err:
        if err.status == 404:
            return False
        raise
    return True


def test_site_applies_the_fleet_then_changes_nothing(site_run, api, core, lab_nodes):
    first = recap(site_run())
    assert first["localhost"]["changed"] > 0
    assert first["localhost"]["failed"] == 0

    # What a user would look at after the first run.
    for node in core.list_node().items:
        if node.metadata.name not in lab_nodes:
            continue
        tenant = lab_nodes[node.metadata.name]
        assert node.metadata.labels["gpufleet.io/gpu-node"] == "true"
        assert node.metadata.labels["gpufleet.io/tenant"] == tenant
        taints = {(t.key, t.value, t.effect) for t in node.spec.taints or []}
        assert ("gpufleet.io/tenant", tenant, "NoExecute") in taints, node.metadata.name
    quotas = {(q.metadata.namespace, q.metadata.name) for q in core.list_resource_quota_for_all_namespaces().items}
    for namespace in ("llm-inference", "imagegen", "finnlp", "finnlp-batch"):
        assert any(ns == namespace for ns, _ in quotas), f"no ResourceQuota in {namespace}: {quotas}"
    expected = [
        ("scheduling.k8s.io/v1", "PriorityClass", "gpufleet-inference", None),
        ("scheduling.k8s.io/v1", "PriorityClass", "gpufleet-batch", None),
        ("apps/v1", "Deployment", "gpufleet-extender", "gpufleet-system"),
        ("v1", "Service", "gpufleet-extender", "gpufleet-system"),
        ("v1", "ServiceAccount", "gpufleet-extender", "gpufleet-system"),
        ("rbac.authorization.k8s.io/v1", "ClusterRole", "gpufleet-extender", None),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", "gpufleet-extender", None),
        ("networking.k8s.io/v1", "NetworkPolicy", "gpufleet-extender", "gpufleet-system"),
        ("apps/v1", "Deployment", "gpufleet-scheduler", "gpufleet-system"),
        ("apps/v1", "Deployment", "descheduler", "gpufleet-system"),
        ("apps/v1", "DaemonSet", "nvidia-device-plugin", "gpufleet-node-agents"),
        ("apps/v1", "DaemonSet", "dcgm-exporter", "gpufleet-node-agents"),
        ("v1", "ConfigMap", "gpufleet-dashboard-hongkong", "gpufleet-system"),  # the fleet dashboard (monitoring role)
    ]
    missing = [f"{kind} {ns}/{name}" for ver, kind, name, ns in expected if not exists(api, ver, kind, name, ns)]
    assert missing == []

    output = site_run()
    second = recap(output)
    changed = {host: counters["changed"] for host, counters in second.items() if counters["changed"]}
    assert changed == {}, f"the second run changed something: {changed}; tasks: {changed_tasks(output)}"


def test_a_feature_switched_off_is_removed_in_apply_and_render_mode(api, control_plane, tmp_path):
    """The extender's NetworkPolicy switched off: gone from the cluster (apply), gone from the manifests (render).
    Only the gpu_extender role runs: the rest of site.yml is the test above."""
    apply = {
        "gpufleet_k8s_mode": "apply",
        "gpufleet_kubeconfig": str(control_plane.kubeconfig),
        "gpu_extender_tls_source": "secret",  # no cert-manager on the test cluster
    }
    render = {"gpufleet_k8s_mode": "render"}

    def extender_role(settings: dict, network_policy: bool, run: str):
        extra = {**settings, "gpu_extender_network_policy_enabled": network_policy}
        result, manifests = try_render(["gpufleet.mig.gpu_extender"], tmp_path / run, extra_vars=extra)
        assert result.returncode == 0, result.stdout[-6000:]
        return manifests

    extender_role(apply, True, "apply-on")
    assert exists(api, "networking.k8s.io/v1", "NetworkPolicy", "gpufleet-extender", "gpufleet-system")
    extender_role(apply, False, "apply-off")
    assert not exists(api, "networking.k8s.io/v1", "NetworkPolicy", "gpufleet-extender", "gpufleet-system")
    assert exists(api, "apps/v1", "Deployment", "gpufleet-extender", "gpufleet-system")

    manifests = tmp_path / "manifests"
    extender_role({**render, "gpufleet_manifests_dir": str(manifests)}, True, "render-on")
    assert (manifests / "gpu_extender" / "network-policy.yaml").exists()
    extender_role({**render, "gpufleet_manifests_dir": str(manifests)}, False, "render-off")
    assert not (manifests / "gpu_extender" / "network-policy.yaml").exists()
    assert (manifests / "gpu_extender" / "deployment.yaml").exists()
