"""Module documentation is a contract: DOCUMENTATION (with its fragment) matches each module's argument_spec,
and EXAMPLES / RETURN parse."""

from __future__ import annotations

import pytest
import yaml
from ansible_collections.gpufleet.mig.plugins.doc_fragments.nvml_backend import ModuleDocFragment
from ansible_collections.gpufleet.mig.plugins.modules import nvidia_gpu_info, nvidia_mig

FRAGMENT = yaml.safe_load(ModuleDocFragment.DOCUMENTATION)["options"]


def _compare(doc_options: dict, spec: dict, path: str) -> list[str]:
    problems = []
    if set(doc_options) != set(spec):
        problems.append(f"{path}: documented {sorted(doc_options)} vs argument_spec {sorted(spec)}")
    for name in set(doc_options) & set(spec):
        doc, arg = doc_options[name], spec[name]
        for key, fallback in (("type", "str"), ("required", False), ("default", None), ("elements", None)):
            if doc.get(key, fallback) != arg.get(key, fallback):
                problems.append(f"{path}.{name}: {key} documented {doc.get(key)!r}, spec {arg.get(key)!r}")
        if "options" in arg or "suboptions" in doc:
            problems += _compare(doc.get("suboptions", {}), arg.get("options", {}), f"{path}.{name}")
    return problems


@pytest.mark.parametrize("module", [nvidia_mig, nvidia_gpu_info], ids=["nvidia_mig", "nvidia_gpu_info"])
def test_documentation_matches_argument_spec(module):
    doc = yaml.safe_load(module.DOCUMENTATION)
    assert doc["extends_documentation_fragment"] == ["gpufleet.mig.nvml_backend"]
    options = dict(doc.get("options") or {}, **FRAGMENT)
    assert _compare(options, module.argument_spec(), module.__name__.rsplit(".", 1)[-1]) == []
    assert yaml.safe_load(module.EXAMPLES)
    returned = yaml.safe_load(module.RETURN)
    assert "gpus" in returned and all("description" in v and "type" in v for v in returned.values())
