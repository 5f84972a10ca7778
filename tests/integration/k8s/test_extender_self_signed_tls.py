"""The gpu_extender role's self-signed TLS in apply mode, against the real apiserver (which has no cert-manager):
`auto` makes a CA on the controller and delivers the kubernetes.io/tls Secret; the extender started with that
Secret's certificate serves TLS a client holding only its ca.crt accepts for the Service's name (and for no other
name); the real kube-scheduler, given that CA as the kube_scheduler role renders it, calls it and follows its
answers; a second run changes nothing; and once cert-manager's CRDs appear, the self-signed Secret stays
self-signed while a new one goes to cert-manager."""

from __future__ import annotations

import base64
import re
import ssl

import httpx
import pytest
from gpufleet_testsupport.collection import try_render
from gpufleet_testsupport.extender import start_extender
from gpufleet_testsupport.processes import stop_process
from gpufleet_testsupport.scheduling import (
    MIG_RESOURCE,
    create_nodes,
    create_pods,
    gpu_pod,
    rendered_scheduler_config,
    write_mig_metrics,
)
from gpufleet_testsupport.waits import wait_for
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

pytestmark = pytest.mark.integration

NAMESPACE = "tls-self-signed"  # the role's objects live apart from the other tests' gpufleet-system
SERVER_NAME = f"gpufleet-extender.{NAMESPACE}.svc"
POOL = {"gpufleet.test/scheduling": "extender-self-signed"}
COOL, HOT = "self-signed-cool", "self-signed-hot"
CERT_MANAGER_KINDS = {"certificates": "Certificate", "issuers": "Issuer"}


def recap_changed(output: str) -> int:
    return int(re.search(r"^localhost\s+:.*\bchanged=(\d+)", output, re.MULTILINE).group(1))


@pytest.fixture(scope="module")
def apply_role(control_plane, core, tmp_path_factory):
    """Run the gpu_extender role in apply mode (tls source auto) with one PKI directory; returns the run's output.
    Afterwards the extender's Service goes, so that the lab's fixed ClusterIP is free for the other tests."""
    workdir = tmp_path_factory.mktemp("self-signed")
    runs = []

    def run(extra: dict | None = None) -> str:
        settings = {
            "gpufleet_k8s_mode": "apply",
            "gpufleet_kubeconfig": str(control_plane.kubeconfig),
            "gpufleet_namespace": NAMESPACE,
            "gpu_extender_tls_pki_dir": str(workdir / "pki"),
            **(extra or {}),
        }
        result, _ = try_render(["gpufleet.mig.gpu_extender"], workdir / f"run-{len(runs)}", extra_vars=settings)
        runs.append(result)
        assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-2000:]
        return result.stdout

    run.pki = workdir / "pki"
    yield run
    try:
        core.delete_namespaced_service("gpufleet-extender", NAMESPACE)
    except ApiException as exc:
        if exc.status != 404:
            raise


def secret_files(core, directory, name: str = "gpufleet-extender-tls") -> dict:
    """The Secret's keys written to files (the extender's mount); returns {key: path} and the Secret itself."""
    secret = core.read_namespaced_secret(name, NAMESPACE)
    directory.mkdir(parents=True, exist_ok=True)
    files = {}
    for key, value in secret.data.items():
        files[key] = directory / key
        files[key].write_bytes(base64.b64decode(value))
    return {"files": files, "secret": secret}


def test_without_cert_manager_the_role_makes_a_ca_the_extender_serves_and_the_scheduler_trusts(
    apply_role, core, control_plane, namespace, tmp_path
):
    apply_role()
    found = secret_files(core, tmp_path / "tls")
    secret, files = found["secret"], found["files"]
    assert secret.type == "kubernetes.io/tls"
    assert secret.metadata.annotations["gpufleet.io/tls-source"] == "self-signed"
    assert set(files) == {"tls.crt", "tls.key", "ca.crt"}
    assert (apply_role.pki / "ca.key").exists()  # the CA's key is on the controller only
    assert (apply_role.pki / "ca.key").read_bytes() not in {path.read_bytes() for path in files.values()}
    deployment = k8s.AppsV1Api(core.api_client).read_namespaced_deployment("gpufleet-extender", NAMESPACE)
    assert deployment.spec.template.metadata.annotations["gpufleet.io/tls-certificate-hash"]

    # The real extender with the Secret's certificate: start_extender waits for /readyz over TLS, verified
    # against the Secret's ca.crt for the Service's name.
    create_nodes(core, [COOL, HOT], {MIG_RESOURCE: "3"}, labels=POOL)
    metrics = write_mig_metrics(tmp_path / "dcgm.prom", {COOL: [0.1, 0.2, 0.1], HOT: [0.95, 0.97, 0.96]})
    env = {"METRICS_SOURCE": "file", "METRICS_FILE": str(metrics), "KUBE_API": "off", "METRICS_REFRESH_SECONDS": "1"}
    process, url = start_extender(tmp_path, env, tls=files, server_name=SERVER_NAME)
    scheduler = None
    try:
        verify = ssl.create_default_context(cafile=str(files["ca.crt"]))
        with httpx.Client(verify=verify, timeout=5) as client:
            assert client.get(f"{url}/readyz", extensions={"sni_hostname": SERVER_NAME}).status_code == 200
        # A client of its own: a pooled connection would skip the handshake.
        with httpx.Client(verify=verify, timeout=5) as client, pytest.raises(httpx.ConnectError, match="VERIFY_FAILED"):
            client.get(f"{url}/readyz", extensions={"sni_hostname": "gpufleet-extender.x.svc"})

        # The real kube-scheduler with the CA inline, as the kube_scheduler role renders it; the extender is
        # required, so a pod binds only if the TLS call succeeded, and lands where only the extender says.
        config = rendered_scheduler_config(
            tmp_path / "scheduler",
            gpufleet_namespace=NAMESPACE,
            kube_scheduler_extender_url_prefix=url,
            kube_scheduler_extender_ignorable=False,
            kube_scheduler_extender_tls_ca=files["ca.crt"].read_text(),
        )
        assert config["extenders"][0]["tlsConfig"]["serverName"] == SERVER_NAME
        scheduler = control_plane.start_scheduler(config, name="gpufleet-scheduler-self-signed")
        name, bindings = namespace
        pods = [gpu_pod(f"mig-{i}", "gpufleet-scheduler", {MIG_RESOURCE: "1"}) for i in range(2)]
        for pod in pods:
            pod.spec.node_selector = POOL
        create_pods(core, name, pods)
        assert bindings.wait(2, timeout=60), f"bound: {bindings.bound}"
        assert {node for node, _ in bindings.bound.values()} == {COOL}
    finally:
        if scheduler:
            control_plane.stop_component(scheduler)
        stop_process(process)


def test_a_second_run_changes_nothing_and_does_not_reissue(apply_role, core):
    apply_role()  # the first run, when this test runs alone
    before = core.read_namespaced_secret("gpufleet-extender-tls", NAMESPACE)
    output = apply_role()
    assert recap_changed(output) == 0, output[-4000:]
    after = core.read_namespaced_secret("gpufleet-extender-tls", NAMESPACE)
    assert after.metadata.resource_version == before.metadata.resource_version
    assert after.data == before.data


@pytest.fixture
def cert_manager_crds(api):
    """cert-manager's Certificate and Issuer kinds (the CRDs only, no controller), removed afterwards."""
    extensions = k8s.ApiextensionsV1Api(api)
    for plural, kind in CERT_MANAGER_KINDS.items():
        body = {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.cert-manager.io"},
            "spec": {
                "group": "cert-manager.io",
                "scope": "Namespaced",
                "names": {"plural": plural, "singular": kind.lower(), "kind": kind},
                "versions": [
                    {
                        "name": "v1",
                        "served": True,
                        "storage": True,
                        "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                    }
                ],
            },
        }
        extensions.create_custom_resource_definition(body)

    def established():
        names = [f"{plural}.cert-manager.io" for plural in CERT_MANAGER_KINDS]
        crds = [extensions.read_custom_resource_definition(name) for name in names]
        return all(
            any(c.type == "Established" and c.status == "True" for c in (crd.status.conditions or [])) for crd in crds
        )

    wait_for(established, what="cert-manager's CRDs established")
    yield k8s.CustomObjectsApi(api)
    for plural in CERT_MANAGER_KINDS:
        try:
            extensions.delete_custom_resource_definition(f"{plural}.cert-manager.io")
        except ApiException as err:
            if err.status != 404:
                raise


def test_cert_manager_installed_later_does_not_take_over_a_self_signed_secret(apply_role, core, cert_manager_crds):
    apply_role()  # self-signed, when this test runs alone
    before = core.read_namespaced_secret("gpufleet-extender-tls", NAMESPACE)

    output = apply_role()  # auto, now with cert-manager's kinds in the cluster
    assert recap_changed(output) == 0, output[-4000:]
    assert core.read_namespaced_secret("gpufleet-extender-tls", NAMESPACE).data == before.data
    certificates = cert_manager_crds.list_namespaced_custom_object("cert-manager.io", "v1", NAMESPACE, "certificates")
    assert certificates["items"] == []

    # A Secret the role did not make: auto now hands it to cert-manager.
    apply_role({"gpu_extender_tls_secret_name": "gpufleet-extender-tls-cm"})
    certificates = cert_manager_crds.list_namespaced_custom_object("cert-manager.io", "v1", NAMESPACE, "certificates")
    assert {item["spec"]["secretName"] for item in certificates["items"]} == {
        "gpufleet-extender-ca",
        "gpufleet-extender-tls-cm",
    }
    with pytest.raises(ApiException) as missing:
        core.read_namespaced_secret("gpufleet-extender-tls-cm", NAMESPACE)
    assert missing.value.status == 404  # cert-manager's to write; the role made none
