"""The Python check of the scheduler configuration (a port of kube-scheduler's validation, so that the controller
needs no binary) judges every configuration of tests/scheduler_config_corpus.py as the real kube-scheduler does:
each is handed to the binary the suite builds (gpufleet-scheduler where GPUScore must be registered) with
`--write-config-to`, which decodes it strictly, validates it, builds the profiles' frameworks and exits before any
connection to an apiserver. Accepted and refused alike; for a refused one, what each of the port's messages is
about (the field, or the value) is in the binary's message too."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml
from gpufleet_testsupport.collection import collections_path
from gpufleet_testsupport.controlplane import assets_dir, missing_assets
from scheduler_config_corpus import corpus

collections_path()
from ansible_collections.gpufleet.mig.plugins.module_utils.kube_scheduler_config import (  # noqa: E402
    scheduler_config_errors,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        bool(missing_assets(("kube-scheduler", "gpufleet-scheduler"))),
        reason=f"no kube-scheduler or gpufleet-scheduler in {assets_dir()}: run `make k8s-assets`",
    ),
]

KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: none, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: none, user: {token: unused}}]
contexts: [{name: none, context: {cluster: none, user: none}}]
current-context: none
"""


def judged_by_the_binary(case, tmp_path: Path) -> subprocess.CompletedProcess:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG)
    config = case.config
    if isinstance(config, dict):  # the binary needs a kubeconfig it can read; validation does not look at it
        connection = config.get("clientConnection")
        connection = dict(connection) if isinstance(connection, dict) else {}
        config = {**config, "clientConnection": {**connection, "kubeconfig": str(kubeconfig)}}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    binary = assets_dir() / ("gpufleet-scheduler" if case.plugins else "kube-scheduler")
    command = [str(binary), "--config", str(path), "--write-config-to", str(tmp_path / "written.yaml")]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize("case", corpus(), ids=lambda case: case.name)
def test_the_port_and_kube_scheduler_judge_alike(case, tmp_path):
    errors = scheduler_config_errors(case.config, case.plugins)
    judged = judged_by_the_binary(case, tmp_path)
    said = judged.stdout + judged.stderr
    assert (judged.returncode == 0) == case.valid, f"kube-scheduler: {said[-1500:]}"
    assert (errors == []) == case.valid, errors
    for error in errors:  # what each of the port's messages is about (the field, or its value) is in the binary's
        field, _, rest = error.partition(":")
        value = re.search(r'Invalid value: "([^"]*)"', rest)
        detail = rest.rsplit(": ", 1)[-1].split('"')[0].strip()
        about = [field.split(".")[-1].split("[")[0], *([value.group(1)] if value and value.group(1) else [])]
        about += [detail] if len(detail) > 3 else []
        assert any(word in said for word in about), f"{error!r}: none of {about} in {said[-1500:]!r}"
