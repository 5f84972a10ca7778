"""gpufleet.mig.inventory_placeholders: the variables an inventory still marks as to be filled in (CHANGE-ME)."""

from __future__ import annotations

from collections.abc import Mapping

DOCUMENTATION = r"""
name: inventory_placeholders
short_description: The inventory variables still marked to be filled in
description:
  - Walks every host's variables (inventory, group_vars, host_vars; nested mappings and lists too) and returns one
    line per variable whose value still holds the marker - C(inventories/example) marks each site-specific value
    with C(CHANGE-ME) - naming the hosts that have it.
  - preflight refuses to go on while the list is not empty, before anything connects to a host.
options:
  _input:
    description: C(hostvars).
    type: dict
    required: true
  hosts:
    description: The hosts to look at (C(groups['all'])).
    type: list
    elements: str
    required: true
  marker:
    description: The text that marks a value to fill in.
    type: str
    default: CHANGE-ME
"""

EXAMPLES = r"""
- name: Refuse an inventory not filled in
  ansible.builtin.assert:
    that: hostvars | gpufleet.mig.inventory_placeholders(groups['all']) | length == 0
"""

RETURN = r"""
_value:
  description: 'One line per variable, for example "gpu_extender_cluster_ip (every host): CHANGE-ME (a free ...)".'
  type: list
  elements: str
"""


def _holds(value, marker: str) -> str | None:
    """The first string inside `value` that holds the marker."""
    if isinstance(value, str):
        return value if marker in value else None
    if isinstance(value, Mapping):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        for item in value:
            if (found := _holds(item, marker)) is not None:
                return found
    return None


def inventory_placeholders(hostvars, hosts, marker: str = "CHANGE-ME") -> list[str]:
    marked: dict[str, tuple[str, list[str]]] = {}
    for host in hosts:
        variables = hostvars[host]
        for name in list(variables.keys()):
            try:
                value = variables[name]
            except Exception:  # a variable that does not template is no placeholder
                continue
            if (text := _holds(value, marker)) is not None:
                marked.setdefault(name, (text, []))[1].append(host)
    lines = []
    for name, (text, where) in sorted(marked.items()):
        hosts_text = "every host" if len(where) == len(hosts) else ", ".join(where)
        lines.append(f"{name} ({hosts_text}): {text}")
    return lines


class FilterModule:
    def filters(self):
        return {"inventory_placeholders": inventory_placeholders}
