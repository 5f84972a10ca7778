"""What the rendered NetworkPolicies mean (tests/netpol.py's evaluator; the test control plane has no CNI to
enforce them): no tenant pod reaches dcgm-exporter, the device plugin, GFD or the fleet's own components; the
Prometheus the inventory names scrapes the exporters; tenants keep DNS, their own namespaces and the internet.

Both ends are checked apart: the node agents' ingress policies and the tenants' egress policy each keep a tenant
away on their own, so losing either one fails a test."""

from __future__ import annotations

import pytest
from conftest import load_manifests
from gpufleet_testsupport.collection import render_roles
from netpol import Cluster, Endpoint, workload_endpoints

TENANT_NAMESPACES = ("llm-inference", "imagegen", "finnlp", "finnlp-batch")
PROMETHEUS = Endpoint("monitoring", {"app.kubernetes.io/name": "prometheus"}, ip="10.244.50.2", name="prometheus")
# The extender (gpu_extender role, not rendered here: its TLS set-up is slow) stands for every pod of the fleet's
# own namespace, whatever its labels.
EXTENDER = Endpoint("gpufleet-system", {"app.kubernetes.io/name": "gpufleet-extender"}, {"https": 8443}, "10.244.60.3")
DNS = Endpoint("kube-system", {"k8s-app": "kube-dns"}, {"dns": 53}, ip="10.96.0.10", name="coredns")


def tenant_pod(namespace: str, labels: dict | None = None) -> Endpoint:
    return Endpoint(namespace, labels or {"app": "anything"}, {"http": 8080}, ip="10.244.20.4", name="tenant")


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    manifests = render_roles(
        ["gpufleet.mig.tenants", "gpufleet.mig.gpu_device_plugin", "gpufleet.mig.dcgm_exporter"],
        tmp_path_factory.mktemp("netpol"),
    )
    documents = [doc for docs in load_manifests(manifests).values() for doc in docs]
    agents = {e.name: e for e in workload_endpoints(documents)}
    return documents, agents


def cluster(documents, drop: tuple[str, ...] = ()) -> Cluster:
    kept = [d for d in documents if not (d.get("kind") == "NetworkPolicy" and d["metadata"]["name"] in drop)]
    return Cluster.from_documents(kept, extra_namespaces=("monitoring", "kube-system", "gpufleet-system", "default"))


def test_the_node_agents_are_the_three_daemonsets(rendered):
    _, agents = rendered
    assert set(agents) == {
        "DaemonSet/dcgm-exporter",
        "DaemonSet/nvidia-device-plugin",
        "DaemonSet/gpu-feature-discovery",
    }
    assert agents["DaemonSet/dcgm-exporter"].ports == {"metrics": 9400}


@pytest.mark.parametrize("namespace", TENANT_NAMESPACES)
def test_no_tenant_pod_reaches_dcgm_exporter_and_either_end_alone_refuses(rendered, namespace):
    documents, agents = rendered
    exporter, pod = agents["DaemonSet/dcgm-exporter"], tenant_pod(namespace)
    # A tenant's own pod may carry Prometheus' labels: the namespace is what counts.
    impostor = tenant_pod(namespace, dict(PROMETHEUS.labels))
    plane = cluster(documents)
    for source in (pod, impostor):
        assert not plane.may_connect(source, exporter, 9400)
        assert not plane.egress_allows(source, exporter, 9400), "tenant egress must not reach the node agents"
        assert not plane.ingress_allows(source, exporter, 9400), "dcgm-exporter's ingress must refuse tenants"
    # Each control holds without the other: drop the exporter's policy and the namespace's default deny, or the
    # tenants' egress policy, and the tenant is still refused; drop all three and it gets in.
    assert not cluster(documents, ("dcgm-exporter", "gpufleet-node-agents-deny-ingress")).may_connect(
        pod, exporter, 9400
    )
    assert not cluster(documents, ("gpufleet-tenant-egress",)).may_connect(pod, exporter, 9400)
    opened = cluster(documents, ("dcgm-exporter", "gpufleet-node-agents-deny-ingress", "gpufleet-tenant-egress"))
    assert opened.may_connect(pod, exporter, 9400)


def test_only_the_named_prometheus_scrapes_the_exporters(rendered):
    documents, agents = rendered
    exporter, plane = agents["DaemonSet/dcgm-exporter"], cluster(documents)
    assert plane.may_connect(PROMETHEUS, exporter, 9400)
    assert not plane.may_connect(PROMETHEUS, exporter, 5555)  # the metrics port only
    assert not plane.may_connect(Endpoint("monitoring", {"app.kubernetes.io/name": "grafana"}), exporter, 9400)
    assert not plane.may_connect(Endpoint("default", dict(PROMETHEUS.labels)), exporter, 9400)


@pytest.mark.parametrize("agent", ["DaemonSet/nvidia-device-plugin", "DaemonSet/gpu-feature-discovery"])
def test_device_plugin_and_gfd_take_no_connection_at_all(rendered, agent):
    documents, agents = rendered
    plane = cluster(documents)
    for source in (PROMETHEUS, tenant_pod("finnlp"), Endpoint("default"), EXTENDER):
        for port in (80, 443, 8080, 9400):
            assert not plane.ingress_allows(source, agents[agent], port)


@pytest.mark.parametrize("namespace", TENANT_NAMESPACES)
def test_tenant_egress_keeps_to_its_own_dns_and_the_internet(rendered, namespace):
    documents, _ = rendered
    plane, pod = cluster(documents), tenant_pod(namespace)
    assert not plane.egress_allows(pod, EXTENDER, 8443)  # the fleet's own components
    assert not plane.egress_allows(pod, PROMETHEUS, 9090)  # every pool's load and pod names
    assert not plane.egress_allows(pod, Endpoint("kube-system", {"component": "kube-scheduler"}), 10259)
    api_server = Endpoint("default", ip="10.20.0.5", pod=False)  # a control-plane node's address
    assert not plane.egress_allows(pod, api_server, 6443)
    assert plane.egress_allows(pod, DNS, 53, "UDP") and plane.egress_allows(pod, DNS, 53)
    assert not plane.egress_allows(pod, DNS, 8080)
    assert plane.egress_allows(pod, Endpoint("default", ip="203.0.113.20", pod=False), 443)  # model downloads
    assert plane.may_connect(pod, tenant_pod(namespace, {"app": "other"}), 8080)


def test_tenants_do_not_reach_each_other_but_a_tenants_own_namespaces_do(rendered):
    documents, _ = rendered
    plane = cluster(documents)
    assert not plane.may_connect(tenant_pod("imagegen"), tenant_pod("finnlp"), 8080)
    assert not plane.may_connect(tenant_pod("llm-inference"), tenant_pod("imagegen"), 8080)
    assert plane.may_connect(tenant_pod("finnlp-batch"), tenant_pod("finnlp"), 8080)
    assert plane.may_connect(PROMETHEUS, tenant_pod("finnlp"), 8080)  # tenants' own metrics are scraped
