"""What GPU devices a pod asks for, read from its containers' resources (pure, no I/O).

The reading itself is the collection's one reader of a pod's GPU request (`mig_utils.pod_requests`: requests or
limits, sidecars and init containers as kube-scheduler counts them, Kubernetes quantities), shared with the MIG
advisor; this module gives it the extender's wire types and errors.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet_extender.mig_utils.names import MIG_RESOURCE_PREFIX, WHOLE_GPU_RESOURCE
from gpufleet_extender.mig_utils.pod_requests import ContainerResources, QuantityError, is_gpu_resource, pod_devices
from gpufleet_extender.wire import Container, Pod, WireError

__all__ = ["MIG_RESOURCE_PREFIX", "WHOLE_GPU_RESOURCE", "GpuRequest", "ResourceRequest", "is_gpu_resource"]


@dataclass(frozen=True, slots=True)
class ResourceRequest:
    """``count`` devices of the extended resource ``resource``."""

    resource: str
    count: int


# Empty when the pod asks for no GPU; otherwise sorted by resource name (a stable cache key).
GpuRequest = tuple[ResourceRequest, ...]


def _resources(container: Container) -> ContainerResources:
    resources = container.resources
    if resources is None:
        return ContainerResources(None, None, container.restartPolicy)
    return ContainerResources(resources.limits, resources.requests, container.restartPolicy)


def pod_gpu_request(pod: Pod) -> GpuRequest:
    """The GPU devices ``pod`` needs; raise WireError for quantities Kubernetes would not accept."""
    try:
        devices = pod_devices(
            (_resources(c) for c in pod.spec.containers or []),
            (_resources(c) for c in pod.spec.initContainers or []),
        )
    except QuantityError as exc:
        raise WireError(str(exc)) from None
    return tuple(ResourceRequest(name, count) for name, count in devices.items())
