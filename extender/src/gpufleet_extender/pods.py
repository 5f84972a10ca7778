"""What GPU devices a pod asks for, read from its containers' resources (pure, no I/O).

Under the device plugin's mixed strategy a pod asks for whole GPUs (``nvidia.com/gpu``) or MIG instances
of one profile (``nvidia.com/mig-3g.40gb``). Like kube-scheduler, the effective request of a pod is the
larger of the sum over its containers and the largest single init container (init containers run one
after the other), and a limit stands in for a missing request.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpufleet_extender.wire import Container, Pod, WireError

WHOLE_GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"


def is_gpu_resource(name: str) -> bool:
    return name == WHOLE_GPU_RESOURCE or name.startswith(MIG_RESOURCE_PREFIX)


@dataclass(frozen=True, slots=True)
class ResourceRequest:
    """``count`` devices of the extended resource ``resource``."""

    resource: str
    count: int


# Empty when the pod asks for no GPU; otherwise sorted by resource name (a stable cache key).
GpuRequest = tuple[ResourceRequest, ...]

# Quantities are int64 in Kubernetes. ASCII digits only: str.isdigit() also takes "²" or "٣", which int()
# refuses or reads as another number; and at most 18 of them, so int() never meets its 4,300-digit limit.
_WHOLE_NUMBER = re.compile(r"[0-9]{1,18}")
_MAX_QUANTITY = 2**63 - 1


def _quantity(resource: str, value: str | int | float) -> int:
    # Extended resources only take whole numbers ("2", 2); kube-apiserver rejects "500m" or "1Gi".
    if isinstance(value, bool):
        raise WireError(f"resource {resource}: quantity must be a whole number, got {value!r}")
    if isinstance(value, int):
        number = value
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    elif isinstance(value, str) and _WHOLE_NUMBER.fullmatch(value.strip()):
        number = int(value.strip())
    else:
        raise WireError(f"resource {resource}: quantity must be a whole number, got {_shorten(value)}")
    if number < 0:
        raise WireError(f"resource {resource}: quantity must not be negative, got {value!r}")
    if number > _MAX_QUANTITY:
        raise WireError(f"resource {resource}: quantity is larger than Kubernetes allows, got {_shorten(value)}")
    return number


def _shorten(value: object) -> str:
    # The value goes back in the 4xx answer: a 4 MB digit string must not.
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:40]}... ({len(text)} characters)"


def _container_gpus(container: Container) -> dict[str, int]:
    resources = container.resources
    if resources is None:
        return {}
    counts: dict[str, int] = {}
    for source in (resources.limits, resources.requests):  # requests win when both are set
        for name, value in (source or {}).items():
            if is_gpu_resource(name):
                counts[name] = _quantity(name, value)
    return counts


def _sum_counts(per_container: Iterable[Mapping[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for counts in per_container:
        for name, count in counts.items():
            total[name] = total.get(name, 0) + count
    return total


def pod_gpu_request(pod: Pod) -> GpuRequest:
    """The GPU devices ``pod`` needs; raise WireError for quantities Kubernetes would not accept."""
    containers = pod.spec.containers or []
    init_containers = pod.spec.initContainers or []
    total = _sum_counts(_container_gpus(c) for c in containers)
    for init in init_containers:
        for name, count in _container_gpus(init).items():
            total[name] = max(total.get(name, 0), count)
    return tuple(ResourceRequest(name, count) for name, count in sorted(total.items()) if count > 0)
