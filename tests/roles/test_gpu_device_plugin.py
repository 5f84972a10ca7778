"""The gpu_device_plugin role: what it renders for the real inventories, the allocatable comparison, and the
after-repartition refresh run in apply mode against a small fake Kubernetes API (plugin pod deleted on exactly
the changed nodes, success once the node advertises its layout, a failure naming node/resource/expected/actual)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import sys
from urllib.parse import parse_qs, urlparse

import pytest
import yaml
from conftest import REPO, load_manifests, validate_manifests
from gpufleet_testsupport import servers
from gpufleet_testsupport.collection import render_roles, run_playbook, run_refresh, try_render
from gpufleet_testsupport.servers import QuietHandler

GPU_NODE_SELECTOR = {"gpufleet.io/gpu-node": "true"}


def by_kind_name(documents: dict[str, list[dict]]) -> dict[tuple[str, str], dict]:
    return {(d["kind"], d["metadata"]["name"]): d for docs in documents.values() for d in docs}


FINNLP_CONFIG = "time-sliced-mig-1g.10gb-x4"


def fleet_tenants(sharing: bool = True) -> dict:
    """The Hong Kong inventory's gpufleet_tenants, with or without its pools' sharing."""
    tenants = yaml.safe_load((REPO / "inventories/hongkong/group_vars/all/fleet.yml").read_text())["gpufleet_tenants"]
    if not sharing:
        for spec in tenants.values():
            spec.pop("sharing", None)
    return tenants


def check_agent_pods(objects: dict, config_hash: str) -> None:
    """What both agents' pods have in common, sharing or not."""
    for name in ("nvidia-device-plugin", "gpu-feature-discovery"):
        daemonset = objects[("DaemonSet", name)]
        pod = daemonset["spec"]["template"]
        assert pod["spec"]["nodeSelector"] == GPU_NODE_SELECTOR
        assert {"key": "gpufleet.io/tenant", "operator": "Exists"} in pod["spec"]["tolerations"]
        assert daemonset["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
        # A changed config must roll the pods: the annotation is the hash of exactly the configs.
        assert pod["metadata"]["annotations"]["gpufleet.io/config-hash"] == config_hash
        # The agents get no token; the runtime's default seccomp profile.
        assert pod["spec"]["automountServiceAccountToken"] is False
        assert pod["spec"]["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
        agent = next(c for c in pod["spec"]["containers"] if c["name"] == name)
        assert {"name": "CONFIG_FILE", "value": "/config/config.yaml"} in agent["env"]
        assert agent["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["SYS_ADMIN"]}
        assert {"name": "config", "mountPath": "/config", "readOnly": True} in agent["volumeMounts"]


def check_base_config(config: dict) -> None:
    assert config["version"] == "v1"
    assert config["flags"]["migStrategy"] == "mixed"
    # Devices reach a container only through the kubelet's mounts, never through a variable a pod can set itself.
    assert config["flags"]["plugin"]["deviceListStrategy"] == "volume-mounts"


@pytest.mark.parametrize("inventory", ["inventories/hongkong+lab", "inventories/hongkong"])
def test_renders_a_default_and_a_named_time_slicing_config_chosen_by_node_label(tmp_path, inventory):
    manifests = render_roles(["gpufleet.mig.gpu_device_plugin"], tmp_path, inventory)
    # Namespace, ConfigMap, ServiceAccount, ClusterRole and binding (config-manager), plugin and GFD DaemonSets,
    # the namespace's default-deny ingress NetworkPolicy
    assert validate_manifests(manifests) == 8
    documents = load_manifests(manifests)
    deny = by_kind_name(documents)[("NetworkPolicy", "gpufleet-node-agents-deny-ingress")]
    assert deny["spec"] == {"podSelector": {}, "policyTypes": ["Ingress"]}
    assert set(documents) == {"namespaces/gpufleet-node-agents.yaml", "gpu_device_plugin/device-plugin.yaml"}
    objects = by_kind_name(documents)
    # The node agents' own namespace: privileged (host paths, SYS_ADMIN), apart from the restricted gpufleet-system.
    namespace = objects[("Namespace", "gpufleet-node-agents")]["metadata"]["labels"]
    assert namespace["pod-security.kubernetes.io/enforce"] == "privileged"

    data = objects[("ConfigMap", "nvidia-device-plugin-config")]["data"]
    # One default, one named config per distinct sharing setting (finnlp's 1g.10gb x4 is the only one).
    assert set(data) == {"default", FINNLP_CONFIG}
    default, shared = yaml.safe_load(data["default"]), yaml.safe_load(data[FINNLP_CONFIG])
    check_base_config(default)
    check_base_config(shared)
    assert "sharing" not in default
    assert shared["flags"] == default["flags"]  # the named config differs only in its sharing
    assert shared["sharing"] == {
        "timeSlicing": {
            "renameByDefault": False,
            "failRequestsGreaterThanOne": True,
            "resources": [{"name": "nvidia.com/mig-1g.10gb", "replicas": 4}],
        }
    }
    check_agent_pods(objects, hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest())

    for name in ("nvidia-device-plugin", "gpu-feature-discovery"):
        pod = objects[("DaemonSet", name)]["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == "nvidia-device-plugin"
        assert pod["shareProcessNamespace"] is True
        (init,) = pod["initContainers"]
        sidecar = next(c for c in pod["containers"] if c["name"] == "config-manager")
        for manager, oneshot in ((init, "true"), (sidecar, "false")):
            assert manager["command"] == ["config-manager"]
            env = {e["name"]: e.get("value") for e in manager["env"]}
            assert env["ONESHOT"] == oneshot
            assert env["NODE_LABEL"] == "nvidia.com/device-plugin.config"
            assert env["DEFAULT_CONFIG"] == "default"
            assert env["CONFIG_FILE_DST"] == "/config/config.yaml"
            assert manager["securityContext"]["capabilities"] == {"drop": ["ALL"]}
            mounts = {m["name"]: m["mountPath"] for m in manager["volumeMounts"]}
            assert mounts["config-manager-token"] == "/var/run/secrets/kubernetes.io/serviceaccount"
        assert {e["name"]: e.get("value") for e in sidecar["env"]}["PROCESS_TO_SIGNAL"] == name
        # Only config-manager holds the API token.
        agent = next(c for c in pod["containers"] if c["name"] == name)
        assert "config-manager-token" not in {m["name"] for m in agent["volumeMounts"]}
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["available-configs"]["configMap"]["name"] == "nvidia-device-plugin-config"
        assert volumes["config"] == {"name": "config", "emptyDir": {}}

    # config-manager may read nodes, nothing else.
    assert objects[("ClusterRole", "gpufleet-nvidia-device-plugin")]["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}
    ]
    binding = objects[("ClusterRoleBinding", "gpufleet-nvidia-device-plugin")]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "nvidia-device-plugin", "namespace": "gpufleet-node-agents"}
    ]


def test_without_sharing_one_config_file_and_no_api_access(tmp_path):
    manifests = render_roles(
        ["gpufleet.mig.gpu_device_plugin"], tmp_path, extra_vars={"gpufleet_tenants": fleet_tenants(sharing=False)}
    )
    assert validate_manifests(manifests) == 5  # Namespace, ConfigMap, plugin and GFD DaemonSets, NetworkPolicy
    objects = by_kind_name(load_manifests(manifests))
    data = objects[("ConfigMap", "nvidia-device-plugin-config")]["data"]
    assert list(data) == ["config.yaml"]
    check_base_config(yaml.safe_load(data["config.yaml"]))
    check_agent_pods(objects, hashlib.sha256(data["config.yaml"].encode()).hexdigest())
    for name in ("nvidia-device-plugin", "gpu-feature-discovery"):
        pod = objects[("DaemonSet", name)]["spec"]["template"]["spec"]
        assert "serviceAccountName" not in pod and "initContainers" not in pod
        assert [c["name"] for c in pod["containers"]] == [name]
        assert {v["name"]: v for v in pod["volumes"]}["config"]["configMap"]["name"] == "nvidia-device-plugin-config"


def test_pools_with_the_same_sharing_share_a_config_and_bad_sharing_is_refused(tmp_path):
    tenants = fleet_tenants()
    tenants["imagegen"]["sharing"] = {"mig-1g.10gb": 4, "nvidia.com/mig-2g.20gb": 2}
    tenants["llm"]["sharing"] = {"gpu": 1}  # exclusive: no config
    manifests = render_roles(["gpufleet.mig.gpu_device_plugin"], tmp_path, extra_vars={"gpufleet_tenants": tenants})
    data = by_kind_name(load_manifests(manifests))[("ConfigMap", "nvidia-device-plugin-config")]["data"]
    assert set(data) == {"default", FINNLP_CONFIG, "time-sliced-mig-1g.10gb-x4_mig-2g.20gb-x2"}
    resources = yaml.safe_load(data["time-sliced-mig-1g.10gb-x4_mig-2g.20gb-x2"])["sharing"]["timeSlicing"]["resources"]
    assert resources == [
        {"name": "nvidia.com/mig-1g.10gb", "replicas": 4},
        {"name": "nvidia.com/mig-2g.20gb", "replicas": 2},
    ]

    tenants["llm"]["sharing"] = {"nvidia.com/gpu": 100}
    result, manifests = try_render(
        ["gpufleet.mig.gpu_device_plugin"], tmp_path / "bad", extra_vars={"gpufleet_tenants": tenants}
    )
    assert result.returncode != 0
    assert (
        "tenant llm: sharing of nvidia.com/gpu must be a whole number of replicas from 1 (exclusive) to 64, not 100"
        in " ".join(result.stdout.split())
    )
    assert not manifests.exists()


def test_gfd_can_be_left_out_and_strategy_changed(tmp_path):
    manifests = render_roles(
        ["gpufleet.mig.gpu_device_plugin"],
        tmp_path,
        extra_vars={"gpu_device_plugin_gfd_enabled": False, "gpu_device_plugin_mig_strategy": "single"},
    )
    objects = by_kind_name(load_manifests(manifests))
    assert ("DaemonSet", "gpu-feature-discovery") not in objects
    data = objects[("ConfigMap", "nvidia-device-plugin-config")]["data"]
    assert {yaml.safe_load(text)["flags"]["migStrategy"] for text in data.values()} == {"single"}


def test_an_image_digest_pins_both_agents_and_a_bad_one_is_refused(tmp_path):
    images = {}
    for run, digest in (("tag", None), ("pinned", "sha256:" + "0123456789abcdef" * 4)):
        manifests = render_roles(
            ["gpufleet.mig.gpu_device_plugin"], tmp_path / run, extra_vars={"gpu_device_plugin_image_digest": digest}
        )
        objects = by_kind_name(load_manifests(manifests))
        # Every container of both agents, config-manager's init container and sidecar included (the lab's
        # inventory time-slices a pool, so they are there).
        images[run] = {
            (name, container["name"]): container["image"]
            for name in ("nvidia-device-plugin", "gpu-feature-discovery")
            for pod in [objects[("DaemonSet", name)]["spec"]["template"]["spec"]]
            for container in pod["containers"] + pod.get("initContainers", [])
        }
    assert len(images["tag"]) >= 4  # both agents, each with config-manager
    tag = "nvcr.io/nvidia/k8s-device-plugin:v0.17.1"
    assert set(images["tag"].values()) == {tag}
    pinned = f"{tag}@sha256:{'0123456789abcdef' * 4}"
    assert images["pinned"] == dict.fromkeys(images["tag"], pinned)

    for bad in ("sha256:" + "0123456789ABCDEF" * 4, "0123456789abcdef" * 4, "sha256:abc"):
        result, manifests = try_render(
            ["gpufleet.mig.gpu_device_plugin"], tmp_path / "bad", extra_vars={"gpu_device_plugin_image_digest": bad}
        )
        assert result.returncode != 0
        assert "gpu_device_plugin_image_digest must be sha256:<64 lower-case hex> or null" in " ".join(
            result.stdout.split()
        )
        assert not (manifests / "gpu_device_plugin").exists()


# --- the allocatable comparison (vars/main.yml) -------------------------------------------------------------


def mismatches(tmp_path, expected: dict, allocatable: dict) -> list[dict]:
    """Evaluate the role's gpu_device_plugin_allocatable_mismatches expression for one node."""
    out = tmp_path / "mismatches.json"
    playbook = tmp_path / "compare.yml"
    playbook.write_text(
        yaml.safe_dump(
            [
                {
                    "hosts": "localhost",
                    "gather_facts": False,
                    "tasks": [
                        {"ansible.builtin.include_vars": {"file": str(REPO / "roles/gpu_device_plugin/vars/main.yml")}},
                        {
                            "ansible.builtin.copy": {
                                "dest": str(out),
                                "content": "{{ gpu_device_plugin_allocatable_mismatches | to_json }}",
                                "mode": "0644",
                            }
                        },
                    ],
                }
            ]
        )
    )
    extra = {
        "gpu_device_plugin_expected": expected,
        "gpu_device_plugin_allocatable": allocatable,
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
    }
    result = run_playbook(str(playbook), "inventories/hongkong+lab", extra, tmp_path)
    assert result.returncode == 0, result.stdout[-3000:]
    return json.loads(out.read_text())


def test_allocatable_matching_the_layout_has_no_mismatch(tmp_path):
    expected = {"nvidia.com/mig-3g.40gb": 8, "nvidia.com/mig-2g.20gb": 12, "nvidia.com/mig-1g.10gb": 4}
    # Quantities come as strings; non-GPU resources and a resource left at 0 by the old layout do not count.
    allocatable = {"cpu": "190", "memory": "2Ti", "nvidia.com/gpu": "0"} | {k: str(v) for k, v in expected.items()}
    assert mismatches(tmp_path, expected, allocatable) == []


def test_allocatable_mismatches_name_resource_expected_and_actual(tmp_path):
    expected = {"nvidia.com/mig-1g.10gb": 56}
    stale = {"cpu": "190", "nvidia.com/gpu": "8", "nvidia.com/mig-1g.10gb": "49"}
    assert mismatches(tmp_path, expected, stale) == [
        {"resource": "nvidia.com/gpu", "expected": 0, "actual": 8},
        {"resource": "nvidia.com/mig-1g.10gb", "expected": 56, "actual": 49},
    ]
    assert mismatches(tmp_path, {"nvidia.com/gpu": 8}, {"cpu": "190"}) == [
        {"resource": "nvidia.com/gpu", "expected": 8, "actual": 0}
    ]


# --- the after-repartition refresh --------------------------------------------------------------------------

NAMESPACE = "gpufleet-system"
NOT_FOUND = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404}
PLUGIN_LABELS = "app.kubernetes.io/name=nvidia-device-plugin,app.kubernetes.io/part-of=gpufleet"


class FakeCluster:
    """Just enough of the Kubernetes API for the refresh: discovery, pods (list/get/delete) and nodes (get).

    Each node runs one plugin pod; deleting it makes the node advertise `after[node]` when `plugin_restart_fixes`
    (the DaemonSet's fresh pod re-enumerated the MIG devices), else it keeps its stale allocatable. Like a kubelet,
    the node changes late: the first `stale_reads` reads of the node after the delete still show the old figures
    (the new plugin pod starts, registers, and the kubelet's next status update carries the devices)."""

    def __init__(
        self, before: dict[str, dict], after: dict[str, dict], plugin_restart_fixes: bool, stale_reads: int = 0
    ):
        self.allocatable = {node: dict(resources) for node, resources in before.items()}
        self.after = after
        self.plugin_restart_fixes = plugin_restart_fixes
        self.stale_reads = stale_reads
        self.pending: dict[str, int] = {}  # node -> stale reads left before its new allocatable shows
        self.node_reads: dict[str, int] = {}  # node -> reads since its plugin pod was deleted
        self.pods = {f"nvidia-device-plugin-{node}": node for node in before}
        self.pod_queries: list[dict] = []
        self.deleted: list[str] = []

    def pod(self, name: str) -> dict:
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": {}},
            "spec": {"nodeName": self.pods[name]},
        }

    def handle(self, method: str, url: str) -> tuple[int, dict]:
        parsed = urlparse(url)
        path, query = parsed.path.rstrip("/"), parse_qs(parsed.query)
        resource = lambda name, kind, namespaced: {  # noqa: E731
            "name": name, "singularName": kind.lower(), "namespaced": namespaced, "kind": kind,
            "verbs": ["get", "list", "delete", "watch"],
        }  # fmt: skip
        if path == "/version":
            return 200, {"major": "1", "minor": "33", "gitVersion": "v1.33.0"}
        if path == "/api":
            return 200, {"kind": "APIVersions", "versions": ["v1"]}
        if path == "/apis":
            return 200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": []}
        if path == "/api/v1":
            resources = [resource("pods", "Pod", True), resource("nodes", "Node", False)]
            return 200, {"kind": "APIResourceList", "groupVersion": "v1", "resources": resources}
        if path == f"/api/v1/namespaces/{NAMESPACE}/pods" and method == "GET":
            self.pod_queries.append({key: values[0] for key, values in query.items()})
            node = query.get("fieldSelector", [""])[0].removeprefix("spec.nodeName=")
            items = [self.pod(name) for name, on in self.pods.items() if on == node]
            return 200, {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items}
        if path.startswith(f"/api/v1/namespaces/{NAMESPACE}/pods/"):
            name = path.rsplit("/", 1)[1]
            if name not in self.pods:
                return 404, NOT_FOUND
            if method == "DELETE":
                pod = self.pod(name)
                node = self.pods.pop(name)
                self.deleted.append(name)
                self.node_reads[node] = 0
                if self.plugin_restart_fixes:
                    self.pending[node] = self.stale_reads
                return 200, pod
            return 200, self.pod(name)
        if path.startswith("/api/v1/nodes/"):
            node = path.rsplit("/", 1)[1]
            if node not in self.allocatable:
                return 404, NOT_FOUND
            if node in self.node_reads:
                self.node_reads[node] += 1
            if node in self.pending:
                if self.pending[node] == 0:
                    self.allocatable[node] = dict(self.after[node])
                    del self.pending[node]
                else:
                    self.pending[node] -= 1
            status = {"allocatable": self.allocatable[node]}
            return 200, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}, "status": status}
        return 404, NOT_FOUND


@pytest.fixture
def serve():
    """Start a FakeCluster on 127.0.0.1 (plain HTTP); returns (cluster, url). Stopped after the test."""
    with contextlib.ExitStack() as stack:

        def start(cluster: FakeCluster) -> str:
            class Handler(QuietHandler):
                def _reply(self):
                    length = int(self.headers.get("Content-Length") or 0)
                    if length:
                        self.rfile.read(length)
                    code, body = cluster.handle(self.command, self.path)
                    self.send_json(body, code)

                do_GET = do_DELETE = _reply

            return servers.url(stack.enter_context(servers.serve(Handler)))

        yield start


def write_kubeconfig(tmp_path, url: str):
    """A kubeconfig for the fake API at `url`."""
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": {"server": url}}],
        "users": [{"name": "fake", "user": {"token": "fake"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
        "current-context": "fake",
    }
    (tmp_path / "kubeconfig").write_text(yaml.safe_dump(kubeconfig))
    return tmp_path / "kubeconfig"


def refresh(tmp_path, url: str, changed: dict[str, bool], layouts: dict[str, list]) -> tuple[int, str]:
    """Run the role's refresh step in apply mode on a hand-made inventory against the API at `url`."""
    result = run_refresh(tmp_path, write_kubeconfig(tmp_path, url), NAMESPACE, changed, layouts, retries=3)
    return result.returncode, result.stdout + result.stderr


SEVEN_SMALL = [{"devices": "all", "mig_enabled": True, "mig_devices": {"1g.10gb": 7}}]
WHOLE = [{"devices": "all", "mig_enabled": False}]


def test_refresh_restarts_only_changed_nodes_and_waits_for_their_layout(tmp_path, serve):
    cluster = FakeCluster(
        before={"n1": {"cpu": "64", "nvidia.com/gpu": "1"}, "n2": {"cpu": "64", "nvidia.com/gpu": "1"}},
        after={"n1": {"cpu": "64", "nvidia.com/gpu": "0", "nvidia.com/mig-1g.10gb": "7"}, "n2": {}},
        plugin_restart_fixes=True,
    )
    code, output = refresh(tmp_path, serve(cluster), {"n1": True, "n2": False}, {"n1": SEVEN_SMALL, "n2": WHOLE})
    assert code == 0, output[-4000:]
    assert cluster.deleted == ["nvidia-device-plugin-n1"]
    assert cluster.pod_queries == [{"labelSelector": PLUGIN_LABELS, "fieldSelector": "spec.nodeName=n1"}]
    assert "1 GPU node(s) with a changed MIG layout: n1." in output


def test_refresh_waits_through_a_lagging_kubelet(tmp_path, serve):
    # The node shows the old figures on the first two reads after the restart: only a wait that polls again passes.
    cluster = FakeCluster(
        before={"n1": {"cpu": "64", "nvidia.com/gpu": "1"}},
        after={"n1": {"cpu": "64", "nvidia.com/gpu": "0", "nvidia.com/mig-1g.10gb": "7"}},
        plugin_restart_fixes=True,
        stale_reads=2,
    )
    code, output = refresh(tmp_path, serve(cluster), {"n1": True}, {"n1": SEVEN_SMALL})
    assert code == 0, output[-4000:]
    assert cluster.deleted == ["nvidia-device-plugin-n1"]
    assert cluster.node_reads == {"n1": 3}  # two stale reads, then the match: no more polls after it


def test_refresh_fails_naming_node_resource_expected_and_actual(tmp_path, serve):
    cluster = FakeCluster(
        before={"n1": {"cpu": "64", "nvidia.com/gpu": "1"}}, after={"n1": {}}, plugin_restart_fixes=False
    )
    code, output = refresh(tmp_path, serve(cluster), {"n1": True}, {"n1": SEVEN_SMALL})
    assert code != 0
    assert cluster.deleted == ["nvidia-device-plugin-n1"]
    assert (
        "Node n1: allocatable does not match its MIG layout after 3s: nvidia.com/gpu expected 0, actual 1; "
        "nvidia.com/mig-1g.10gb expected 7, actual 0." in " ".join(output.split())
    )
    assert "Traceback" not in output


def test_refresh_expects_a_time_sliced_pool_to_advertise_devices_times_replicas(tmp_path, serve):
    cluster = FakeCluster(
        before={"n1": {"nvidia.com/gpu": "1"}, "n2": {"nvidia.com/gpu": "1"}},
        after={"n1": {"nvidia.com/mig-1g.10gb": "28"}, "n2": {"nvidia.com/mig-1g.10gb": "7"}},
        plugin_restart_fixes=True,
    )
    tenants = {
        "nlp": {"group": "gpu_nodes", "namespaces": ["nlp"], "sharing": {"nvidia.com/mig-1g.10gb": 4}},
        "img": {"group": "gpu_nodes", "namespaces": ["img"]},
    }
    result = run_refresh(
        tmp_path,
        write_kubeconfig(tmp_path, serve(cluster)),
        NAMESPACE,
        {"n1": True, "n2": True},
        {"n1": SEVEN_SMALL, "n2": SEVEN_SMALL},
        tenants={"n1": "nlp", "n2": "img"},
        extra_vars={"gpufleet_tenants": tenants},
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert cluster.deleted == ["nvidia-device-plugin-n1", "nvidia-device-plugin-n2"]

    # A node of the shared pool that advertises its devices once (the plugin did not take the sharing) fails.
    cluster = FakeCluster(
        before={"n1": {"nvidia.com/gpu": "1"}}, after={"n1": {"nvidia.com/mig-1g.10gb": "7"}}, plugin_restart_fixes=True
    )
    result = run_refresh(
        tmp_path,
        write_kubeconfig(tmp_path, serve(cluster)),
        NAMESPACE,
        {"n1": True},
        {"n1": SEVEN_SMALL},
        tenants={"n1": "nlp"},
        extra_vars={"gpufleet_tenants": tenants},
    )
    assert result.returncode != 0
    assert "nvidia.com/mig-1g.10gb expected 28, actual 7" in " ".join(result.stdout.split())


def test_render_mode_skips_the_refresh_visibly(tmp_path):
    inventory = {
        "all": {
            "vars": {"gpufleet_namespace": NAMESPACE, "gpufleet_gpus_per_node": 1},
            "children": {
                "gpu_nodes": {
                    "hosts": {
                        "a": {"mig_partition_config": SEVEN_SMALL, "mig_partition_layout_changed": True},
                        "b": {"mig_partition_config": WHOLE, "mig_partition_layout_changed": False},
                        "c": {"mig_partition_config": WHOLE},
                    }
                }
            },
        }
    }
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump(inventory))
    playbook = tmp_path / "render.yml"
    playbook.write_text(
        yaml.safe_dump([{"hosts": "localhost", "gather_facts": False, "roles": ["gpufleet.mig.gpu_device_plugin"]}])
    )
    extra = {
        "gpufleet_k8s_mode": "render",
        "gpufleet_manifests_dir": str(tmp_path / "out"),
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
    }
    result = run_playbook(str(playbook), str(tmp_path / "inventory.yml"), extra, tmp_path)
    assert result.returncode == 0, result.stdout[-3000:]
    output = " ".join(result.stdout.split())
    assert "1 GPU node(s) with a changed MIG layout: a." in output
    assert "Render mode: plugin restart and allocatable check skipped" in output


TOOLKIT_CONFIG = """#accept-nvidia-visible-devices-as-volume-mounts = false
accept-nvidia-visible-devices-envvar-when-unprivileged = true
disable-require = false

[nvidia-container-cli]
environment = []
ldconfig = "@/sbin/ldconfig.real"
"""


def run_host_toolkit(tmp_path, config, *flags: str, **extra) -> str:
    """The role's host_toolkit entry point on localhost (as the GPU hosts' play runs it), with command-line flags
    such as --check; returns the output."""
    playbook = tmp_path / "host-toolkit.yml"
    include = {"name": "gpufleet.mig.gpu_device_plugin", "tasks_from": "host_toolkit"}
    playbook.write_text(
        yaml.safe_dump(
            [{"hosts": "localhost", "gather_facts": False, "tasks": [{"ansible.builtin.import_role": include}]}]
        )
    )
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump({"all": {"hosts": {"localhost": None}}}))
    extra = {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        "gpu_device_plugin_toolkit_config": str(config),
        **extra,
    }
    result = run_playbook(str(playbook), str(tmp_path / "inventory.yml"), extra, tmp_path, flags)
    assert result.returncode == 0, result.stdout[-4000:]
    return result.stdout


def test_host_toolkit_refuses_the_variable_and_reads_mounts(tmp_path):
    config = tmp_path / "etc" / "nvidia-container-runtime" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text(TOOLKIT_CONFIG)

    # Check mode changes nothing on the host but reports what would change.
    output = run_host_toolkit(tmp_path, config, "--check", "--diff")
    assert config.read_text() == TOOLKIT_CONFIG
    assert "changed=1" in output

    output = run_host_toolkit(tmp_path, config)
    assert "changed=1" in output
    lines = config.read_text().splitlines()
    assert "accept-nvidia-visible-devices-envvar-when-unprivileged = false" in lines
    assert "accept-nvidia-visible-devices-as-volume-mounts = true" in lines
    assert not any(line.endswith("= true") and "envvar" in line for line in lines)
    # Both stay top-level keys (before the first table) and the rest of the file is untouched.
    assert max(lines.index(k) for k in lines if k.startswith("accept-")) < lines.index("[nvidia-container-cli]")
    assert 'ldconfig = "@/sbin/ldconfig.real"' in lines and "disable-require = false" in lines

    assert "changed=0" in run_host_toolkit(tmp_path, config)


def test_host_toolkit_envvar_strategy_and_switched_off(tmp_path):
    config = tmp_path / "config.toml"
    run_host_toolkit(tmp_path, config, gpu_device_plugin_device_list_strategy="envvar")
    lines = config.read_text().splitlines()
    # Even with the envvar strategy an unprivileged pod's own variable is refused (the plugin's pods run with
    # SYS_ADMIN, which the toolkit counts as privileged).
    assert sorted(lines) == [
        "accept-nvidia-visible-devices-as-volume-mounts = false",
        "accept-nvidia-visible-devices-envvar-when-unprivileged = false",
    ]
    other = tmp_path / "absent.toml"
    run_host_toolkit(tmp_path, other, gpu_device_plugin_manage_toolkit=False)
    assert not other.exists()
