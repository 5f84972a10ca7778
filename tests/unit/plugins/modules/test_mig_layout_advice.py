"""mig_layout_advice on facts read from simulated GPUs: the advice, applied with the real nvidia_mig runner, keeps
every allocated MIG device (its UUID survives), serves the demand, and a second advice changes nothing; demand
files, pending pods, check mode, one-line errors, documentation against argument_spec."""

from __future__ import annotations

import json

import pytest
import yaml
from ansible.module_utils.testing import patch_module_args
from ansible_collections.gpufleet.mig.plugins.module_utils import gpu_info
from ansible_collections.gpufleet.mig.plugins.module_utils.nvml_sim import SimulatedNvml, new_state
from ansible_collections.gpufleet.mig.plugins.module_utils.runner import apply
from ansible_collections.gpufleet.mig.plugins.modules import mig_layout_advice

IMAGEGEN = [
    {"devices": [0, 1], "mig_enabled": True, "mig_devices": {"3g.40gb": 2}},
    {"devices": [2, 3], "mig_enabled": True, "mig_devices": {"2g.20gb": 3, "1g.10gb": 1}},
]


@pytest.fixture
def run(capsys):
    def run_module(args: dict, check_mode: bool = False) -> dict:
        with patch_module_args(dict(args, _ansible_check_mode=check_mode)), pytest.raises(SystemExit):
            mig_layout_advice.main()
        return json.loads(capsys.readouterr().out)

    return run_module


@pytest.fixture
def fleet(tmp_path):
    """Two simulated imagegen nodes (4 GPUs each); on each, the first instance of every GPU is held by a pod."""
    sims = {}
    for node in ("hk-gpu-11", "hk-gpu-12"):
        path = tmp_path / f"{node}.json"
        path.write_text(json.dumps(new_state(gpus=4, product="NVIDIA H100 80GB HBM3")))
        sims[node] = SimulatedNvml(str(path))
        apply(sims[node], IMAGEGEN)
    return sims


def held_uuids(facts) -> list[str]:
    return [g["gpu_instances"][0]["compute_instances"][0]["mig_device_uuid"] for g in facts]


def nodes_of(sims) -> list[dict]:
    nodes = []
    for name, sim in sims.items():
        facts = gpu_info.collect(sim)
        allocated = [{"resource_name": "nvidia.com/mig-x", "device_id": u} for u in held_uuids(facts)]
        nodes.append({"name": name, "gpus": facts, "pod_resources": {"allocated": allocated}})
    return nodes


def test_advice_applied_keeps_allocated_devices_and_settles(fleet, run):
    before = {name: held_uuids(gpu_info.collect(sim)) for name, sim in fleet.items()}
    args = {"nodes": nodes_of(fleet), "demand": {"1g.10gb": 12}, "allowed_profiles": ["1g.10gb", "2g.20gb", "3g.40gb"]}
    advice = run(args)
    assert advice["changed"] is False and advice["exact"] is True
    assert advice["served"] == {"1g.10gb": 12} and advice["unserved"] == {}
    assert advice["destroyed"] > 0 and advice["summary"][-1].startswith("pool: serves 12 of 12")
    for node in advice["nodes"]:
        result = apply(fleet[node["name"]], node["config"])  # what the rollout runs, node by node
        destroyed = sum(1 for g in result["gpus"] for a in g["actions"] if a["op"] == "destroy")
        assert destroyed == node["destroyed"]
        facts = gpu_info.collect(fleet[node["name"]])
        uuids = {ci["mig_device_uuid"] for g in facts for i in g["gpu_instances"] for ci in i["compute_instances"]}
        assert set(before[node["name"]]) <= uuids  # every allocated MIG device is still there
    again = run(dict(args, nodes=nodes_of(fleet)))
    assert again["destroyed"] == again["created"] == 0 and again["served"] == {"1g.10gb": 12}


def test_check_mode_and_pending_pods(fleet, run):
    pod = {
        "metadata": {"name": "p"},
        "spec": {"containers": [{"resources": {"limits": {"nvidia.com/mig-3g.40gb": 1}}}]},
    }
    result = run({"nodes": nodes_of(fleet), "pending_pods": [pod] * 2}, check_mode=True)
    assert result["demand"] == {"3g.40gb": 2} and result["served"] == {"3g.40gb": 2}
    assert result["destroyed"] == result["created"] == 0  # the free 3g.40gb instances already serve them


def test_demand_file(fleet, run, tmp_path):
    path = tmp_path / "night.yml"
    path.write_text(yaml.safe_dump({"version": "v1", "demand": {"1g.10gb": 2}, "minimums": {"3g.40gb": 8}}))
    result = run({"nodes": nodes_of(fleet), "demand_file": str(path), "demand": {"1g.10gb": 1}})
    assert result["demand"] == {"1g.10gb": 3}
    total_3g = sum(g["mig_devices"].get("3g.40gb", 0) for n in result["nodes"] for g in n["gpus"])
    assert total_3g >= 8


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"version": "v2", "demand": {}}, "unsupported version"),
        ({"version": "v1", "demnd": {}}, "unknown key"),
        ({"version": "v1", "demand": {"9g.90gb": 1}}, "not a profile of the pool"),
    ],
)
def test_bad_demand_file_is_one_line(fleet, run, tmp_path, document, message):
    path = tmp_path / "bad.yml"
    path.write_text(yaml.safe_dump(document))
    result = run({"nodes": nodes_of(fleet), "demand_file": str(path)})
    assert result["failed"] and message in result["msg"] and "\n" not in result["msg"]


def test_documentation_matches_argument_spec():
    doc = yaml.safe_load(mig_layout_advice.DOCUMENTATION)
    spec = mig_layout_advice.argument_spec()

    def compare(doc_options, spec_options, path):
        assert set(doc_options) == set(spec_options), path
        for name, option in doc_options.items():
            for key in ("type", "default", "required", "elements"):
                assert option.get(key) == spec_options[name].get(key), f"{path}.{name}.{key}"
            if "suboptions" in option:
                compare(option["suboptions"], spec_options[name]["options"], f"{path}.{name}")

    compare(doc["options"], spec, "options")
    assert yaml.safe_load(mig_layout_advice.EXAMPLES)
    returned = yaml.safe_load(mig_layout_advice.RETURN)
    assert all("description" in v and "type" in v for v in returned.values())
