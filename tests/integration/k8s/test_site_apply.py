"""`playbooks/site.yml` on the lab inventory in apply mode, against the real apiserver: what a user runs in
production, with the lab's simulated GPUs. The first run creates everything, a second run changes nothing, and
a feature switched off takes its object away (apply) or its file (render)."""

from __future__ import annotations

import base64
import contextlib
import re
import threading
import time

import pytest
from conftest import FakeKubelet, ensure_namespace, lab_gpu_hosts, register_lab_gpu_nodes
from gpufleet_testsupport.collection import run_playbook, try_render
from gpufleet_testsupport.controlplane import serving_files
from gpufleet_testsupport.https_prometheus import FakePrometheus
from gpufleet_testsupport.waits import wait_for
from kubernetes import client as k8s
from kubernetes import dynamic
from kubernetes import watch as k8s_watch
from kubernetes.client.rest import ApiException

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def lab_nodes(core):
    """The lab's 20 GPU nodes, registered with the allocatable their layouts imply (the device plugin's
    after-repartition check then finds them right at once)."""
    kubelet = register_lab_gpu_nodes(core)
    yield {host: vars_.get("gpufleet_tenant") for host, vars_ in lab_gpu_hosts().items()}
    kubelet.stop()


# What the install guide has an operator provide before site.yml: the extender's TLS Secret (no cert-manager on the
# test cluster), the Prometheus readers' token (the roles store it in their Secrets), and the fleet's own images
# pushed to a registry. Preflight checks each of them.
INSTALL_VARS = {
    # Hong Kong patches kubeadm's static pods, which this control plane does not run: a plugin-mode fleet instead
    # (a gpufleet-scheduler Deployment, which the tests below upgrade and verify.yml's canaries are bound by).
    "kube_scheduler_mode": "plugin",
    "gpu_extender_tls_source": "secret",
    "gpu_extender_prometheus_token": "reader-token",
    "kube_scheduler_prometheus_token": "reader-token",
    "descheduler_prometheus_token": "reader-token",
    "gpu_extender_image": "registry.invalid/gpufleet/gpufleet-extender:0.1.0",
    "kube_scheduler_plugin_image": "registry.invalid/gpufleet/gpufleet-scheduler:v1.36.3",
}


def create_tls_secret(core, directory) -> None:
    files = serving_files(directory, "extender", ("gpufleet-extender.gpufleet-system.svc",))
    ensure_namespace(core, "gpufleet-system")
    data = {name: base64.b64encode(path.read_bytes()).decode() for name, path in files.items()}
    secret = {"metadata": {"name": "gpufleet-extender-tls"}, "type": "kubernetes.io/tls", "data": data}
    try:
        core.create_namespaced_secret("gpufleet-system", secret)
    except ApiException as err:
        if err.status != 409:
            raise


# Prometheus as the install guide has it: https with a certificate the cluster's CA issued for its Service, answering
# only to the readers' token. The controller reaches it as through `kubectl port-forward` (preflight_prometheus_url
# and the Service's name in the certificate), and preflight queries it as each reader will.
PROMETHEUS_SERVICE = "prometheus-operated.monitoring.svc"


@pytest.fixture(scope="module")
def cluster_prometheus(control_plane, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("prometheus")
    prometheus = FakePrometheus(workdir, pki=control_plane.pki.issue_server("prometheus", (PROMETHEUS_SERVICE,)))
    prometheus.rotate_token(INSTALL_VARS["gpu_extender_prometheus_token"])
    yield prometheus
    prometheus.close()


@pytest.fixture(scope="module")
def site_run(control_plane, core, lab_nodes, cluster_prometheus, tmp_path_factory):
    """Run site.yml in apply mode; the lab's state (simulated GPUs, host files) in a directory of its own."""
    lab_dir = tmp_path_factory.mktemp("lab")
    create_tls_secret(core, lab_dir / "pki")

    def run(extra: dict | None = None, playbook: str = "playbooks/site.yml"):
        extra_vars = {
            "gpufleet_k8s_mode": "apply",
            "gpufleet_kubeconfig": str(control_plane.kubeconfig),
            "gpufleet_lab_dir": str(lab_dir),
            "mig_partition_serial": "100%",
            "preflight_prometheus_url": cluster_prometheus.url,
            "preflight_prometheus_server_name": PROMETHEUS_SERVICE,
            **INSTALL_VARS,
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


# --- after the deploy: verify.yml, a broken install, uninstall.yml -------------------------------------------------


@pytest.fixture(scope="module")
def running_fleet(control_plane, core, lab_nodes, tmp_path_factory):
    """What a cluster adds to the applied objects: a node for the fleet's own Deployments, a default scheduler that
    places them and the node agents, a kubelet that reports their pods running and ready, and gpufleet-scheduler
    (the lab deploys the plugin mode) reading a Prometheus, which binds the canaries."""
    from test_scheduler_plugin import FakePrometheus, _plugin_scheduler

    workdir = tmp_path_factory.mktemp("running-fleet")
    # Two untainted nodes outside the pools for the fleet's own Deployments (the extender spreads its replicas one per
    # node), labelled with their hostname as a kubelet labels its node.
    others = ("hk-cp-01", "hk-cp-02")
    hostnames = {name: {"kubernetes.io/hostname": name} for name in others}
    kubelet = FakeKubelet(core, {name: {} for name in others}, labels=hostnames).register()
    # Play every node's kubelet (run and finish their pods): the lab's, and those other tests of the session left
    # behind, where the default scheduler may put the fleet's own pods too.
    kubelet.allocatable.update(
        {node.metadata.name: {} for node in core.list_node().items if node.metadata.name not in others}
    )
    kubelet.start()
    default = control_plane.start_scheduler(name="default-scheduler-verify")
    prometheus = FakePrometheus(workdir)
    plugin = _plugin_scheduler(control_plane, prometheus, workdir)
    next(plugin)
    stop = threading.Event()

    def report_running():
        while not stop.wait(0.5):
            with contextlib.suppress(ApiException):
                kubelet.run_pods()

    reporter = threading.Thread(target=report_running, daemon=True)
    reporter.start()
    yield kubelet
    stop.set()
    reporter.join(5)
    next(plugin, None)
    control_plane.stop_component(default)
    prometheus.close()
    kubelet.stop()


def run_lab_playbook(control_plane, tmp_path, playbook: str, extra: dict | None = None):
    extra_vars = {
        "gpufleet_k8s_mode": "apply",
        "gpufleet_kubeconfig": str(control_plane.kubeconfig),
        "gpufleet_lab_dir": str(tmp_path / "lab"),
        **INSTALL_VARS,
        **(extra or {}),
    }
    return run_playbook(playbook, "inventories/hongkong+lab", extra_vars, tmp_path)


def verify(control_plane, tmp_path, **extra):
    return run_lab_playbook(control_plane, tmp_path, "playbooks/verify.yml", extra)


def test_verify_passes_on_the_deployed_fleet_with_a_canary_bound_in_each_pool(
    control_plane, core, running_fleet, tmp_path
):
    # The node agents and the fleet's Deployments become ready as the fake kubelet reports their pods.
    deadline, result = time.monotonic() + 180, None
    while result is None or (result.returncode != 0 and time.monotonic() < deadline):
        result = verify(control_plane, tmp_path, verify_canary=False)
    assert result.returncode == 0, result.stdout[-6000:]
    # The canaries as created, seen by a watch (each is deleted as soon as it is bound): the image pinned and pulled
    # as the verify role's three image variables say.
    digest = "sha256:" + "c" * 64
    seen: dict[str, tuple[str, list[str]]] = {}
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            for event in k8s_watch.Watch().stream(
                core.list_pod_for_all_namespaces,
                label_selector="app.kubernetes.io/name=gpufleet-verify-canary",
                timeout_seconds=2,
            ):
                pod = event["object"]
                pulls = [secret.name for secret in pod.spec.image_pull_secrets or []]
                seen[pod.metadata.name] = (pod.spec.containers[0].image, pulls)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        result = verify(
            control_plane,
            tmp_path,
            verify_canary_image_digest=digest,
            verify_canary_image_pull_secrets=["canary-pull"],
        )
    finally:
        stop.set()
        watcher.join(5)
    assert result.returncode == 0, result.stdout[-6000:]
    for tenant, nodes in (("llm", 10), ("imagegen", 6), ("finnlp", 4)):
        line = re.search(rf"{tenant}: {nodes} node\(s\), OK; canary bound to (hk-gpu-\d+)", result.stdout)
        assert line, result.stdout[-4000:]
        assert seen[f"gpufleet-verify-canary-{tenant}"] == (f"registry.k8s.io/pause:3.10@{digest}", ["canary-pull"])
    assert recap(result.stdout)["localhost"]["failed"] == 0

    result = verify(control_plane, tmp_path, verify_canary_image_digest="latest")
    assert result.returncode != 0
    assert 'verify_canary_image_digest must be sha256:<64 lower-case hex> or null (got "latest")' in result.stdout


def test_verify_names_a_node_without_its_pool_label_and_one_short_of_its_layout(
    control_plane, core, running_fleet, tmp_path
):
    core.patch_node("hk-gpu-03", {"metadata": {"labels": {"gpufleet.io/tenant": None}}})
    allocatable = core.read_node("hk-gpu-18").status.allocatable
    full = {name: value for name, value in allocatable.items() if name.startswith("nvidia.com/")}
    short = {**full, "nvidia.com/mig-1g.10gb": str(int(full["nvidia.com/mig-1g.10gb"]) - 4)}
    running_fleet.set_allocatable("hk-gpu-18", short)
    try:
        result = verify(control_plane, tmp_path, verify_canary=False)
        assert result.returncode != 0
        text = " ".join(result.stdout.split())
        assert "node hk-gpu-03 is labelled gpufleet.io/tenant=(none), not llm" in text, text[-4000:]
        assert (
            f"node hk-gpu-18 advertises nvidia.com/mig-1g.10gb {int(full['nvidia.com/mig-1g.10gb']) - 4} "
            f"(layout: {full['nvidia.com/mig-1g.10gb']})" in text
        ), text[-4000:]
        assert "imagegen: 6 node(s), OK" in result.stdout
    finally:
        core.patch_node("hk-gpu-03", {"metadata": {"labels": {"gpufleet.io/tenant": "llm"}}})
        running_fleet.set_allocatable("hk-gpu-18", full)


def test_an_upgrade_rolls_the_extender_and_the_scheduler_with_one_always_ready(site_run, api, running_fleet):
    """site.yml over the install with new images and a changed setting: the extender's and the scheduler's
    Deployments roll (maxUnavailable 0, a PDB each), and at every moment of the rollout each has a ready replica,
    as the deployment controller and the (fake) kubelet play it out. (That a rerun changes nothing is the first
    test's.)"""
    apps = k8s.AppsV1Api(api)
    policy = k8s.PolicyV1Api(api)
    names = ("gpufleet-extender", "gpufleet-scheduler")
    for name in names:
        strategy = apps.read_namespaced_deployment(name, "gpufleet-system").spec.strategy.rolling_update
        assert (strategy.max_unavailable, strategy.max_surge) == (0, 1), name
        assert policy.read_namespaced_pod_disruption_budget(name, "gpufleet-system").spec.min_available >= 1, name

    upgrade = {
        "gpu_extender_image": "registry.invalid/gpufleet/gpufleet-extender:0.1.1",
        "kube_scheduler_plugin_image": "registry.invalid/gpufleet/gpufleet-scheduler:v1.36.4",
        "gpu_extender_log_level": "debug",
        # dcgm-exporter runs now, so preflight would ask Prometheus for the dcgm series, which this stand-in does not
        # hold here (test_preflight_queries_prometheus_as_each_reader_will covers that probe).
        "preflight_prometheus_probe": False,
    }
    lowest_ready = dict.fromkeys(names, 99)
    stop = threading.Event()

    def watch_ready():
        while not stop.wait(0.2):
            for name in names:
                status = apps.read_namespaced_deployment_status(name, "gpufleet-system").status
                lowest_ready[name] = min(lowest_ready[name], status.ready_replicas or 0)

    watcher = threading.Thread(target=watch_ready, daemon=True)
    watcher.start()
    try:
        site_run(upgrade)

        def rolled():
            deployments = [apps.read_namespaced_deployment(name, "gpufleet-system") for name in names]
            return all(
                d.status.updated_replicas == d.spec.replicas == d.status.ready_replicas == d.status.replicas
                and d.status.observed_generation == d.metadata.generation
                for d in deployments
            )

        wait_for(rolled, timeout=120, interval=1, what="the extender and the scheduler to finish rolling")
    finally:
        stop.set()
        watcher.join(5)
    images = {
        name: apps.read_namespaced_deployment(name, "gpufleet-system").spec.template.spec.containers[0].image
        for name in names
    }
    assert images == {
        "gpufleet-extender": upgrade["gpu_extender_image"],
        "gpufleet-scheduler": upgrade["kube_scheduler_plugin_image"],
    }
    assert min(lowest_ready.values()) >= 1, f"a Deployment had no ready replica during the rollout: {lowest_ready}"


def test_preflight_names_a_missing_secret_before_any_change(control_plane, running_fleet, tmp_path):
    result = run_lab_playbook(
        control_plane,
        tmp_path,
        "playbooks/preflight.yml",
        {
            "gpu_extender_prometheus_token": None,
            "gpu_extender_prometheus_auth_secret": "prometheus-reader",
            "preflight_prometheus_probe": False,
        },
    )
    assert result.returncode != 0
    text = " ".join(result.stdout.split())
    assert (
        "Secret gpufleet-system/prometheus-reader (gpu_extender_prometheus_auth_secret) is missing: set "
        "gpu_extender_prometheus_token (the role then stores it) or create it with key prometheusAuthToken" in text
    ), text[-4000:]
    assert "The cluster is not ready for gpufleet.mig (nothing was changed)" in text


def test_preflight_queries_prometheus_as_each_reader_will(
    control_plane, core, lab_nodes, running_fleet, cluster_prometheus, tmp_path
):
    """The readers' tokens, CA and URL as the roles will mount them: a Service name the controller cannot reach, a
    token Prometheus refuses, a CA ConfigMap that is not there, and no series while dcgm-exporter runs are each one
    line naming the reader and the fix."""

    def preflight(extra: dict) -> tuple[int, str]:
        # The cluster's side is judged on the controller; the GPU hosts' own checks are other tests' (none here).
        result = run_lab_playbook(control_plane, tmp_path, "playbooks/preflight.yml", {"preflight_checks": [], **extra})
        assert INSTALL_VARS["gpu_extender_prometheus_token"] not in result.stdout
        return result.returncode, " ".join(result.stdout.split())

    # The readers' own URL, a Service name the controller does not reach; the extender's CA (and so GPUScore's, by
    # the role's default) from a ConfigMap that is not there: named, and those two are not probed.
    code, text = preflight({"gpu_extender_prometheus_ca_configmap": "prometheus-ca"})
    assert code != 0
    for variable in ("gpu_extender_prometheus_ca_configmap", "kube_scheduler_prometheus_ca_configmap"):
        assert f"ConfigMap gpufleet-system/prometheus-ca ({variable}) is missing: create it with key ca.crt" in text
    assert "(the extender) did not" not in text and "(GPUScore) did not" not in text
    assert f"Prometheus at https://{PROMETHEUS_SERVICE}:9090 (the descheduler) did not answer the controller" in text
    assert "preflight_prometheus_url (for example a kubectl port-forward)" in text

    port_forward = {
        "preflight_prometheus_url": cluster_prometheus.url,
        "preflight_prometheus_server_name": PROMETHEUS_SERVICE,
    }

    # dcgm-exporter's pods run (the fake kubelet reports them ready): from now on Prometheus must hold their series.
    daemon_set = k8s.AppsV1Api(core.api_client).read_namespaced_daemon_set("dcgm-exporter", "gpufleet-node-agents")
    assert daemon_set.status.number_ready > 0
    code, text = preflight({**port_forward, "descheduler_prometheus_token": "stale"})
    assert code != 0
    assert (
        f"Prometheus at {cluster_prometheus.url} (the descheduler) refused the token in descheduler_prometheus_token"
        in text
    ), text[-4000:]
    for reader in ("the extender", "GPUScore"):
        assert f"({reader}): Prometheus answers but holds no dcgm series of any GPU node, though dcgm" in text, text

    cluster_prometheus.set_loads({node: [0.2, 0.2, 0.2] for node in sorted(lab_nodes)[:3]})
    try:
        code, text = preflight(port_forward)
    finally:
        cluster_prometheus.set_loads({})
    assert code == 0, text[-4000:]


def gpufleet_objects(api) -> list[str]:
    """Every object labelled as the collection's, of every kind the cluster serves that can be listed."""
    client = dynamic.DynamicClient(api)
    found = []
    for resource in client.resources.search():
        if "list" not in (resource.verbs or []) or "/" in resource.name or resource.kind.endswith("List"):
            continue
        try:
            items = resource.get(label_selector="app.kubernetes.io/part-of=gpufleet").items
        except ApiException:
            continue
        found += [f"{resource.kind} {item.metadata.namespace or ''}/{item.metadata.name}" for item in items]
    return sorted(set(found))


def test_uninstall_leaves_no_object_of_the_collection_then_changes_nothing(
    control_plane, api, core, running_fleet, lab_nodes, tmp_path
):
    assert len(gpufleet_objects(api)) > 50
    result = run_lab_playbook(control_plane, tmp_path, "playbooks/uninstall.yml")
    assert result.returncode == 0, result.stdout[-8000:]
    assert gpufleet_objects(api) == []
    for node in core.list_node().items:
        labels = node.metadata.labels or {}
        assert not {"gpufleet.io/gpu-node", "gpufleet.io/tenant", "nvidia.com/device-plugin.config"} & set(labels)
        assert not [t for t in node.spec.taints or [] if t.key == "gpufleet.io/tenant"], node.metadata.name
    # The tenants' namespaces stay, with their workloads, without gpufleet's Pod Security and tenant labels.
    for name in ("llm-inference", "imagegen", "finnlp", "finnlp-batch"):
        labels = core.read_namespace(name).metadata.labels or {}
        assert not [key for key in labels if key.startswith(("pod-security.", "gpufleet.io/", "app.kubernetes"))]
    for name in ("gpufleet-system", "gpufleet-node-agents"):
        with pytest.raises(ApiException) as gone:
            core.read_namespace(name)
        assert gone.value.status == 404

    again = run_lab_playbook(control_plane, tmp_path, "playbooks/uninstall.yml")
    assert again.returncode == 0, again.stdout[-8000:]
    changed = {host: counters["changed"] for host, counters in recap(again.stdout).items() if counters["changed"]}
    assert changed == {}, f"the second uninstall changed something: {changed}; tasks: {changed_tasks(again.stdout)}"
