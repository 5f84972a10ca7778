"""Test helpers: dcgm-exporter text for a few nodes, pods and ExtenderArgs shaped as kube-scheduler sends them."""

from __future__ import annotations

import json
import socket
from pathlib import Path

from exposition import DeviceLoad, render_exposition

from gpufleet_extender.config import Settings, load_settings


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for a server a test or benchmark starts)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def gpus(*utils: float, mem_used_mib: float = 8000.0) -> list[DeviceLoad]:
    """Whole GPUs 0..n-1 with the given utilisations (0..1)."""
    return [DeviceLoad(i, util, mem_used_mib) for i, util in enumerate(utils)]


def mig(gpu: int, profile: str, *utils: float, mem_used_mib=1000.0, total=40960.0, first_id=1) -> list[DeviceLoad]:
    """MIG instances of one profile on GPU ``gpu``; GPU_I_IDs from ``first_id`` (unique per GPU, as in DCGM)."""
    return [
        DeviceLoad(gpu, util, mem_used_mib, total, profile, instance)
        for instance, util in enumerate(utils, start=first_id)
    ]


def make_pod(resources: dict | None = None, namespace: str = "team-a", init: dict | None = None) -> dict:
    container = {"name": "main", "image": "cuda:12", "resources": {"limits": resources} if resources else {}}
    spec: dict = {"containers": [container], "schedulerName": "default-scheduler"}
    if init:
        spec["initContainers"] = [{"name": "init", "image": "busybox", "resources": {"limits": init}}]
    return {
        "metadata": {"name": "job-1", "namespace": namespace, "uid": "2f0c1c9e-0000-4000-8000-000000000001"},
        "spec": spec,
        "status": {"phase": "Pending"},
    }


def names_args(pod: dict, names: list[str]) -> dict:
    """ExtenderArgs of an extender with nodeCacheCapable: true (Go writes the nil Nodes as null)."""
    return {"Pod": pod, "Nodes": None, "NodeNames": names}


def node_obj(name: str, labels: dict | None = None) -> dict:
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
        "spec": {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]},
        "status": {"allocatable": {"nvidia.com/gpu": "8"}, "nodeInfo": {"kubeletVersion": "v1.31.4"}},
    }


def nodes_args(pod: dict, nodes: list[dict]) -> dict:
    """ExtenderArgs of an extender with nodeCacheCapable: false."""
    return {"Pod": pod, "Nodes": {"metadata": {}, "items": nodes}, "NodeNames": None}


def write_metrics(path: Path, fleet: dict, host_label: str = "Hostname", timestamp_ms: int | None = None) -> Path:
    path.write_text(render_exposition(fleet, host_label=host_label, timestamp_ms=timestamp_ms))
    return path


def file_settings(metrics_file: Path, **overrides) -> Settings:
    return load_settings(METRICS_SOURCE="file", METRICS_FILE=str(metrics_file), KUBE_API="off", **overrides)


def body(obj) -> bytes:
    return json.dumps(obj).encode()


def write_ca_and_server_cert(directory: Path, host: str = "127.0.0.1") -> tuple[Path, Path, Path]:
    """A throwaway CA and a serving certificate it issued for ``host`` (an IP address): ca.crt, tls.crt, tls.key."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)

    def certificate(subject: str, key, issuer: x509.Name | None, signer, *, ca: bool) -> x509.Certificate:
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
        builder = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(issuer or name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if ca:
            builder = builder.add_extension(
                x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
            )
        else:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(host))]), critical=False
            )
        return builder.sign(signer, hashes.SHA256())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = certificate("test CA", ca_key, None, ca_key, ca=True)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = certificate(host, key, ca_cert.subject, ca_key, ca=False)
    paths = directory / "ca.crt", directory / "tls.crt", directory / "tls.key"
    paths[0].write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return paths
