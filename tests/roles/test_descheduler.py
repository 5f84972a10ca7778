"""The descheduler role: strict validation of its core objects, the DeschedulerPolicy's own structure (not a core
kind: checked here against descheduler v1alpha2's fields and rules), the node selector covering the same nodes
as dcgm-exporter, the derived PromQL load query evaluated by promtool on synthetic dcgm-exporter series, and the
errors it refuses; and the optional consolidation instances (HighNodeUtilization on a tenant pool's GPU
resources, issue 7)."""

from __future__ import annotations

import subprocess
from urllib.parse import urlparse

import pytest
import yaml
from conftest import load_manifests, validate_manifests
from gpufleet_testsupport.collection import render_roles, require_tool, try_render

# descheduler v1alpha2 fields (pkg/api/v1alpha2/types.go, LowNodeUtilizationArgs, DefaultEvictorArgs).
POLICY_FIELDS = {
    "apiVersion", "kind", "profiles", "nodeSelector", "maxNoOfPodsToEvictPerNode", "maxNoOfPodsToEvictPerNamespace",
    "maxNoOfPodsToEvictTotal", "evictionFailureEventNotification", "metricsCollector", "metricsProviders",
    "gracePeriodSeconds",
}  # fmt: skip
PROFILE_FIELDS = {"name", "pluginConfig", "plugins"}
EXTENSION_POINTS = {"presort", "sort", "deschedule", "balance", "filter", "preEvictionFilter"}
LOW_NODE_UTILIZATION_FIELDS = {
    "useDeviationThresholds", "thresholds", "targetThresholds", "numberOfNodes", "metricsUtilization",
    "evictionModes", "evictableNamespaces", "evictionLimits",
}  # fmt: skip
DEFAULT_EVICTOR_FIELDS = {
    "nodeSelector", "evictLocalStoragePods", "evictDaemonSetPods", "evictSystemCriticalPods", "ignorePvcPods",
    "evictFailedBarePods", "labelSelector", "priorityThreshold", "nodeFit", "minReplicas", "minPodAge",
    "ignorePodsWithoutPDB", "noEvictionPolicy", "podProtections",
}  # fmt: skip
# HighNodeUtilizationArgs (pkg/framework/plugins/nodeutilization/types.go).
HIGH_NODE_UTILIZATION_FIELDS = {"thresholds", "numberOfNodes", "metricsUtilization", "evictableNamespaces",
                                "evictionModes"}  # fmt: skip
BALANCE_PLUGINS = {"LowNodeUtilization", "HighNodeUtilization", "RemoveDuplicates",
                   "RemovePodsViolatingTopologySpreadConstraint"}  # fmt: skip


def policy_errors(policy: dict) -> list[str]:
    """What descheduler would refuse (or silently ignore) in a v1alpha2 policy that uses Prometheus metrics."""
    errors = []
    if policy.get("apiVersion") != "descheduler/v1alpha2" or policy.get("kind") != "DeschedulerPolicy":
        errors.append("not a descheduler/v1alpha2 DeschedulerPolicy")
    errors += [f"unknown policy field {key}" for key in set(policy) - POLICY_FIELDS]
    providers = policy.get("metricsProviders", [])
    sources = [p.get("source") for p in providers]
    if len(sources) != len(set(sources)):
        errors.append("a metrics source is configured twice")
    for provider in providers:
        if provider.get("source") == "Prometheus":
            url = urlparse(provider.get("prometheus", {}).get("url", ""))
            if url.scheme not in ("http", "https") or not url.hostname:
                errors.append("prometheus URL is required when prometheus is enabled")
    selector = policy.get("nodeSelector")
    if selector is not None and not all(part.count("=") == 1 for part in selector.split(",")):
        errors.append(f"nodeSelector {selector!r} is not a k=v,... label selector")
    for key in ("maxNoOfPodsToEvictPerNode", "maxNoOfPodsToEvictPerNamespace", "maxNoOfPodsToEvictTotal"):
        if key in policy and not (isinstance(policy[key], int) and policy[key] >= 0):
            errors.append(f"{key} must be a non-negative integer")
    names = [profile.get("name") for profile in policy.get("profiles", [])]
    if not names or len(names) != len(set(names)):
        errors.append("profiles must be a non-empty list with unique names")
    for profile in policy.get("profiles", []):
        errors += [f"unknown profile field {key}" for key in set(profile) - PROFILE_FIELDS]
        configs = {config["name"]: config.get("args", {}) for config in profile.get("pluginConfig", [])}
        errors += [f"unknown extension point {key}" for key in set(profile.get("plugins", {})) - EXTENSION_POINTS]
        enabled = {name for point in profile.get("plugins", {}).values() for name in point.get("enabled", [])}
        errors += [f"{name} configured but not enabled" for name in set(configs) - enabled - {"DefaultEvictor"}]
        if set(profile.get("plugins", {}).get("balance", {}).get("enabled", [])) - BALANCE_PLUGINS:
            errors.append("balance enables a plugin that is not a balance plugin")
        errors += [
            f"unknown DefaultEvictor arg {k}" for k in set(configs.get("DefaultEvictor", {})) - DEFAULT_EVICTOR_FIELDS
        ]
        if "LowNodeUtilization" in configs:
            errors += low_node_utilization_errors(configs["LowNodeUtilization"], "Prometheus" in sources)
        if "HighNodeUtilization" in configs:
            errors += high_node_utilization_errors(configs["HighNodeUtilization"])
    return errors


def high_node_utilization_errors(args: dict) -> list[str]:
    errors = [f"unknown HighNodeUtilization arg {key}" for key in set(args) - HIGH_NODE_UTILIZATION_FIELDS]
    thresholds = args.get("thresholds") or {}
    if not thresholds:
        errors.append("HighNodeUtilization needs thresholds")
    errors += [f"{name}: threshold must be 0..100" for name, value in thresholds.items() if not 0 <= value <= 100]
    if set(args.get("evictableNamespaces", {})) - {"exclude"}:
        errors.append("only exclude namespaces can be set for HighNodeUtilization")
    return errors


def low_node_utilization_errors(args: dict, prometheus_provider: bool) -> list[str]:
    errors = [f"unknown LowNodeUtilization arg {key}" for key in set(args) - LOW_NODE_UTILIZATION_FIELDS]
    low, target = args.get("thresholds", {}), args.get("targetThresholds", {})
    if not low or set(low) != set(target):
        errors.append("thresholds and targetThresholds must configure the same resources")
    for resource, value in low.items():
        if not (0 <= value <= target.get(resource, -1) <= 100):
            errors.append(f"{resource}: need 0 <= threshold <= targetThreshold <= 100")
    metrics = args.get("metricsUtilization")
    if metrics and metrics.get("source") == "Prometheus":
        if not metrics.get("prometheus", {}).get("query"):
            errors.append("prometheus query is required when metrics source is set to Prometheus")
        if set(low) != {"MetricResource"} or set(target) != {"MetricResource"}:
            errors.append('thresholds are expected to specify a single instance of "MetricResource" resource')
        if not prometheus_provider:
            errors.append("metricsUtilization uses Prometheus but no Prometheus metrics provider is configured")
    if set(args.get("evictableNamespaces", {})) - {"exclude"}:
        errors.append("only exclude namespaces can be set for LowNodeUtilization")
    return errors


def rendered(tmp_path, inventory="inventories/hongkong+lab", extra_vars=None, roles=("gpufleet.mig.descheduler",)):
    manifests = render_roles(list(roles), tmp_path, inventory, extra_vars)
    documents = load_manifests(manifests)
    objects = {(d["kind"], d["metadata"]["name"]): d for docs in documents.values() for d in docs}
    policy = yaml.safe_load(objects[("ConfigMap", "descheduler-policy")]["data"]["policy.yaml"])
    return manifests, objects, policy


def load_args(policy: dict) -> dict:
    (profile,) = [p for p in policy["profiles"] if p["name"] == "gpu-load"]
    return {c["name"]: c.get("args", {}) for c in profile["pluginConfig"]}["LowNodeUtilization"]


@pytest.mark.parametrize("inventory", ["inventories/hongkong+lab", "inventories/hongkong"])
def test_renders_a_valid_policy_covering_the_dcgm_exporter_nodes(tmp_path, inventory):
    roles = ("gpufleet.mig.dcgm_exporter", "gpufleet.mig.descheduler")
    manifests, objects, policy = rendered(tmp_path, inventory, roles=roles)
    assert validate_manifests(manifests) >= 8
    assert policy_errors(policy) == []

    # The processed nodes and the nodes that export GPU load must be the same set, else a run aborts.
    exporter_nodes = objects[("DaemonSet", "dcgm-exporter")]["spec"]["template"]["spec"]["nodeSelector"]
    assert policy["nodeSelector"] == ",".join(f"{k}={v}" for k, v in exporter_nodes.items())

    args = load_args(policy)
    assert args["thresholds"] == {"MetricResource": 20} and args["targetThresholds"] == {"MetricResource": 70}
    assert "gpufleet-system" in args["evictableNamespaces"]["exclude"]
    query = args["metricsUtilization"]["prometheus"]["query"]
    for profile, slices in {"1g.10gb": 1, "2g.20gb": 2, "3g.40gb": 3}.items():  # the inventory's layouts
        assert f'GPU_I_PROFILE="{profile}"' in query and f"* {slices})" in query
    assert '"Hostname"' in query and '"hostname"' in query and "DCGM_FI_DEV_GPU_UTIL" not in query

    deployment = objects[("Deployment", "descheduler")]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert "--descheduling-interval=5m" in container["args"]
    assert deployment["spec"]["replicas"] == 1


def test_policy_check_rejects_what_descheduler_rejects(tmp_path):
    _, _, policy = rendered(tmp_path)
    args = load_args(policy)
    broken = [
        ({"thresholds": {"MetricResource": 80}}, "need 0 <= threshold"),
        ({"thresholds": {"cpu": 20}, "targetThresholds": {"cpu": 50}}, "single instance"),
        ({"metricsUtilization": {"source": "Prometheus", "prometheus": {}}}, "query is required"),
        ({"evictableNamespaces": {"include": ["a"]}}, "only exclude"),
        ({"typo": 1}, "unknown LowNodeUtilization arg typo"),
    ]
    for change, message in broken:
        bad = yaml.safe_load(yaml.safe_dump(policy))
        load_args(bad).update(change)
        assert any(message in error for error in policy_errors(bad)), (change, policy_errors(bad))
    without_url = yaml.safe_load(yaml.safe_dump(policy))
    without_url["metricsProviders"][0]["prometheus"]["url"] = ""
    assert "prometheus URL is required when prometheus is enabled" in policy_errors(without_url)
    assert args  # the unmodified policy's args were found


def test_variables_reach_the_policy(tmp_path):
    extra = {
        "descheduler_low_threshold": 10,
        "descheduler_target_threshold": 85,
        "descheduler_max_evictions_total": None,
        "descheduler_excluded_namespaces": ["kube-system", "finnlp-batch"],
        "descheduler_prometheus_url": "https://prometheus.example.invalid:9091",
        "descheduler_prometheus_auth_secret": "prometheus-token",
        "descheduler_prometheus_token": "not-to-be-rendered",
        "descheduler_interval": "2m",
    }
    manifests, objects, policy = rendered(tmp_path, extra_vars=extra)
    validate_manifests(manifests)
    assert policy_errors(policy) == []
    args = load_args(policy)
    assert args["thresholds"] == {"MetricResource": 10} and args["targetThresholds"] == {"MetricResource": 85}
    assert args["evictableNamespaces"]["exclude"] == ["kube-system", "finnlp-batch"]
    assert "maxNoOfPodsToEvictTotal" not in policy and policy["maxNoOfPodsToEvictPerNode"] == 1
    prometheus = policy["metricsProviders"][0]["prometheus"]
    assert prometheus == {
        "url": "https://prometheus.example.invalid:9091",
        "authToken": {"secretReference": {"namespace": "gpufleet-system", "name": "prometheus-token"}},
    }
    assert ("Role", "gpufleet-descheduler-prometheus-token") in objects
    # The token never reaches a rendered file (apply mode stores it in the Secret, not logged).
    assert "not-to-be-rendered" not in "".join(path.read_text() for path in manifests.rglob("*") if path.is_file())
    query = args["metricsUtilization"]["prometheus"]["query"]
    assert query.count('job="dcgm-exporter",namespace="gpufleet-node-agents"') == query.count("DCGM_FI_")
    container = objects[("Deployment", "descheduler")]["spec"]["template"]["spec"]["containers"][0]
    assert "--descheduling-interval=2m" in container["args"]


def test_query_weighs_only_the_profiles_of_a_hand_made_inventory(tmp_path):
    inventory = {
        "all": {
            "vars": {"gpufleet_namespace": "gpufleet-system", "gpufleet_gpus_per_node": 2},
            "children": {
                "gpu_nodes": {
                    "hosts": {
                        "big": {"mig_partition_config": [{"devices": "all", "mig_enabled": True,
                                                          "mig_devices": {"4g.40gb": 1, "3g.40gb": 1}}]},
                        "whole": {"mig_partition_config": [{"devices": "all", "mig_enabled": False}]},
                    }
                }
            },
        }
    }  # fmt: skip
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump(inventory))
    _, _, policy = rendered(tmp_path, inventory=str(path))
    query = load_args(policy)["metricsUtilization"]["prometheus"]["query"]
    assert 'GPU_I_PROFILE="4g.40gb"' in query and "* 4)" in query and "* 0 + 4)" in query
    assert 'GPU_I_PROFILE="3g.40gb"' in query and "1g.10gb" not in query and "2g.20gb" not in query


# --- the query, evaluated --------------------------------------------------------------------------------------


def series(
    name_label: str,
    host: str,
    gpu: int,
    value: float,
    profile: str = "",
    instance_id: str = "",
    job: str = "dcgm-exporter",
    namespace: str = "gpufleet-node-agents",
) -> dict:
    labels = {name_label: host, "gpu": str(gpu), "instance": f"10.0.0.{gpu}:9400", "job": job, "namespace": namespace}
    if profile:
        labels |= {"GPU_I_PROFILE": profile, "GPU_I_ID": instance_id}
    text = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{text}}}", "values": f"{value}x10"}


def test_query_gives_each_gpu_node_its_slice_weighted_load(tmp_path):
    require_tool("promtool", "prometheus")
    _, _, policy = rendered(tmp_path)
    query = load_args(policy)["metricsUtilization"]["prometheus"]["query"]

    inputs, expected = [], {}
    # Released exporter (Hostname): a node of 8 whole GPUs - the plain mean.
    whole = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]
    inputs += [series("Hostname", "hk-gpu-01", gpu, v) for gpu, v in enumerate(whole)]
    expected["hk-gpu-01"] = sum(whole) / len(whole)
    # Newer exporter (hostname): GPU 0 as two 3g.40gb, GPU 1 as three 2g.20gb + one 1g.10gb. The GPU-level series
    # of the MIG-enabled GPU 0 must not count on top of its instances.
    mig = [(0, "3g.40gb", "1", 0.9, 3), (0, "3g.40gb", "2", 0.3, 3), (1, "2g.20gb", "3", 0.5, 2),
           (1, "2g.20gb", "4", 0.0, 2), (1, "2g.20gb", "5", 1.0, 2), (1, "1g.10gb", "6", 0.2, 1)]  # fmt: skip
    inputs += [series("hostname", "hk-gpu-11", gpu, v, p, i) for gpu, p, i, v, _ in mig]
    inputs.append(series("hostname", "hk-gpu-11", 0, 0.99))
    expected["hk-gpu-11"] = sum(v * w for *_, v, w in mig) / sum(w for *_, w in mig)
    # A tenant's exporter (its own job, its own namespace) claims hk-gpu-01 busy and a node of its own: the query
    # reads only the fleet exporter's job and namespace, so neither counts.
    inputs += [series("Hostname", "hk-gpu-01", gpu, 1.0, job="gpu-metrics", namespace="finnlp") for gpu in range(8)]
    inputs += [series("Hostname", "hk-gpu-66", 0, 1.0, job="dcgm-exporter", namespace="finnlp")]

    test_file = tmp_path / "query_test.yml"
    test_file.write_text(
        yaml.safe_dump(
            {
                "rule_files": [],
                "evaluation_interval": "1m",
                "tests": [
                    {
                        "interval": "1m",
                        "input_series": inputs,
                        "promql_expr_test": [
                            # One sample per GPU node, named after the host label, not the scrape address.
                            {
                                "expr": f"count by (instance) ({query})",
                                "eval_time": "5m",
                                "exp_samples": [{"labels": f'{{instance="{node}"}}', "value": 1} for node in expected],
                            },
                        ]
                        + [
                            # Each node's load, to within float rounding (promtool compares exactly).
                            {
                                "expr": f'abs(sum(({query}) and on(instance) label_replace(vector(1), "instance", '
                                f'"{node}", "", "")) - {load!r}) < bool 1e-9',
                                "eval_time": "5m",
                                "exp_samples": [{"labels": "{}", "value": 1}],
                            }
                            for node, load in expected.items()
                        ],
                    }
                ],
            },
            sort_keys=False,
        )
    )
    result = subprocess.run(["promtool", "test", "rules", str(test_file)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert min(expected.values()) >= 0 and max(expected.values()) <= 1


# --- refused input -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"descheduler_prometheus_url": "http://prometheus.monitoring.svc:9090"}, "must be https://"),
        ({"descheduler_prometheus_auth_secret": None}, "sends its own service account token"),
    ],
)
def test_plain_http_and_a_missing_token_secret_are_refused(tmp_path, extra, message):
    result, _ = try_render(["descheduler"], tmp_path, extra_vars=extra)
    assert result.returncode != 0
    assert message in " ".join(result.stdout.split())


def test_bad_thresholds_fail_with_a_clear_message(tmp_path):
    thresholds = {"descheduler_low_threshold": 80, "descheduler_target_threshold": 50}
    result, manifests = try_render(["descheduler"], tmp_path, extra_vars=thresholds)
    assert result.returncode != 0
    assert "Need 0 <= descheduler_low_threshold (80) <= descheduler_target_threshold (50) <= 100" in " ".join(
        result.stdout.split()
    )
    assert not (manifests / "descheduler").exists()


def render(tmp_path, pools, inventory="inventories/hongkong+lab", **extra):
    manifests = render_roles(
        ["gpufleet.mig.descheduler"], tmp_path, inventory, {"descheduler_consolidation_pools": pools, **extra}
    )
    objects = {}
    for path in sorted(manifests.rglob("*.y*ml")):
        for document in yaml.safe_load_all(path.read_text()):
            if document:
                objects[(document["kind"], document["metadata"]["name"])] = document
    return manifests, objects


def policy_of(objects, name):
    return yaml.safe_load(objects[("ConfigMap", f"{name}-policy")]["data"]["policy.yaml"])


def test_off_by_default(tmp_path):
    _, objects = render(tmp_path, [])
    assert not [key for key in objects if "consolidate" in key[1]]
    assert ("Deployment", "descheduler") in objects


@pytest.mark.parametrize("inventory", ["inventories/hongkong+lab", "inventories/hongkong"])
def test_one_instance_per_pool_on_the_pool_nodes_only(tmp_path, inventory):
    manifests, objects = render(tmp_path, ["llm", "imagegen"], inventory)
    assert validate_manifests(manifests) >= 10

    llm = policy_of(objects, "descheduler-consolidate-llm")
    assert policy_errors(llm) == []
    assert llm["nodeSelector"] == "gpufleet.io/gpu-node=true,gpufleet.io/tenant=llm"
    (profile,) = llm["profiles"]
    configs = {c["name"]: c["args"] for c in profile["pluginConfig"]}
    assert high_node_utilization_errors(configs["HighNodeUtilization"]) == []
    assert configs["HighNodeUtilization"]["thresholds"] == {"nvidia.com/gpu": 40}
    assert profile["plugins"]["balance"]["enabled"] == ["HighNodeUtilization"]
    # Evict only pods that fit on another node of the same pool, never from system namespaces, within the limits.
    assert configs["DefaultEvictor"]["nodeFit"] is True
    assert configs["DefaultEvictor"]["nodeSelector"] == llm["nodeSelector"]
    assert "gpufleet-system" in configs["HighNodeUtilization"]["evictableNamespaces"]["exclude"]
    assert (llm["maxNoOfPodsToEvictPerNode"], llm["maxNoOfPodsToEvictTotal"]) == (1, 4)
    assert "metricsProviders" not in llm  # allocation, not load: no Prometheus needed

    imagegen = policy_of(objects, "descheduler-consolidate-imagegen")
    thresholds = {c["name"]: c["args"] for c in imagegen["profiles"][0]["pluginConfig"]}["HighNodeUtilization"]
    assert thresholds["thresholds"] == {
        "nvidia.com/mig-1g.10gb": 40, "nvidia.com/mig-2g.20gb": 40, "nvidia.com/mig-3g.40gb": 40,
    }  # fmt: skip

    # Each instance has its own Deployment, reading its own policy, with a selector disjoint from the main one.
    main = objects[("Deployment", "descheduler")]
    consolidate = objects[("Deployment", "descheduler-consolidate-llm")]
    main_selector = main["spec"]["selector"]["matchLabels"]
    pod_labels = consolidate["spec"]["template"]["metadata"]["labels"]
    assert not all(pod_labels.get(k) == v for k, v in main_selector.items())
    spec = consolidate["spec"]["template"]["spec"]
    assert spec["volumes"][0]["configMap"]["name"] == "descheduler-consolidate-llm-policy"
    assert spec["serviceAccountName"] == "descheduler"
    assert "--descheduling-interval=30m" in spec["containers"][0]["args"]
    selectors = [objects[("Deployment", f"descheduler-consolidate-{p}")]["spec"]["selector"]["matchLabels"]
                 for p in ("llm", "imagegen")]  # fmt: skip
    assert selectors[0] != selectors[1]


def test_variables_reach_the_consolidation_policy(tmp_path):
    extra = {
        "descheduler_consolidation_threshold": 25,
        "descheduler_consolidation_number_of_nodes": 1,
        "descheduler_consolidation_interval": "1h",
        "descheduler_max_evictions_total": None,
    }
    manifests, objects = render(tmp_path, ["finnlp"], **extra)
    validate_manifests(manifests)
    policy = policy_of(objects, "descheduler-consolidate-finnlp")
    args = {c["name"]: c["args"] for c in policy["profiles"][0]["pluginConfig"]}["HighNodeUtilization"]
    assert args["thresholds"] == {"nvidia.com/mig-1g.10gb": 25} and args["numberOfNodes"] == 1
    assert "maxNoOfPodsToEvictTotal" not in policy
    container = objects[("Deployment", "descheduler-consolidate-finnlp")]["spec"]["template"]["spec"]["containers"][0]
    assert "--descheduling-interval=1h" in container["args"]


def test_policy_check_rejects_bad_high_node_utilization_args():
    assert "HighNodeUtilization needs thresholds" in high_node_utilization_errors({})
    assert "unknown HighNodeUtilization arg targetThresholds" in high_node_utilization_errors(
        {"thresholds": {"nvidia.com/gpu": 40}, "targetThresholds": {"nvidia.com/gpu": 80}}
    )
    assert any("0..100" in e for e in high_node_utilization_errors({"thresholds": {"nvidia.com/gpu": 140}}))


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"descheduler_consolidation_pools": ["gpt"]}, "unknown: gpt"),
        ({"descheduler_consolidation_pools": ["llm"], "descheduler_consolidation_threshold": 0}, "must be in 1..100"),
    ],
)
def test_bad_consolidation_settings_fail_with_a_clear_message(tmp_path, extra, message):
    result, manifests = try_render(["descheduler"], tmp_path, extra_vars=extra)
    assert result.returncode != 0
    assert message in " ".join(result.stdout.split())
    assert not (manifests / "descheduler").exists()
