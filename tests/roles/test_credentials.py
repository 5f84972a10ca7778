"""One credential shape for the three Prometheus readers: the extender, GPUScore (plugin mode) and the descheduler
each read the token from key prometheusAuthToken of a Secret in the fleet's namespace, the one key the descheduler
can read, so that one Secret layout serves all three (docs/install.md, "Credentials")."""

from __future__ import annotations

import pytest
import yaml
from gpufleet_testsupport.collection import try_render

KEY = "prometheusAuthToken"


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> list[dict]:
    roles = [
        "gpufleet.mig.gpu_extender",
        {"role": "gpufleet.mig.kube_scheduler", "kube_scheduler_mode": "plugin"},
        "gpufleet.mig.descheduler",
    ]
    result, manifests = try_render(roles, tmp_path_factory.mktemp("credentials"))
    assert result.returncode == 0, result.stdout[-6000:]
    return [d for p in sorted(manifests.rglob("*.yaml")) for d in yaml.safe_load_all(p.read_text()) if d]


def token_items(doc: dict) -> list[dict]:
    volumes = doc["spec"]["template"]["spec"].get("volumes", [])
    return [item for v in volumes if v["name"] == "prometheus-token" for item in v["secret"]["items"]]


@pytest.mark.parametrize("name", ["gpufleet-extender", "gpufleet-scheduler"])
def test_the_extender_and_gpuscore_mount_the_token_from_the_descheduler_s_key(rendered, name):
    deployment = next(d for d in rendered if d["kind"] == "Deployment" and d["metadata"]["name"] == name)
    assert [item["key"] for item in token_items(deployment)] == [KEY]


def test_the_descheduler_reads_a_secret_reference_which_upstream_reads_by_that_key(rendered):
    policy = next(d for d in rendered if d["kind"] == "ConfigMap" and "descheduler" in d["metadata"]["name"])
    assert "secretReference" in str(policy["data"])
