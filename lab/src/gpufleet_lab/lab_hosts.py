"""The lab's simulated hosts, made from the inventory: `make lab` runs this before playbooks/site.yml.

For every GPU host (group gpu_nodes) the host's GPUs are read through the collection's one reader of a host's GPU
facts (module_utils/host_gpus.py: gpufleet_gpu_product, gpufleet_gpus_per_node, the layout) and simulated as such:
an NVML simulator state file <lab>/nvml/<host>.json of that many GPUs of that product, fresh out of the box (MIG
off), and the NVSwitch device list of its board under <lab>/hosts/<host>/proc/driver/nvidia-nvswitch/devices/ (an
HGX 8-GPU board has four NVSwitch chips; a 4-GPU board and PCIe cards none). For every control-plane host (group
control_plane) when the inventory deploys the scheduler as `static_pod`: kubeadm's kube-scheduler manifest in the
host's tree, for the kube_scheduler role to patch.

What exists is kept (the lab keeps its state between runs, like a real fleet: a second run changes nothing); a
state file that no longer matches the inventory (another product or GPU count) is refused with the host named,
since the simulated GPUs are the hardware: `make lab-reset` starts over. Every host is checked before anything is
written, so a bad inventory writes nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from gpufleet_lab.mig_utils.exceptions import MigError
from gpufleet_lab.mig_utils.host_gpus import host_gpus
from gpufleet_lab.mig_utils.nvml_sim import new_state
from gpufleet_lab.mig_utils.profile_tables import nvswitches, product_table
from gpufleet_lab.simulate.fleet import FleetError, read_inventory

# kubeadm's kube-scheduler manifest as `kubeadm init` writes it (the molecule scenario of the static-pod rollout
# uses the same file), from the repository root, where make lab runs (as the inventory's path).
KUBEADM_MANIFEST = Path("extensions/molecule/kube_scheduler_static_pod/files/kube-scheduler.yaml")
STATIC_POD_MANIFEST = "etc/kubernetes/manifests/kube-scheduler.yaml"


def _groups(data: dict[str, Any], group: str) -> list[str]:
    """The hosts of a group and of its children, from ``ansible-inventory --list``."""
    entry = data.get(group) or {}
    hosts = list(entry.get("hosts") or [])
    for child in entry.get("children") or []:
        hosts.extend(h for h in _groups(data, child) if h not in hosts)
    return hosts


def plan(data: dict[str, Any], lab: Path) -> tuple[dict[Path, str], list[str]]:
    """Files to write (path -> text, only those missing) and the problems; nothing is written here."""
    hostvars: dict[str, Any] = (data.get("_meta") or {}).get("hostvars") or {}
    files: dict[Path, str] = {}
    problems: list[str] = []
    gpu_hosts = _groups(data, "gpu_nodes")
    if not gpu_hosts:
        problems.append("the inventory has no host in group gpu_nodes: nothing to simulate")
    for host in gpu_hosts:
        try:
            facts = host_gpus(host, hostvars.get(host) or {})
        except MigError as exc:
            problems.append(exc.message)
            continue
        state = lab / "nvml" / f"{host}.json"
        if state.exists():
            try:
                gpus = json.loads(state.read_text(encoding="utf-8"))["gpus"]
                found = {product_table(gpu["name"]).product for gpu in gpus}
            except (OSError, ValueError, KeyError, TypeError) as exc:
                problems.append(f"host {host}: {state} is no simulator state ({exc}); make lab-reset starts over")
                continue
            if found != {facts.product} or len(gpus) != facts.gpu_count:
                problems.append(
                    f"host {host}: its simulated GPUs ({state}: {len(gpus)} x {', '.join(sorted(found))}) are not "
                    f"what the inventory says ({facts.gpu_count} x {facts.product}); make lab-reset starts over"
                )
        else:
            files[state] = json.dumps(new_state(facts.gpu_count, facts.product), indent=2, sort_keys=True) + "\n"
        switches = nvswitches(product_table(facts.product), facts.gpu_count)
        devices = lab / "hosts" / host / "proc/driver/nvidia-nvswitch/devices"
        for index in range(switches):
            path = devices / f"0000:0{5 + index}:00.0"
            if not path.exists():
                files[path] = ""
    control_plane = _groups(data, "control_plane")
    for host in control_plane:
        if (hostvars.get(host) or {}).get("kube_scheduler_mode", "static_pod") != "static_pod":
            continue
        manifest = lab / "hosts" / host / STATIC_POD_MANIFEST
        if not manifest.exists():
            files[manifest] = KUBEADM_MANIFEST.read_text(encoding="utf-8")
    return files, problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpufleet-lab hosts", description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--inventory", required=True, help="the inventory (as given to ansible-playbook -i)")
    parser.add_argument("--lab-dir", required=True, type=Path, help="the lab's directory (build/lab/<inventory>)")
    args = parser.parse_args(argv)
    try:
        data = read_inventory(args.inventory)
    except FleetError as exc:
        print(f"lab hosts: {exc}", file=sys.stderr)
        return 1
    files, problems = plan(data, args.lab_dir)
    if problems:
        for problem in problems:
            print(f"lab hosts: {problem}", file=sys.stderr)
        return 1
    for path, text in sorted(files.items()):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    made = sum(1 for p in files if p.suffix == ".json")
    print(
        f"Simulated hosts: {len(_groups(data, 'gpu_nodes'))} GPU hosts ({made} made fresh), "
        f"{len(_groups(data, 'control_plane'))} control-plane hosts -> {args.lab_dir}/"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
