"""The collection's resource names (names.py, read on controllers and hosts where the extender is not installed)
against the settings contract, which the extender reads them from; GPUScore's are checked by go test."""

from __future__ import annotations

import shutil
from pathlib import Path

from ansible_collections.gpufleet.mig.plugins.module_utils import names, pod_resources
from gpufleet_extender import pods, settings_contract


def resource_mismatches(contract_file: Path) -> list[str]:
    """Where the collection's names.py (on controllers and hosts, without the extender) says otherwise than the
    contract about the resource names and the replicas' range."""
    whole, prefix = settings_contract.load_resources(contract_file)
    problems = []
    if (whole, prefix) != (names.WHOLE_GPU_RESOURCE, names.MIG_RESOURCE_PREFIX):
        problems.append(
            f"names.py: {names.WHOLE_GPU_RESOURCE}, {names.MIG_RESOURCE_PREFIX}; the contract's {whole}, {prefix}"
        )
    if f"{whole} or {prefix}<profile>" != names.RESOURCE_FORMS:
        problems.append(f"names.py: RESOURCE_FORMS {names.RESOURCE_FORMS}")
    if settings_contract.load(contract_file)["SHARED_RESOURCES"].max != names.MAX_REPLICAS:
        problems.append(f"names.py: MAX_REPLICAS {names.MAX_REPLICAS}")
    return problems


def test_the_resource_names_and_replicas_are_the_contracts_everywhere(tmp_path):
    # The extender reads them from the contract; GPUScore's are checked by go test (contract_test.go).
    assert settings_contract.load_resources() == (pods.WHOLE_GPU_RESOURCE, pods.MIG_RESOURCE_PREFIX)
    assert pod_resources.MIG_RESOURCE_PREFIX is names.MIG_RESOURCE_PREFIX  # the collection's one definition
    assert resource_mismatches(settings_contract.CONTRACT_FILE) == []
    changed = tmp_path / "settings_contract.json"
    shutil.copy(settings_contract.CONTRACT_FILE, changed)
    text = changed.read_text(encoding="utf-8")
    assert text.count('"wholeGPU": "nvidia.com/gpu"') == 1 and text.count('"max": 64,') == 1
    changed.write_text(text.replace("nvidia.com/gpu", "nvidia.com/gpus").replace('"max": 64,', '"max": 32,'))
    assert len(resource_mismatches(changed)) == 3
