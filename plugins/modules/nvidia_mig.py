#!/usr/bin/python
# Copyright: gpufleet maintainers
# Apache License 2.0 (see galaxy.yml)

from __future__ import annotations

DOCUMENTATION = r"""
module: nvidia_mig
short_description: Apply a declarative NVIDIA MIG layout with minimal disruption
version_added: 0.1.0
description:
  - Declares, per GPU, whether MIG is enabled and which GPU instances exist (mig-parted's entry shape with
    underscores), and applies it idempotently through NVML.
  - The whole request is validated against the MIG profile catalog NVML reports for each GPU before anything is
    written. Unknown profiles (the valid names are listed), counts over a profile's maximum, and combinations
    without a valid placement fail with a message naming the constraint, and nothing is written on any GPU.
  - Placement is an exact search over NVML's possible placements (memory and compute slices), not greedy.
  - Minimal disruption - every existing instance that can stay in a valid placement of the new layout is kept
    (busy ones first), only the others are destroyed, and new instances are created at explicit placements with
    C(nvmlDeviceCreateGpuInstanceWithPlacement), each with one compute instance spanning it. GPUs whose layout
    already matches are not touched.
  - A MIG mode change that stays pending (C(nvmlDeviceSetMigMode) returns an activation status) is completed by
    resetting only that GPU when O(reset=true); otherwise, or when that GPU cannot be reset here (reset not
    supported, or processes still hold it after O(force)), RV(reboot_required) is set, RV(gpus[].reset_error) says
    why, and the other GPUs are still processed.
  - GPUs that cannot do MIG are left alone where mig-parted skips them (O(config[].devices=all), or MIG off
    wanted); an entry that names such a GPU's index and wants MIG on fails.
  - An NVML failure part-way fails the task with what was already done on which GPU (RV(gpus[].done)); rerunning
    converges.
author: gpufleet maintainers (@gpufleet)
options:
  config:
    description:
      - The layout, a list of entries. Each entry selects GPUs with O(config[].devices) and says what they must look
        like. GPUs no entry selects are left alone; a GPU selected by two entries is an error (mig-parted would let
        the last one win).
      - Mutually exclusive with O(mig_parted_file).
    type: list
    elements: dict
    suboptions:
      devices:
        description:
          - V(all) or a list of GPU indexes (whole numbers from 0).
          - An index the host does not have fails the task unless O(missing_devices=skip).
        type: raw
        required: true
      mig_enabled:
        description: Whether MIG mode is enabled on these GPUs.
        type: bool
        required: true
      mig_devices:
        description:
          - Map of GPU-instance profile name to count, for example C(2g.20gb) to V(3) and C(1g.10gb) to V(1).
          - Requires O(config[].mig_enabled).
          - Profile names are the ones NVML reports for the GPU (C(1g.10gb), C(1g.10gb+me), C(3g.40gb), ...); IDs are
            never used here. Names are read with go-nvlib's grammar, as mig-parted reads them
            (C([<C>c.]<G>g.<GB>gb[+attr,...|-attr,...]), e.g. C(1g.24gb+me.all), C(2g.48gb-me)), so names of other
            GPU models are not an error in entries that do not select this GPU. A profile the GPU does not have
            fails, naming the valid ones. Compute-instance forms smaller than their GPU instance (C(1c.3g.40gb)) are
            accepted by the grammar but fail when they select a GPU - one compute instance spans each GPU
            instance here.
        type: dict
      device_filter:
        description:
          - Optional PCI IDs, as mig-parted's C(device-filter); the entry then only applies to GPUs that match one
            of them.
          - V(0x233010DE) (device and vendor) matches every board of that GPU model; V(0x233010DE:0x16C110DE) also
            needs the board's subsystem ID (subsystem device and vendor) to match.
        type: list
        elements: raw
  mig_parted_file:
    description:
      - Path (on the managed host) of a mig-parted C(version v1) config file; the config named O(mig_parted_config)
        is applied. Lets users of the GPU Operator reuse their file. Mutually exclusive with O(config).
      - The whole file is checked with mig-parted's rules first (as mig-parted does, every config in it) - for
        example C(mig-enabled true) needs C(mig-devices) (C({}) for none), and counts may not all be 0.
      - Entries are applied with mig-parted's selection - C(device-filter), then C(devices); a GPU no entry selects
        is left as it is. Two differences remain by design, both failing before any write - a GPU selected by two
        entries, and (unless O(missing_devices=skip)) an index the host does not have.
    type: path
  mig_parted_config:
    description: Name of the config in O(mig_parted_file) (a key of its C(mig-configs)).
    type: str
  force:
    description:
      - Allow destroying instances that have running processes (and changing the MIG mode of a GPU with processes).
      - Without it the task fails before any write, naming the GPU, the instance and the PIDs.
      - NVML itself still refuses (IN_USE) while a process holds an instance; O(force) only skips the pre-check, for
        clients that are being stopped.
    type: bool
    default: false
  missing_devices:
    description:
      - What to do with GPU indexes in O(config[].devices) (or a file's C(devices)) that this host does not have.
      - V(fail) (default) refuses the request before any write - a typo must not silently configure nothing.
      - V(skip) ignores them, as mig-parted does; meant for GPU Operator files written for hosts with more GPUs.
    type: str
    choices: [fail, skip]
    default: fail
  reset:
    description:
      - Reset the GPUs whose MIG mode change stays pending (only those GPUs). When false, or when the reset is not
        possible, RV(reboot_required) is returned and those GPUs get their instances on a later run.
    type: bool
    default: true
  lock_timeout:
    description:
      - Seconds to wait while another MIG change holds this host's lock (the boot unit, or another run of this
        module), before failing with a message naming the holder and changing nothing.
      - The lock is C(/run/lock/gpufleet-mig.lock), or the simulator state file's path with C(.lock) appended when
        O(nvml_sim_state) is set. The kernel releases it when its holder ends, however it ends. Check mode does not
        take it.
    type: int
    default: 300
extends_documentation_fragment:
  - gpufleet.mig.nvml_backend
attributes:
  check_mode:
    support: full
    description: Returns the same plan (RV(gpus[].actions)) and writes nothing.
  diff_mode:
    support: full
    description: Shows the MIG mode and instances (profile@start) of each changed GPU, before and after.
seealso:
  - module: gpufleet.mig.nvidia_gpu_info
notes:
  - A run killed part-way (or a host that lost power) is completed by the next run or the boot unit; every write is
    one NVML call, and each run re-reads the GPUs before it plans.
  - MIG instances do not survive a reboot; the C(gpufleet.mig.mig_partition) role installs a boot unit that re-applies
    the layout with the same code.
"""

EXAMPLES = r"""
- name: Diffusion nodes - two 3g.40gb on GPUs 0-3, three 2g.20gb and one 1g.10gb on GPUs 4-7
  gpufleet.mig.nvidia_mig:
    config:
      - devices: [0, 1, 2, 3]
        mig_enabled: true
        mig_devices:
          3g.40gb: 2
      - devices: [4, 5, 6, 7]
        mig_enabled: true
        mig_devices:
          2g.20gb: 3
          1g.10gb: 1

- name: Whole GPUs for tensor-parallel inference
  gpufleet.mig.nvidia_mig:
    config:
      - devices: all
        mig_enabled: false

- name: Apply a config from a GPU Operator / mig-parted file
  gpufleet.mig.nvidia_mig:
    mig_parted_file: /etc/nvidia-mig-manager/config.yaml
    mig_parted_config: all-1g.10gb

- name: Plan only, against the simulator
  gpufleet.mig.nvidia_mig:
    config: "{{ mig_partition_config }}"
    nvml_sim_state: /var/lib/gpufleet/nvml-sim.json
  check_mode: true
  register: mig_plan
"""

RETURN = r"""
gpus:
  description: One entry per GPU the request selected, in index order.
  returned: always
  type: list
  elements: dict
  contains:
    index:
      description: NVML device index.
      type: int
      sample: 4
    uuid:
      description: GPU UUID.
      type: str
      sample: GPU-5d6f2b9e-8a51-4c43-9f8e-0f8a2a1d7c11
    name:
      description: Product name as NVML reports it.
      type: str
      sample: NVIDIA H100 80GB HBM3
    mig_enabled:
      description: MIG mode before and after (the target).
      type: dict
      sample: {"before": true, "after": true}
    before:
      description: Instances before, as profile and placement start, by start.
      type: list
      elements: dict
      sample: [{"profile": "3g.40gb", "start": 0}, {"profile": "3g.40gb", "start": 4}]
    after:
      description: Instances after (planned, in check mode).
      type: list
      elements: dict
      sample: [{"profile": "3g.40gb", "start": 0}, {"profile": "2g.20gb", "start": 4}]
    actions:
      description: Instance actions in execution order (all destroys, then creates).
      type: list
      elements: dict
      sample: [{"op": "destroy", "profile": "3g.40gb", "start": 4}, {"op": "create", "profile": "2g.20gb", "start": 4}]
    done:
      description:
        - Steps actually carried out, in order - the instance actions plus C(enable_mig)/C(disable_mig) (with NVML's
          activation status) and C(reset). Empty in check mode; on failure, what was done before it, including
          C(destroy_compute_instances) (with C(compute_instance_ids)) when a destroy failed after removing the
          instance's compute instances.
      type: list
      elements: dict
      sample: [{"op": "destroy", "profile": "3g.40gb", "start": 4}]
    changed:
      description: Whether this GPU needed any change.
      type: bool
      sample: true
    disruptive:
      description:
        - Whether the change takes this GPU away from running work - an instance is destroyed or the MIG mode
          switches (a GPU reset). Creating instances in free slices is not disruptive.
      type: bool
      sample: false
    mig_mode_pending:
      description: The MIG mode change is pending until this GPU is reset or the host reboots.
      type: bool
      sample: false
    reset:
      description: This GPU was reset to activate its MIG mode change.
      type: bool
      sample: false
    reset_error:
      description:
        - Why the reset that would have activated the pending MIG mode was not possible here (the GPU then needs
          a reboot, see RV(reboot_required)); null otherwise.
      type: str
      sample: "nvidia-smi --gpu-reset failed: NVML_ERROR_NOT_SUPPORTED (3): GPU reset is not supported here"
reboot_required:
  description: Some GPU's MIG mode change is still pending (reset disabled or not possible).
  returned: always
  type: bool
  sample: false
disruptive:
  description: Whether any GPU's change is disruptive (see RV(gpus[].disruptive)); in check mode, whether it would be.
  returned: always
  type: bool
  sample: false
changed:
  description: Whether any GPU needed a change (in check mode, whether one would be made).
  returned: always
  type: bool
  sample: true
"""

import json
from contextlib import ExitStack

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.mig.plugins.module_utils.args_common import nvml_backend_args
from ansible_collections.gpufleet.mig.plugins.module_utils.exceptions import MigError, SpecError
from ansible_collections.gpufleet.mig.plugins.module_utils.host_lock import lock_path, mig_change_lock
from ansible_collections.gpufleet.mig.plugins.module_utils.nvml_backend import open_nvml, warn_ignored_environment
from ansible_collections.gpufleet.mig.plugins.module_utils.runner import apply
from ansible_collections.gpufleet.mig.plugins.module_utils.spec import config_from_mig_parted

try:
    import yaml

    HAS_YAML = True
except ImportError:
    HAS_YAML = False


def load_mig_parted_file(path: str, name: str) -> list:
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as exc:
        raise SpecError(f"cannot read mig_parted_file {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise SpecError(
            f"mig_parted_file {path} is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}): "
            "is it the mig-parted YAML config, not a binary or another encoding?"
        ) from None
    # yaml.YAMLError (a NUL or other control character included) is no ValueError; json.JSONDecodeError is.
    errors = (yaml.YAMLError, ValueError) if HAS_YAML else (ValueError,)
    try:
        document = yaml.safe_load(text) if HAS_YAML else json.loads(text)
    except errors as exc:
        raise SpecError(f"mig_parted_file {path} is not valid YAML: {exc}") from None
    return config_from_mig_parted(document, name)


def render_diff(gpus: list) -> dict:
    def layout(gpu: dict, side: str) -> str:
        instances = ", ".join(f"{i['profile']}@{i['start']}" for i in gpu[side]) or "no instances"
        mode = "MIG enabled" if gpu["mig_enabled"][side] else "MIG disabled"
        return f"GPU {gpu['index']} ({gpu['uuid']}): {mode}: {instances}\n"

    changed = [g for g in gpus if g["changed"]]
    return {
        "before": "".join(layout(g, "before") for g in changed),
        "after": "".join(layout(g, "after") for g in changed),
        "before_header": "MIG layout (before)",
        "after_header": "MIG layout (after)",
    }


def argument_spec() -> dict:
    spec = {
        "config": {
            "type": "list",
            "elements": "dict",
            "options": {
                "devices": {"type": "raw", "required": True},
                "mig_enabled": {"type": "bool", "required": True},
                "mig_devices": {"type": "dict"},
                "device_filter": {"type": "list", "elements": "raw"},
            },
        },
        "mig_parted_file": {"type": "path"},
        "mig_parted_config": {"type": "str"},
        "force": {"type": "bool", "default": False},
        "missing_devices": {"type": "str", "default": "fail", "choices": ["fail", "skip"]},
        "reset": {"type": "bool", "default": True},
        "lock_timeout": {"type": "int", "default": 300},
    }
    spec.update(nvml_backend_args())
    return spec


def main():
    module = AnsibleModule(
        argument_spec=argument_spec(),
        mutually_exclusive=[("config", "mig_parted_file")],
        required_one_of=[("config", "mig_parted_file")],
        required_together=[("mig_parted_file", "mig_parted_config")],
        supports_check_mode=True,
    )
    params = module.params
    try:
        if params["mig_parted_file"]:
            config = load_mig_parted_file(params["mig_parted_file"], params["mig_parted_config"])
        else:
            # Drop the suboptions Ansible filled with None so the spec sees what the user wrote.
            config = [{k: v for k, v in entry.items() if v is not None} for entry in params["config"]]
        warn_ignored_environment(module.warn, params["nvml_sim_state"])
        with ExitStack() as stack:
            if not module.check_mode:
                lock = lock_path(params["nvml_sim_state"])
                stack.enter_context(mig_change_lock(lock, "the gpufleet.mig.nvidia_mig module", params["lock_timeout"]))
            nvml = open_nvml(params["nvml_sim_state"], sim_on_gpu_host=params["nvml_sim_on_gpu_host"])
            stack.callback(nvml.close)  # NVML's session ends before the lock is released
            result = apply(
                nvml,
                config,
                force=params["force"],
                reset=params["reset"],
                check_mode=module.check_mode,
                missing_devices=params["missing_devices"],
            )
    except MigError as exc:
        module.fail_json(msg=exc.message, gpus=exc.results, changed=any(r.get("done") for r in exc.results))
    if module._diff:
        result["diff"] = render_diff(result["gpus"])
    module.exit_json(**result)


if __name__ == "__main__":
    main()
