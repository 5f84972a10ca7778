"""The gpu_extender role: the objects it renders for the real inventories, what follows from its variables
(API access, host CIDRs, the config hash), the settings it refuses, and the arguments of its apply path."""

from __future__ import annotations

import base64
import datetime
import hashlib
import json
import re
import socket
import ssl
import stat
import sys
import threading

import pytest
import yaml
from conftest import REPO, closed_port_kubeconfig, load_manifests, validate_manifests
from cryptography import x509
from gpufleet_extender.config import Settings
from gpufleet_extender.scoring import Policy
from gpufleet_testsupport.collection import render_roles, run_playbook, try_render, write_inventory

SELECTOR = {"app.kubernetes.io/name": "gpufleet-extender", "app.kubernetes.io/component": "scheduler-extender"}
PART_OF = {"app.kubernetes.io/part-of": "gpufleet", "app.kubernetes.io/managed-by": "gpufleet.mig"}


def objects(documents: dict[str, list[dict]]) -> dict[str, dict]:
    """Every rendered object keyed by kind (the role renders one of each kind)."""
    found = {}
    for docs in documents.values():
        for doc in docs:
            assert doc["kind"] not in found, f"two {doc['kind']} objects"
            found[doc["kind"]] = doc
    return found


def control_plane_inventory(tmp_path, control_plane: dict[str, str | None], all_vars=None) -> str:
    """A control plane only: host -> ansible_host (None for none)."""
    hosts = {name: ({"ansible_host": address} if address else None) for name, address in control_plane.items()}
    inventory = {
        "all": {
            "vars": {"gpufleet_namespace": "gpufleet-system", **(all_vars or {})},
            "children": {"control_plane": {"hosts": hosts}},
        }
    }
    return write_inventory(tmp_path, inventory)


def render_extender(tmp_path, inventory: str, extra_vars=None) -> dict[str, dict]:
    manifests = render_roles(["gpu_extender"], tmp_path, inventory=inventory, extra_vars=extra_vars)
    assert validate_manifests(manifests) > 0
    documents = load_manifests(manifests)
    # The TLS set (cert-manager's CA chain) has two Issuers and two Certificates: tls_objects() reads it.
    return objects({k: v for k, v in documents.items() if k.startswith("gpu_extender/") and k != TLS_FILE})


TLS_FILE = "gpu_extender/tls.yaml"


def tls_objects(tmp_path, inventory: str, extra_vars=None) -> dict[tuple[str, str], dict]:
    """The TLS set's objects keyed by (kind, name); {} when the role delivers none."""
    manifests = render_roles(["gpu_extender"], tmp_path, inventory=inventory, extra_vars=extra_vars)
    docs = load_manifests(manifests).get(TLS_FILE, [])
    return {(doc["kind"], doc["metadata"]["name"]): doc for doc in docs}


def run_extender(tmp_path, inventory: str, extra_vars: dict, check_mode: bool = False, args: tuple[str, ...] = ()):
    playbook = tmp_path / "extender.yml"
    play = {"name": "Extender", "hosts": "localhost", "gather_facts": False, "roles": ["gpu_extender"]}
    if check_mode:
        play["check_mode"] = True
    playbook.write_text(yaml.safe_dump([play]))
    base = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    return run_playbook(str(playbook), inventory, {**base, **extra_vars}, tmp_path, args)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    return render_extender(tmp_path_factory.mktemp("extender-lab"), "inventories/hongkong+lab")


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
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "https", "scheme": "HTTPS"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "https", "scheme": "HTTPS"}
    assert container["resources"]["requests"]["cpu"] and container["resources"]["limits"]["memory"]
    assert container["envFrom"] == [{"configMapRef": {"name": lab["ConfigMap"]["metadata"]["name"]}}]
    # The only writable place is the in-memory /tmp; the TLS Secret, Prometheus' token and CA are mounted read-only.
    assert container["volumeMounts"] == [
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "prometheus-token", "mountPath": "/etc/gpufleet/prometheus-token", "readOnly": True},
        {"name": "prometheus-ca", "mountPath": "/etc/gpufleet/prometheus-ca", "readOnly": True},
        {"name": "tls", "mountPath": "/etc/gpufleet-extender/tls", "readOnly": True},
    ]


def test_lab_settings_and_service(lab):
    settings = lab["ConfigMap"]["data"]
    # The scoring settings the lab does not set are left to the extender's defaults (written once, in the extender).
    for name in ("WEIGHT_GPU_UTIL", "WEIGHT_MEM_UTIL", "GPU_UTIL_THRESHOLD", "MEM_UTIL_THRESHOLD", "PACK_TARGET_UTIL"):
        assert name not in settings
    assert settings["PROMETHEUS_URL"].startswith("http")
    assert settings["NODE_NAME_LABELS"] == "Hostname,hostname"
    assert settings["KUBE_API"] == "in-cluster"
    assert all(isinstance(value, str) for value in settings.values())
    # finnlp's time-sliced 1g.10gb (the pool's sharing); the interference weight is left to the extender.
    assert json.loads(settings["SHARED_RESOURCES"]) == {"nvidia.com/mig-1g.10gb": 4}
    assert "INTERFERENCE_WEIGHT" not in settings
    service = lab["Service"]["spec"]
    # The lab pins the ClusterIP the kube_scheduler role's static_pod mode points kube-scheduler at.
    assert service["clusterIP"] == "10.96.0.50"
    assert service["ports"] == [{"name": "https", "port": 8000, "targetPort": "https", "protocol": "TCP"}]


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
    assert rule["ports"] == [{"port": "https", "protocol": "TCP"}]
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
    assert ip_blocks == ["10.20.0.0/28"]  # Hong Kong's control-plane subnet (gpu_extender_scheduler_host_cidrs)


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
    """Four control-plane hosts: an IPv4 address, an IPv6 address, a host name and no address at all; the lab's
    tenant pools (their sharing is one of the extender's settings)."""
    tenants = yaml.safe_load((REPO / "inventories/hongkong/group_vars/all/fleet.yml").read_text())["gpufleet_tenants"]
    return control_plane_inventory(
        tmp_path_factory.mktemp("extender-inventory"),
        {"cp-1": "10.20.0.11", "cp-2": "fd00:10::12", "cp-3": "cp-3.example.org", "cp-4": None},
        {"gpufleet_tenants": tenants},
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
        ({"gpu_extender_cluster_ip": "extender.local"}, "an IP address or null (got"),
        ({"gpu_extender_replicas": 2, "gpu_extender_pdb_min_available": 2}, "gpu_extender_pdb_min_available"),
        # the extender's own rules, in its own words (gpufleet-extender check-config on the rendered ConfigMap)
        ({"gpu_extender_weight_gpu_util": 0.6}, "WEIGHT_GPU_UTIL + WEIGHT_MEM_UTIL must be 1.0 (got 0.6 + 0.3 = 0.9)"),
        ({"gpu_extender_gpu_util_threshold": 1.5}, "GPU_UTIL_THRESHOLD: Input should be less than or equal to 1"),
        # the role's own rule comes first: https, or http:// with gpu_extender_prometheus_allow_http
        ({"gpu_extender_prometheus_url": "prometheus:9090"}, "must be https:// (got prometheus:9090)"),
        ({"gpu_extender_image_digest": "sha256:ABC"}, 'sha256:<64 lower-case hex> or null (got "sha256:ABC")'),
    ],
)
def test_bad_settings_fail_with_a_clear_message(tmp_path, extra, shown):
    inventory = control_plane_inventory(tmp_path, {"cp-1": "10.20.0.11"})
    result = run_extender(tmp_path, inventory, {"gpufleet_k8s_mode": "render", **extra})
    output = " ".join(result.stdout.split())  # the message is wrapped over several lines
    assert result.returncode != 0
    assert "gpu_extender: invalid settings" in output
    assert shown in output
    assert "Traceback" not in result.stdout + result.stderr


def test_auto_that_would_never_spread_is_refused_as_the_pod_refuses_it(tmp_path):
    # auto with AUTO_PACK_BELOW + AUTO_HYSTERESIS >= 1 would never spread: the extender refuses to start on it, and
    # the role used to deploy it anyway (the pods crash-looped).
    settings = {
        "gpu_extender_scoring_strategy": "auto",
        "gpu_extender_auto_pack_below": 0.6,
        "gpu_extender_auto_hysteresis": 0.5,
    }
    result, manifests = try_render(["gpu_extender"], tmp_path, extra_vars=settings)
    output = " ".join(result.stdout.split())
    assert result.returncode != 0
    assert "the extender would refuse this ConfigMap at start" in output
    assert "AUTO_PACK_BELOW + AUTO_HYSTERESIS must be below 1 (got 0.6 + 0.5): auto would never spread" in output
    assert not (manifests / "gpu_extender").exists()


def test_every_problem_of_the_settings_is_listed_at_once(tmp_path):
    settings = {
        "gpu_extender_scoring_strategy": "auto",
        "gpu_extender_auto_pack_below": 0.6,
        "gpu_extender_auto_hysteresis": 0.5,
        "gpu_extender_weight_mem_util": 0.5,
        "gpu_extender_mem_util_threshold": 2,
    }
    result, _manifests = try_render(["gpu_extender"], tmp_path, extra_vars=settings)
    output = " ".join(result.stdout.split())
    assert result.returncode != 0
    for problem in (
        "MEM_UTIL_THRESHOLD: Input should be less than or equal to 1",
        "WEIGHT_GPU_UTIL + WEIGHT_MEM_UTIL must be 1.0 (got 0.7 + 0.5 = 1.2)",
        "AUTO_PACK_BELOW + AUTO_HYSTERESIS must be below 1 (got 0.6 + 0.5): auto would never spread",
    ):
        assert problem in output


def test_tls_serves_from_the_secret_cert_manager_issues(lab, tmp_path):
    container = lab["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert container["args"] == [
        "--tls-cert-file",
        "/etc/gpufleet-extender/tls/tls.crt",
        "--tls-key-file",
        "/etc/gpufleet-extender/tls/tls.key",
    ]
    volumes = {v["name"]: v for v in lab["Deployment"]["spec"]["template"]["spec"]["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == "gpufleet-extender-tls"
    assert [item["key"] for item in volumes["tls"]["secret"]["items"]] == ["tls.crt", "tls.key"]  # never ca.key
    assert lab["Deployment"]["spec"]["template"]["spec"]["securityContext"]["fsGroup"] == 65532

    tls = tls_objects(tmp_path / "lab", "inventories/hongkong+lab")
    serving = tls[("Certificate", "gpufleet-extender-tls")]["spec"]
    assert serving["secretName"] == "gpufleet-extender-tls"
    assert serving["dnsNames"][0] == "gpufleet-extender.gpufleet-system.svc"
    assert serving["ipAddresses"] == ["10.96.0.50"]  # the static-pod scheduler calls the fixed ClusterIP
    assert serving["issuerRef"]["name"] == "gpufleet-extender-ca"
    assert tls[("Certificate", "gpufleet-extender-ca")]["spec"]["isCA"] is True
    assert tls[("Issuer", "gpufleet-extender-ca")]["spec"]["ca"] == {"secretName": "gpufleet-extender-ca"}

    own = tls_objects(tmp_path / "own", "inventories/hongkong+lab", {"gpu_extender_tls_source": "secret"})
    assert own == {}
    digest = "sha256:" + "0123456789abcdef" * 4
    plain = render_extender(
        tmp_path / "plain",
        "inventories/hongkong+lab",
        {"gpu_extender_tls_enabled": False, "gpu_extender_image_digest": digest},
    )
    container = plain["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert "args" not in container and container["readinessProbe"]["httpGet"]["scheme"] == "HTTP"
    assert container["image"] == f"gpufleet-extender:0.1.0@{digest}"  # pinned: the tag stays readable


# --- self-signed: a CA the role makes on the controller ----------------------------------------------------------

SECRET_FILE = "gpu_extender/tls-secret.yaml"
SERVER_NAME = "gpufleet-extender.gpufleet-system.svc"


def render_self_signed(tmp_path, pki, manifests, extra=None, check_mode=False):
    """The role in render mode with gpu_extender_tls_source self-signed, the PKI in `pki`, manifests in
    `manifests` (shared between runs, so a second run can find nothing to change), in check mode as a user asks
    for it (`--check`). Returns the run."""
    settings = {
        "gpufleet_k8s_mode": "render",
        "gpufleet_manifests_dir": str(manifests),
        "gpu_extender_tls_source": "self-signed",
        "gpu_extender_tls_pki_dir": str(pki),
        **(extra or {}),
    }
    tmp_path.mkdir(parents=True, exist_ok=True)
    result = run_extender(tmp_path, "inventories/hongkong+lab", settings, args=("--check",) if check_mode else ())
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    return result


def changed_count(result) -> int:
    return int(re.search(r"^localhost\s+:.*\bchanged=(\d+)", result.stdout, re.MULTILINE).group(1))


def rendered_secret(manifests) -> dict[str, bytes]:
    """The rendered TLS Secret's keys, decoded; checks its kind, type and the file's mode."""
    path = manifests / SECRET_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # it holds tls.key
    (secret,) = [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    assert (secret["kind"], secret["type"]) == ("Secret", "kubernetes.io/tls")
    assert secret["metadata"]["annotations"] == {
        "gpufleet.io/tls-source": "self-signed",
        "gpufleet.io/manifest": "gpu_extender/tls-secret",  # the set that delivered it (uninstall)
    }
    return {key: base64.b64decode(value) for key, value in secret["data"].items()}


def handshake(secret: dict[str, bytes], tmp_path, server_name: str) -> str:
    """Serve TLS on 127.0.0.1 with the Secret's certificate and key, connect verifying against its ca.crt for
    `server_name`; return the certificate's common name as the client saw it. Raises ssl.SSLError on a refusal."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    for key in ("tls.crt", "tls.key", "ca.crt"):
        (tmp_path / key).write_bytes(secret[key])
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    client_context = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]

        def accept_one():
            connection, _ = listener.accept()
            try:
                with server_context.wrap_socket(connection, server_side=True):
                    pass
            except (ssl.SSLError, OSError):
                pass

        server = threading.Thread(target=accept_one)
        server.start()
        try:
            with (
                socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
                client_context.wrap_socket(raw, server_hostname=server_name) as tls,
            ):
                subject = dict(item[0] for item in tls.getpeercert()["subject"])
        finally:
            server.join(10)
    return subject["commonName"]


def test_self_signed_ca_signs_a_certificate_a_client_verifies_for_the_service_name(tmp_path):
    pki, manifests = tmp_path / "pki", tmp_path / "manifests"
    render_self_signed(tmp_path / "run", pki, manifests)

    # The CA's key stays on the controller, owner-only; the Secret has the serving pair and the CA certificate.
    assert stat.S_IMODE(pki.stat().st_mode) == 0o700
    assert {path.name: stat.S_IMODE(path.stat().st_mode) for path in pki.iterdir()} == {
        "ca.key": 0o600,
        "ca.crt": 0o644,
        "tls.key": 0o600,
        "tls.crt": 0o644,
    }
    secret = rendered_secret(manifests)
    assert set(secret) == {"tls.crt", "tls.key", "ca.crt"}
    assert secret["tls.crt"] == (pki / "tls.crt").read_bytes() and secret["ca.crt"] == (pki / "ca.crt").read_bytes()
    assert (pki / "ca.key").read_bytes() not in secret.values()

    ca = x509.load_pem_x509_certificate(secret["ca.crt"])
    serving = x509.load_pem_x509_certificate(secret["tls.crt"])
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    assert serving.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    serving.verify_directly_issued_by(ca)
    names = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == [SERVER_NAME, SERVER_NAME + ".cluster.local"]
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == ["10.96.0.50"]  # the lab's ClusterIP
    usages = serving.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usages) == [x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]
    lifetime = serving.not_valid_after_utc - serving.not_valid_before_utc
    assert abs(lifetime - datetime.timedelta(hours=2160)) < datetime.timedelta(minutes=5)
    assert ca.not_valid_after_utc - ca.not_valid_before_utc > datetime.timedelta(days=3640)

    # A TLS client holding only ca.crt accepts the certificate for the Service's name, and for no other name.
    assert handshake(secret, tmp_path / "ok", SERVER_NAME) == SERVER_NAME
    with pytest.raises(ssl.SSLCertVerificationError, match="Hostname mismatch"):
        handshake(secret, tmp_path / "other", "gpufleet-extender.default.svc")

    # The pods roll when the certificate changes; no cert-manager objects are rendered.
    rendered = objects(load_manifests(manifests))
    annotations = rendered["Deployment"]["spec"]["template"]["metadata"]["annotations"]
    assert annotations["gpufleet.io/tls-certificate-hash"] == hashlib.sha256(secret["tls.crt"]).hexdigest()
    assert not (manifests / TLS_FILE).exists()


def test_self_signed_second_run_changes_nothing_and_renews_only_within_the_window(tmp_path):
    pki, manifests = tmp_path / "pki", tmp_path / "manifests"
    render_self_signed(tmp_path / "first", pki, manifests)
    first = {name: (pki / name).read_bytes() for name in ("ca.key", "ca.crt", "tls.key", "tls.crt")}

    second = render_self_signed(tmp_path / "second", pki, manifests)
    assert changed_count(second) == 0, second.stdout[-4000:]
    assert {name: (pki / name).read_bytes() for name in first} == first  # nothing re-issued

    # Renewal window wider than what is left (2160h): re-issued by the same CA with the same key.
    renewed_run = render_self_signed(tmp_path / "renew", pki, manifests, {"gpu_extender_tls_renew_before": "2200h"})
    assert changed_count(renewed_run) > 0
    renewed = x509.load_pem_x509_certificate((pki / "tls.crt").read_bytes())
    assert renewed.serial_number != x509.load_pem_x509_certificate(first["tls.crt"]).serial_number
    assert (pki / "ca.crt").read_bytes() == first["ca.crt"] and (pki / "tls.key").read_bytes() == first["tls.key"]
    renewed.verify_directly_issued_by(x509.load_pem_x509_certificate(first["ca.crt"]))
    assert rendered_secret(manifests)["tls.crt"] == (pki / "tls.crt").read_bytes()

    # Back to the default window: the renewed certificate is kept.
    kept = render_self_signed(tmp_path / "kept", pki, manifests)
    assert changed_count(kept) == 0
    assert x509.load_pem_x509_certificate((pki / "tls.crt").read_bytes()).serial_number == renewed.serial_number

    # A name added to the certificate re-issues it at once.
    names = [SERVER_NAME, "gpufleet-extender.example.internal"]
    render_self_signed(tmp_path / "names", pki, manifests, {"gpu_extender_tls_dns_names": names})
    serving = x509.load_pem_x509_certificate((pki / "tls.crt").read_bytes())
    alt = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert alt.get_values_for_type(x509.DNSName) == names
    assert (pki / "ca.crt").read_bytes() == first["ca.crt"]


def test_self_signed_check_mode_makes_nothing_and_another_source_drops_the_file(tmp_path):
    pki, manifests = tmp_path / "pki", tmp_path / "manifests"
    check = render_self_signed(tmp_path / "check", pki, manifests, check_mode=True)
    assert "check mode - the CA and the serving certificate would be made in" in " ".join(check.stdout.split())
    assert not pki.exists() and not (manifests / SECRET_FILE).exists()

    render_self_signed(tmp_path / "made", pki, manifests)
    assert (manifests / SECRET_FILE).exists()
    # In check mode with the PKI in place: it is read, and nothing changes.
    again = render_self_signed(tmp_path / "check-again", pki, manifests, check_mode=True)
    assert changed_count(again) == 0

    render_self_signed(tmp_path / "cm", pki, manifests, {"gpu_extender_tls_source": "cert-manager"})
    assert not (manifests / SECRET_FILE).exists()  # the key leaves the manifests with the source
    assert (manifests / TLS_FILE).exists()


@pytest.mark.parametrize(
    ("extra", "shown"),
    [
        # the role's argument spec, before any task
        ({"gpu_extender_tls_source": "vault"}, "must be one of: auto, cert-manager, self-signed, secret, got: vault"),
        ({"gpu_extender_tls_renew_before": "30d"}, "such as 2160h or 1h30m (got 2160h, 30d, 87600h)"),
        ({"gpu_extender_tls_duration": "h"}, "such as 2160h or 1h30m (got h, 720h, 87600h)"),
        ({"gpu_extender_tls_dns_names": []}, "gpu_extender_tls_dns_names at least one name"),
    ],
)
def test_bad_tls_settings_fail_with_a_clear_message(tmp_path, extra, shown):
    settings = {"gpufleet_k8s_mode": "render", "gpufleet_manifests_dir": str(tmp_path / "manifests"), **extra}
    result = run_extender(tmp_path, "inventories/hongkong+lab", settings)
    output = " ".join(result.stdout.split())
    assert result.returncode != 0
    assert shown in output
    assert "Traceback" not in result.stdout + result.stderr
    assert not (tmp_path / "manifests").exists()


# --- apply mode -------------------------------------------------------------------------------------------------


def test_apply_mode_reaches_the_api_server(tmp_path):
    """Check mode against a closed port: the first apply fails on the connection, not on its arguments."""
    inventory = control_plane_inventory(tmp_path, {"cp-1": "10.20.0.11"})
    extra = {
        "gpufleet_k8s_mode": "apply",
        "gpufleet_kubeconfig": closed_port_kubeconfig(tmp_path),
        "gpu_extender_tls_source": "secret",  # auto needs the API's answer first: the next test
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


def test_auto_tls_without_an_answer_from_the_api_makes_no_ca_and_says_why(tmp_path):
    inventory = control_plane_inventory(tmp_path, {"cp-1": "10.20.0.11"})
    extra = {
        "gpufleet_k8s_mode": "apply",
        "gpufleet_kubeconfig": closed_port_kubeconfig(tmp_path),
        "gpu_extender_tls_pki_dir": str(tmp_path / "pki"),
    }
    result = run_extender(tmp_path, inventory, extra)
    output = " ".join(result.stdout.split())
    assert result.returncode != 0
    assert "gpu_extender_tls_source is auto but the cluster did not say whether cert-manager is installed" in output
    assert "choose: gpu_extender_tls_source cert-manager, self-signed or secret" in output
    assert not (tmp_path / "pki").exists()


def test_scoring_strategy_reaches_the_extender_settings(tmp_path):
    rendered = render_extender(
        tmp_path,
        "inventories/hongkong+lab",
        extra_vars={
            "gpu_extender_scoring_strategy": "auto",
            "gpu_extender_auto_pack_below": 0.3,
            "gpu_extender_shared_mem_free_min": 0.35,
        },
    )
    data = rendered["ConfigMap"]["data"]
    assert (data["SCORING_STRATEGY"], data["AUTO_PACK_BELOW"]) == ("auto", "0.3")
    assert data["SHARED_MEM_FREE_MIN"] == "0.35"
    # a setting left null is left to the extender's own default, not restated in the ConfigMap
    assert "PACK_TARGET_UTIL" not in data and "GPU_UTIL_THRESHOLD" not in data


def test_the_pools_sharing_reaches_the_extender_as_the_pod_reads_it(tmp_path, monkeypatch):
    tenants = yaml.safe_load((REPO / "inventories/hongkong/group_vars/all/fleet.yml").read_text())["gpufleet_tenants"]
    tenants["llm"]["sharing"] = {"gpu": 2}
    tenants["imagegen"]["sharing"] = {"nvidia.com/mig-1g.10gb": 8}  # the largest count of a resource wins
    rendered = render_extender(
        tmp_path, "inventories/hongkong+lab", {"gpufleet_tenants": tenants, "gpu_extender_interference_weight": 1.5}
    )
    data = rendered["ConfigMap"]["data"]
    # The pod loads the ConfigMap with envFrom: read it from the environment exactly as the extender does.
    for key, value in data.items():
        monkeypatch.setenv(key, value)
    policy = Policy.from_settings(Settings())
    assert policy.shared_resources == (("nvidia.com/gpu", 2), ("nvidia.com/mig-1g.10gb", 8))
    assert policy.replicas_of("nvidia.com/mig-2g.20gb") == 1
    assert policy.interference_weight == 1.5

    # Without any sharing the setting is left out, and the extender's default (nothing shared) applies.
    for spec in tenants.values():
        spec.pop("sharing", None)
    data = render_extender(tmp_path / "none", "inventories/hongkong+lab", {"gpufleet_tenants": tenants})["ConfigMap"][
        "data"
    ]
    assert "SHARED_RESOURCES" not in data and "INTERFERENCE_WEIGHT" not in data and "SHARED_MEM_FREE_MIN" not in data


def test_a_bad_interference_weight_or_sharing_is_refused(tmp_path):
    result, manifests = try_render(["gpu_extender"], tmp_path, extra_vars={"gpu_extender_interference_weight": 11})
    assert result.returncode != 0
    assert "INTERFERENCE_WEIGHT" in result.stdout and "less than or equal to 10" in result.stdout
    assert not (manifests / "gpu_extender").exists()
    result, manifests = try_render(
        ["gpu_extender"], tmp_path / "sharing", extra_vars={"gpu_extender_shared_resources": {"amd.com/gpu": 2}}
    )
    assert result.returncode != 0
    assert "SHARED_RESOURCES" in result.stdout and "amd.com/gpu" in result.stdout


def test_a_pack_target_above_the_filter_threshold_is_refused(tmp_path):
    settings = {"gpu_extender_scoring_strategy": "pack", "gpu_extender_pack_target_util": 0.9}
    result, manifests = try_render(["gpu_extender"], tmp_path, extra_vars=settings)
    assert result.returncode != 0
    assert "PACK_TARGET_UTIL (0.9) must be below GPU_UTIL_THRESHOLD (0.8) with SCORING_STRATEGY=pack" in " ".join(
        result.stdout.split()
    )
    assert not (manifests / "gpu_extender").exists()


# --- the metrics path: Prometheus over https, a pinned CA, a token of its own ---------------------------------


def test_lab_queries_prometheus_over_https_with_a_pinned_ca_and_its_own_token(lab):
    settings = lab["ConfigMap"]["data"]
    assert settings["PROMETHEUS_URL"] == "https://prometheus-operated.monitoring.svc:9090"
    assert settings["PROMETHEUS_CA_FILE"] == "/etc/gpufleet/prometheus-ca/ca.crt"
    assert settings["PROMETHEUS_TOKEN_FILE"] == "/etc/gpufleet/prometheus-token/token"
    pod = lab["Deployment"]["spec"]["template"]["spec"]
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mounts["prometheus-ca"] == {
        "name": "prometheus-ca",
        "mountPath": "/etc/gpufleet/prometheus-ca",
        "readOnly": True,
    }
    assert mounts["prometheus-token"]["mountPath"] == "/etc/gpufleet/prometheus-token"
    assert mounts["prometheus-token"]["readOnly"] is True and "subPath" not in mounts["prometheus-token"]
    assert volumes["prometheus-ca"]["configMap"]["name"] == "kube-root-ca.crt"
    assert volumes["prometheus-ca"]["configMap"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]
    assert volumes["prometheus-token"]["secret"]["secretName"] == "gpufleet-extender-prometheus"
    assert volumes["prometheus-token"]["secret"]["items"] == [{"key": "prometheusAuthToken", "path": "token"}]
    assert "Secret" not in lab  # the token is never rendered to a file


def test_plain_http_prometheus_is_refused_without_the_opt_out(tmp_path):
    inventory = control_plane_inventory(tmp_path, {"cp-1": "10.20.0.11"})
    plain = {"gpufleet_k8s_mode": "render", "gpu_extender_prometheus_url": "http://prometheus.monitoring.svc:9090"}
    result = run_extender(tmp_path, inventory, plain)
    output = " ".join(result.stdout.split())
    assert result.returncode != 0
    assert "gpu_extender_prometheus_url must be https:// (got http://prometheus.monitoring.svc:9090)" in output
    assert "gpu_extender_prometheus_allow_http: true for a lab only" in output
    assert "Traceback" not in result.stdout + result.stderr


def test_the_http_opt_out_sends_the_token_but_pins_no_ca(tmp_path):
    inventory = control_plane_inventory(tmp_path, {"cp-1": "10.20.0.11"})
    opt_out = {"gpu_extender_prometheus_url": "http://127.0.0.1:9090", "gpu_extender_prometheus_allow_http": True}
    rendered = render_extender(tmp_path, inventory, opt_out)
    settings = rendered["ConfigMap"]["data"]
    assert settings["PROMETHEUS_URL"] == "http://127.0.0.1:9090" and "PROMETHEUS_CA_FILE" not in settings
    assert settings["PROMETHEUS_TOKEN_FILE"] == "/etc/gpufleet/prometheus-token/token"
    volumes = {v["name"] for v in rendered["Deployment"]["spec"]["template"]["spec"]["volumes"]}
    assert "prometheus-token" in volumes and "prometheus-ca" not in volumes


def test_the_extender_gets_no_query_form(lab):
    # The raw dcgm series are the one form pulled (PROMETHEUS_QUERY is gone: the extender refuses it).
    assert "PROMETHEUS_QUERY" not in lab["ConfigMap"]["data"]


# --- the push form -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "source"),
    [
        ({"gpufleet_metrics_push_from_nodes": 1}, "push"),  # the lab's GPU nodes are at least one
        ({"gpufleet_metrics_push_from_nodes": 100_000}, "prometheus"),
        ({"gpufleet_metrics_push_from_nodes": 1, "gpufleet_gpu_nodes_group": "no_such_group"}, "prometheus"),
        ({"gpufleet_metrics_push_from_nodes": 1, "gpufleet_metrics_source": "prometheus"}, "prometheus"),
    ],
)
def test_the_load_is_pushed_by_default_from_a_fleet_size_on(tmp_path, extra, source):
    # roles/gpufleet's one rule: push once the GPU node group holds gpufleet_metrics_push_from_nodes hosts.
    manifests = render_roles(["gpu_extender"], tmp_path, inventory="inventories/hongkong+lab", extra_vars=extra)
    docs = [doc for name, docs in load_manifests(manifests).items() if name.startswith("gpu_extender/") for doc in docs]
    (config,) = [doc for doc in docs if doc["kind"] == "ConfigMap" and doc["metadata"]["name"] == "gpufleet-extender"]
    assert config["data"]["METRICS_SOURCE"] == source
    assert {doc["kind"] for doc in docs} >= ({"StatefulSet"} if source == "push" else {"Deployment"})


@pytest.fixture(scope="module")
def pushed(tmp_path_factory):
    """The lab rendered with gpufleet_metrics_source: push: the objects keyed by (kind, name), and the directory."""
    manifests = render_roles(
        ["gpu_extender"],
        tmp_path_factory.mktemp("extender-push"),
        inventory="inventories/hongkong+lab",
        extra_vars={"gpufleet_metrics_source": "push"},
    )
    assert validate_manifests(manifests) > 0
    found = {
        (doc["kind"], doc["metadata"]["name"]): doc
        for name, docs in load_manifests(manifests).items()
        if name.startswith("gpu_extender/")
        for doc in docs
    }
    return found, manifests


def test_push_makes_each_replica_a_receiver_with_an_address_of_its_own(pushed):
    found, _ = pushed
    assert ("Deployment", "gpufleet-extender") not in found
    workload = found[("StatefulSet", "gpufleet-extender")]["spec"]
    assert workload["serviceName"] == "gpufleet-metrics-receivers"
    assert workload["podManagementPolicy"] == "Parallel"
    receivers = found[("Service", "gpufleet-metrics-receivers")]["spec"]
    assert receivers["clusterIP"] == "None"
    # A replica is ready only once pushed to: its address must resolve before that.
    assert receivers["publishNotReadyAddresses"] is True
    # The fleet's receivers (the extender's replicas, gpufleet-scheduler's in plugin mode) by their label.
    assert receivers["selector"] == {"gpufleet.io/metrics-receiver": "true"}
    assert workload["template"]["metadata"]["labels"] == {**SELECTOR, **receivers["selector"], **PART_OF}
    assert receivers["ports"] == [
        {"name": "remote-write", "port": 9402, "targetPort": "remote-write", "protocol": "TCP"}
    ]
    (container,) = workload["template"]["spec"]["containers"]
    assert {"name": "remote-write", "containerPort": 9402, "protocol": "TCP"} in container["ports"]
    # The scheduler-facing Service is unchanged: the receivers are not behind it.
    assert [p["name"] for p in found[("Service", "gpufleet-extender")]["spec"]["ports"]] == ["https"]


def test_push_settings_point_at_the_mounted_token_and_certificate(pushed):
    found, _ = pushed
    data = found[("ConfigMap", "gpufleet-extender")]["data"]
    assert data["METRICS_SOURCE"] == "push"
    assert data["REMOTE_WRITE_ADDRESS"] == ":9402"
    pod = found[("StatefulSet", "gpufleet-extender")]["spec"]["template"]["spec"]
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    token = volumes["remote-write-token"]["secret"]
    assert token["secretName"] == "gpufleet-remote-write"
    (item,) = token["items"]
    assert item["key"] == "token"
    assert data["REMOTE_WRITE_TOKEN_FILE"] == f"{mounts['remote-write-token']}/{item['path']}"
    tls = {i["key"]: f"{mounts['tls']}/{i['path']}" for i in volumes["tls"]["secret"]["items"]}
    assert (data["REMOTE_WRITE_CERT_FILE"], data["REMOTE_WRITE_KEY_FILE"]) == (tls["tls.crt"], tls["tls.key"])
    # (The role rendered them only after the extender's own check-config accepted this ConfigMap.)


def test_only_prometheus_reaches_the_receivers(pushed):
    found, _ = pushed
    rules = found[("NetworkPolicy", "gpufleet-extender")]["spec"]["ingress"]
    (receivers,) = [rule for rule in rules if rule["ports"][0]["port"] == "remote-write"]
    peers = [
        (p["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"], p["podSelector"]["matchLabels"])
        for p in receivers["from"]
    ]
    assert peers == [("monitoring", {"app.kubernetes.io/name": "prometheus"})]


def test_prometheus_is_told_every_receiver_and_the_certificate_names_them(pushed):
    found, manifests = pushed
    certificate = found[("Certificate", "gpufleet-extender-tls")]["spec"]
    replicas = found[("StatefulSet", "gpufleet-extender")]["spec"]["replicas"]
    plain = yaml.safe_load((manifests / "gpu_extender" / "remote-write.yaml.snippet").read_text())["remote_write"]
    operator = yaml.safe_load((manifests / "gpu_extender" / "remote-write-operator.yaml.snippet").read_text())
    urls = [entry["url"] for entry in plain]
    assert urls == [entry["url"] for entry in operator["remoteWrite"]]
    assert urls == [
        f"https://gpufleet-extender-{i}.gpufleet-metrics-receivers.gpufleet-system.svc:9402/api/v1/write"
        for i in range(replicas)
    ]
    for url in urls:  # a wildcard covers exactly one label: the pod's name
        host = url.split("/")[2].split(":")[0]
        assert any(
            name == host or (name.startswith("*.") and host.split(".", 1)[1] == name[2:])
            for name in certificate["dnsNames"]
        ), (host, certificate["dnsNames"])
    entry = operator["remoteWrite"][0]
    assert entry["authorization"]["credentials"] == {"name": "gpufleet-remote-write", "key": "token"}
    assert entry["tlsConfig"]["ca"]["configMap"] == {"name": "gpufleet-remote-write-ca", "key": "ca.crt"}
    assert plain[0]["write_relabel_configs"][0]["regex"].count("|") == 3  # the four dcgm series, nothing else


def test_without_push_the_replicas_stay_a_deployment_and_nothing_listens_for_writes(lab):
    assert "StatefulSet" not in lab
    assert "REMOTE_WRITE_ADDRESS" not in lab["ConfigMap"]["data"]
    ports = lab["Deployment"]["spec"]["template"]["spec"]["containers"][0]["ports"]
    assert [p["name"] for p in ports] == ["https"]


def test_an_inventory_without_fleet_wide_settings_gets_the_collections_defaults(tmp_path):
    # No gpufleet_namespace, gpufleet_tenants, ...: roles/gpufleet's defaults apply, as they do for every role.
    inventory = write_inventory(tmp_path, {"all": {"children": {"control_plane": {"hosts": {"cp-1": None}}}}})
    rendered = render_extender(tmp_path, inventory)
    assert {doc["metadata"].get("namespace") for doc in rendered.values()} == {"gpufleet-system", None}
    assert rendered["ConfigMap"]["data"]["EXPORTER_NAMESPACE"] == "gpufleet-node-agents"
    assert rendered["ConfigMap"]["data"]["METRICS_SOURCE"] == "prometheus"


# --- memory by fleet size ------------------------------------------------------------------------------------------
# A replica's RSS, measured with the newest sample of 5,000 nodes x 8 GPUs x 7 MIG instances held
# (extender/benchmarks/bench_remote_write.py --http 5000x7x2000): the limit of such a fleet must hold it.
RSS_AT_5000_NODES_MIB = 716


def fleet_inventory(tmp_path, gpu_hosts: int) -> str:
    """A control plane and `gpu_hosts` hosts in gpu_nodes (rendering reaches none of them)."""
    hosts = {f"gpu-{i:05d}": None for i in range(gpu_hosts)}
    inventory = {"all": {"children": {"control_plane": {"hosts": {"cp-1": None}}, "gpu_nodes": {"hosts": hosts}}}}
    return write_inventory(tmp_path, inventory)


def extender_container(tmp_path, gpu_hosts: int, extra_vars=None) -> tuple[str, dict]:
    """(METRICS_SOURCE, the extender's container) rendered for a fleet of `gpu_hosts` GPU hosts."""
    manifests = render_roles(
        ["gpu_extender"], tmp_path, inventory=fleet_inventory(tmp_path, gpu_hosts), extra_vars=extra_vars
    )
    found = {
        (doc["kind"], doc["metadata"]["name"]): doc
        for name, docs in load_manifests(manifests).items()
        if name.startswith("gpu_extender/")
        for doc in docs
    }
    source = found[("ConfigMap", "gpufleet-extender")]["data"]["METRICS_SOURCE"]
    workload = found.get(("StatefulSet", "gpufleet-extender")) or found[("Deployment", "gpufleet-extender")]
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    return source, container


@pytest.mark.parametrize(("gpu_hosts", "source"), [(20, "prometheus"), (250, "push"), (5000, "push")])
def test_memory_grows_with_the_pushed_fleet(tmp_path, gpu_hosts, source):
    # Push by default from 200 GPU hosts on; the receiver's 160 KiB per host, rounded up to MiB, on the request and
    # the limit.
    rendered_source, container = extender_container(tmp_path, gpu_hosts)
    assert rendered_source == source
    extra = -(-gpu_hosts * 160 // 1024) if source == "push" else 0
    assert container["resources"]["requests"]["memory"] == f"{128 + extra}Mi"
    assert container["resources"]["limits"]["memory"] == f"{512 + extra}Mi"
    if gpu_hosts == 5000:
        assert 512 + extra > RSS_AT_5000_NODES_MIB * 1.5


def test_memory_can_be_set_whole(tmp_path):
    resources = {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "4Gi"}}
    _, container = extender_container(tmp_path, 300, {"gpu_extender_resources": resources})
    assert container["resources"] == resources
