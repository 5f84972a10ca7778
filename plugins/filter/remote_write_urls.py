"""gpufleet.mig.remote_write_urls: the remote-write URL of every replica of a receiving StatefulSet."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

DOCUMENTATION = r"""
name: remote_write_urls
short_description: The remote-write URL of each replica of a StatefulSet that receives the GPU load
description:
  - With C(gpufleet_metrics_source) C(push) every replica of the extender (and of C(gpufleet-scheduler) in plugin
    mode) receives the whole stream from Prometheus, so each is listed on its own, by the name its pod has through the
    fleet's headless Service - C(<scheme>://<name>-<i>.<service>.<namespace>.svc:<port>/api/v1/write).
options:
  _input:
    description: The StatefulSet's name.
    type: str
    required: true
  replicas:
    description: How many replicas it runs.
    type: int
    required: true
  service:
    description: The headless Service that names its pods.
    type: str
    required: true
  namespace:
    description: Its namespace.
    type: str
    required: true
  port:
    description: The receivers' port.
    type: int
    required: true
  scheme:
    description: C(https) or C(http).
    type: str
    default: https
"""

EXAMPLES = r"""
- name: The extender's receivers
  ansible.builtin.debug:
    msg: >-
      {{ 'gpufleet-extender'
         | gpufleet.mig.remote_write_urls(2, 'gpufleet-metrics-receivers', 'gpufleet-system', 9402) }}
"""

RETURN = r"""
_value:
  description: One URL per replica, in replica order.
  type: list
  elements: str
"""


def remote_write_urls(name, replicas, service, namespace, port, scheme="https") -> list[str]:
    if scheme not in ("https", "http"):
        raise AnsibleFilterError(f"remote_write_urls: scheme must be https or http, not {scheme!r}")
    try:
        count, port = int(replicas), int(port)
    except (TypeError, ValueError):
        raise AnsibleFilterError(
            f"remote_write_urls: replicas and port must be whole numbers (got {replicas!r}, {port!r})"
        ) from None
    return [f"{scheme}://{name}-{i}.{service}.{namespace}.svc:{port}/api/v1/write" for i in range(count)]


class FilterModule:
    def filters(self):
        return {"remote_write_urls": remote_write_urls}
