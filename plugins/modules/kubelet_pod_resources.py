#!/usr/bin/python
# Copyright: gpufleet maintainers
# Apache License 2.0 (see galaxy.yml)

from __future__ import annotations

DOCUMENTATION = r"""
module: kubelet_pod_resources
short_description: Which devices (MIG instances) the kubelet has allocated to which pods, and which are free
version_added: 0.1.0
description:
  - Reads the kubelet's pod-resources gRPC API on the node (C(v1.PodResourcesLister), calls C(List) and
    C(GetAllocatableResources)) over its unix socket.
  - Reports, for the device resources whose name starts with O(resource_prefix), which device IDs each container
    of each pod holds, which device IDs the kubelet can allocate, and which of those are free.
  - With the NVIDIA device plugin's default device-ID strategy (C(uuid)) a MIG instance's device ID is its MIG
    device UUID (C(MIG-...)), the C(mig_device_uuid) that C(gpufleet.mig.nvidia_gpu_info) reports, so the two
    together tell which MIG instances are allocated - whether or not their pod runs a process on them yet.
  - Read-only.
author: gpufleet maintainers (@gpufleet)
options:
  socket:
    description:
      - Path of the kubelet's pod-resources socket on the node. It is root-only; run the task with C(become).
    type: path
    default: /var/lib/kubelet/pod-resources/kubelet.sock
  timeout:
    description: Seconds to wait for each of the two calls.
    type: float
    default: 10.0
  resource_prefix:
    description:
      - Only device resources whose name starts with this are reported. The default covers the NVIDIA device
        plugin's C(nvidia.com/gpu) and, in the mixed strategy, C(nvidia.com/mig-<profile>); an empty string
        reports every device resource.
    type: str
    default: nvidia.com/
requirements:
  - grpcio and protobuf on the node's Python (the C(gpufleet.mig.mig_partition) role installs them into its venv).
attributes:
  check_mode:
    support: full
    description: Reads only; runs the same in check mode.
  diff_mode:
    support: none
    description: Nothing changes, so there is nothing to diff.
seealso:
  - module: gpufleet.mig.nvidia_gpu_info
  - name: Monitoring device plugin resources
    description: The kubelet's pod-resources API in the Kubernetes documentation.
    link: https://kubernetes.io/docs/concepts/extend-kubernetes/compute-storage-net/device-plugins/#monitoring-device-plugin-resources
notes:
  - The kubelet serves C(List) since Kubernetes 1.20 and C(GetAllocatableResources) since 1.23 (1.21 and 1.22
    behind the C(KubeletPodResourcesGetAllocatable) feature gate); an older kubelet fails the task, naming the call.
"""

EXAMPLES = r"""
- name: Read which MIG instances are allocated on the node
  gpufleet.mig.kubelet_pod_resources:
  become: true
  register: pod_resources

- name: Free 1g.10gb instances
  ansible.builtin.debug:
    msg: "{{ pod_resources.free['nvidia.com/mig-1g.10gb'] | default([]) }}"

- name: MIG device UUIDs that must not be destroyed
  ansible.builtin.set_fact:
    allocated_mig_uuids: "{{ pod_resources.allocated | map(attribute='device_id') | list }}"
"""

RETURN = r"""
socket:
  description: The socket that was read.
  returned: always
  type: str
  sample: /var/lib/kubelet/pod-resources/kubelet.sock
allocated:
  description: Every device ID a container holds, one entry per device, sorted by resource and device ID.
  returned: success
  type: list
  elements: dict
  sample:
    - resource_name: nvidia.com/mig-3g.40gb
      device_id: MIG-0d1c7a8e-5b3f-5e0a-9c61-2f1f4d6b9a10
      namespace: imagegen
      pod: sdxl-7c9f8
      container: worker
allocatable:
  description: The device IDs the kubelet can allocate, per resource name.
  returned: success
  type: dict
  sample: {"nvidia.com/mig-3g.40gb": ["MIG-0d1c7a8e-5b3f-5e0a-9c61-2f1f4d6b9a10", "MIG-5e2a..."]}
free:
  description: Allocatable device IDs that no container holds, per resource name (empty lists included).
  returned: success
  type: dict
  sample: {"nvidia.com/mig-3g.40gb": ["MIG-5e2a..."]}
devices:
  description:
    - Every device ID seen, keyed by ID - its resource name, MIG profile (from a C(nvidia.com/mig-<profile>) name,
      else null), whether it is allocatable and allocated, and the holder (null when free).
    - A device held by a container but no longer allocatable (for example unhealthy) has C(allocatable=false).
  returned: success
  type: dict
  sample:
    MIG-0d1c7a8e-5b3f-5e0a-9c61-2f1f4d6b9a10:
      resource_name: nvidia.com/mig-3g.40gb
      mig_profile: 3g.40gb
      allocatable: true
      allocated: true
      namespace: imagegen
      pod: sdxl-7c9f8
      container: worker
pods:
  description: The pods that hold reported devices, with each container's device IDs per resource name.
  returned: success
  type: list
  elements: dict
  sample:
    - namespace: imagegen
      name: sdxl-7c9f8
      containers:
        - name: worker
          devices: [{"resource_name": "nvidia.com/mig-3g.40gb", "device_ids": ["MIG-0d1c..."]}]
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.mig.plugins.module_utils.pod_resources import (
    DEFAULT_SOCKET,
    DEFAULT_TIMEOUT,
    PodResourcesError,
    read_pod_resources,
)


def argument_spec() -> dict:
    return {
        "socket": {"type": "path", "default": DEFAULT_SOCKET},
        "timeout": {"type": "float", "default": DEFAULT_TIMEOUT},
        "resource_prefix": {"type": "str", "default": "nvidia.com/"},
    }


def main():
    module = AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)
    path = module.params["socket"]
    try:
        reading = read_pod_resources(path, module.params["timeout"], module.params["resource_prefix"])
    except PodResourcesError as exc:
        module.fail_json(msg=exc.message, socket=path)
    module.exit_json(
        changed=False,
        socket=path,
        allocated=[a.as_dict() for a in reading.allocations],
        allocatable=reading.allocatable,
        free=reading.free(),
        devices=reading.devices(),
        pods=reading.pods(),
    )


if __name__ == "__main__":
    main()
