"""gpufleet.mig.host_gpus and gpufleet.mig.node_name: a host's GPU facts for the roles, from the one reader
(module_utils/host_gpus.py): its Kubernetes node name, GPU product, GPU count and what its layout makes of them,
judged against the host's own product. A problem is one AnsibleFilterError naming the host and the variable.
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.gpufleet.mig.plugins.module_utils import host_gpus as facts
from ansible_collections.gpufleet.mig.plugins.module_utils.exceptions import MigError


def _hostvars_of(host, hostvars) -> dict:
    try:
        return hostvars[str(host)]
    except KeyError:
        raise AnsibleFilterError(f"host {host} is not a host of the inventory") from None


def host_gpus(host, hostvars, replicas=None) -> dict:
    """{host, node_name, product, gpu_count, mig_capable, layout, instances, resources} of an inventory host."""
    try:
        return facts.host_gpus(str(host), _hostvars_of(host, hostvars)).as_dict(replicas)
    except MigError as exc:
        raise AnsibleFilterError(exc.message) from None


def node_name(host, hostvars) -> str:
    """The Kubernetes node name of an inventory host: gpufleet_node_name, else its inventory name."""
    try:
        return facts.node_name(str(host), _hostvars_of(host, hostvars))
    except MigError as exc:
        raise AnsibleFilterError(exc.message) from None


class FilterModule:
    def filters(self):
        return {"host_gpus": host_gpus, "node_name": node_name}
