"""gpufleet.mig.mig_rebalance_surprises: what changed on a node since its layout advice (playbooks/mig-rebalance.yml
stops on the first node where this is not empty). The logic lives in module_utils/advisor.py."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.gpufleet.mig.plugins.module_utils.advisor import rollout_surprises
from ansible_collections.gpufleet.mig.plugins.module_utils.exceptions import MigError


def mig_rebalance_surprises(advice_node, plan, gpu_info, pod_resources=None):
    """advice_node | gpufleet.mig.mig_rebalance_surprises(plan, gpu_info, pod_resources) -> list of problems."""
    if not isinstance(advice_node, dict) or not isinstance(plan, dict) or not isinstance(gpu_info, list):
        raise AnsibleFilterError(
            "mig_rebalance_surprises: expects an advice node (dict), nvidia_mig's result (dict) and nvidia_gpu_info's "
            "gpus (list)"
        )
    try:
        return rollout_surprises(
            advice_node, plan, gpu_info, pod_resources if isinstance(pod_resources, dict) else None
        )
    except MigError as exc:
        raise AnsibleFilterError(f"mig_rebalance_surprises: {exc.message}") from None


class FilterModule:
    def filters(self):
        return {"mig_rebalance_surprises": mig_rebalance_surprises}
