"""The gpu_extender role: the objects it renders for the real inventories, what follows from its variables
(API access, host CIDRs, the config hash), the settings it refuses, and the arguments of its apply path."""

from __future__ import annotations

import hashlib
import json
import sys

import pytest
import yaml
from conftest import closed_port_kubeconfig, load_manifests, render_roles, run_playbook, try_render, validate_manifests

SELECTOR = {"app.kubernetes.io/name": "gpufleet-extender", "app.kubernetes.io/component": "scheduler-extender"}


def objects(documents: dict[str, list[dict]]) -> dict[str, dict]:
    """Every rendered object keyed by kind (the role renders one of each kind)."""
    found = {}
    for docs in documents.values():
        for doc in docs:
            assert doc["kind"] not in found, f"two {doc['kind']} objects"
            found[doc["kind"]] = doc
    return found


def write_inventory(tmp_path, control_plane: dict[str, str | None]) -> str:
    """A control plane only: host -> ansible_host (None for none)."""
    hosts = {name: ({"ansible_host": address} if address else None) for name, address in control_plane.items()}
    inventory = {
        "all": {
            "vars": {"gpufleet_namespace": "gpufleet-system"},
            "children": {"control_plane": {"hosts": hosts}},
        }
    }
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump(inventory))
    return str(path)


def render_extender(tmp_path, inventory: str, extra_vars=None) -> dict[str, dict]:
    manifests = render_roles(["gpu_extender"], tmp_path, inventory=inventory, extra_vars=extra_vars)
    assert validate_manifests(manifests) > 0
    return objects({k: v for k, v in load_manifests(manifests).items() if k.startswith("gpu_extender/")})


def run_extender(tmp_path, inventory: str, extra_vars: dict, check_mode: bool = False):
    playbook = tmp_path / "extender.yml"
    play = {"name": "Extender", "hosts": "localhost", "gather_facts": False, "roles": ["gpu_extender"]}
    if check_mode:
        play["check_mode"] = True
    playbook.write_text(yaml.safe_dump([play]))
    base = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    return run_playbook(str(playbook), inventory, {**base, **extra_vars}, tmp_path)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    return render_extender(tmp_path_factory.mktemp("extender-lab"), "inventories/lab")


# --- the lab ----------------------------------------------------------------------------------------------------


def test_lab_deployment_is_highly_available(lab):
    deployment = lab["Deployment"]["spec"]
    assert deployment["replicas"] >= 2
    assert deployment["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    spread = deployment["template"]["spec"]["topologySpreadConstraints"]
    assert spread == [
        {
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": SELECTOR},
        }
    ]
    pdb = lab["PodDisruptionBudget"]["spec"]
    assert pdb["selector"]["matchLabels"] == SELECTOR
    assert 1 <= pdb["minAvailable"] < deployment["replicas"]
    assert deployment["selector"]["matchLabels"] == SELECTOR
    assert lab["Service"]["spec"]["selector"] == SELECTOR


def test_lab_container_is_hardened_and_probed(lab):
    pod = lab["Deployment"]["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert container["command"][:6] == ["gpufleet-extender", "serve", "--host", "0.0.0.0", "--port", "8000"]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["resources"]["requests"]["cpu"] and container["resources"]["limits"]["memory"]
    assert container["envFrom"] == [{"configMapRef": {"name": lab["ConfigMap"]["metadata"]["name"]}}]
    # The only writable place is the in-memory /tmp.
    assert container["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}]


def test_lab_settings_and_service(lab):
    settings = lab["ConfigMap"]["data"]
    assert settings["WEIGHT_GPU_UTIL"] == "0.7"
    assert settings["WEIGHT_MEM_UTIL"] == "0.3"
    assert settings["GPU_UTIL_THRESHOLD"] == "0.8"
    assert settings["MEM_UTIL_THRESHOLD"] == "0.9"
    assert settings["PROMETHEUS_URL"].startswith("http")
    assert settings["NODE_NAME_LABELS"] == "Hostname,hostname"
    assert settings["KUBE_API"] == "in-cluster"
    assert all(isinstance(value, str) for value in settings.values())
    service = lab["Service"]["spec"]
    # The lab pins the ClusterIP the kube_scheduler role's static_pod mode points kube-scheduler at.
    assert service["clusterIP"] == "10.96.0.50"
    assert service["ports"] == [{"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}]


def test_lab_rbac_is_read_only_and_exactly_what_the_watches_need(lab):
    assert lab["ClusterRole"]["rules"] == [
        {"apiGroups": [""], "resources": ["pods", "nodes", "namespaces"], "verbs": ["get", "list", "watch"]}
    ]
    binding = lab["ClusterRoleBinding"]
    assert binding["roleRef"]["name"] == lab["ClusterRole"]["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "gpufleet-extender", "namespace": "gpufleet-system"}
    ]
    assert lab["Deployment"]["spec"]["template"]["spec"]["automountServiceAccountToken"] is True


def test_lab_network_policy_admits_only_scheduler_and_prometheus(lab):
    policy = lab["NetworkPolicy"]["spec"]
    assert policy["podSelector"] == {"matchLabels": SELECTOR}
    assert policy["policyTypes"] == ["Ingress"]
    (rule,) = policy["ingress"]
    assert rule["ports"] == [{"port": "http", "protocol": "TCP"}]
    pod_peers = [
        (p["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"], p["podSelector"]["matchLabels"])
        for p in rule["from"]
        if "podSelector" in p
    ]
    assert pod_peers == [
        ("kube-system", {"component": "kube-scheduler"}),
        ("gpufleet-system", {"app.kubernetes.io/component": "scheduler", "app.kubernetes.io/part-of": "gpufleet"}),
        ("monitoring", {"app.kubernetes.io/name": "prometheus"}),
    ]
    # Every peer is a (namespace AND pod) pair: no bare namespaceSelector admitting a whole namespace.
    assert all("podSelector" in p or "ipBlock" in p for p in rule["from"])
    ip_blocks = [p["ipBlock"]["cidr"] for p in rule["from"] if "ipBlock" in p]
    assert ip_blocks == ["192.0.2.11/32", "192.0.2.12/32", "192.0.2.13/32"]


def test_hongkong_renders_with_the_fixed_cluster_ip_its_static_pod_scheduler_calls(tmp_path):
    hongkong = render_extender(tmp_path, "inventories/hongkong")
    # group_vars/all/extender.yml: the host-network kube-scheduler cannot resolve *.svc names.
    assert hongkong["Service"]["spec"]["clusterIP"] == "10.96.0.50"
    ingress_cidrs = [
        p["ipBlock"]["cidr"] for p in hongkong["NetworkPolicy"]["spec"]["ingress"][0]["from"] if "ipBlock" in p
    ]
    assert ingress_cidrs == ["10.20.0.0/28"]
    assert hongkong["Deployment"]["spec"]["replicas"] >= 2


def test_without_a_fixed_address_kubernetes_picks_the_cluster_ip(tmp_path):
    rendered = render_extender(tmp_path, "inventories/hongkong", extra_vars={"gpu_extender_cluster_ip": None})
    assert "clusterIP" not in rendered["Service"]["spec"]


# --- derived values on small inventories ------------------------------------------------------------------------


def config_hash(rendered: dict[str, dict]) -> str:
    return rendered["Deployment"]["spec"]["template"]["metadata"]["annotations"]["gpufleet.io/config-hash"]


@pytest.fixture(scope="module")
def small_inventory(tmp_path_factory) -> str:
    """Four control-plane hosts: an IPv4 address, an IPv6 address, a host name and no address at all."""
    return write_inventory(
        tmp_path_factory.mktemp("extender-inventory"),
        {"cp-1": "10.20.0.11", "cp-2": "fd00:10::12", "cp-3": "cp-3.example.org", "cp-4": None},
    )


def test_host_cidrs_and_what_the_config_hash_ignores(tmp_path, small_inventory, lab):
    rendered = render_extender(tmp_path, small_inventory, {"gpu_extender_replicas": 3})
    rule = rendered["NetworkPolicy"]["spec"]["ingress"][0]
    # Host names and hosts without an address cannot be turned into an ipBlock: only the IP addresses.
    assert [p["ipBlock"]["cidr"] for p in rule["from"] if "ipBlock" in p] == ["10.20.0.11/32", "fd00:10::12/128"]
    assert rendered["Deployment"]["spec"]["replicas"] == 3
    # Replicas, ClusterIP and host CIDRs differ from the lab, the extender's settings do not: same hash, no roll.
    assert rendered["ConfigMap"]["data"] == lab["ConfigMap"]["data"]
    assert config_hash(rendered) == config_hash(lab)
    # sha256 of the ConfigMap's data as JSON (the role's to_json | hash('sha256')): the settings, nothing else.
    data_json = json.dumps(lab["ConfigMap"]["data"])
    assert config_hash(lab) == hashlib.sha256(data_json.encode()).hexdigest()


def test_without_api_features_there_is_no_api_access_and_the_pods_roll(tmp_path, small_inventory, lab):
    rendered = render_extender(
        tmp_path,
        small_inventory,
        {
            "gpu_extender_inflight_accounting": False,
            "gpu_extender_tenant_pools": False,
            "gpu_extender_gpu_util_threshold": 0.75,
            "gpu_extender_extra_settings": {"MAX_BODY_BYTES": 8388608},
        },
    )
    assert "ClusterRole" not in rendered and "ClusterRoleBinding" not in rendered
    assert rendered["ServiceAccount"]["automountServiceAccountToken"] is False
    assert rendered["Deployment"]["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    settings = rendered["ConfigMap"]["data"]
    assert settings["KUBE_API"] == "off"
    assert settings["TENANT_POOLS"] == "false"
    assert settings["GPU_UTIL_THRESHOLD"] == "0.75"
    assert settings["MAX_BODY_BYTES"] == "8388608"
    # Changed settings change the pod template's hash: the Deployment rolls and the pods read the new values.
    assert config_hash(rendered) != config_hash(lab)


def test_one_api_feature_is_enough_for_the_read_only_role(tmp_path, small_inventory):
    rendered = render_extender(
        tmp_path, small_inventory, {"gpu_extender_inflight_accounting": True, "gpu_extender_tenant_pools": False}
    )
    assert rendered["ClusterRole"]["rules"][0]["verbs"] == ["get", "list", "watch"]
    assert rendered["Deployment"]["spec"]["template"]["spec"]["automountServiceAccountToken"] is True
    assert rendered["ConfigMap"]["data"]["KUBE_API"] == "in-cluster"
    assert rendered["ConfigMap"]["data"]["TENANT_POOLS"] == "false"


# --- refused settings -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "shown"),
    [
        ({"gpu_extender_replicas": 1}, "gpu_extender_replicas >= 2 (got 1)"),
        ({"gpu_extender_weight_gpu_util": 0.6}, "(got 0.6 + 0.3)"),
        ({"gpu_extender_gpu_util_threshold": 1.5}, "(got GPU 1.5"),
        ({"gpu_extender_cluster_ip": "extender.local"}, "an IP address or null (got"),
        ({"gpu_extender_prometheus_url": "prometheus:9090"}, "(got prometheus:9090)"),
        ({"gpu_extender_replicas": 2, "gpu_extender_pdb_min_available": 2}, "gpu_extender_pdb_min_available"),
    ],
)
def test_bad_settings_fail_with_a_clear_message(tmp_path, extra, shown):
    inventory = write_inventory(tmp_path, {"cp-1": "10.20.0.11"})
    result = run_extender(tmp_path, inventory, {"gpufleet_k8s_mode": "render", **extra})
    output = " ".join(result.stdout.split())  # the message is wrapped over several lines
    assert result.returncode != 0
    assert "gpu_extender: invalid settings" in output
    assert shown in output
    assert "Traceback" not in result.stdout + result.stderr


# --- apply mode -------------------------------------------------------------------------------------------------


def test_apply_mode_reaches_the_api_server(tmp_path):
    """Check mode against a closed port: the first apply fails on the connection, not on its arguments."""
    inventory = write_inventory(tmp_path, {"cp-1": "10.20.0.11"})
    extra = {
        "gpufleet_k8s_mode": "apply",
        "gpufleet_kubeconfig": closed_port_kubeconfig(tmp_path),
    }
    result = run_extender(tmp_path, inventory, extra, check_mode=True)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert (
        "TASK [gpufleet.mig.k8s_manifests : Apply the objects with server-side apply (namespaces/gpufleet-system)]"
        in (output)
    )
    assert "Connection refused" in output or "Max retries exceeded" in output
    for argument_error in ("Unsupported parameters", "missing required arguments", "is not a valid", "argument spec"):
        assert argument_error not in output


def test_scoring_strategy_reaches_the_extender_settings(tmp_path):
    rendered = render_extender(
        tmp_path,
        "inventories/lab",
        extra_vars={"gpu_extender_scoring_strategy": "auto", "gpu_extender_auto_pack_below": 0.3},
    )
    data = rendered["ConfigMap"]["data"]
    assert (data["SCORING_STRATEGY"], data["AUTO_PACK_BELOW"], data["PACK_TARGET_UTIL"]) == ("auto", "0.3", "0.6")


def test_a_pack_target_above_the_filter_threshold_is_refused(tmp_path):
    settings = {"gpu_extender_scoring_strategy": "pack", "gpu_extender_pack_target_util": 0.9}
    result, manifests = try_render(["gpu_extender"], tmp_path, extra_vars=settings)
    assert result.returncode != 0
    assert "gpu_extender_pack_target_util below the GPU threshold (got 0.9 with pack)" in " ".join(
        result.stdout.split()
    )
    assert not (manifests / "gpu_extender").exists()
