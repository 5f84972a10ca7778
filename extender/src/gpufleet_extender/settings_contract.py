"""The decision settings, declared once in ``settings_contract.json``: what the extender and GPUScore decide with.

The file also names the extended resources the decision reads (``WHOLE_GPU_RESOURCE``, ``MIG_RESOURCE_PREFIX``).
Each setting has its name (the extender's environment and config key), GPUScore's arg name, a type, a default, a
range or choices, and the gpu_extender role's variable. ``config.Settings`` takes its fields' defaults and bounds
from here, ``scoring.Policy`` its defaults, ``plugin_args`` the arg names and JSON types; the Go plugin's args test
(``k8s/gpuscore``) and the repository's settings contract test check GPUScore's defaults and validation, the roles'
defaults, argument specs and templates against the same file, so a default changed in one place only fails the
suite. Pure data: reading it has no other effect.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field
from pydantic.fields import FieldInfo

CONTRACT_FILE = Path(__file__).with_name("settings_contract.json")

TYPES = frozenset({"float", "string", "path", "bool", "choice", "strings", "replicas"})


@dataclass(frozen=True, slots=True)
class Setting:
    """One decision setting as the contract declares it."""

    name: str
    arg: str
    type: str
    default: Any
    min: float | None = None
    min_open: bool = False
    max: float | None = None
    max_open: bool = False
    choices: tuple[str, ...] = ()
    role_var: str | None = None
    role_default: Any = None
    has_role_default: bool = False
    scheduler_arg: bool = True
    doc: str = ""

    def bounds(self) -> FieldInfo:
        """The pydantic constraints of the range (a Field to put in ``Annotated``)."""
        low, high = self.min, self.max
        info: FieldInfo = Field(
            gt=low if self.min_open else None,
            ge=None if self.min_open else low,
            lt=high if self.max_open else None,
            le=None if self.max_open else high,
        )
        return info

    def accepts(self, value: float) -> bool:
        """Whether a number is in the range."""
        if math.isnan(value):
            return False
        if self.min is not None and (value <= self.min if self.min_open else value < self.min):
            return False
        return not (self.max is not None and (value >= self.max if self.max_open else value > self.max))

    @property
    def deployed_default(self) -> Any:
        """What the roles deploy when the inventory says nothing: the role's own default where the contract gives
        one, else the default."""
        return self.role_default if self.has_role_default else self.default


class ContractError(ValueError):
    """The contract file is not a valid contract; the message names the setting and the problem."""


def _setting(name: str, entry: Mapping[str, Any]) -> Setting:
    known = {"arg", "type", "default", "min", "minOpen", "max", "maxOpen", "choices", "roleVar", "roleDefault"}
    unknown = set(entry) - known - {"roleWhy", "schedulerArg", "doc"}
    if unknown:
        raise ContractError(f"{name}: unknown keys {sorted(unknown)}")
    if entry.get("type") not in TYPES:
        raise ContractError(f"{name}: type must be one of {sorted(TYPES)} (got {entry.get('type')!r})")
    if "roleDefault" in entry and not entry.get("roleWhy"):
        raise ContractError(f"{name}: a roleDefault needs its roleWhy")
    setting = Setting(
        name=name,
        arg=str(entry["arg"]),
        type=entry["type"],
        default=entry["default"],
        min=entry.get("min"),
        min_open=bool(entry.get("minOpen", False)),
        max=entry.get("max"),
        max_open=bool(entry.get("maxOpen", False)),
        choices=tuple(entry.get("choices", ())),
        role_var=entry.get("roleVar"),
        role_default=entry.get("roleDefault"),
        has_role_default="roleDefault" in entry,
        scheduler_arg=bool(entry.get("schedulerArg", True)),
        doc=str(entry.get("doc", "")),
    )
    if setting.type == "float" and not (isinstance(setting.default, int | float) and setting.accepts(setting.default)):
        raise ContractError(f"{name}: default {setting.default!r} is not a number in its range")
    if setting.type == "choice" and setting.default not in setting.choices:
        raise ContractError(f"{name}: default {setting.default!r} is not one of {list(setting.choices)}")
    return setting


def load(path: Path = CONTRACT_FILE) -> dict[str, Setting]:
    """The contract's settings by name, in the file's order."""
    data = _read(path)
    settings = {name: _setting(name, entry) for name, entry in data["settings"].items()}
    args = [s.arg for s in settings.values()]
    if len(set(args)) != len(args):
        raise ContractError("two settings share an arg name")
    return settings


def _read(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def load_resources(path: Path = CONTRACT_FILE) -> tuple[str, str]:
    """The extended resource names: a whole GPU's, and the prefix of a MIG instance's (then the profile)."""
    resources = _read(path)["resources"]
    return str(resources["wholeGPU"]), str(resources["migPrefix"])


def load_receivers_max_series(path: Path = CONTRACT_FILE) -> int:
    """The series a remote-write receiver holds at most (new series beyond it are not kept, and counted)."""
    return int(_read(path)["receivers"]["maxSeries"])


def load_removed(path: Path = CONTRACT_FILE) -> dict[str, tuple[str, str]]:
    """Settings the extender and GPUScore took once, by name: (GPUScore's arg, the line a config that still sets
    one gets, whatever its value)."""
    return {name: (str(entry["arg"]), str(entry["why"])) for name, entry in _read(path).get("removed", {}).items()}


SETTINGS = load()
WHOLE_GPU_RESOURCE, MIG_RESOURCE_PREFIX = load_resources()
REMOVED = load_removed()
RECEIVER_MAX_SERIES = load_receivers_max_series()


def default(name: str) -> Any:
    """The contract's default of ``name`` (a fresh copy for lists and mappings)."""
    value = SETTINGS[name].default
    return type(value)(value) if isinstance(value, list | dict) else value


def bounds(name: str) -> FieldInfo:
    return SETTINGS[name].bounds()
