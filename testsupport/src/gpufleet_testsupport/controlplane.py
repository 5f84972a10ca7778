"""A real Kubernetes control plane on 127.0.0.1 for the tests and benchmarks: etcd, kube-apiserver, and on demand
kube-controller-manager and kube-scheduler (or gpufleet-scheduler), from the binaries `make k8s-assets` builds.

Each control plane has its own directory with a throwaway PKI (a CA, the apiserver's serving certificate, the
service-account key pair, an admin client certificate in `system:masters`), an admin kubeconfig, every component's
log and etcd's data. Components listen on free 127.0.0.1 ports and are stopped by PID, schedulers and controllers
first, then the apiserver, then etcd. No node or kubelet runs: tests create Node objects and play the kubelet's
part (node status, pod status) themselves.

Used by `tests/integration/k8s/conftest.py` (pytest fixtures) and `benchmarks/bench_scheduler.py`.
"""

from __future__ import annotations

import datetime
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpufleet_testsupport.collection import REPO
from gpufleet_testsupport.ports import free_port

BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
# kubeadm's default Service CIDR: the lab's inventory pins the extender's ClusterIP inside it.
SERVICE_CIDR = "10.96.0.0/12"
# start_scheduler's extra_args for a scheduler that serves its health and /metrics without a token (its counters,
# GPUScore's gauges).
OPEN_METRICS = ("--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",)


class ControlPlaneError(RuntimeError):
    """A component did not start or answer; the message carries the end of its log."""


def assets_dir() -> Path:
    """Where the binaries are: KUBE_ASSETS, else KUBEBUILDER_ASSETS (envtest's name), else build/k8s/bin."""
    for variable in ("KUBE_ASSETS", "KUBEBUILDER_ASSETS"):
        if os.environ.get(variable):
            return Path(os.environ[variable]).resolve()
    return REPO / "build" / "k8s" / "bin"


def missing_assets(names: tuple[str, ...] = BINARIES) -> list[str]:
    """The binaries of `names` that are not executable in assets_dir()."""
    directory = assets_dir()
    return [name for name in names if not os.access(directory / name, os.X_OK)]


def needs_assets(*names: str) -> pytest.MarkDecorator:
    """Skip a test (module: in pytestmark) without these binaries in assets_dir()."""
    return pytest.mark.skipif(
        bool(missing_assets(names)), reason=f"no {', '.join(names)} in {assets_dir()}: run `make k8s-assets`"
    )


# --- PKI ---------------------------------------------------------------------------------------------------------
def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    path.chmod(0o600)


def _issue(
    ca_key: ec.EllipticCurvePrivateKey | None,
    ca_cert: x509.Certificate | None,
    subject: x509.Name,
    *,
    is_ca: bool = False,
    server_names: tuple[str, ...] = (),
    client: bool = False,
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A new P-256 key and a certificate for it, signed by the CA (self-signed when ca_key is None)."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject if ca_cert else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True)
    )
    if is_ca:  # certificate and CRL signing: a CA without key usage fails strict verification (Python 3.13's default)
        builder = builder.add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
    if server_names:
        import ipaddress

        alt_names: list[x509.GeneralName] = []
        for name in server_names:
            try:
                alt_names.append(x509.IPAddress(ipaddress.ip_address(name)))
            except ValueError:
                alt_names.append(x509.DNSName(name))
        builder = builder.add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
    usages = [ExtendedKeyUsageOID.SERVER_AUTH] if server_names else []
    usages += [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
    if usages:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    cert = builder.sign(ca_key or key, hashes.SHA256())
    return key, cert


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attributes.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attributes)


@dataclass
class Pki:
    """The files of one control plane's throwaway PKI."""

    directory: Path

    @property
    def ca(self) -> Path:
        return self.directory / "ca.crt"

    def create(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        ca_key, ca_cert = _issue(None, None, _name("gpufleet-test-ca"), is_ca=True)
        self._save("ca", ca_key, ca_cert)
        self._save(
            "apiserver",
            *_issue(
                ca_key,
                ca_cert,
                _name("kube-apiserver"),
                server_names=("127.0.0.1", "localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"),
            ),
        )
        self._save("admin", *_issue(ca_key, ca_cert, _name("gpufleet-test-admin", "system:masters"), client=True))
        service_account_key = ec.generate_private_key(ec.SECP256R1())
        _write_key(self.directory / "sa.key", service_account_key)
        (self.directory / "sa.pub").write_bytes(
            service_account_key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )

    def _save(self, stem: str, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> None:
        _write_key(self.directory / f"{stem}.key", key)
        (self.directory / f"{stem}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    def file(self, name: str) -> str:
        return str(self.directory / name)

    def issue_server(self, stem: str, server_names: tuple[str, ...]) -> dict[str, Path]:
        """A serving certificate for `server_names` signed by the cluster's CA (the one kube-root-ca.crt holds), as a
        kubernetes.io/tls Secret holds it: {"ca.crt", "tls.crt", "tls.key"} -> files."""
        ca_key = serialization.load_pem_private_key((self.directory / "ca.key").read_bytes(), password=None)
        ca_cert = x509.load_pem_x509_certificate(self.ca.read_bytes())
        assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
        self._save(stem, *_issue(ca_key, ca_cert, _name(stem), server_names=server_names))
        return {"ca.crt": self.ca, "tls.crt": self.directory / f"{stem}.crt", "tls.key": self.directory / f"{stem}.key"}

    def issue_client(self, user: str, groups: tuple[str, ...] = ()) -> tuple[str, str]:
        """A client certificate for `user` in `groups` (the apiserver reads CN as the user name and each O as a
        group, as for any x509 user), signed by this CA; returns the certificate's and the key's paths."""
        ca_key = serialization.load_pem_private_key((self.directory / "ca.key").read_bytes(), password=None)
        ca_cert = x509.load_pem_x509_certificate(self.ca.read_bytes())
        attributes = [x509.NameAttribute(NameOID.COMMON_NAME, user)]
        attributes += [x509.NameAttribute(NameOID.ORGANIZATION_NAME, group) for group in groups]
        assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
        stem = "user-" + user.replace("@", "-at-")
        self._save(stem, *_issue(ca_key, ca_cert, x509.Name(attributes), client=True))
        return self.file(f"{stem}.crt"), self.file(f"{stem}.key")


def serving_files(directory: Path, stem: str, server_names: tuple[str, ...]) -> dict[str, Path]:
    """A CA of its own and a serving certificate it signed for `server_names`, as a kubernetes.io/tls Secret holds
    them: {"ca.crt", "tls.crt", "tls.key"} -> files in `directory` (prefixed with `stem`)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = _issue(None, None, _name(f"{stem}-ca"), is_ca=True)
    key, cert = _issue(ca_key, ca_cert, _name(stem), server_names=server_names)
    files = {name: directory / f"{stem}-{name}" for name in ("ca.crt", "tls.crt", "tls.key")}
    files["ca.crt"].write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    files["tls.crt"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(files["tls.key"], key)
    return files


# --- the control plane -------------------------------------------------------------------------------------------
@dataclass
class ControlPlane:
    """etcd + kube-apiserver, plus the controllers and schedulers a test asks for. Use as a context manager."""

    workdir: Path
    assets: Path = field(default_factory=assets_dir)
    # An apiserver.config.k8s.io AdmissionConfiguration (--admission-control-config-file), or None.
    admission_config: dict | None = None
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.pki = Pki(self.workdir / "pki")

    # The admin's view, for clients and tools.
    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports['kube-apiserver']}"

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "admin.kubeconfig"

    def http_client(self, **kwargs) -> httpx.Client:
        """An httpx client to the apiserver as the admin (client certificate, the test CA)."""
        return httpx.Client(
            base_url=self.server,
            verify=str(self.pki.ca),
            cert=(self.pki.file("admin.crt"), self.pki.file("admin.key")),
            **kwargs,
        )

    def __enter__(self) -> ControlPlane:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def start(self) -> None:
        if not (self.workdir / "pki" / "ca.crt").exists():
            self.pki.create()
        self.ports.setdefault("etcd", free_port())
        self.ports.setdefault("etcd-peer", free_port())
        self.ports.setdefault("kube-apiserver", free_port())
        self._write_kubeconfig()
        self.start_etcd()
        self.start_apiserver()

    def _write_kubeconfig(self) -> None:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": "test", "cluster": {"server": self.server, "certificate-authority": str(self.pki.ca)}}
            ],
            "users": [
                {
                    "name": "admin",
                    "user": {
                        "client-certificate": self.pki.file("admin.crt"),
                        "client-key": self.pki.file("admin.key"),
                    },
                }
            ],
            "contexts": [{"name": "admin@test", "context": {"cluster": "test", "user": "admin"}}],
            "current-context": "admin@test",
        }
        self.kubeconfig.write_text(yaml.safe_dump(config))

    def user_kubeconfig(self, user: str, groups: tuple[str, ...] = ()) -> Path:
        """A kubeconfig authenticating as `user` in `groups` with a client certificate of this control plane's CA."""
        cert, key = self.pki.issue_client(user, groups)
        config = yaml.safe_load(self.kubeconfig.read_text())
        config["users"] = [{"name": user, "user": {"client-certificate": cert, "client-key": key}}]
        config["contexts"] = [{"name": "user@test", "context": {"cluster": "test", "user": user}}]
        config["current-context"] = "user@test"
        path = self.workdir / f"user-{user.replace('@', '-at-')}.kubeconfig"
        path.write_text(yaml.safe_dump(config))
        return path

    def start_etcd(self) -> None:
        client, peer = self.ports["etcd"], self.ports["etcd-peer"]
        self._spawn(
            "etcd",
            [
                "--name=default",
                f"--data-dir={self.workdir / 'etcd-data'}",
                f"--listen-client-urls=http://127.0.0.1:{client}",
                f"--advertise-client-urls=http://127.0.0.1:{client}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=default=http://127.0.0.1:{peer}",
                # Throwaway data: no fsync, as envtest does; it is most of etcd's cost on a small disk.
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )
        self._wait("etcd", lambda: httpx.get(f"http://127.0.0.1:{client}/health", timeout=2).status_code == 200)

    def start_apiserver(self) -> None:
        extra = []
        if self.admission_config is not None:
            path = self.workdir / "admission-config.yaml"
            path.write_text(yaml.safe_dump(self.admission_config))
            extra.append(f"--admission-control-config-file={path}")
        self._spawn(
            "kube-apiserver",
            [
                *extra,
                f"--etcd-servers=http://127.0.0.1:{self.ports['etcd']}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.ports['kube-apiserver']}",
                f"--tls-cert-file={self.pki.file('apiserver.crt')}",
                f"--tls-private-key-file={self.pki.file('apiserver.key')}",
                f"--client-ca-file={self.pki.ca}",
                f"--service-account-key-file={self.pki.file('sa.pub')}",
                f"--service-account-signing-key-file={self.pki.file('sa.key')}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                "--authorization-mode=RBAC",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                # No real node address to publish for the `kubernetes` Service's endpoints.
                "--endpoint-reconciler-type=none",
                "--allow-privileged=true",
                f"--cert-dir={self.workdir / 'apiserver-certs'}",
                "-v=1",
            ],
        )
        self._wait("kube-apiserver", self._apiserver_ready, timeout=90)

    def restart_apiserver(self) -> None:
        """Stop the apiserver and start it again on the same port: every watch on it breaks."""
        self.stop_component("kube-apiserver")
        self.start_apiserver()

    def _apiserver_ready(self) -> bool:
        with self.http_client(timeout=2) as client:
            return client.get("/readyz").status_code == 200

    def start_controller_manager(self, controllers: str = "*,-nodelifecycle,-nodeipam") -> None:
        """kube-controller-manager with the admin kubeconfig. Node lifecycle is off by default: no kubelet sends
        heartbeats here, so it would taint every node unreachable and evict the tests' pods."""
        port = self.ports.setdefault("kube-controller-manager", free_port())
        self._spawn(
            "kube-controller-manager",
            [
                f"--kubeconfig={self.kubeconfig}",
                f"--authentication-kubeconfig={self.kubeconfig}",
                f"--authorization-kubeconfig={self.kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self.workdir / 'controller-manager-certs'}",
                "--leader-elect=false",
                f"--controllers={controllers}",
                f"--service-account-private-key-file={self.pki.file('sa.key')}",
                f"--root-ca-file={self.pki.ca}",
                "--use-service-account-credentials=false",
                # Quota and disruption status within a second or two, not the production minutes.
                "--resource-quota-sync-period=2s",
                "-v=1",
            ],
        )
        self._wait("kube-controller-manager", lambda: self._https_healthz(port))

    def start_scheduler(
        self,
        config: dict | None = None,
        *,
        binary: str = "kube-scheduler",
        name: str | None = None,
        extra_args: tuple[str, ...] = (),
        ready_timeout: float = 60,
        leader_election: dict | None = None,
    ) -> str:
        """A scheduler (kube-scheduler, or gpufleet-scheduler with the GPUScore plugin) with `config`, a
        KubeSchedulerConfiguration (the default profile when None), run as component `name` (default: binary);
        `extra_args` are added to its command line; `leader_election`: its leaderElection settings (default: off,
        a scheduler of its own). Its port: `ports[name]`. Raises ControlPlaneError (with its
        log's tail) when it exits or does not serve /healthz within `ready_timeout` seconds."""
        name = name or binary
        config = dict(config or {"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration"})
        connection = dict(config.get("clientConnection") or {})
        connection["kubeconfig"] = str(self.kubeconfig)
        connection.setdefault("qps", 5000)
        connection.setdefault("burst", 5000)
        config["clientConnection"] = connection
        config["leaderElection"] = dict(leader_election or {"leaderElect": False})
        config_path = self.workdir / f"{name}.config.yaml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        port = self.ports[name] = free_port()
        self._spawn(
            name,
            [
                f"--config={config_path}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self.workdir / (name + '-certs')}",
                f"--authentication-kubeconfig={self.kubeconfig}",
                f"--authorization-kubeconfig={self.kubeconfig}",
                "-v=1",
                *extra_args,
            ],
            binary=binary,
        )
        self._wait(name, lambda: self._https_healthz(port), timeout=ready_timeout)
        return name

    @staticmethod
    def _https_healthz(port: int) -> bool:
        # Self-signed serving certificate; /healthz is always allowed without credentials.
        return httpx.get(f"https://127.0.0.1:{port}/healthz", verify=False, timeout=2).status_code == 200

    # --- processes ---------------------------------------------------------------------------------------------
    def _spawn(self, name: str, args: list[str], *, binary: str | None = None) -> None:
        executable = self.assets / (binary or name)
        if not os.access(executable, os.X_OK):
            raise ControlPlaneError(f"{executable} is missing: run `make k8s-assets` or set KUBE_ASSETS")
        log = (self.workdir / f"{name}.log").open("ab")
        self.processes[name] = subprocess.Popen(
            [str(executable), *args], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        log.close()

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.workdir / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def _wait(self, name: str, ready, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        process = self.processes[name]
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise ControlPlaneError(f"{name} exited with {process.returncode}:\n{self.log_tail(name)}")
            try:
                if ready():
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise ControlPlaneError(f"{name} did not become ready in {timeout:.0f} s:\n{self.log_tail(name)}")

    def stop_component(self, name: str, timeout: float = 15) -> None:
        process = self.processes.pop(name, None)
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def stop(self) -> None:
        """Schedulers and controllers first, then the apiserver, then etcd: each by its PID."""
        order = [n for n in self.processes if n not in ("kube-apiserver", "etcd")] + ["kube-apiserver", "etcd"]
        for name in order:
            self.stop_component(name)
