"""The kube_scheduler role: what it renders for the real inventories (both modes), the managedResources it derives
for small hand-made inventories, the configurations and inventories it refuses, and its apply path's arguments.

The KubeSchedulerConfiguration is checked here against an independent strict pydantic model of the v1 types
(k8s.io/kube-scheduler/config/v1), besides the role's own port of kube-scheduler's validation rules."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from typing import Literal

import pytest
import yaml
from conftest import REPO, closed_port_kubeconfig, load_manifests, validate_manifests
from gpufleet_extender.settings_contract import SETTINGS
from gpufleet_testsupport.collection import LAB, run_playbook, write_inventory
from gpufleet_testsupport.collection import render_roles as render_inventory
from gpufleet_testsupport.ports import free_port
from pydantic import BaseModel, ConfigDict, Field

ROLE = "gpufleet.mig.kube_scheduler"


def render_roles(roles, tmp_path, inventory=LAB, extra_vars=None):
    """Render on the lab; on the lab the scheduler in plugin mode unless the test names another mode (Hong Kong
    itself deploys static_pod: test_hongkong_static_pod_mode_* and the lab's own run cover that)."""
    mode = {"kube_scheduler_mode": "plugin"} if inventory == LAB else {}
    return render_inventory(roles, tmp_path, inventory, {**mode, **(extra_vars or {})})


KUBEADM_MANIFEST = REPO / "extensions/molecule/kube_scheduler_static_pod/files/kube-scheduler.yaml"
FAKE_LIVEZ = REPO / "extensions/molecule/kube_scheduler_static_pod/files/fake-kube-scheduler-livez.py"
CLUSTER_IP = "10.96.0.50"
MIG_OFF = [{"devices": "all", "mig_enabled": False}]
# The Hong Kong fleet: llm whole GPUs, imagegen 3g.40gb + 2g.20gb + 1g.10gb, finnlp 1g.10gb (inventories/hongkong).
FLEET_RESOURCES = ["nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "nvidia.com/mig-2g.20gb", "nvidia.com/mig-3g.40gb"]


# --- a strict model of kubescheduler.config.k8s.io/v1 (the fields the role may write) --------------------------------


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class ManagedResource(Strict):
    name: str
    ignoredByScheduler: bool = False


class Extender(Strict):
    urlPrefix: str
    filterVerb: str = ""
    preemptVerb: str = ""
    prioritizeVerb: str = ""
    weight: int = 0
    bindVerb: str = ""
    enableHTTPS: bool = False
    tlsConfig: dict | None = None
    httpTimeout: str = Field(default="", pattern=r"^(\d+(\.\d+)?(ns|us|ms|s|m|h))+$")
    nodeCacheCapable: bool = False
    managedResources: list[ManagedResource] = []
    ignorable: bool = False


class LeaderElection(Strict):
    leaderElect: bool
    leaseDuration: str = "15s"
    renewDeadline: str = "10s"
    retryPeriod: str = "2s"
    resourceLock: str = "leases"
    resourceName: str
    resourceNamespace: str


class ClientConnection(Strict):
    kubeconfig: str = ""
    acceptContentTypes: str = ""
    contentType: str = ""
    qps: float = 50
    burst: int = 100


class Profile(Strict):
    schedulerName: str
    percentageOfNodesToScore: int | None = None
    plugins: dict | None = None
    pluginConfig: list[dict] | None = None


class KubeSchedulerConfiguration(Strict):
    apiVersion: Literal["kubescheduler.config.k8s.io/v1"]
    kind: Literal["KubeSchedulerConfiguration"]
    parallelism: int | None = None
    leaderElection: LeaderElection
    clientConnection: ClientConnection
    percentageOfNodesToScore: int | None = None
    podInitialBackoffSeconds: int | None = None
    podMaxBackoffSeconds: int | None = None
    profiles: list[Profile]
    extenders: list[Extender] = []  # none in plugin mode: GPUScore decides in process


# --- helpers ----------------------------------------------------------------------------------------------------------


def scheduler_config(manifests: Path, relative: str = "kube_scheduler/scheduler-config.yaml") -> dict:
    config = yaml.safe_load((manifests / relative).read_text())
    KubeSchedulerConfiguration.model_validate(config)
    return config


def objects(manifests: Path) -> dict[tuple[str, str], dict]:
    """Rendered objects of the secondary mode keyed by (kind, name)."""
    docs = load_manifests(manifests)["kube_scheduler/secondary.yaml"]
    return {(doc["kind"], doc["metadata"]["name"]): doc for doc in docs}


def managed_resource_names(config: dict) -> list[str]:
    return [resource["name"] for resource in config["extenders"][0]["managedResources"]]


def pools_inventory(tmp_path: Path, pools: dict[str, tuple[list, int]], all_vars: dict | None = None) -> str:
    """An inventory with control_plane (cp-1, cp-2) and one gpu_nodes child group per pool:
    pools = {group: (mig_partition_config, gpus_per_node)}, two hosts each."""
    children = {
        group: {
            "hosts": {f"{group}-1": None, f"{group}-2": None},
            "vars": {"mig_partition_config": layout, "gpufleet_gpus_per_node": gpus},
        }
        for group, (layout, gpus) in pools.items()
    }
    inventory = {
        "all": {
            "vars": {"gpufleet_namespace": "gpufleet-system", **(all_vars or {})},
            "children": {
                "control_plane": {"hosts": {"cp-1": None, "cp-2": None}},
                "gpu_nodes": {"children": children},
            },
        }
    }
    return write_inventory(tmp_path, inventory)


def render_static_pod(tmp_path: Path, inventory: str, extra_vars: dict | None = None) -> subprocess.CompletedProcess:
    """Run the role in static_pod + render mode on the control-plane hosts, patching the kubeadm fixture."""
    playbook = tmp_path / "static_pod.yml"
    playbook.write_text(
        yaml.safe_dump(
            [{"name": "static_pod", "hosts": "control_plane", "serial": 1, "gather_facts": False, "roles": [ROLE]}]
        )
    )
    all_vars = {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        "gpufleet_k8s_mode": "render",
        "gpufleet_manifests_dir": str(tmp_path / "manifests"),
        "kube_scheduler_mode": "static_pod",
        "kube_scheduler_static_pod_manifest": str(KUBEADM_MANIFEST),
        "gpu_extender_cluster_ip": CLUSTER_IP,
        **(extra_vars or {}),
    }
    return run_playbook(str(playbook), inventory, all_vars, tmp_path)


def render_failure(tmp_path: Path, extra_vars: dict, inventory: str = LAB) -> str:
    """Render the secondary mode expecting the play to fail; return its output."""
    playbook = tmp_path / "render.yml"
    playbook.write_text(yaml.safe_dump([{"name": "r", "hosts": "localhost", "gather_facts": False, "roles": [ROLE]}]))
    all_vars = {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        "gpufleet_k8s_mode": "render",
        "gpufleet_manifests_dir": str(tmp_path / "manifests"),
        "kube_scheduler_mode": "secondary",
        **extra_vars,
    }
    result = run_playbook(str(playbook), inventory, all_vars, tmp_path)
    assert result.returncode != 0, result.stdout[-3000:]
    assert "Traceback" not in result.stdout + result.stderr
    return result.stdout + result.stderr


# --- the real inventories ---------------------------------------------------------------------------------------------


def test_lab_renders_the_secondary_scheduler(tmp_path):
    manifests = render_roles([ROLE], tmp_path, extra_vars={"kube_scheduler_mode": "secondary"})
    # 9 objects of the secondary scheduler and its namespace (delivered by k8s_manifests).
    assert validate_manifests(manifests) == 10
    assert "namespaces/gpufleet-system.yaml" in load_manifests(manifests)
    config = scheduler_config(manifests)
    assert managed_resource_names(config) == FLEET_RESOURCES
    extender = config["extenders"][0]
    assert extender["urlPrefix"] == "https://gpufleet-extender.gpufleet-system.svc:8000"
    # TLS: the CA is the extender Secret's ca.crt, mounted into the scheduler pods (and only that key).
    assert extender["enableHTTPS"] is True
    assert extender["tlsConfig"] == {
        "serverName": "gpufleet-extender.gpufleet-system.svc",
        "caFile": "/etc/kubernetes/gpufleet-extender-tls/ca.crt",
    }
    pod = objects(manifests)[("Deployment", "gpufleet-scheduler")]["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == "extender-ca")
    assert volume["secret"] == {"secretName": "gpufleet-extender-tls", "items": [{"key": "ca.crt", "path": "ca.crt"}]}
    assert (extender["filterVerb"], extender["prioritizeVerb"]) == ("filter", "prioritize")
    assert extender["weight"] == 3 and extender["httpTimeout"] == "500ms"
    assert extender["nodeCacheCapable"] is True and extender["ignorable"] is True
    assert all(resource["ignoredByScheduler"] is False for resource in extender["managedResources"])
    assert config["profiles"] == [{"schedulerName": "gpufleet-scheduler"}]
    assert config["leaderElection"]["resourceName"] == "gpufleet-scheduler"
    assert config["leaderElection"]["resourceNamespace"] == "gpufleet-system"
    assert config["clientConnection"]["kubeconfig"] == ""  # in-cluster credentials of the ServiceAccount


def test_secondary_objects_wire_config_hash_rbac_and_leader_election(tmp_path):
    manifests = render_roles([ROLE], tmp_path, extra_vars={"kube_scheduler_mode": "secondary"})
    rendered = objects(manifests)
    config_text = (manifests / "kube_scheduler/scheduler-config.yaml").read_text()
    configmap = rendered[("ConfigMap", "gpufleet-scheduler-config")]
    assert configmap["data"]["scheduler-config.yaml"] == config_text

    deployment = rendered[("Deployment", "gpufleet-scheduler")]
    pod = deployment["spec"]["template"]
    container = pod["spec"]["containers"][0]
    assert container["command"] == ["kube-scheduler", "--config=/etc/kubernetes/gpufleet/scheduler-config.yaml"]
    assert pod["spec"]["volumes"] == [
        {"name": "config", "configMap": {"name": "gpufleet-scheduler-config"}},
        # the CA of the extender's serving certificate (https), only ca.crt of its TLS Secret
        {
            "name": "extender-ca",
            "secret": {"secretName": "gpufleet-extender-tls", "items": [{"key": "ca.crt", "path": "ca.crt"}]},
        },
    ]
    assert pod["spec"]["serviceAccountName"] == "gpufleet-scheduler"
    assert deployment["spec"]["replicas"] == 2
    assert ("PodDisruptionBudget", "gpufleet-scheduler") in rendered
    assert container["securityContext"]["readOnlyRootFilesystem"] is True

    role_refs = {(doc["kind"], doc["roleRef"]["name"]) for doc in rendered.values() if "roleRef" in doc}
    assert role_refs == {
        ("ClusterRoleBinding", "system:kube-scheduler"),
        ("ClusterRoleBinding", "system:volume-scheduler"),
        ("RoleBinding", "extension-apiserver-authentication-reader"),
        ("RoleBinding", "gpufleet-scheduler-leader-election"),
    }
    lease_role = rendered[("Role", "gpufleet-scheduler-leader-election")]
    assert lease_role["metadata"]["namespace"] == "gpufleet-system"
    assert {"resources": ["leases"], "resourceNames": ["gpufleet-scheduler"], "verbs": ["get", "update"]}.items() <= (
        lease_role["rules"][1].items()
    )


def test_a_config_change_changes_the_pod_template_hash(tmp_path):
    for run in "abc":
        (tmp_path / run).mkdir()
    secondary = {"kube_scheduler_mode": "secondary"}
    first = objects(render_roles([ROLE], tmp_path / "a", extra_vars=secondary))
    second = objects(
        render_roles([ROLE], tmp_path / "b", extra_vars={**secondary, "kube_scheduler_extender_weight": 4})
    )
    same = objects(render_roles([ROLE], tmp_path / "c", extra_vars=secondary))

    def config_hash(rendered):
        annotations = rendered[("Deployment", "gpufleet-scheduler")]["spec"]["template"]["metadata"]["annotations"]
        return annotations["gpufleet.io/scheduler-config-hash"]

    assert config_hash(first) != config_hash(second)
    assert config_hash(first) == config_hash(same)


# --- plugin mode: gpufleet-scheduler with GPUScore --------------------------------------------------------------------

GPUSCORE_POINTS = ["preFilter", "filter", "preScore", "score", "reserve"]


def test_lab_renders_the_plugin_scheduler_with_the_extenders_settings(tmp_path):
    manifests = render_roles([ROLE], tmp_path)  # plugin mode (render_roles above)
    assert validate_manifests(manifests) == 10
    config = scheduler_config(manifests)
    assert "extenders" not in config  # no HTTP hop per pod
    (profile,) = config["profiles"]
    assert profile["schedulerName"] == "gpufleet-scheduler"
    assert list(profile["plugins"]) == GPUSCORE_POINTS
    assert profile["plugins"]["score"] == {"enabled": [{"name": "GPUScore", "weight": 3}]}
    assert all(
        profile["plugins"][point] == {"enabled": [{"name": "GPUScore"}]}
        for point in GPUSCORE_POINTS
        if point != "score"
    )
    (plugin_config,) = profile["pluginConfig"]
    assert plugin_config["name"] == "GPUScore"
    # The gpu_extender role's settings under the plugin's names, native types (the plugin decodes strictly).
    args = plugin_config["args"]
    assert args["prometheusURL"] == "https://prometheus-operated.monitoring.svc:9090"
    # Where the inventory says nothing, the settings contract's defaults (what the roles deploy).
    for setting in SETTINGS.values():
        if setting.scheduler_arg and "{{" not in str(setting.deployed_default):
            assert args[setting.arg] == setting.deployed_default, setting.arg
    assert args["nodeNameLabels"] == ["Hostname", "hostname"] and args["tenantPools"] is True
    assert args["scoringStrategy"] == "spread" and args["metricsMaxAgeSeconds"] == 60
    assert (args["exporterJob"], args["exporterNamespace"]) == ("dcgm-exporter", "gpufleet-node-agents")
    # No extender in the profile: nothing of its TLS Secret is mounted (it need not exist). Prometheus' token and CA
    # are (test_plugin_queries_prometheus_over_https_with_a_pinned_ca_and_its_own_token).
    volumes = objects(manifests)[("Deployment", "gpufleet-scheduler")]["spec"]["template"]["spec"]["volumes"]
    assert [v["name"] for v in volumes] == ["config", "prometheus-token", "prometheus-ca"]

    deployment = objects(manifests)[("Deployment", "gpufleet-scheduler")]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    # The image `make images` builds, tagged with the collection's version.
    assert container["image"] == f"gpufleet-scheduler:{yaml.safe_load((REPO / 'galaxy.yml').read_text())['version']}"
    assert container["command"] == ["gpufleet-scheduler", "--config=/etc/kubernetes/gpufleet/scheduler-config.yaml"]


def test_plugin_mode_follows_the_extenders_settings_and_can_keep_the_extender(tmp_path):
    extra = {
        "gpu_extender_scoring_strategy": "pack",
        "gpu_extender_gpu_util_threshold": 0.7,
        "kube_scheduler_plugin_extra_args": {"metricsRefreshSeconds": 2},
        "kube_scheduler_plugin_with_extender": True,
        "kube_scheduler_plugin_weight": 5,
    }
    config = scheduler_config(render_roles([ROLE], tmp_path, extra_vars=extra))
    args = config["profiles"][0]["pluginConfig"][0]["args"]
    assert (args["scoringStrategy"], args["gpuUtilThreshold"], args["metricsRefreshSeconds"]) == ("pack", 0.7, 2)
    assert config["profiles"][0]["plugins"]["score"]["enabled"] == [{"name": "GPUScore", "weight": 5}]
    assert config["extenders"][0]["urlPrefix"] == "https://gpufleet-extender.gpufleet-system.svc:8000"


def test_plugin_mode_renders_shared_resources_and_the_interference_weight(tmp_path):
    lab = scheduler_config(render_roles([ROLE], tmp_path / "lab"))
    args = lab["profiles"][0]["pluginConfig"][0]["args"]
    # From the inventory's pools (finnlp time-slices its 1g.10gb x4), as the extender's SHARED_RESOURCES; the
    # weight is scoring.Policy's default.
    assert (args["sharedResources"], args["interferenceWeight"]) == ({"nvidia.com/mig-1g.10gb": 4}, 0.0)
    # The extender's weight, when the inventory sets it, is the plugin's too.
    follows = scheduler_config(
        render_roles([ROLE], tmp_path / "follows", extra_vars={"gpu_extender_interference_weight": 2})
    )
    assert follows["profiles"][0]["pluginConfig"][0]["args"]["interferenceWeight"] == 2.0
    # The shared-memory rule likewise: off (0.0, a float) unless the extender's variable sets it.
    assert type(args["sharedMemFreeMin"]) is float and args["sharedMemFreeMin"] == 0.0
    guarded = scheduler_config(
        render_roles([ROLE], tmp_path / "guarded", extra_vars={"gpu_extender_shared_mem_free_min": 0.35})
    )
    assert guarded["profiles"][0]["pluginConfig"][0]["args"]["sharedMemFreeMin"] == 0.35
    extra = {
        "kube_scheduler_plugin_shared_resources": {"nvidia.com/mig-1g.10gb": 4, "nvidia.com/gpu": "2"},
        "kube_scheduler_plugin_interference_weight": 1,
    }
    config = scheduler_config(render_roles([ROLE], tmp_path / "set", extra_vars=extra))
    args = config["profiles"][0]["pluginConfig"][0]["args"]
    # Whole numbers and a float, as the plugin's strict decoding wants them.
    assert args["sharedResources"] == {"nvidia.com/mig-1g.10gb": 4, "nvidia.com/gpu": 2}
    assert type(args["interferenceWeight"]) is float and args["interferenceWeight"] == 1.0


def test_dra_mode_adds_gpuclaimscore_to_the_plugin_profile_and_only_then(tmp_path):
    # The lab's allocation is device_plugin: GPUScore alone (the test above checks its points).
    default = scheduler_config(render_roles([ROLE], tmp_path / "default"))["profiles"][0]
    assert "GPUClaimScore" not in json.dumps(default)
    extra = {"gpufleet_gpu_allocation": "dra", "gpu_extender_gpu_util_threshold": 0.7}
    (profile,) = scheduler_config(render_roles([ROLE], tmp_path / "dra", extra_vars=extra))["profiles"]
    plugins = profile["plugins"]
    # GPUScore's five points as in device plugin mode; GPUClaimScore beside it at preScore and score, weight 10.
    assert list(plugins) == GPUSCORE_POINTS
    assert plugins["preScore"] == {"enabled": [{"name": "GPUScore"}, {"name": "GPUClaimScore"}]}
    assert plugins["score"] == {"enabled": [{"name": "GPUScore", "weight": 3}, {"name": "GPUClaimScore", "weight": 10}]}
    assert all("GPUClaimScore" not in json.dumps(plugins[p]) for p in ("preFilter", "filter", "reserve"))
    # The same args as GPUScore: its load rule, its metrics.
    gpuscore, claims = profile["pluginConfig"]
    assert (gpuscore["name"], claims["name"]) == ("GPUScore", "GPUClaimScore")
    assert claims["args"] == gpuscore["args"] and claims["args"]["gpuUtilThreshold"] == 0.7
    weighted = scheduler_config(
        render_roles([ROLE], tmp_path / "weight", extra_vars={**extra, "kube_scheduler_plugin_claim_score_weight": 4})
    )
    assert weighted["profiles"][0]["plugins"]["score"]["enabled"][1] == {"name": "GPUClaimScore", "weight": 4}
    # The stock kube-scheduler (static_pod, secondary) has no GPUClaimScore: DRA mode adds nothing there.
    secondary = render_roles([ROLE], tmp_path / "secondary", extra_vars={**extra, "kube_scheduler_mode": "secondary"})
    assert "GPUClaimScore" not in json.dumps(scheduler_config(secondary))


def test_plugin_mode_refuses_bad_args_with_every_problem_in_the_plugins_words(tmp_path):
    # gpufleet-extender check-config --plugin-args on the rendered args: every problem at once, as GPUScore says it.
    extra = {
        "kube_scheduler_mode": "plugin",
        "kube_scheduler_plugin_shared_resources": {"example.com/fpga": 2, "nvidia.com/mig-1g.10gb": 4},
        "kube_scheduler_plugin_interference_weight": 12,
        "kube_scheduler_plugin_extra_args": {"threshold": 1, "scoringStrategy": "pack", "packTargetUtil": 0.9},
    }
    output = " ".join(render_failure(tmp_path, extra).split())  # the message is wrapped over several lines
    assert "kube_scheduler: GPUScore would refuse its args at start" in output
    assert (
        "invalid GPUScore args: threshold: unknown argument; "
        "sharedResources: names nvidia.com/gpu or nvidia.com/mig-<profile> resources, got example.com/fpga; "
        "interferenceWeight: 12 is not in [0, 10]; "
        "packTargetUtil (0.9) must be below gpuUtilThreshold (0.8) with scoringStrategy=pack"
    ) in output


def test_gpuscore_is_refused_outside_plugin_mode(tmp_path):
    # The stock kube-scheduler does not register GPUScore: it would not start with it.
    output = render_failure(
        tmp_path, {"kube_scheduler_profile_plugins": {"filter": {"enabled": [{"name": "GPUScore"}]}}}
    )
    assert (
        'profiles[0].plugins.filter.enabled[0].name: Invalid value: "GPUScore": FilterPlugin "GPUScore" does not exist'
        in output
    )


@pytest.mark.parametrize(
    ("extra_vars", "message"),
    [
        (
            {"kube_scheduler_profile_plugins": {"score": {"enabled": [{"name": "TrimaranTargetLoadPacking"}]}}},
            'ScorePlugin "TrimaranTargetLoadPacking" does not exist',
        ),
    ],
)
def test_plugin_mode_refuses_what_gpufleet_scheduler_would_refuse(tmp_path, extra_vars, message):
    output = render_failure(tmp_path, {"kube_scheduler_mode": "plugin", **extra_vars})
    assert "kube-scheduler would refuse this configuration" in output
    assert message in output


# --- plugin mode: the metrics path (Prometheus over https, a pinned CA, a token of its own) ---------------------------


def test_plugin_queries_prometheus_over_https_with_a_pinned_ca_and_its_own_token(tmp_path):
    manifests = render_roles([ROLE], tmp_path)  # the lab: plugin mode, https by default
    args = scheduler_config(manifests)["profiles"][0]["pluginConfig"][0]["args"]
    assert args["prometheusURL"] == "https://prometheus-operated.monitoring.svc:9090"
    assert args["prometheusCAFile"] == "/etc/gpufleet/prometheus-ca/ca.crt"
    assert args["prometheusTokenFile"] == "/etc/gpufleet/prometheus-token/token"
    rendered = objects(manifests)
    pod = rendered[("Deployment", "gpufleet-scheduler")]["spec"]["template"]["spec"]
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mounts["prometheus-ca"] == {
        "name": "prometheus-ca",
        "mountPath": "/etc/gpufleet/prometheus-ca",
        "readOnly": True,
    }
    # A directory mount, no subPath: the kubelet updates a rotated token in place.
    assert mounts["prometheus-token"] == {
        "name": "prometheus-token",
        "mountPath": "/etc/gpufleet/prometheus-token",
        "readOnly": True,
    }
    assert volumes["prometheus-ca"]["configMap"] == {
        "name": "kube-root-ca.crt",
        "defaultMode": 0o444,
        "items": [{"key": "ca.crt", "path": "ca.crt"}],
    }
    assert volumes["prometheus-token"]["secret"] == {
        "secretName": "gpufleet-scheduler-prometheus",
        "defaultMode": 0o440,
        "items": [{"key": "prometheusAuthToken", "path": "token"}],
    }
    # The token's group owns the mounted Secret: the non-root user can read it.
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsGroup"] == 65532
    assert all(doc["kind"] != "Secret" for doc in rendered.values())  # the token is never rendered to a file


def test_plugin_takes_the_extenders_prometheus_and_ca_but_keeps_its_own_token(tmp_path):
    extra = {
        "gpu_extender_prometheus_url": "https://prometheus.example:9443",
        "gpu_extender_prometheus_ca_configmap": "prometheus-ca",
        "gpu_extender_prometheus_ca_key": "ca.pem",
        "gpu_extender_prometheus_auth_secret": "gpufleet-extender-prometheus",
    }
    manifests = render_roles([ROLE], tmp_path, extra_vars=extra)
    args = scheduler_config(manifests)["profiles"][0]["pluginConfig"][0]["args"]
    assert args["prometheusURL"] == "https://prometheus.example:9443"
    volumes = {
        v["name"]: v
        for v in objects(manifests)[("Deployment", "gpufleet-scheduler")]["spec"]["template"]["spec"]["volumes"]
    }
    assert volumes["prometheus-ca"]["configMap"]["name"] == "prometheus-ca"
    assert volumes["prometheus-ca"]["configMap"]["items"] == [{"key": "ca.pem", "path": "ca.crt"}]
    assert volumes["prometheus-token"]["secret"]["secretName"] == "gpufleet-scheduler-prometheus"


@pytest.mark.parametrize(
    "extra_vars",
    [
        {"kube_scheduler_prometheus_url": "http://prometheus.monitoring.svc:9090"},
        # the extender's own opt-out is not the scheduler's
        {
            "gpu_extender_prometheus_url": "http://prometheus.monitoring.svc:9090",
            "gpu_extender_prometheus_allow_http": True,
        },
        # nor can extra args slip an http URL past the check
        {"kube_scheduler_plugin_extra_args": {"prometheusURL": "http://prometheus.monitoring.svc:9090"}},
    ],
)
def test_plain_http_prometheus_is_refused_without_the_opt_out(tmp_path, extra_vars):
    output = " ".join(render_failure(tmp_path, {"kube_scheduler_mode": "plugin", **extra_vars}).split())
    assert "GPUScore's prometheusURL (kube_scheduler_prometheus_url, by default gpu_extender_prometheus_url)" in output
    assert "must be https:// (got http://prometheus.monitoring.svc:9090)" in output
    assert "set kube_scheduler_prometheus_allow_http: true for a lab only" in output


def test_the_http_opt_out_sends_the_token_but_pins_no_ca(tmp_path):
    extra = {"kube_scheduler_prometheus_url": "http://127.0.0.1:9090", "kube_scheduler_prometheus_allow_http": True}
    manifests = render_roles([ROLE], tmp_path, extra_vars=extra)
    args = scheduler_config(manifests)["profiles"][0]["pluginConfig"][0]["args"]
    assert args["prometheusURL"] == "http://127.0.0.1:9090" and "prometheusCAFile" not in args
    assert args["prometheusTokenFile"] == "/etc/gpufleet/prometheus-token/token"
    pod = objects(manifests)[("Deployment", "gpufleet-scheduler")]["spec"]["template"]["spec"]
    assert [v["name"] for v in pod["volumes"]] == ["config", "prometheus-token"]
    assert [m["name"] for m in pod["containers"][0]["volumeMounts"]] == ["config", "prometheus-token"]


def test_other_modes_mount_nothing_of_prometheus_and_ignore_its_url(tmp_path):
    # kube-scheduler with the extender queries no Prometheus itself: an http URL there is the extender's business.
    extra = {"kube_scheduler_mode": "secondary", "kube_scheduler_prometheus_url": "http://prometheus:9090"}
    pod = objects(render_roles([ROLE], tmp_path, extra_vars=extra))[("Deployment", "gpufleet-scheduler")]
    assert [v["name"] for v in pod["spec"]["template"]["spec"]["volumes"]] == ["config", "extender-ca"]


def test_hongkong_secondary_mode_renders_and_validates(tmp_path):
    manifests = render_roles(
        [ROLE], tmp_path, inventory="inventories/hongkong", extra_vars={"kube_scheduler_mode": "secondary"}
    )
    assert validate_manifests(manifests) == 10
    assert managed_resource_names(scheduler_config(manifests)) == FLEET_RESOURCES


def test_hongkong_static_pod_mode_renders_a_config_and_patched_manifest_per_control_plane_node(tmp_path):
    result = render_static_pod(tmp_path, str(REPO / "inventories/hongkong"))
    assert result.returncode == 0, result.stdout[-4000:]
    manifests = tmp_path / "manifests"
    # The patched manifests are Pods: validated strictly like every other object.
    assert validate_manifests(manifests) == 3
    for host in ("hk-cp-01", "hk-cp-02", "hk-cp-03"):
        config = scheduler_config(manifests, f"kube_scheduler/{host}/scheduler-config.yaml")
        assert managed_resource_names(config) == FLEET_RESOURCES
        assert config["extenders"][0]["urlPrefix"] == f"https://{CLUSTER_IP}:8000"
        # Render mode cannot read the CA from the cluster: the file is expected in the mounted config directory;
        # the certificate is checked against the Service's name although the ClusterIP is called.
        assert config["extenders"][0]["tlsConfig"] == {
            "serverName": "gpufleet-extender.gpufleet-system.svc",
            "caFile": "/etc/kubernetes/gpufleet/extender-ca.crt",
        }
        assert config["profiles"] == [{"schedulerName": "default-scheduler"}]
        # With --config, kube-scheduler ignores kubeadm's --kubeconfig flag: the file must carry it.
        assert config["clientConnection"]["kubeconfig"] == "/etc/kubernetes/scheduler.conf"
        assert config["leaderElection"]["resourceName"] == "kube-scheduler"
        pod = yaml.safe_load((manifests / f"kube_scheduler/{host}/kube-scheduler.yaml").read_text())
        command = pod["spec"]["containers"][0]["command"]
        assert command.count("--config=/etc/kubernetes/gpufleet/scheduler-config.yaml") == 1
        # The annotation is the first 16 hex digits of the sha256 of the very file the pod mounts: a change of the
        # file rolls the pod, and nothing else does.
        config_text = (manifests / f"kube_scheduler/{host}/scheduler-config.yaml").read_bytes()
        expected_hash = hashlib.sha256(config_text).hexdigest()[:16]
        assert pod["metadata"]["annotations"]["gpufleet.io/scheduler-config-hash"] == expected_hash


def test_static_pod_mode_takes_an_ipv6_cluster_ip(tmp_path):
    inventory = pools_inventory(tmp_path, {"whole": (MIG_OFF, 8)})
    result = render_static_pod(tmp_path, inventory, {"gpu_extender_cluster_ip": "fd00:10:96::50"})
    assert result.returncode == 0, result.stdout[-4000:]
    config = scheduler_config(tmp_path / "manifests", "kube_scheduler/cp-1/scheduler-config.yaml")
    assert config["extenders"][0]["urlPrefix"] == "https://[fd00:10:96::50]:8000"


# --- managedResources derived from hand-made inventories -------------------------------------------------------------


@pytest.mark.parametrize(
    ("pools", "expected"),
    [
        ({"whole": (MIG_OFF, 8)}, ["nvidia.com/gpu"]),
        (
            {"small": ([{"devices": "all", "mig_enabled": True, "mig_devices": {"1g.20gb": 3, "1g.10gb": 1}}], 4)},
            ["nvidia.com/mig-1g.10gb", "nvidia.com/mig-1g.20gb"],
        ),
        (
            {
                # Two GPUs whole, six split in one 7g.80gb each; a second pool adds 4g.40gb + 3g.40gb.
                "mixed": (
                    [
                        {"devices": [0, 1], "mig_enabled": False},
                        {"devices": [2, 3, 4, 5, 6, 7], "mig_enabled": True, "mig_devices": {"7g.80gb": 1}},
                    ],
                    8,
                ),
                "halves": ([{"devices": "all", "mig_enabled": True, "mig_devices": {"4g.40gb": 1, "3g.40gb": 1}}], 2),
            },
            ["nvidia.com/gpu", "nvidia.com/mig-3g.40gb", "nvidia.com/mig-4g.40gb", "nvidia.com/mig-7g.80gb"],
        ),
    ],
)
def test_managed_resources_follow_the_layouts(tmp_path, pools, expected):
    inventory = pools_inventory(tmp_path, pools, {"kube_scheduler_mode": "secondary"})
    manifests = render_roles([ROLE], tmp_path, inventory=inventory)
    assert managed_resource_names(scheduler_config(manifests)) == expected


# --- what the role refuses -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra_vars", "message"),
    [
        (
            {"kube_scheduler_extender_weight": 0},
            "extenders[0].weight: Invalid value: 0: must have a positive weight applied to it",
        ),
        (
            {"kube_scheduler_extender_http_timeout": "500"},
            'extenders[0].httpTimeout: Invalid value: "500": time: invalid duration "500"',
        ),
        (
            {
                "kube_scheduler_extra_extenders": [
                    {"urlPrefix": "http://a", "bindVerb": "bind"},
                    {"urlPrefix": "http://b", "bindVerb": "bind"},
                ]
            },
            'extenders: Invalid value: "found 2 extenders implementing bind": only one extender can implement bind',
        ),
        (
            {
                "kube_scheduler_extra_extenders": [
                    {"urlPrefix": "http://a", "managedResources": [{"name": "nvidia.com/gpu"}]}
                ]
            },
            'extenders[1].managedResources[0].name: Invalid value: "nvidia.com/gpu": duplicate extender managed',
        ),
        (
            {"kube_scheduler_extra_extenders": [{"urlPrefix": "http://a", "managedResources": [{"name": "gpu"}]}]},
            'extenders[1].managedResources[0].name: Invalid value: "gpu": is an invalid extended resource name',
        ),
    ],
)
def test_the_play_fails_with_kube_schedulers_own_message(tmp_path, extra_vars, message):
    output = render_failure(tmp_path, extra_vars)
    assert "kube-scheduler would refuse this configuration" in output
    assert message in output
    assert not (tmp_path / "manifests" / "kube_scheduler").exists()


def test_static_pod_mode_needs_a_reachable_extender_address(tmp_path):
    inventory = pools_inventory(tmp_path, {"whole": (MIG_OFF, 8)})
    result = render_static_pod(tmp_path, inventory, {"gpu_extender_cluster_ip": None})
    assert result.returncode != 0
    assert "cannot resolve *.svc names" in result.stdout
    assert "Set gpu_extender_cluster_ip" in result.stdout


def test_static_pod_mode_refuses_hosts_outside_the_control_plane(tmp_path):
    output = render_failure(tmp_path, {"kube_scheduler_mode": "static_pod", "gpu_extender_cluster_ip": CLUSTER_IP})
    assert "run the role on the hosts of group 'control_plane'" in output


def test_gpu_nodes_without_layouts_are_named(tmp_path):
    inventory = pools_inventory(tmp_path, {"whole": (MIG_OFF, 8)})
    inventory_data = yaml.safe_load(Path(inventory).read_text())
    inventory_data["all"]["children"]["gpu_nodes"]["children"]["bare"] = {"hosts": {"bare-1": None}}
    Path(inventory).write_text(yaml.safe_dump(inventory_data))
    output = render_failure(tmp_path, {}, inventory=inventory)
    assert "mig_partition_config or gpufleet_gpus_per_node is not defined for bare-1." in output


def test_many_gpu_nodes_without_layouts_are_named_ten_then_counted(tmp_path):
    inventory = pools_inventory(tmp_path, {"whole": (MIG_OFF, 8)})
    inventory_data = yaml.safe_load(Path(inventory).read_text())
    bare = {f"bare-{i:03d}": None for i in range(250)}
    inventory_data["all"]["children"]["gpu_nodes"]["children"]["bare"] = {"hosts": bare}
    Path(inventory).write_text(yaml.safe_dump(inventory_data))
    output = " ".join(render_failure(tmp_path, {}, inventory=inventory).split())
    named = ", ".join(sorted(bare)[:10])
    assert f"is not defined for {named} and 240 more hosts." in output


def test_an_invalid_layout_fails_with_the_layout_filters_message(tmp_path):
    layout = [{"devices": "all", "mig_enabled": True, "mig_devices": {"3g.40gb": 3}}]  # 12 slices > 8
    output = render_failure(tmp_path, {}, inventory=pools_inventory(tmp_path, {"bad": (layout, 8)}))
    # One line naming the host and the variable, judged against the host's product (the default H100 80GB).
    assert (
        "host bad-1: mig_partition_config: config[0]: GPU 0 (NVIDIA H100 80GB HBM3): 3 x 3g.40gb requested"
        in " ".join(output.split())
    )


# --- apply mode ------------------------------------------------------------------------------------------------------


def test_secondary_apply_mode_reaches_the_api_server(tmp_path):
    """Check mode against a closed port: the apply task accepts the rendered objects and fails connecting."""
    playbook = tmp_path / "apply.yml"
    playbook.write_text(
        yaml.safe_dump(
            [{"name": "a", "hosts": "localhost", "gather_facts": False, "check_mode": True, "roles": [ROLE]}]
        )
    )
    extra = {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        "gpufleet_k8s_mode": "apply",
        "gpufleet_kubeconfig": closed_port_kubeconfig(tmp_path),
        "gpufleet_manifests_dir": str(tmp_path / "unused"),
        "kube_scheduler_mode": "secondary",
    }
    result = run_playbook(str(playbook), LAB, extra, tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "TASK [gpufleet.mig.k8s_manifests : Apply the objects with server-side apply" in output
    assert "Connection refused" in output or "Max retries exceeded" in output
    for argument_error in ("Unsupported parameters", "missing required arguments", "is not a valid", "argument spec"):
        assert argument_error not in output


# --- static_pod apply mode on this machine: real files, the molecule scenario's simulated /livez ---------------------


@pytest.fixture
def control_plane_node(tmp_path):
    """kubeadm's manifest in a directory of its own and the simulated /livez serving it on a free 127.0.0.1 port
    (healthy while the manifest's --config file exists and does not contain the text of `reject`)."""
    root = tmp_path / "node"
    (root / "manifests").mkdir(parents=True)
    node = SimpleNamespace(
        manifest=root / "manifests/kube-scheduler.yaml",
        config_dir=root / "gpufleet",
        reject=root / "reject",
        url=f"http://127.0.0.1:{free_port()}/livez",
    )
    shutil.copy(KUBEADM_MANIFEST, node.manifest)
    port = node.url.split(":")[2].split("/")[0]
    command = [sys.executable, str(FAKE_LIVEZ), "--port", port, "--manifest", str(node.manifest)]
    server = subprocess.Popen([*command, "--reject-file", str(node.reject)])
    try:
        for _ in range(50):
            try:
                urllib.request.urlopen(node.url, timeout=1)
                break
            except OSError:
                time.sleep(0.2)
        yield node
    finally:
        server.terminate()
        server.wait(timeout=10)


def apply_static_pod(tmp_path: Path, node, extra_vars: dict | None = None, check: bool = False):
    """Run the role in static_pod + apply mode against `node` (one control-plane host, local connection).

    check: `--check --diff` on the command line; the role tests `ansible_check_mode`, which only the CLI sets."""
    inventory = pools_inventory(tmp_path, {"whole": (MIG_OFF, 8)})
    playbook = tmp_path / "apply_static_pod.yml"
    play = {"name": "static_pod", "hosts": "cp-1", "serial": 1, "gather_facts": False, "roles": [ROLE]}
    playbook.write_text(yaml.safe_dump([play]))
    all_vars = {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        "gpufleet_k8s_mode": "apply",
        "kube_scheduler_mode": "static_pod",
        "gpu_extender_cluster_ip": CLUSTER_IP,
        # Inline: apply mode would otherwise read the extender's CA from the cluster (there is none here).
        "kube_scheduler_extender_tls_ca": (KUBEADM_MANIFEST.parent / "extender-ca.crt").read_text(),
        "kube_scheduler_static_pod_manifest": str(node.manifest),
        "kube_scheduler_config_dir": str(node.config_dir),
        "kube_scheduler_livez_url": node.url,
        "kube_scheduler_restart_grace_seconds": 1,
        "kube_scheduler_livez_timeout_seconds": 3,
        "kube_scheduler_livez_interval_seconds": 1,
        **(extra_vars or {}),
    }
    vars_file = tmp_path / "static-pod-vars.json"
    vars_file.write_text(json.dumps(all_vars))
    ansible_playbook = Path(sys.executable).with_name("ansible-playbook")
    command = [str(ansible_playbook), "-i", inventory, str(playbook), "-e", f"@{vars_file}"]
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    return subprocess.run(
        [*command, *(["--check", "--diff"] if check else [])],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


def recap_changed(output: str) -> int:
    recap = output.rsplit("PLAY RECAP", 1)[1]
    return int(recap.split("changed=")[1].split()[0])


def test_static_pod_check_mode_shows_the_diff_and_changes_nothing(tmp_path, control_plane_node):
    node = control_plane_node
    result = apply_static_pod(tmp_path, node, check=True)
    assert result.returncode == 0, result.stdout[-4000:]
    assert node.manifest.read_bytes() == KUBEADM_MANIFEST.read_bytes()
    assert not (node.config_dir / "scheduler-config.yaml").exists()
    assert f"+    - --config={node.config_dir}/scheduler-config.yaml" in result.stdout
    assert "+    gpufleet.io/scheduler-config-hash:" in result.stdout


def test_static_pod_rollout_is_idempotent_and_rolls_back_a_refused_config(tmp_path, control_plane_node):
    node = control_plane_node
    config_file = node.config_dir / "scheduler-config.yaml"

    first = apply_static_pod(tmp_path, node)
    assert first.returncode == 0, first.stdout[-4000:]
    patched, config = node.manifest.read_bytes(), config_file.read_bytes()
    pod = yaml.safe_load(patched)
    assert pod["spec"]["containers"][0]["command"][-1] == f"--config={config_file}"
    assert yaml.safe_load(config)["extenders"][0]["managedResources"] == [
        {"name": "nvidia.com/gpu", "ignoredByScheduler": False}
    ]
    # https to the ClusterIP, the certificate checked against the Service's name and the CA given inline.
    extender = yaml.safe_load(config)["extenders"][0]
    ca = (KUBEADM_MANIFEST.parent / "extender-ca.crt").read_bytes()
    assert extender["urlPrefix"] == f"https://{CLUSTER_IP}:8000"
    assert extender["tlsConfig"] == {
        "serverName": "gpufleet-extender.gpufleet-system.svc",
        "caData": base64.b64encode(ca).decode(),
    }
    backups = sorted(p.name for p in (node.config_dir / "backup").iterdir())
    assert [name.split(".yaml.")[0] for name in backups] == ["kube-scheduler"]  # no config existed before
    assert (node.config_dir / "backup" / backups[0]).read_bytes() == KUBEADM_MANIFEST.read_bytes()

    second = apply_static_pod(tmp_path, node)
    assert second.returncode == 0, second.stdout[-4000:]
    assert recap_changed(second.stdout) == 0
    assert node.manifest.read_bytes() == patched

    node.reject.write_text("weight: 7")
    refused = apply_static_pod(tmp_path, node, {"kube_scheduler_extender_weight": 7})
    assert refused.returncode != 0
    assert f"kube-scheduler on cp-1 did not become healthy at {node.url}" in refused.stdout
    assert "the restored scheduler is healthy" in refused.stdout
    assert node.manifest.read_bytes() == patched
    assert config_file.read_bytes() == config


def test_static_pod_leaves_an_unhealthy_scheduler_alone(tmp_path, control_plane_node):
    node = control_plane_node
    node.url = f"http://127.0.0.1:{free_port()}/livez"  # nothing answers there
    result = apply_static_pod(tmp_path, node)
    assert result.returncode != 0
    assert "Check kube-scheduler is healthy before changing anything" in result.stdout.split("fatal:")[0]
    assert node.manifest.read_bytes() == KUBEADM_MANIFEST.read_bytes()
    assert not node.config_dir.exists()


def test_plugin_mode_sets_no_query_form_and_refuses_the_removed_one_with_what_replaced_it(tmp_path):
    lab = scheduler_config(render_roles([ROLE], tmp_path / "lab"))
    assert "prometheusQuery" not in lab["profiles"][0]["pluginConfig"][0]["args"]
    extra = {"kube_scheduler_mode": "plugin", "kube_scheduler_plugin_extra_args": {"prometheusQuery": "recorded"}}
    (tmp_path / "old").mkdir()
    output = " ".join(render_failure(tmp_path / "old", extra).split())
    assert (
        "invalid GPUScore args: prometheusQuery: removed with the recorded form: the dcgm series are read raw from "
        "Prometheus, or pushed by its remote write (metricsSource push); delete it"
    ) in output


# --- plugin mode, pushed load -----------------------------------------------------------------------------------------


def test_plugin_mode_with_push_receives_the_load_in_each_replica(tmp_path):
    manifests = render_roles([ROLE], tmp_path, extra_vars={"gpufleet_metrics_source": "push"})
    args = scheduler_config(manifests)["profiles"][0]["pluginConfig"][0]["args"]
    found = objects(manifests)
    assert ("Deployment", "gpufleet-scheduler") not in found
    workload = found[("StatefulSet", "gpufleet-scheduler")]["spec"]
    # Named through the fleet's receivers' Service, as the extender's replicas are.
    assert workload["serviceName"] == "gpufleet-metrics-receivers"
    assert workload["template"]["metadata"]["labels"]["gpufleet.io/metrics-receiver"] == "true"
    pod = workload["template"]["spec"]
    (container,) = pod["containers"]
    assert {"name": "remote-write", "containerPort": 9402, "protocol": "TCP"} in container["ports"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v["secret"] for v in pod["volumes"] if "secret" in v}
    assert volumes["remote-write-token"]["secretName"] == "gpufleet-remote-write"
    assert volumes["remote-write-tls"]["secretName"] == "gpufleet-extender-tls"
    token_path = volumes["remote-write-token"]["items"][0]["path"]
    assert args["metricsSource"] == "push"
    assert args["remoteWriteAddress"] == ":9402"
    assert args["remoteWriteTokenFile"] == f"{mounts['remote-write-token']}/{token_path}"
    assert (args["remoteWriteCertFile"], args["remoteWriteKeyFile"]) == (
        f"{mounts['remote-write-tls']}/tls.crt",
        f"{mounts['remote-write-tls']}/tls.key",
    )
    # Only Prometheus reaches the receivers; the secure port stays open as before.
    ingress = found[("NetworkPolicy", "gpufleet-scheduler")]["spec"]["ingress"]
    assert ingress[0] == {"ports": [{"port": "https", "protocol": "TCP"}]}
    assert [p["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] for p in ingress[1]["from"]] == [
        "monitoring"
    ]
    # Prometheus is told every replica's receiver.
    plain = yaml.safe_load((manifests / "kube_scheduler" / "remote-write.yaml.snippet").read_text())
    assert [entry["url"] for entry in plain["remote_write"]] == [
        f"https://gpufleet-scheduler-{i}.gpufleet-metrics-receivers.gpufleet-system.svc:9402/api/v1/write"
        for i in range(workload["replicas"])
    ]


def test_plugin_mode_without_push_keeps_its_deployment_and_queries_prometheus(tmp_path):
    manifests = render_roles([ROLE], tmp_path)
    args = scheduler_config(manifests)["profiles"][0]["pluginConfig"][0]["args"]
    assert "metricsSource" not in args and "remoteWriteAddress" not in args
    found = objects(manifests)
    assert ("Deployment", "gpufleet-scheduler") in found
    assert ("NetworkPolicy", "gpufleet-scheduler") not in found
    assert not (manifests / "kube_scheduler" / "remote-write.yaml.snippet").exists()


# --- memory by fleet size ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "gpu_hosts", "receives"), [("plugin", 400, True), ("plugin", 20, False), ("secondary", 400, False)]
)
def test_memory_grows_with_the_fleet_gpuscore_receives(tmp_path, mode, gpu_hosts, receives):
    # GPUScore's receiver in each replica (plugin mode, push: by default from 200 GPU hosts on): 64 KiB per host,
    # rounded up to MiB, on the request and the limit; a secondary kube-scheduler holds no series.
    hosts = {f"gpu-{i:05d}": None for i in range(gpu_hosts)}
    inventory = write_inventory(
        tmp_path,
        {
            "all": {
                "children": {
                    "control_plane": {"hosts": {"cp-1": None}},
                    "gpu_nodes": {
                        "hosts": hosts,
                        "vars": {"mig_partition_config": MIG_OFF, "gpufleet_gpus_per_node": 8},
                    },
                }
            }
        },
    )
    manifests = render_roles([ROLE], tmp_path, inventory=inventory, extra_vars={"kube_scheduler_mode": mode})
    found = objects(manifests)
    workload = found.get(("StatefulSet", "gpufleet-scheduler")) or found[("Deployment", "gpufleet-scheduler")]
    assert (workload["kind"] == "StatefulSet") is receives
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    extra = -(-gpu_hosts * 64 // 1024) if receives else 0
    assert container["resources"]["requests"]["memory"] == f"{128 + extra}Mi"
    assert container["resources"]["limits"]["memory"] == f"{512 + extra}Mi"
