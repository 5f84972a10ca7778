"""Fleets other than Hong Kong, run the way `make lab INVENTORY=<dir>` runs them: the inventory as it is, the lab's
simulation overrides on top (playbooks/vars/lab.yml), each host's GPUs simulated from its inventory
(gpufleet-lab hosts).

- The fleet matrix: H100 80GB, H200 141GB and a product without MIG (L4) x MIG off / mixed layouts / time-sliced
  pools, nodes of 2, 4 and 8 GPUs, several products in one fleet. playbooks/site.yml completes, a rerun changes
  nothing, every simulated GPU reads back as its host's layout (with its host's product's profiles), and each
  pool's quotas add up to its capacity.
- Bad inventories: mutations of a valid fleet (tests/data/fleets/harbour), each refused before any change by one
  line naming the host or tenant and the variable, with nothing written (the simulated GPUs untouched, no manifest).
"""

from __future__ import annotations

import copy
import json
import re
import shutil
from collections import Counter
from pathlib import Path

import pytest
import yaml
from ansible_collections.gpufleet.mig.plugins.module_utils.host_gpus import host_gpus
from ansible_collections.gpufleet.mig.plugins.module_utils.profile_tables import product_table
from conftest import REPO
from fleet_matrix import FLEETS, L4, mig, write_fleet
from gpufleet_lab import lab_hosts
from gpufleet_testsupport.collection import run_playbook

HARBOUR = REPO / "tests/data/fleets/harbour"


def make_hosts(inventory: Path, lab: Path) -> None:
    assert lab_hosts.main(["--inventory", str(inventory), "--lab-dir", str(lab)]) == 0


def site(inventory: Path, lab: Path, tmp_path: Path, playbook: str = "playbooks/site.yml"):
    return run_playbook(playbook, f"{inventory}+lab", {"gpufleet_lab_dir": str(lab)}, tmp_path)


def recap_changes(output: str) -> dict[str, int]:
    return {m[0]: int(m[1]) for m in re.findall(r"^(\S+)\s+: ok=\d+\s+changed=(\d+)", output, re.M)}


def inventory_hostvars(inventory: Path) -> tuple[dict, dict]:
    data = lab_hosts.read_inventory(str(inventory))
    return data["_meta"]["hostvars"], data


def read_back(state: Path) -> list[dict[str, int] | None]:
    """Each simulated GPU as the layout it holds: instances per profile name, None when MIG is off."""
    gpus = []
    for gpu in json.loads(state.read_text())["gpus"]:
        if not gpu["mig_mode"]["current"]:
            gpus.append(None)
            continue
        names = {row.id: row.name for row in product_table(gpu["name"]).profiles}
        gpus.append(dict(Counter(names[gi["profile_id"]] for gi in gpu["gpu_instances"])))
    return gpus


@pytest.mark.parametrize("fleet", sorted(FLEETS))
def test_fleet_matrix_site_yml_converges_on_each_hosts_own_gpus(tmp_path, fleet):
    pools, fleet_vars = FLEETS[fleet]
    inventory = write_fleet(tmp_path / f"fleet-{fleet}", pools, fleet_vars)
    lab = tmp_path / "lab"
    make_hosts(inventory, lab)
    first = site(inventory, lab, tmp_path)
    assert first.returncode == 0, first.stdout[-5000:]
    rerun = site(inventory, lab, tmp_path)
    assert rerun.returncode == 0, rerun.stdout[-5000:]
    changes = recap_changes(rerun.stdout)
    assert changes and not any(changes.values()), {h: n for h, n in changes.items() if n}

    hostvars, _ = inventory_hostvars(inventory)
    quotas = {}
    for path in (lab / "manifests/tenants").glob("quotas.yaml"):
        for document in yaml.safe_load_all(path.read_text()):
            if document and document["kind"] == "ResourceQuota" and document["metadata"]["name"] == "gpufleet-gpu":
                quotas[document["metadata"]["namespace"]] = document["spec"]["hard"]
    for spec in pools:
        capacity: Counter = Counter()
        for host in spec["hosts"]:
            facts = host_gpus(host, hostvars[host])
            assert facts.product == spec["vars"]["gpufleet_gpu_product"]
            # The simulated GPUs are the host's product and count, and hold exactly its layout.
            gpus = json.loads((lab / "nvml" / f"{host}.json").read_text())["gpus"]
            assert [g["name"] for g in gpus] == [facts.product] * facts.gpu_count
            assert read_back(lab / "nvml" / f"{host}.json") == list(facts.layout)
            capacity.update(facts.resources(spec["sharing"]))
        # The pool's quotas, over its namespaces, add up to what its nodes advertise (time-sliced x replicas).
        for resource, count in capacity.items():
            assert sum(quotas[ns][f"requests.{resource}"] for ns in spec["namespaces"]) == count, (spec, resource)
    if fleet_vars["kube_scheduler_mode"] == "static_pod":
        tree = lab / "hosts/cp-1/etc/kubernetes"
        manifest = yaml.safe_load((tree / "manifests/kube-scheduler.yaml").read_text())
        assert "--config=/etc/kubernetes/gpufleet/scheduler-config.yaml" in manifest["spec"]["containers"][0]["command"]
        assert len(list((tree / "gpufleet/backup").glob("kube-scheduler.yaml.*"))) == 1


# --- bad inventories --------------------------------------------------------------------------------------------


def _set(path: str, key: str, value):
    def mutate(files: dict[str, dict]) -> None:
        files[path][key] = value

    return mutate


def _tenant(tenant: str, key: str, value):
    def mutate(files: dict[str, dict]) -> None:
        files["group_vars/all/fleet.yml"]["gpufleet_tenants"][tenant][key] = value

    return mutate


def _second_group(files: dict[str, dict]) -> None:
    files["hosts.yml"]["all"]["children"]["gpu_nodes"]["children"]["embed_nodes"]["hosts"]["hb-h200-a"] = None


GENAI = "group_vars/genai_nodes/fleet.yml"
INFER = "group_vars/infer_nodes/fleet.yml"
EMBED = "group_vars/embed_nodes/fleet.yml"

# id -> (mutation of the harbour inventory, the line that refuses it)
MUTATIONS = {
    "layout-invalid-for-the-product": (
        _set(GENAI, "mig_partition_config", [mig("all", **{"3g.71gb": 3})]),
        "host hb-h200-a: mig_partition_config: config[0]: GPU 0 (NVIDIA H200): 3 x 3g.71gb requested, at most 2 fit",
    ),
    "profile-of-another-product": (
        _set(GENAI, "mig_partition_config", [mig("all", **{"3g.40gb": 2})]),
        "host hb-h200-a: mig_partition_config: config[0]: GPU 0 (NVIDIA H200): unknown MIG profile(s) 3g.40gb",
    ),
    "mig-on-a-product-without-mig": (
        _set(EMBED, "gpufleet_gpu_product", L4),
        "host hb-h100-sliced: mig_partition_config: it enables MIG, but NVIDIA L4 cannot do MIG",
    ),
    "sharing-a-resource-the-pool-lacks": (
        _tenant("embed", "sharing", {"nvidia.com/mig-2g.20gb": 2}),
        "tenant embed: sharing names nvidia.com/mig-2g.20gb, which no node of its pool has",
    ),
    "tenant-group-missing": (
        _tenant("infer", "group", "infer_pool"),
        "tenant infer: group infer_pool does not exist in the inventory",
    ),
    "namespace-in-two-tenants": (
        _tenant("embed", "namespaces", ["embed", "genai"]),
        "namespace genai is listed by two tenants: genai and embed",
    ),
    "kube-system-namespace": (
        _tenant("infer", "namespaces", ["kube-system"]),
        "tenant infer: namespace kube-system is reserved",
    ),
    "the-fleets-own-namespace": (
        _tenant("infer", "namespaces", ["harbour-gpu-agents"]),
        "tenant infer: namespace harbour-gpu-agents is reserved",
    ),
    "host-in-two-tenant-groups": (
        _second_group,
        "host hb-h200-a is in two tenant groups: genai_nodes (tenant genai) and embed_nodes (tenant embed)",
    ),
    "zero-gpus": (
        _set(INFER, "gpufleet_gpus_per_node", 0),
        "host hb-h100-whole: gpufleet_gpus_per_node must be a whole number of GPUs >= 1, got 0",
    ),
    "device-index-beyond-the-gpu-count": (
        _set(INFER, "mig_partition_config", [{"devices": [0, 4], "mig_enabled": False}]),
        "host hb-h100-whole: mig_partition_config: config[0]: GPU index(es) [4] do not exist on this host",
    ),
    "unknown-product": (
        _set(INFER, "gpufleet_gpu_product", "NVIDIA B300"),
        "host hb-h100-whole: gpufleet_gpu_product: no MIG profile table for GPU product 'NVIDIA B300'",
    ),
}


@pytest.fixture(scope="module")
def harbour_lab(tmp_path_factory) -> Path:
    """The harbour fleet's simulated hosts, made once from the valid inventory."""
    lab = tmp_path_factory.mktemp("harbour-lab")
    make_hosts(HARBOUR, lab)
    return lab


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("case", sorted(MUTATIONS))
def test_a_bad_inventory_is_refused_before_any_change(tmp_path, harbour_lab, case):
    mutate, line = MUTATIONS[case]
    inventory = tmp_path / "harbour"
    files = {str(p.relative_to(HARBOUR)): yaml.safe_load(p.read_text()) for p in HARBOUR.rglob("*.yml")}
    mutated = copy.deepcopy(files)
    mutate(mutated)
    assert mutated != files
    for name, data in mutated.items():
        (inventory / name).parent.mkdir(parents=True, exist_ok=True)
        (inventory / name).write_text(yaml.safe_dump(data, sort_keys=False))
    lab = tmp_path / "lab"
    shutil.copytree(harbour_lab, lab)
    before = _snapshot(lab)

    result = site(inventory, lab, tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert line in output, output[-4000:]
    assert "Traceback" not in output and "template error" not in output.lower()
    # Refused by the first play, on the controller: no host was touched and nothing rendered.
    assert "Validate the inventory before any change" in output and "PLAY [Preflight" not in output
    assert _snapshot(lab) == before
    assert not (lab / "manifests").exists()
