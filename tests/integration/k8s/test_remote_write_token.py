"""The push form's remote-write token in apply mode, on the real control plane (the gpu_extender role's
remote_write_token.yml): without gpu_extender_remote_write_token the role makes one random token and stores it in
the fleet's namespace and in Prometheus', keeps a Secret that holds one, and gives a missing Secret the token in
use; a given token is stored in each. The token never reaches the play's output."""

from __future__ import annotations

import base64
import uuid

import pytest
from conftest import ensure_namespace
from gpufleet_testsupport.collection import run_role
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

pytestmark = pytest.mark.integration

SECRET = "gpufleet-remote-write"


def token_in(core: k8s.CoreV1Api, namespace: str) -> str | None:
    try:
        secret = core.read_namespaced_secret(SECRET, namespace)
    except ApiException as err:
        if err.status == 404:
            return None
        raise
    return base64.b64decode(secret.data["token"]).decode()


def deliver(control_plane, tmp_path, fleet: str, prometheus: str, **extra) -> str:
    """Run the role's token task file in apply mode with push; return the play's output."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    role_vars = {
        "ansible_connection": "local",
        "gpufleet_k8s_mode": "apply",
        "gpufleet_kubeconfig": str(control_plane.kubeconfig),
        "gpufleet_metrics_source": "push",
        "gpu_extender_namespace": fleet,
        "gpufleet_prometheus_peers": [
            {"namespace": prometheus, "pod_labels": {"app.kubernetes.io/name": "prometheus"}}
        ],
        **extra,
    }
    inventory = {"all": {"hosts": {"localhost": None}}}
    result = run_role(tmp_path, "gpu_extender", inventory, role_vars, tasks_from="remote_write_token.yml")
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    return result.stdout + result.stderr


def test_a_push_install_without_a_token_gets_one_kept_across_runs(control_plane, core, tmp_path):
    suffix = uuid.uuid4().hex[:6]
    fleet, prometheus = f"rw-fleet-{suffix}", f"rw-monitoring-{suffix}"
    for namespace in (fleet, prometheus):
        ensure_namespace(core, namespace)

    output = deliver(control_plane, tmp_path / "first", fleet, prometheus)
    token = token_in(core, fleet)
    assert token and len(token) == 48 and token.isalnum()
    assert token_in(core, prometheus) == token  # Prometheus presents what the receivers check
    assert token not in output

    # An existing Secret is kept: a second run does not even write it.
    versions = {ns: core.read_namespaced_secret(SECRET, ns).metadata.resource_version for ns in (fleet, prometheus)}
    deliver(control_plane, tmp_path / "again", fleet, prometheus)
    assert {ns: core.read_namespaced_secret(SECRET, ns).metadata.resource_version for ns in versions} == versions

    # A Secret gone from one namespace gets the token still in use in the other, not a new one.
    core.delete_namespaced_secret(SECRET, prometheus)
    deliver(control_plane, tmp_path / "healed", fleet, prometheus)
    assert token_in(core, prometheus) == token

    # A token given in the inventory is stored in both.
    output = deliver(
        control_plane, tmp_path / "given", fleet, prometheus, gpu_extender_remote_write_token="given-t0ken"
    )
    assert token_in(core, fleet) == "given-t0ken" and token_in(core, prometheus) == "given-t0ken"
    assert "given-t0ken" not in output
