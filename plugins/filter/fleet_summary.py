"""gpufleet.mig.fleet_summary: the per-tenant fleet summary printed at the end of playbooks/site.yml.

It reports what each node's GPUs hold after the run (the nvidia_mig result that the mig_partition role leaves in
the `mig_partition_result` fact) and flags any node whose GPUs disagree with what its inventory layout implies.
"""

from __future__ import annotations

from collections import Counter

from ansible.errors import AnsibleFilterError
from ansible_collections.gpufleet.mig.plugins.filter.host_gpus import host_gpus
from ansible_collections.gpufleet.mig.plugins.module_utils.layout import profile_slices

WHOLE_GPU = "gpu"

DOCUMENTATION = r"""
name: fleet_summary
short_description: Per-tenant summary of the fleet's GPU nodes and their MIG instances
description:
  - Turns the inventory's tenant pools and each node's C(mig_partition_result) fact into report lines, one per node
    and a total per pool; a node not configured in this run is reported from its layout, marked as such.
options:
  _input:
    description: C(hostvars).
    type: dict
    required: true
  groups:
    description: The C(groups) magic variable.
    type: dict
    required: true
  tenants:
    description: C(gpufleet_tenants) (tenant -> {group, description, ...}).
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Print the fleet summary
  ansible.builtin.debug:
    msg: "{{ hostvars | gpufleet.mig.fleet_summary(groups, gpufleet_tenants) }}"
"""

RETURN = r"""
_value:
  description: Report lines.
  type: list
  elements: str
"""


def _describe(counts: Counter) -> str:
    """'8 x 3g.40gb, 12 x 2g.20gb' (largest profiles first), whole GPUs as 'whole GPU'."""

    def size(profile: str) -> int:
        return 100 if profile == WHOLE_GPU else profile_slices(profile)

    parts = [
        f"{counts[p]} x {'whole GPU' if p == WHOLE_GPU else p}" for p in sorted(counts, key=lambda p: (-size(p), p))
    ]
    return ", ".join(parts) if parts else "nothing"


def _observed(result: dict) -> Counter:
    """Instances per profile on the node after the run, from the nvidia_mig module's result."""
    counts: Counter = Counter()
    for gpu in result.get("gpus", []):
        if gpu.get("mig_enabled", {}).get("after"):
            counts.update(instance["profile"] for instance in gpu.get("after", []))
        else:
            counts[WHOLE_GPU] += 1
    return counts


def fleet_summary(hostvars, groups, tenants) -> list[str]:
    if not isinstance(tenants, dict) or not tenants:
        raise AnsibleFilterError("fleet_summary: gpufleet_tenants must be a non-empty dict of tenant -> {group, ...}")
    lines: list[str] = []
    for tenant, spec in tenants.items():
        group = spec.get("group", f"tenant_{tenant}")
        hosts = sorted(groups.get(group, []))
        lines.append(f"tenant {tenant} ({group}): {len(hosts)} nodes - {spec.get('description', '')}".rstrip(" -"))
        pool: Counter = Counter()
        for host in hosts:
            node = hostvars[host]
            implied = Counter(host_gpus(host, hostvars)["instances"])
            result = node.get("mig_partition_result")
            if result is None:
                counts, note = implied, "  (not configured in this run: from the layout)"
            else:
                counts = _observed(result)
                note = "" if counts == implied else f"  (!) layout implies {_describe(implied)}"
                if result.get("reboot_required"):
                    note += "  (MIG mode change pending a reboot)"
            pool.update(counts)
            lines.append(f"  {host:<12} {_describe(counts)}{note}")
        lines.append(f"  {'pool total':<12} {_describe(pool)}")
    return lines


class FilterModule:
    def filters(self):
        return {"fleet_summary": fleet_summary}
