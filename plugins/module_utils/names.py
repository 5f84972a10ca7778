"""The names the fleet uses for GPU devices, in one place: MIG profile names (go-nvlib's grammar), the extended
resources the NVIDIA device plugin advertises for them, and a pool's time-slicing (`sharing`) of those resources.

Every reader of a profile or resource name goes through here: the layout library (spec, planner, advisor), the
filters (tenants_model, mig_layout) and the extender's simulator (its trace and fleet readers), so that a name one
of them accepts is a name all of them accept, with the same message when it is not.

Pure Python, no Ansible: the extender's wheel ships it with the layout library (docs/layout_library.md).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

WHOLE_GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
RESOURCE_FORMS = "nvidia.com/gpu or nvidia.com/mig-<profile>"
# Time-slicing replicas per device: 1 is exclusive; the extender's SHARED_RESOURCES accepts at most 64.
MAX_REPLICAS = 64
# A profile's numbers are small; bounding them keeps a 5,000-digit string from reaching int().
_NUMBER = re.compile(r"[0-9]{1,6}")
# The most GPU slices of a MIG-capable GPU (A100, H100, H200: 7).
_MAX_GPU_SLICES = 7


@dataclass(frozen=True)
class ProfileName:
    """A MIG profile name parsed with go-nvlib's grammar (pkg/nvlib/device/mig_profile.go), which mig-parted uses.

    ``[<C>c.]<G>g.<GB>gb`` then optionally ``+attr[,attr...]`` or ``-attr[,attr...]`` (not both); attributes are
    alphanumeric with inner dots (``me``, ``me.all``, ``gfx``). Without ``<C>c.`` the compute slices equal the
    GPU slices. Two spellings of one profile (``3c.3g.40gb`` and ``3g.40gb``, ``+me,gfx`` and ``+gfx,me``) are
    the same profile: ``canonical`` is the one spelling (go-nvlib's String(), attributes sorted).
    """

    compute: int
    gpu: int
    gb: int
    attributes: tuple[str, ...] = ()
    negated: tuple[str, ...] = ()

    @property
    def canonical(self) -> str:
        base = f"{self.gpu}g.{self.gb}gb" if self.compute == self.gpu else f"{self.compute}c.{self.gpu}g.{self.gb}gb"
        if self.attributes:
            return base + "+" + ",".join(self.attributes)
        if self.negated:
            return base + "-" + ",".join(self.negated)
        return base

    @property
    def partial_compute(self) -> bool:
        """A compute-instance profile smaller than its GPU instance (``1c.3g.40gb``)."""
        return self.compute != self.gpu


def _profile_field(text: str, suffix: str) -> int:
    if text.strip() != text or not text.endswith(suffix):
        raise ValueError(f"expected '<number>{suffix}', got {text!r}")
    digits = text[: -len(suffix)]
    if not _NUMBER.fullmatch(digits):
        raise ValueError(f"malformed number in {text!r}")
    return int(digits)


def _profile_attributes(text: str) -> tuple[str, ...]:
    attributes = text.split(",")
    if len(set(attributes)) != len(attributes):
        raise ValueError("an attribute is listed twice")
    for attribute in attributes:
        if not attribute:
            raise ValueError("empty attribute")
        if attribute[0].isdigit() or attribute[0] == "." or attribute[-1] == ".":
            raise ValueError(f"attribute {attribute!r} starts with a digit or starts/ends with a dot")
        if not all(c.isascii() and (c.isalnum() or c == ".") for c in attribute):
            raise ValueError(f"attribute {attribute!r} has characters other than letters, digits and dots")
    return tuple(sorted(attributes))


def parse_profile_name(name: str) -> ProfileName:
    """Parse a profile name as go-nvlib does; ValueError says what is wrong."""
    if not name:
        raise ValueError("empty profile name")
    plus, minus = name.split("+", 1), name.split("-", 1)
    if len(plus) == 2 and len(minus) == 2:
        raise ValueError("both '+' and '-' attributes")
    parts = plus if len(plus) == 2 else minus
    fields = parts[0].split(".", 2)
    if len(fields) == 3:
        compute, gpu, gb = (
            _profile_field(fields[0], "c"),
            _profile_field(fields[1], "g"),
            _profile_field(fields[2], "gb"),
        )
    elif len(fields) == 2:
        gpu, gb = _profile_field(fields[0], "g"), _profile_field(fields[1], "gb")
        compute = gpu
    else:
        raise ValueError("expected [<C>c.]<G>g.<GB>gb")
    attributes = _profile_attributes(parts[1]) if len(parts) == 2 else ()
    if len(plus) == 2:
        return ProfileName(compute, gpu, gb, attributes=attributes)
    return ProfileName(compute, gpu, gb, negated=attributes)


def mig_resource(profile: str) -> str:
    """The device plugin's resource for instances of a profile (mixed strategy): ``nvidia.com/mig-<profile>``."""
    return MIG_RESOURCE_PREFIX + profile


def is_device_profile(profile: str) -> bool:
    """Whether the device plugin can advertise `profile` as a resource: a whole GPU instance (the only kind
    nvidia_mig creates), ``<G>g.<GB>gb`` with G of 1 to 7, optionally ``+me``, spelt canonically."""
    try:
        parsed = parse_profile_name(profile)
    except ValueError:
        return False
    return (
        parsed.canonical == profile
        and not parsed.partial_compute
        and 1 <= parsed.gpu <= _MAX_GPU_SLICES
        and parsed.attributes in ((), ("me",))
        and not parsed.negated
    )


def resource_name(name: object) -> str | None:
    """The resource the device plugin advertises for `name`: ``nvidia.com/gpu``, ``nvidia.com/mig-<profile>``, or
    a short form of either (``gpu``, ``mig-1g.10gb``, ``1g.10gb``); None when it is neither."""
    if not isinstance(name, str):
        return None
    short = _without_prefix(name.strip(), "nvidia.com/")
    if short == "gpu":
        return WHOLE_GPU_RESOURCE
    profile = _without_prefix(short, "mig-")
    return mig_resource(profile) if is_device_profile(profile) else None


def _without_prefix(text: str, prefix: str) -> str:
    # str.removeprefix is Python 3.9+; module_utils also runs on the nodes' Python.
    return text[len(prefix) :] if text.startswith(prefix) else text


def parse_sharing(value: Any, where: str) -> tuple[dict[str, int], list[str]]:
    """A pool's ``sharing`` ({resource: replicas}, short resource names allowed) as resource -> replicas, with
    every problem found (messages start with `where`); replicas are whole numbers from 1 (exclusive) to 64."""
    if value is None:
        return {}, []
    if not isinstance(value, Mapping):
        return {}, [
            f"{where}: sharing must map a resource to its time-slicing replicas "
            f"(for example {{nvidia.com/mig-1g.10gb: 4}}), not {value!r}"
        ]
    sharing: dict[str, int] = {}
    errors: list[str] = []
    for name, replicas in value.items():
        resource = resource_name(name)
        if resource is None:
            errors.append(f"{where}: sharing names {name}, which is not {RESOURCE_FORMS}")
        elif isinstance(replicas, bool) or not isinstance(replicas, int) or not 1 <= replicas <= MAX_REPLICAS:
            errors.append(
                f"{where}: sharing of {resource} must be a whole number of replicas from 1 (exclusive) "
                f"to {MAX_REPLICAS}, not {replicas!r}"
            )
        elif resource in sharing:
            errors.append(f"{where}: sharing names {resource} twice")
        else:
            sharing[resource] = replicas
    return sharing, errors
