"""The GPUScore kube-scheduler plugin's args, checked by the extender's own rules: ``gpufleet-extender check-config
--plugin-args`` (how the kube_scheduler role checks the pluginConfig it is about to deploy).

The plugin (k8s/gpuscore/args_*.go) takes the extender's settings under camelCase names (``ARG_NAMES``), decoded
strictly from JSON. Here the args are first checked for JSON types as the plugin decodes them (an unknown name or a
wrong type is one problem each, and that argument keeps its default), then validated by ``config.Settings``: the
ranges, choices and rules between settings are the extender's, written once there. The problems come out in the
plugin's words, argument names and Go's number and string formats, so a refused config fails the play with the
message the plugin would log; the conformance vectors compare the two lists of messages.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Any

from annotated_types import Ge, Gt, Le, Lt
from pydantic import ValidationError

from gpufleet_extender.config import (
    LAB_ONLY_CHOICES,
    MAX_REPLICAS,
    MappingOnlySettings,
    Settings,
    go_number,
    go_quote,
    rule_problems,
    valid_rule_fields,
)
from gpufleet_extender.settings_contract import REMOVED
from gpufleet_extender.settings_contract import SETTINGS as CONTRACT

# Extender setting -> plugin argument, as the settings contract names them.
ARG_NAMES = {setting.name: setting.arg for setting in CONTRACT.values()}
SETTING_NAMES = {arg: setting for setting, arg in ARG_NAMES.items()}
# Arguments the plugin took once -> the line a config that still sets one gets (the contract's "removed").
REMOVED_ARGS = dict(REMOVED.values())
# File settings that are unset in the plugin when empty (Go's zero value), where Settings would read "" as the path ".".
UNSET_WHEN_EMPTY = frozenset(setting.name for setting in CONTRACT.values() if setting.type == "path")

# The JSON type each argument decodes from in Go (the Args struct's field types), and how a problem says it.
_NUMBER, _STRING, _BOOL, _STRINGS, _REPLICAS = (
    "a number",
    "a string",
    "true or false",
    "a list of strings",
    "a mapping of resource name to whole replicas",
)
_KIND_OF_TYPE = {
    "float": _NUMBER,
    "string": _STRING,
    "path": _STRING,
    "choice": _STRING,
    "bool": _BOOL,
    "strings": _STRINGS,
    "replicas": _REPLICAS,
}
_KINDS = {setting.name: _KIND_OF_TYPE[setting.type] for setting in CONTRACT.values()}


def _is_whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _has_kind(value: Any, kind: str) -> bool:
    if kind == _NUMBER:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == _STRING:
        return isinstance(value, str)
    if kind == _BOOL:
        return isinstance(value, bool)
    if kind == _STRINGS:
        return isinstance(value, list) and all(isinstance(item, str) for item in value)
    return isinstance(value, Mapping) and all(isinstance(k, str) and _is_whole(v) for k, v in value.items())


def _decoded(args: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Settings values from args, as Go's JSON decoding reads them: a null list or mapping is empty, a null number
    or string keeps the default, an unknown name or a wrong type is a problem (and the default stays); an empty file
    name is no file, as in Go."""
    values: dict[str, Any] = {}
    problems: list[str] = []
    for arg in sorted(args):
        setting = SETTING_NAMES.get(arg)
        if arg in REMOVED_ARGS:
            problems.append(f"{arg}: {REMOVED_ARGS[arg]}")
            continue
        if setting is None:
            problems.append(f"{arg}: unknown argument")
            continue
        value, kind = args[arg], _KINDS.get(setting, _NUMBER)
        if value is None:
            if kind in (_STRINGS, _REPLICAS):
                values[setting] = [] if kind == _STRINGS else {}
        elif not _has_kind(value, kind):
            problems.append(f"{arg}: must be {kind}")
        elif value == "" and setting in UNSET_WHEN_EMPTY:
            continue
        elif value in LAB_ONLY_CHOICES.get(setting, ()):
            problems.append(f"{arg}: must be {_choices(setting)} (got {go_quote(value)})")
        else:
            values[setting] = value
    return values, problems


def _interval(setting: str) -> str:
    """The range a number setting takes, as the plugin writes it: (0, 1], [0, +Inf]."""
    low, high, left, right = "-Inf", "+Inf", "[", "]"
    for bound in Settings.model_fields[setting].metadata:
        if isinstance(bound, Gt):
            low, left = _bound(bound.gt), "("
        elif isinstance(bound, Ge):
            low, left = _bound(bound.ge), "["
        elif isinstance(bound, Lt):
            high, right = _bound(bound.lt), ")"
        elif isinstance(bound, Le):
            high, right = _bound(bound.le), "]"
    return f"{left}{low}, {high}{right}"


def _bound(value: Any) -> str:
    return go_number(float(value))


def _choices(setting: str) -> str:
    annotation = Settings.model_fields[setting].annotation
    assert isinstance(annotation, type) and issubclass(annotation, Enum)
    lab_only = LAB_ONLY_CHOICES.get(setting, ())  # the extender's alone (METRICS_SOURCE=file): not the plugin's
    values = [str(member.value) for member in annotation if member.value not in lab_only]
    return ", ".join(values[:-1]) + " or " + values[-1]


_RANGE_ERRORS = {"greater_than", "greater_than_equal", "less_than", "less_than_equal"}


def _field_problem(error: Any) -> str:
    """One Settings field error in the plugin's words."""
    setting, *rest = error["loc"]
    arg = ARG_NAMES[str(setting)]
    if rest:  # a sharedResources entry: its replicas
        return f"{arg}: {rest[0]}: {error['input']} replicas is not in [1, {MAX_REPLICAS}]"
    if error["type"] in _RANGE_ERRORS:
        return f"{arg}: {go_number(float(error['input']))} is not in {_interval(str(setting))}"
    if error["type"] == "enum":
        return f"{arg}: must be {_choices(str(setting))} (got {go_quote(str(error['input']))})"
    return f"{arg}: {str(error['msg']).removeprefix('Value error, ')}"


def check_plugin_args(args: Any) -> list[str]:
    """Every problem the GPUScore plugin would refuse ``args`` for (its pluginConfig args as JSON data), in its
    words; an empty list when the plugin takes them."""
    if args is None:
        args = {}
    if not isinstance(args, Mapping):
        return [f"args must be a mapping of argument name to value, not {type(args).__name__}"]
    values, problems = _decoded(args)
    try:
        rule_values: Mapping[str, Any] = MappingOnlySettings(**values).model_dump()
    except ValidationError as exc:
        field_errors = [e for e in exc.errors() if e["loc"]]  # loc (): a rule, said below with argument names
        problems += [_field_problem(e) for e in field_errors]
        rule_values = valid_rule_fields(values, {str(e["loc"][0]) for e in field_errors})
    return problems + rule_problems(rule_values, lambda setting: ARG_NAMES.get(setting, setting))
