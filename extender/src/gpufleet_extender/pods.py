"""What GPU devices a pod asks for, read from its containers' resources (pure, no I/O).

Under the device plugin's mixed strategy a pod asks for whole GPUs (``nvidia.com/gpu``) or MIG instances
of one profile (``nvidia.com/mig-3g.40gb``). Like kube-scheduler, the effective request of a pod is the
larger of the sum over its containers and the largest single init container (init containers run one
after the other), and a limit stands in for a missing request.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Context, Decimal

from gpufleet_extender.settings_contract import MIG_RESOURCE_PREFIX as MIG_RESOURCE_PREFIX  # re-exported
from gpufleet_extender.settings_contract import WHOLE_GPU_RESOURCE as WHOLE_GPU_RESOURCE  # re-exported
from gpufleet_extender.wire import Container, Pod, WireError


def is_gpu_resource(name: str) -> bool:
    return name == WHOLE_GPU_RESOURCE or name.startswith(MIG_RESOURCE_PREFIX)


@dataclass(frozen=True, slots=True)
class ResourceRequest:
    """``count`` devices of the extended resource ``resource``."""

    resource: str
    count: int


# Empty when the pod asks for no GPU; otherwise sorted by resource name (a stable cache key).
GpuRequest = tuple[ResourceRequest, ...]

# A Kubernetes quantity (k8s.io/apimachinery resource.Quantity): a decimal number, then a binary suffix (Ki..Ei),
# a decimal exponent (e3, E-2) or a decimal SI suffix (m, k, M, G, T, P, E). ASCII only: Decimal() would also
# read "٣" as 3, which no Kubernetes quantity is. Bounded in length so a 4 MB string is refused before parsing.
_QUANTITY = re.compile(
    r"(?P<sign>[+-]?)(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[eE][+-]?[0-9]{1,3}|m|k|M|G|T|P|E)?"
)
_MAX_QUANTITY_TEXT = 64
_SUFFIXES = {
    **{s: Decimal(1024) ** (i + 1) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))},
    **{"m": Decimal("0.001"), "": Decimal(1)},
    **{s: Decimal(1000) ** (i + 1) for i, s in enumerate(("k", "M", "G", "T", "P", "E"))},
}
_EXACT = Context(prec=200)  # every value this grammar allows, exactly
_MAX_QUANTITY = 2**63 - 1  # int64, as Kubernetes stores them


def _quantity_value(value: str | int | float) -> Decimal | None:
    """The number a Kubernetes quantity stands for ("1k" is 1000, "500m" 0.5); None when it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, float):
        return Decimal(value) if math.isfinite(value) else None
    if not isinstance(value, str) or len(value) > _MAX_QUANTITY_TEXT:
        return None
    match = _QUANTITY.fullmatch(value.strip())
    if match is None:
        return None
    number = Decimal(match["sign"] + match["number"])
    suffix = match["suffix"] or ""
    if suffix[:1] in ("e", "E") and len(suffix) > 1:
        return _EXACT.multiply(number, _EXACT.power(Decimal(10), int(suffix[1:])))
    return _EXACT.multiply(number, _SUFFIXES[suffix])


def _quantity(resource: str, value: str | int | float) -> int:
    # Extended resources take Kubernetes quantities that are whole numbers: "2", 2, "1k" (1000), "2e1" (20);
    # kube-apiserver refuses "500m" (0.5) and negative ones, and so does this, with the reason.
    if isinstance(value, str) and len(value) > _MAX_QUANTITY_TEXT:
        raise WireError(f"resource {resource}: quantity {_shorten(value)} is longer than any Kubernetes accepts")
    number = _quantity_value(value)
    if number is None:
        raise WireError(
            f"resource {resource}: {_shorten(value)} is not a Kubernetes quantity "
            "(a number with an optional suffix, such as 2, 1k or 2e3)"
        )
    if number < 0:
        raise WireError(f"resource {resource}: quantity must not be negative, got {_shorten(value)}")
    if number != number.to_integral_value():
        raise WireError(
            f"resource {resource}: quantity {_shorten(value)} is {number.normalize():f}, not a whole number: "
            "an extended resource counts whole devices"
        )
    if number > _MAX_QUANTITY:
        raise WireError(f"resource {resource}: quantity is larger than Kubernetes allows, got {_shorten(value)}")
    return int(number)


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
