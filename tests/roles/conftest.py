"""Shared helpers for the Kubernetes roles' tests: render roles in `render` mode and validate what comes out.

Rendering goes through ansible-playbook with the real roles and templates, so what is validated here is exactly
what `apply` mode hands to kubernetes.core (both modes share the k8s_manifests role).
"""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from gpufleet_testsupport.collection import collections_path
from gpufleet_testsupport.ports import free_port

REPO = Path(__file__).resolve().parents[2]
# The collection importable as ansible_collections.gpufleet.mig for every test here, before their modules load.
collections_path()

# The Kubernetes version manifests are validated against (strict: unknown fields fail).
KUBERNETES_VERSION = "1.37.0"
# Kinds that are not in the core OpenAPI schemas (CRDs); their roles validate them with their own checks.
CUSTOM_KINDS = {
    "ServiceMonitor",
    "PrometheusRule",
    "KubeSchedulerConfiguration",
    "DeschedulerPolicy",
    "Certificate",
    "Issuer",
}


def load_manifests(directory: Path) -> dict[str, list[dict]]:
    """Every YAML document under `directory`, keyed by file path relative to it."""
    documents = {}
    for path in sorted(directory.rglob("*.yaml")):
        documents[str(path.relative_to(directory))] = [d for d in yaml.safe_load_all(path.read_text()) if d]
    return documents


def validate_manifests(directory: Path) -> int:
    """Validate every core-API object strictly; return how many were checked. Fails the test on the first error."""
    checked = 0
    for name, docs in load_manifests(directory).items():
        for doc in docs:
            if doc.get("kind") in CUSTOM_KINDS:
                continue
            try:
                kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
            except kubernetes_validate.ValidationError as err:
                pytest.fail(f"{name}: {doc.get('kind')}/{doc.get('metadata', {}).get('name')}: {err.message}")
            checked += 1
    return checked


def closed_port_kubeconfig(tmp_path: Path) -> str:
    """A kubeconfig whose server is a 127.0.0.1 port nothing listens on: apply-mode tasks get past argument
    validation and fail connecting, which is how the apply paths are covered without an API server."""
    server = f"https://127.0.0.1:{free_port()}"
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "none", "cluster": {"server": server, "insecure-skip-tls-verify": True}}],
        "users": [{"name": "none", "user": {"token": "not-a-real-token"}}],
        "contexts": [{"name": "none", "context": {"cluster": "none", "user": "none"}}],
        "current-context": "none",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(kubeconfig))
    return str(path)
