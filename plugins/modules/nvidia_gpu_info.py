#!/usr/bin/python
# Copyright: gpufleet maintainers
# Apache License 2.0 (see galaxy.yml)

from __future__ import annotations

DOCUMENTATION = r"""
module: nvidia_gpu_info
short_description: Facts about NVIDIA GPUs, their MIG mode, instances, processes and MIG profile catalog
version_added: 0.1.0
description:
  - Reads, through NVML, every GPU of the host - index, UUID, name, memory, MIG mode (current and pending), GPU
    instances (profile, placement, GPU instance id, compute instances and MIG device UUIDs), running processes per
    GPU and per MIG instance, and the GPU's MIG profile catalog as NVML reports it.
  - Read-only.
author: gpufleet maintainers (@gpufleet)
options: {}
extends_documentation_fragment:
  - gpufleet.mig.nvml_backend
attributes:
  check_mode:
    support: full
    description: Reads only; runs the same in check mode.
  diff_mode:
    support: none
    description: Nothing changes, so there is nothing to diff.
seealso:
  - module: gpufleet.mig.nvidia_mig
"""

EXAMPLES = r"""
- name: Read the GPUs
  gpufleet.mig.nvidia_gpu_info:
  register: gpu_info

- name: Show each GPU's instances
  ansible.builtin.debug:
    msg: "{{ item.index }}: {{ item.gpu_instances | map(attribute='profile') | list }}"
  loop: "{{ gpu_info.gpus }}"
  loop_control:
    label: "{{ item.uuid }}"
"""

RETURN = r"""
gpus:
  description: One entry per GPU, by NVML index.
  returned: always
  type: list
  elements: dict
  contains:
    index:
      description: NVML device index.
      type: int
      sample: 0
    uuid:
      description: GPU UUID.
      type: str
      sample: GPU-5d6f2b9e-8a51-4c43-9f8e-0f8a2a1d7c11
    name:
      description: Product name.
      type: str
      sample: NVIDIA H100 80GB HBM3
    memory_mib:
      description: Total memory in MiB.
      type: int
      sample: 81559
    pci_device_id:
      description: PCI device ID (device << 16 | vendor), as mig-parted's device-filter.
      type: str
      sample: "0x233010DE"
    pci_subsystem_id:
      description:
        - PCI subsystem ID of the board (subsystem device << 16 | subsystem vendor), for mig-parted device-filter
          entries written C(0x233010DE:0x16C110DE); null when NVML does not say.
      type: str
      sample: "0x16C110DE"
    mig_capable:
      description: Whether the GPU can do MIG at all (NVML reports a MIG mode for it).
      type: bool
      sample: true
    mig_mode:
      description: MIG mode now and after the next reset.
      type: dict
      sample: {"current": true, "pending": true}
    gpu_instances:
      description:
        - GPU instances by placement start (empty when MIG is disabled).
        - C(gpu_instance_id) is the driver's, derived from the placement (C(0) for a whole-GPU instance), not from
          the order of creation.
      type: list
      elements: dict
      sample:
        - gpu_instance_id: 1
          profile: 3g.40gb
          profile_id: 9
          start: 0
          size: 4
          memory_mib: 40192
          compute_instances:
            - compute_instance_id: 0
              compute_slices: 3
              mig_device_uuid: MIG-0d3c1c1e-4c38-5a0f-9b7a-2c7c5f0f3e21
          processes: [4242]
    processes:
      description:
        - Compute and graphics processes on the GPU; C(gpu_instance_id) is null outside MIG instances.
        - C(type) is C(compute), C(graphics) or C(compute+graphics); C(used_memory_mib) is null where NVML does not
          report it.
        - PIDs are the host's - NVML does not translate them into a container's PID namespace.
      type: list
      elements: dict
      sample:
        - {"pid": 4242, "used_memory_mib": 2048, "gpu_instance_id": 1, "compute_instance_id": 0, "type": "compute"}
    mig_profiles:
      description: The GPU-instance profiles NVML reports for this GPU, with their possible placements.
      type: list
      elements: dict
      sample:
        - name: 1g.10gb
          profile_id: 19
          profile_enum: 0
          compute_slices: 1
          max_instances: 7
          memory_mib: 9856
          placements: [{"start": 0, "size": 1}, {"start": 1, "size": 1}]
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.mig.plugins.module_utils.args_common import nvml_backend_args
from ansible_collections.gpufleet.mig.plugins.module_utils.exceptions import MigError
from ansible_collections.gpufleet.mig.plugins.module_utils.gpu_info import collect
from ansible_collections.gpufleet.mig.plugins.module_utils.nvml_backend import open_nvml, warn_ignored_environment


def argument_spec() -> dict:
    return nvml_backend_args()


def main():
    module = AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)
    nvml = None
    try:
        warn_ignored_environment(module.warn, module.params["nvml_sim_state"])
        nvml = open_nvml(module.params["nvml_sim_state"], sim_on_gpu_host=module.params["nvml_sim_on_gpu_host"])
        gpus = collect(nvml)
    except MigError as exc:
        module.fail_json(msg=exc.message)
    finally:
        if nvml is not None:
            nvml.close()
    module.exit_json(changed=False, gpus=gpus)


if __name__ == "__main__":
    main()
