"""gpufleet.mig.mig_rollout: the order and batches in which playbooks/mig.yml rolls MIG layouts over the fleet.

`serial` cuts a play's host list into batches in order, so a single play over gpu_nodes at 25% would take 25% of
the whole fleet at once, possibly most of one pool. This filter orders the GPU nodes pool by pool (the pools of
gpufleet_tenants, in their order, then the GPU nodes in no pool) and sizes the batches per pool, as `serial` would
for a play of that pool alone; no batch spans two pools. Adding a pool is an inventory change.
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

DOCUMENTATION = r"""
name: mig_rollout
short_description: GPU nodes ordered pool by pool, and serial batch sizes that never span two pools
description:
  - Returns C(hosts) (the play's host list, pool by pool) and C(batches) (a C(serial) list of batch sizes).
options:
  _input:
    description: The GPU nodes to roll (C(ansible_play_hosts_all) of a play over gpu_nodes, so C(--limit) applies).
    type: list
    elements: str
    required: true
  groups:
    description: The C(groups) magic variable.
    type: dict
    required: true
  tenants:
    description: C(gpufleet_tenants) (tenant -> {group, ...}); each tenant's group is a pool.
    type: dict
    required: true
  serial:
    description: Batch size per pool, as C(serial) takes it - a host count or a percentage of the pool (V(25%)).
    type: raw
    default: 25%
"""

EXAMPLES = r"""
- name: Plan the rollout
  ansible.builtin.set_fact:
    mig_rollout: "{{ ansible_play_hosts_all | gpufleet.mig.mig_rollout(groups, gpufleet_tenants, '25%') }}"
"""

RETURN = r"""
_value:
  description: C(hosts) in rollout order, C(batches) batch sizes summing to the number of hosts, C(pools) the pools.
  type: dict
"""


def batch_size(serial, pool_size: int) -> int:
    """The batch size `serial` gives a play of `pool_size` hosts (Ansible's rule: a percentage rounds down, min 1)."""
    text = str(serial).strip()
    try:
        size = int(float(text[:-1]) / 100.0 * pool_size) if text.endswith("%") else int(text)
    except ValueError:
        raise AnsibleFilterError(f"mig_rollout: serial must be a host count or a percentage, got {serial!r}") from None
    if size < 0 or (not text.endswith("%") and size == 0):
        raise AnsibleFilterError(f"mig_rollout: serial must be at least 1 host, got {serial!r}")
    return max(1, min(size, pool_size))


def mig_rollout(hosts, groups, tenants, serial="25%") -> dict:
    if not isinstance(tenants, dict):
        raise AnsibleFilterError("mig_rollout: gpufleet_tenants must be a dict of tenant -> {group, ...}")
    remaining = list(hosts)
    pools: list[tuple[str, list[str]]] = []
    for tenant, spec in tenants.items():
        group = (spec or {}).get("group", f"tenant_{tenant}")
        members = set(groups.get(group, []))
        pool = [h for h in remaining if h in members]
        remaining = [h for h in remaining if h not in members]
        pools.append((str(tenant), pool))
    pools.append(("(no pool)", remaining))
    order: list[str] = []
    batches: list[int] = []
    for _name, pool in pools:
        if not pool:
            continue
        size = batch_size(serial, len(pool))
        order.extend(pool)
        batches.extend(min(size, len(pool) - start) for start in range(0, len(pool), size))
    return {"hosts": order, "batches": batches, "pools": {name: pool for name, pool in pools if pool}}


class FilterModule:
    def filters(self):
        return {"mig_rollout": mig_rollout}
