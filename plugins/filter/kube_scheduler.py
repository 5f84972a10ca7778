# Copyright: gpufleet maintainers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Filters of the kube_scheduler role: validate a KubeSchedulerConfiguration, patch the kubeadm static pod manifest
and take the patch out again (uninstall).

The logic lives in module_utils/kube_scheduler_config.py (unit-tested there); these are thin Ansible adapters.
"""

from ansible.errors import AnsibleFilterError
from ansible_collections.gpufleet.mig.plugins.module_utils.kube_scheduler_config import (
    ManifestError,
    patch_static_pod_manifest,
    scheduler_config_errors,
    unpatch_static_pod_manifest,
)


def kube_scheduler_config_errors(config, out_of_tree_plugins=None):
    """Why kube-scheduler would refuse `config`, one message per violated rule; [] when it would start.

    `out_of_tree_plugins`: plugin names the scheduler binary registers besides the in-tree ones (gpufleet-scheduler:
    ["GPUScore"]); none for the stock kube-scheduler.
    """
    return scheduler_config_errors(config, tuple(out_of_tree_plugins or ()))


def kube_scheduler_patch_manifest(manifest, config_file, config_dir, config_hash):
    """kubeadm's kube-scheduler static pod manifest running with --config=config_file (idempotent)."""
    try:
        return patch_static_pod_manifest(manifest, str(config_file), str(config_dir), str(config_hash))
    except ManifestError as err:
        raise AnsibleFilterError(f"kube_scheduler_patch_manifest: {err}") from err


def kube_scheduler_unpatch_manifest(manifest, config_file):
    """The manifest without gpufleet's --config argument, config volume and mount, and hash annotation."""
    try:
        return unpatch_static_pod_manifest(manifest, str(config_file))
    except ManifestError as err:
        raise AnsibleFilterError(f"kube_scheduler_unpatch_manifest: {err}") from err


class FilterModule:
    def filters(self):
        return {
            "kube_scheduler_config_errors": kube_scheduler_config_errors,
            "kube_scheduler_patch_manifest": kube_scheduler_patch_manifest,
            "kube_scheduler_unpatch_manifest": kube_scheduler_unpatch_manifest,
        }
