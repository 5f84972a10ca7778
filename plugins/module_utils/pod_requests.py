"""What GPU devices a pod asks for, read as kube-scheduler and the kubelet read it: the one reader of a pod's GPU
request, for the extender (its filter, prioritize and in-flight accounting) and the MIG advisor (the demand of
pending pods).

Under the device plugin's mixed strategy a pod asks for whole GPUs (``nvidia.com/gpu``) or MIG instances of a
profile (``nvidia.com/mig-3g.40gb``). A container's request is its `requests` entry, else its `limits` entry (the
API server copies a limit into a missing request of an extended resource). The pod's request is that of
component-helpers' PodRequests: the sum over its containers and its sidecars (init containers with `restartPolicy:
Always`, which keep running), or, when larger, what the init containers need while they run one after the other
(each beside the sidecars started before it). Quantities are Kubernetes quantities ("2", 2, "1k", "2e1") that
stand for a whole number of devices.

Pure Python, no Ansible: the extender's wheel ships it with the layout library.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from decimal import Context, Decimal
from typing import Any, NamedTuple

from .names import MIG_RESOURCE_PREFIX, WHOLE_GPU_RESOURCE


class QuantityError(ValueError):
    """A resource quantity Kubernetes would not accept for a count of devices; the message says why."""


class ContainerResources(NamedTuple):
    """What the reader needs of a container: its resources' limits and requests, and its restart policy (init
    containers: "Always" makes it a sidecar)."""

    limits: Mapping[str, Any] | None
    requests: Mapping[str, Any] | None
    restart_policy: str | None = None


def is_gpu_resource(name: str) -> bool:
    return name == WHOLE_GPU_RESOURCE or name.startswith(MIG_RESOURCE_PREFIX)


# A Kubernetes quantity (k8s.io/apimachinery resource.Quantity): a decimal number, then a binary suffix (Ki..Ei),
# a decimal exponent (e3, E-2) or a decimal SI suffix (m, k, M, G, T, P, E). ASCII only: Decimal() would also
# read "٣" as 3, which no Kubernetes quantity is. Bounded in length so a 4 MB string is refused before parsing.
_QUANTITY = re.compile(
    r"(?P<sign>[+-]?)(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[eE][+-]?[0-9]{1,3}|m|k|M|G|T|P|E)?"
)
MAX_QUANTITY_TEXT = 64
_SUFFIXES = {
    **{s: Decimal(1024) ** (i + 1) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))},
    **{"m": Decimal("0.001"), "": Decimal(1)},
    **{s: Decimal(1000) ** (i + 1) for i, s in enumerate(("k", "M", "G", "T", "P", "E"))},
}
_EXACT = Context(prec=200)  # every value this grammar allows, exactly
_MAX_QUANTITY = 2**63 - 1  # int64, as Kubernetes stores them


def quantity_value(value: object) -> Decimal | None:
    """The number a Kubernetes quantity stands for ("1k" is 1000, "500m" 0.5); None when it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, float):
        return Decimal(value) if math.isfinite(value) else None
    if not isinstance(value, str) or len(value) > MAX_QUANTITY_TEXT:
        return None
    match = _QUANTITY.fullmatch(value.strip())
    if match is None:
        return None
    number = Decimal(match["sign"] + match["number"])
    suffix = match["suffix"] or ""
    if suffix in _SUFFIXES:  # "Ei" (exbi) too, which starts like an exponent
        return _EXACT.multiply(number, _SUFFIXES[suffix])
    return _EXACT.multiply(number, _EXACT.power(Decimal(10), int(suffix[1:])))


def shorten(value: object) -> str:
    """A value for a message: a 4 MB digit string must not travel back whole."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:40]}... ({len(text)} characters)"


def device_count(resource: str, value: object) -> int:
    """The whole number of devices a quantity asks for; QuantityError for one Kubernetes would not accept
    (kube-apiserver refuses "500m" (0.5) and negative quantities of an extended resource)."""
    if isinstance(value, str) and len(value) > MAX_QUANTITY_TEXT:
        raise QuantityError(f"resource {resource}: quantity {shorten(value)} is longer than any Kubernetes accepts")
    number = quantity_value(value)
    if number is None:
        raise QuantityError(
            f"resource {resource}: {shorten(value)} is not a Kubernetes quantity "
            "(a number with an optional suffix, such as 2, 1k or 2e3)"
        )
    if number < 0:
        raise QuantityError(f"resource {resource}: quantity must not be negative, got {shorten(value)}")
    if number != number.to_integral_value():
        raise QuantityError(
            f"resource {resource}: quantity {shorten(value)} is {number.normalize():f}, not a whole number: "
            "an extended resource counts whole devices"
        )
    if number > _MAX_QUANTITY:
        raise QuantityError(f"resource {resource}: quantity is larger than Kubernetes allows, got {shorten(value)}")
    return int(number)


def container_devices(container: ContainerResources, wanted: Callable[[str], bool] = is_gpu_resource) -> dict[str, int]:
    """The devices of the `wanted` resources one container asks for (its request, else its limit)."""
    counts: dict[str, int] = {}
    for source in (container.limits, container.requests):  # requests win when both are set
        for name, value in (source or {}).items():
            if wanted(name):
                counts[name] = device_count(name, value)
    return counts


def _add(total: dict[str, int], counts: Mapping[str, int]) -> dict[str, int]:
    merged = dict(total)
    for name, count in counts.items():
        merged[name] = merged.get(name, 0) + count
    return merged


def _max(left: Mapping[str, int], right: Mapping[str, int]) -> dict[str, int]:
    return {name: max(left.get(name, 0), right.get(name, 0)) for name in {*left, *right}}


def pod_devices(
    containers: Iterable[ContainerResources],
    init_containers: Iterable[ContainerResources] = (),
    wanted: Callable[[str], bool] = is_gpu_resource,
) -> dict[str, int]:
    """The pod's request of each `wanted` resource (component-helpers' PodRequests), zero counts left out."""
    total: dict[str, int] = {}
    for container in containers:
        total = _add(total, container_devices(container, wanted))
    sidecars: dict[str, int] = {}  # the restartable init containers started so far
    init_peak: dict[str, int] = {}
    for init in init_containers:
        counts = container_devices(init, wanted)
        if init.restart_policy == "Always":
            total = _add(total, counts)
            sidecars = _add(sidecars, counts)
            running = sidecars
        else:
            running = _add(counts, sidecars)
        init_peak = _max(init_peak, running)
    return {name: count for name, count in sorted(_max(total, init_peak).items()) if count > 0}


def pod_devices_from_object(pod: Mapping[str, Any], wanted: Callable[[str], bool] = is_gpu_resource) -> dict[str, int]:
    """pod_devices of a Pod object as the API returns it (a mapping; kubernetes.core's k8s_info results)."""
    spec = pod.get("spec") if isinstance(pod, Mapping) else None
    spec = spec if isinstance(spec, Mapping) else {}

    def read(entries: object) -> list[ContainerResources]:
        result = []
        for entry in entries if isinstance(entries, list) else []:
            entry = entry if isinstance(entry, Mapping) else {}
            resources = entry.get("resources")
            resources = resources if isinstance(resources, Mapping) else {}
            limits, requests = resources.get("limits"), resources.get("requests")
            result.append(
                ContainerResources(
                    limits if isinstance(limits, Mapping) else None,
                    requests if isinstance(requests, Mapping) else None,
                    entry.get("restartPolicy"),
                )
            )
        return result

    return pod_devices(read(spec.get("containers")), read(spec.get("initContainers")), wanted)
