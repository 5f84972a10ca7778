"""gpufleet.mig.preflight_problems: a GPU host's missing prerequisites, from what the preflight role gathered."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.gpufleet.mig.plugins.module_utils.preflight import problems

DOCUMENTATION = r"""
name: preflight_problems
short_description: One line per missing prerequisite of a GPU host, each with what was found and what is needed
description:
  - Judges the answers the C(gpufleet.mig.preflight) role gathers on a host - C(nvidia-smi --query-gpu), NVSwitch
    devices and nvidia-fabricmanager, the container toolkit, the runtime's NVIDIA handler, C(kubelet --version),
    the device plugin socket directory - against what gpufleet.mig needs (docs/preflight.md).
  - An empty list means the host is ready.
options:
  _input:
    description:
      - The facts - C(checks) (which to run), C(nvidia_smi) ({rc, stdout, stderr}), C(needs_mig), C(nvswitches),
        C(fabricmanager), C(toolkit_found), C(toolkit_searched), C(runtime), C(runtime_configs) (path -> text),
        C(kubelet) ({rc, stdout}), C(kubelet_min_version), C(device_plugin_dir), C(device_plugin_dir_exists).
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Judge the host
  ansible.builtin.set_fact:
    preflight_found: "{{ preflight_facts | gpufleet.mig.preflight_problems }}"
"""

RETURN = r"""
_value:
  description: 'The problems, each "found ...; needed: ...".'
  type: list
  elements: str
"""


def preflight_problems(facts):
    if not isinstance(facts, dict):
        raise AnsibleFilterError(f"preflight_problems expects a dict of facts, got {type(facts).__name__}")
    try:
        return problems(facts)
    except ValueError as exc:
        raise AnsibleFilterError(str(exc)) from None


class FilterModule:
    def filters(self):
        return {"preflight_problems": preflight_problems}
