"""The extender with KUBE_API=kubeconfig against the real apiserver: in-flight accounting from real bindings, tenant
pools from real node and namespace labels, recovery after every watch breaks (apiserver restart), and the gpu_extender
role's RBAC: its ServiceAccount token with exactly the role's ClusterRole works, and one permission less (or a token
the apiserver rejects) is refused clearly (/readyz 503 naming it, an error log line, a counter) and recovered from
without a restart once the permission is back.

The extender runs as its real process (`python -m gpufleet_extender serve`) on 127.0.0.1, fed a static dcgm-exporter
file; no scheduler runs: the tests bind pods with the Binding API, as a scheduler would."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml
from conftest import REPO, FakeKubelet, ensure_namespace, kubeconfig_for_token
from gpufleet_testsupport.collection import try_render
from gpufleet_testsupport.exposition import DeviceLoad, render_exposition
from gpufleet_testsupport.ports import free_port
from gpufleet_testsupport.waits import wait_for
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

pytestmark = pytest.mark.integration

GPU = "nvidia.com/gpu"
# The labels the tenants role puts on namespaces and GPU nodes.
_TENANTS_VARS = yaml.safe_load((REPO / "roles" / "tenants" / "vars" / "main.yml").read_text())
TENANT_KEY = _TENANTS_VARS["tenants_tenant_key"]
GPU_NODE_LABEL = _TENANTS_VARS["tenants_gpu_node_label"]
# A scheduler name nobody serves: the tests bind their pods themselves even if a test's scheduler is still up.
NO_SCHEDULER = "gpufleet-test-nobody"

IDLE, BUSY = 0.05, 0.40
# Every node the tests use, with its GPUs as dcgm-exporter reports them (a static file: METRICS_MAX_AGE_SECONDS=0).
FLEET = {
    "xk-inflight-idle": [DeviceLoad(i, IDLE, 2000.0) for i in range(2)],
    "xk-inflight-busy": [DeviceLoad(i, BUSY, 20000.0) for i in range(4)],
    "xk-pool-alpha": [DeviceLoad(i, IDLE, 2000.0) for i in range(2)],
    "xk-pool-beta": [DeviceLoad(i, IDLE, 2000.0) for i in range(2)],
    "xk-pool-shared": [DeviceLoad(i, BUSY, 20000.0) for i in range(2)],
    "xk-relist-gpu-a": [DeviceLoad(0, IDLE, 2000.0)],
    "xk-relist-gpu-b": [DeviceLoad(0, IDLE, 2000.0)],
    "xk-relist-pool": [DeviceLoad(0, IDLE, 2000.0)],
    "xk-rbac-gpu": [DeviceLoad(0, IDLE, 2000.0)],
    "xk-rbac-pool": [DeviceLoad(0, IDLE, 2000.0)],
}


# --- the extender process ----------------------------------------------------------------------------------------
class ExtenderProcess:
    """`python -m gpufleet_extender serve` on a free 127.0.0.1 port, stopped by PID."""

    def __init__(self, workdir: Path, kubeconfig: Path, metrics_file: Path, settings: dict[str, str] | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = workdir / f"extender-{self.port}.log"
        self.env = {
            **os.environ,
            **(settings or {}),
            "KUBE_API": "kubeconfig",
            "KUBECONFIG": str(kubeconfig),
            "METRICS_SOURCE": "file",
            "METRICS_FILE": str(metrics_file),
            "METRICS_MAX_AGE_SECONDS": "0",
            "METRICS_REFRESH_SECONDS": "1",
        }
        self.env.pop("KUBERNETES_SERVICE_HOST", None)
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> ExtenderProcess:
        with self.log_path.open("w") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "gpufleet_extender", "serve", "--host", "127.0.0.1", "--port", str(self.port)],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        try:
            wait_for(self._listening, timeout=60, interval=0.1, what=f"the extender to listen:\n{self.log()}")
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def _listening(self) -> bool:
        if self.process.poll() is not None:
            pytest.fail(f"the extender exited with {self.process.returncode}:\n{self.log()}")
        try:
            # {"status": "starting"} comes from the start-up responder, before the app itself serves
            return httpx.get(f"{self.url}/healthz", timeout=2).json() == {"status": "ok"}
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def _post(self, verb: str, pod: dict, names: list[str]):
        answer = httpx.post(f"{self.url}/{verb}", json={"Pod": pod, "Nodes": None, "NodeNames": names}, timeout=5)
        assert answer.status_code == 200, answer.text
        return answer.json()

    def filter(self, pod: dict, names: list[str]) -> dict:
        return self._post("filter", pod, names)

    def scores(self, pod: dict, names: list[str]) -> dict[str, int]:
        return {entry["Host"]: entry["Score"] for entry in self._post("prioritize", pod, names)}

    def readyz(self) -> tuple[int, dict]:
        answer = httpx.get(f"{self.url}/readyz", timeout=5)
        return answer.status_code, answer.json()

    def metric(self, name: str, labels: str = "") -> float | None:
        """The value of one sample of /metrics (`labels` as written there, e.g. '{kind="Pod"}'), None if absent."""
        text = httpx.get(f"{self.url}/metrics", timeout=5).text
        found = re.search(rf"^{re.escape(name + labels)} (\S+)$", text, re.MULTILINE)
        return float(found.group(1)) if found else None


# --- cluster helpers ---------------------------------------------------------------------------------------------
def request_pod(namespace: str, gpus: int = 1, name: str = "incoming") -> dict:
    """The Pod of an ExtenderArgs, as kube-scheduler sends it."""
    container = {"name": "main", "image": "registry.invalid/cuda:12", "resources": {"limits": {GPU: str(gpus)}}}
    return {
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{namespace}-{name}"},
        "spec": {"containers": [container], "schedulerName": NO_SCHEDULER},
        "status": {"phase": "Pending"},
    }


def bind_gpu_pod(core, namespace: str, name: str, node: str, gpus: int = 1) -> None:
    """Create a GPU pod (pending, unbound) and bind it to `node` with the Binding API, as a scheduler does."""
    container = k8s.V1Container(
        name="main", image="registry.invalid/cuda:12", resources=k8s.V1ResourceRequirements(limits={GPU: str(gpus)})
    )
    pod = k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name=name),
        spec=k8s.V1PodSpec(containers=[container], scheduler_name=NO_SCHEDULER),
    )
    core.create_namespaced_pod(namespace, pod)
    target = k8s.V1ObjectReference(api_version="v1", kind="Node", name=node)
    binding = k8s.V1Binding(metadata=k8s.V1ObjectMeta(name=name), target=target)
    core.create_namespaced_pod_binding(name, namespace, binding, _preload_content=False)


def assumed_devices(process: ExtenderProcess, pod: dict, names: list[str]) -> float | None:
    """`_inflight_assumed_pods` (devices taken by pods no sample covers) as of a request just made: the gauge is
    updated when a request needs the cluster's current state."""
    process.filter(pod, names)
    return process.metric("gpufleet_extender_inflight_assumed_pods")


def report_running(core, namespace: str, name: str) -> None:
    """What a kubelet reports once the pod's container started."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    container = {
        "name": "main",
        "image": "registry.invalid/cuda:12",
        "imageID": "",
        "ready": True,
        "restartCount": 0,
        "state": {"running": {"startedAt": now}},
    }
    status = {"phase": "Running", "startTime": now, "containerStatuses": [container]}
    core.patch_namespaced_pod_status(name, namespace, {"status": status})


def delete_pods(core, namespace: str) -> None:
    for pod in core.list_namespaced_pod(namespace).items:
        try:
            core.delete_namespaced_pod(pod.metadata.name, namespace, grace_period_seconds=0)
        except ApiException as err:
            if err.status != 404:
                raise


def label_node(core, node: str, tenant: str | None) -> None:
    core.patch_node(node, {"metadata": {"labels": {TENANT_KEY: tenant, GPU_NODE_LABEL: "true"}}})


def label_namespace(core, namespace: str, tenant: str | None) -> None:
    core.patch_namespace(namespace, {"metadata": {"labels": {TENANT_KEY: tenant}}})


def unresolvable(answer: dict) -> dict[str, str]:
    return answer.get("FailedAndUnresolvableNodes") or {}


# --- fixtures ----------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def rendered_role(tmp_path_factory):
    """The gpu_extender role rendered for the lab, in a background thread started with the module's first test
    (ansible-playbook takes most of this file's time): a function returning its documents by kind."""
    workdir = tmp_path_factory.mktemp("render")
    results: list = []
    thread = threading.Thread(
        target=lambda: results.append(try_render(["gpufleet.mig.gpu_extender"], workdir)), daemon=True
    )
    thread.start()

    def documents() -> dict[str, list[dict]]:
        thread.join(300)
        result, manifests = results[0] if results else (None, None)
        if result is None or result.returncode != 0:
            pytest.fail(f"rendering the gpu_extender role failed:\n{result and result.stdout[-4000:]}")
        by_kind: dict[str, list[dict]] = {}
        for path in sorted((manifests / "gpu_extender").glob("*.yaml")):
            for doc in yaml.safe_load_all(path.read_text()):
                if doc:
                    by_kind.setdefault(doc["kind"], []).append(doc)
        return by_kind

    yield documents
    thread.join(300)


@pytest.fixture(scope="module")
def metrics_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("metrics") / "dcgm.prom"
    path.write_text(render_exposition(FLEET, host_label="Hostname"))
    return path


@pytest.fixture(scope="module")
def nodes(core):
    """The fleet's nodes, registered by a fake kubelet with their GPUs allocatable; deleted afterwards."""
    kubelet = FakeKubelet(core, {name: {GPU: str(len(devices))} for name, devices in FLEET.items()}).register()
    yield list(FLEET)
    kubelet.stop()
    for name in FLEET:
        core.delete_node(name)


@pytest.fixture(scope="module")
def extender(control_plane, nodes, rendered_role, metrics_file, tmp_path_factory):
    """One extender for the admin-credential tests (rendered_role: start the render in the background now)."""
    # Bound pods count for an hour: pods other tests bound earlier must not expire in the middle of a count.
    settings = {"INFLIGHT_MAX_SECONDS": "3600"}
    workdir = tmp_path_factory.mktemp("extender")
    with ExtenderProcess(workdir, control_plane.kubeconfig, metrics_file, settings) as process:
        yield process


@pytest.fixture
def namespace(core, request):
    """A fresh namespace named after the test; its pods are deleted afterwards (no kubelet finishes them)."""
    name = "xk-" + re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()[5:]).strip("-")[:50].strip("-")
    ensure_namespace(core, name)
    yield name
    delete_pods(core, name)
    core.delete_namespace(name)


# --- 1. in-flight accounting -------------------------------------------------------------------------------------
def test_inflight_accounting_counts_real_bindings(core, extender, namespace, metrics_file):
    idle, busy = "xk-inflight-idle", "xk-inflight-busy"
    pod = request_pod(namespace)
    before = extender.scores(pod, [idle, busy])
    assert before[idle] > before[busy], before  # the idle node is preferred while nothing is bound to it
    assert extender.filter(pod, [idle, busy])["NodeNames"] == [idle, busy]
    assumed_before = assumed_devices(extender, pod, [idle, busy])

    # Two 1-GPU pods bound to the idle node take both its GPUs, though the (static) metrics still show them idle.
    for index in range(2):
        bind_gpu_pod(core, namespace, f"bound-{index}", idle)

    answer = wait_for(
        lambda: (a := extender.filter(pod, [idle, busy])) and idle in (a.get("FailedNodes") or {}) and a,
        timeout=20,
        what="the extender to count the two bound pods on the idle node",
    )
    assert answer["NodeNames"] == [busy]
    assert answer["FailedNodes"][idle] == (
        f"{idle}: no {GPU} GPU below thresholds (all 2 assumed busy; 2 taken by pods bound since the last sample)"
    )
    after = extender.scores(pod, [idle, busy])
    assert after[idle] == 0 and after[busy] == before[busy], (before, after)
    assert assumed_devices(extender, pod, [idle, busy]) == assumed_before + 2

    # One pod goes (a DELETED event): one GPU is free again, the node passes.
    core.delete_namespaced_pod("bound-0", namespace, grace_period_seconds=0)
    wait_for(
        lambda: extender.filter(pod, [idle, busy])["NodeNames"] == [idle, busy],
        timeout=20,
        what="the deleted pod's GPU to be free again",
    )
    assert assumed_devices(extender, pod, [idle, busy]) == assumed_before + 1

    # The other one runs (its container's startedAt, as a kubelet reports it): still assumed, no sample shows it yet.
    report_running(core, namespace, "bound-1")
    wait_for(
        lambda: core.read_namespaced_pod("bound-1", namespace).status.container_statuses,
        what="the pod's running status",
    )
    assert extender.filter(pod, [idle, busy])["NodeNames"] == [idle, busy]
    assert assumed_devices(extender, pod, [idle, busy]) == assumed_before + 1
    # dcgm-exporter's next sample, taken after the container started, covers it: nothing is assumed any more.
    time.sleep(1.1)  # startedAt has whole seconds: the new sample must be dated after it
    metrics_file.write_text(metrics_file.read_text())
    wait_for(
        lambda: assumed_devices(extender, pod, [idle, busy]) == assumed_before,
        timeout=20,
        what="a newer sample to cover the running pod",
    )
    assert extender.scores(pod, [idle, busy]) == before


# --- 2. tenant pools ---------------------------------------------------------------------------------------------
def test_tenant_pools_follow_live_node_and_namespace_labels(core, extender, namespace):
    alpha, beta, shared = "xk-pool-alpha", "xk-pool-beta", "xk-pool-shared"
    candidates = [alpha, beta, shared]
    label_node(core, alpha, "alpha")
    label_node(core, beta, "beta")
    label_node(core, shared, None)
    label_namespace(core, namespace, "alpha")
    pod = request_pod(namespace)

    # A pod of an alpha namespace: its pool and the shared node, never beta's pool (and not by preemption).
    answer = wait_for(
        lambda: (a := extender.filter(pod, candidates)) and beta in unresolvable(a) and a,
        timeout=20,
        what="the extender to see the tenant labels",
    )
    assert answer["NodeNames"] == [alpha, shared]
    assert unresolvable(answer) == {
        beta: f"{beta}: node is in tenant pool 'beta'; namespace {namespace!r} belongs to tenant alpha"
    }
    # The idle pool node outranks the busier shared one.
    scores = extender.scores(pod, candidates)
    assert scores[alpha] > scores[shared], scores

    # The node moves to the alpha pool on the live cluster: the watch delivers it, the verdict changes.
    label_node(core, beta, "alpha")
    wait_for(
        lambda: extender.filter(pod, candidates)["NodeNames"] == candidates,
        timeout=20,
        what="the relabelled node to join the alpha pool",
    )
    # The namespace moves to tenant beta: now both alpha nodes are refused.
    label_namespace(core, namespace, "beta")
    answer = wait_for(
        lambda: (a := extender.filter(pod, candidates)) and a["NodeNames"] == [shared] and a,
        timeout=20,
        what="the relabelled namespace to lose the alpha pool",
    )
    assert set(unresolvable(answer)) == {alpha, beta}
    # Without a tenant label the namespace gets the shared node only.
    label_namespace(core, namespace, None)
    answer = wait_for(
        lambda: (a := extender.filter(pod, candidates)) and "no tenant" in json.dumps(unresolvable(a)) and a,
        timeout=20,
        what="the unlabelled namespace to be refused every pool",
    )
    assert answer["NodeNames"] == [shared]


# --- 3. relist after the watch breaks ------------------------------------------------------------------------------
def test_relist_after_apiserver_restart_recovers(control_plane, core, extender, namespace):
    gpu_a, gpu_b, pool = "xk-relist-gpu-a", "xk-relist-gpu-b", "xk-relist-pool"
    candidates = [gpu_a, gpu_b, pool]
    label_node(core, pool, "alpha")
    label_namespace(core, namespace, "beta")
    bind_gpu_pod(core, namespace, "before-restart", gpu_a)
    pod = request_pod(namespace)
    wait_for(
        lambda: extender.filter(pod, candidates)["NodeNames"] == [gpu_b],
        timeout=20,
        what="gpu-a taken by the bound pod and the pool node refused to tenant beta",
    )
    breaks_before = extender.log().count("listing again")

    # The extender is paused (SIGSTOP) across the restart and the changes after it, so no watch of the new
    # apiserver can deliver them: once resumed, its watches find their connections gone, and only the relist
    # brings the changes (a pod gone, one bound, the pool node's new tenant). Kept state would hide the deletion.
    began = time.monotonic()
    extender.process.send_signal(signal.SIGSTOP)
    try:
        control_plane.restart_apiserver()  # every watch breaks; returns once the new apiserver is ready
        core.delete_namespaced_pod("before-restart", namespace, grace_period_seconds=0)
        bind_gpu_pod(core, namespace, "after-restart", gpu_b)
        label_node(core, pool, "beta")
    finally:
        extender.process.send_signal(signal.SIGCONT)
    restarted = time.monotonic()

    answer = wait_for(
        lambda: (a := extender.filter(pod, candidates)) and a["NodeNames"] == [gpu_a, pool] and a,
        timeout=60,
        what="the extender to relist and see the deletion, the binding and the new label",
    )
    recovery = time.monotonic() - restarted
    assert answer["FailedNodes"] == {
        gpu_b: f"{gpu_b}: no {GPU} GPU below thresholds (all 1 assumed busy; 1 taken by pods bound since the "
        "last sample)"
    }
    assert not unresolvable(answer)
    assert extender.log().count("listing again") > breaks_before, extender.log()[-3000:]
    assert extender.readyz()[0] == 200
    # The session's other components came through the restart too.
    assert all(process.poll() is None for process in control_plane.processes.values()), control_plane.processes
    print(f"apiserver restart and changes {restarted - began:.1f} s; the extender relisted {recovery:.1f} s later")


# --- 4. RBAC: the role's ServiceAccount and ClusterRole ------------------------------------------------------------
@pytest.fixture(scope="module")
def role_rbac(api, core, nodes, rendered_role):
    """The role's ServiceAccount, ClusterRole and ClusterRoleBinding applied to the real apiserver; the role's
    ConfigMap settings. Yields (ClusterRole, ServiceAccount user name, settings); restores the ClusterRole after."""
    documents = rendered_role()
    (account,) = documents["ServiceAccount"]
    (cluster_role,) = documents["ClusterRole"]
    (binding,) = documents["ClusterRoleBinding"]
    (config_map,) = documents["ConfigMap"]
    rbac = k8s.RbacAuthorizationV1Api(api)
    namespace = account["metadata"]["namespace"]
    ensure_namespace(core, namespace)
    objects = (
        (core.create_namespaced_service_account, core.delete_namespaced_service_account, account, (namespace,)),
        (rbac.create_cluster_role, rbac.delete_cluster_role, cluster_role, ()),
        (rbac.create_cluster_role_binding, rbac.delete_cluster_role_binding, binding, ()),
    )
    created = []  # objects that were not there before (site.yml in apply mode may have made them): removed after
    for create, delete, body, scope in objects:
        try:
            create(*scope, body)
            created.append((delete, body["metadata"]["name"], scope))
        except ApiException as err:
            if err.status != 409:
                raise
    rbac.replace_cluster_role(cluster_role["metadata"]["name"], cluster_role)
    user = f"system:serviceaccount:{namespace}:{account['metadata']['name']}"
    yield cluster_role, user, dict(config_map["data"])
    rbac.replace_cluster_role(cluster_role["metadata"]["name"], cluster_role)
    for delete, name, scope in created:
        delete(name, *scope)


@pytest.fixture(scope="module")
def sa_kubeconfig(control_plane, core, role_rbac, tmp_path_factory) -> Path:
    """A kubeconfig with a token of the role's ServiceAccount (TokenRequest API, as a projected token)."""
    _, user, _ = role_rbac
    namespace, name = user.split(":")[2:]
    request = k8s.AuthenticationV1TokenRequest(spec=k8s.V1TokenRequestSpec(audiences=[], expiration_seconds=3600))
    token = core.create_namespaced_service_account_token(name, namespace, request).status.token
    return kubeconfig_for_token(control_plane, token, tmp_path_factory.mktemp("sa") / "kubeconfig")


def allowed(api, user: str, verb: str, resource: str) -> bool:
    namespace = user.split(":")[2]
    review = k8s.V1SubjectAccessReview(
        spec=k8s.V1SubjectAccessReviewSpec(
            user=user,
            groups=["system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"],
            resource_attributes=k8s.V1ResourceAttributes(verb=verb, resource=resource),
        )
    )
    return k8s.AuthorizationV1Api(api).create_subject_access_review(review).status.allowed


def without(cluster_role: dict, resource: str, verb: str) -> dict:
    """The ClusterRole with one (resource, verb) pair taken out of its rules."""
    rules = []
    for rule in cluster_role["rules"]:
        for name in rule["resources"]:
            verbs = [v for v in rule["verbs"] if (name, v) != (resource, verb)]
            if verbs:
                rules.append({**rule, "resources": [name], "verbs": verbs})
    return {**cluster_role, "rules": rules}


def pools_and_bindings_work(core, process: ExtenderProcess, namespace: str) -> None:
    """Tenant pools and in-flight accounting both work: the pool node is refused to another tenant, and a GPU pod
    bound to the free node makes it fail the filter."""
    gpu_node, pool_node = "xk-rbac-gpu", "xk-rbac-pool"
    label_node(core, pool_node, "alpha")
    label_namespace(core, namespace, "beta")
    pod = request_pod(namespace)
    wait_for(
        lambda: pool_node in unresolvable(process.filter(pod, [gpu_node, pool_node])),
        timeout=30,
        what="tenant pools with the ServiceAccount's permissions",
    )
    bind_gpu_pod(core, namespace, f"bound-{process.port}", gpu_node)
    answer = wait_for(
        lambda: (a := process.filter(pod, [gpu_node, pool_node])) and gpu_node in (a.get("FailedNodes") or {}) and a,
        timeout=30,
        what="in-flight accounting with the ServiceAccount's permissions",
    )
    assert answer["NodeNames"] == []
    delete_pods(core, namespace)


def test_rbac_the_roles_permissions_are_enough(api, core, role_rbac, sa_kubeconfig, metrics_file, namespace, tmp_path):
    _, user, settings = role_rbac
    assert settings["TENANT_LABEL"] == TENANT_KEY  # the role configures the label the tenants role sets
    for resource in ("pods", "nodes", "namespaces"):
        for verb in ("list", "watch"):
            assert allowed(api, user, verb, resource), (verb, resource)
    assert not allowed(api, user, "update", "nodes")  # read-only

    with ExtenderProcess(tmp_path, sa_kubeconfig, metrics_file, settings) as process:
        pools_and_bindings_work(core, process, namespace)
        status, body = process.readyz()
        assert status == 200 and body["kube_api_errors"] == {}, body
        assert "forbidden" not in process.log().lower(), process.log()


@pytest.mark.parametrize(("resource", "verb", "kind"), [("namespaces", "list", "Namespace"), ("pods", "watch", "Pod")])
def test_rbac_one_permission_less_fails_clearly(
    api, core, role_rbac, sa_kubeconfig, metrics_file, namespace, tmp_path, resource, verb, kind
):
    cluster_role, user, settings = role_rbac
    rbac = k8s.RbacAuthorizationV1Api(api)
    name = cluster_role["metadata"]["name"]
    rbac.replace_cluster_role(name, without(cluster_role, resource, verb))
    try:
        wait_for(lambda: not allowed(api, user, verb, resource), what=f"RBAC to deny {verb} {resource}")
        with ExtenderProcess(tmp_path, sa_kubeconfig, metrics_file, settings) as process:
            denied = f'cannot {verb} resource "{resource}"'
            # 503 comes first for the watches not listed yet (kube_api_unsynced); the refusal follows it.
            _, body = wait_for(
                lambda: (r := process.readyz()) and r[0] == 503 and kind in r[1]["kube_api_errors"] and r,
                timeout=30,
                what=f"/readyz to report the missing permission ({verb} {resource})",
            )
            assert body["ready"] is False
            assert denied in body["kube_api_errors"][kind], body
            assert list(body["kube_api_errors"]) == [kind], body
            errors = [line for line in process.log().splitlines() if " ERROR " in line and denied in line]
            assert errors, process.log()
            assert "needs get, list and watch on pods, nodes and namespaces" in errors[0], errors[0]
            assert process.metric("gpufleet_extender_kube_api_errors_total", f'{{kind="{kind}",status="403"}}') >= 1
            assert process.metric("gpufleet_extender_ready") == 0

            # The permission comes back: the extender recovers without a restart.
            rbac.replace_cluster_role(name, cluster_role)
            wait_for(lambda: process.readyz()[0] == 200, timeout=45, what="/readyz to recover with the permission")
            pools_and_bindings_work(core, process, namespace)
    finally:
        rbac.replace_cluster_role(name, cluster_role)


def test_a_token_the_apiserver_rejects_fails_clearly(control_plane, nodes, metrics_file, tmp_path):
    """A revoked or expired token (here: not one the apiserver issued) is refused for every kind, and said so."""
    kubeconfig = kubeconfig_for_token(control_plane, "not-a-token-this-apiserver-issued", tmp_path / "kubeconfig")
    with ExtenderProcess(tmp_path, kubeconfig, metrics_file) as process:
        status, body = wait_for(
            lambda: (r := process.readyz()) and len(r[1]["kube_api_errors"]) == 3 and r,
            timeout=30,
            what="/readyz to report the rejected token for pods, nodes and namespaces",
        )
        assert status == 503 and body["ready"] is False
        assert body["kube_api_errors"] == dict.fromkeys(("Pod", "Node", "Namespace"), "401 Unauthorized: Unauthorized")
        assert "does not accept the extender's credentials" in process.log(), process.log()
        assert process.metric("gpufleet_extender_kube_api_errors_total", '{kind="Pod",status="401"}') >= 1
