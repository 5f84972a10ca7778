"""The settings contract (extender/src/gpufleet_extender/settings_contract.json) against everything else that names a
decision setting: the extender's Settings and Policy (which read it), the gpu_extender role's defaults, argument
specs and ConfigMap template, the kube_scheduler role's GPUScore args and their fallbacks, and the extender's
README table. GPUScore's args (k8s/gpuscore/args_*.go) are checked against it by `go test ./gpuscore/`.

Each check runs over a repository tree, so the mutation tests below change one place in a copy and see it fail.
"""

from __future__ import annotations

import ast
import enum
import json
import re
import shutil
import types
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml
from gpufleet_extender import settings_contract
from gpufleet_extender.config import LAB_ONLY_CHOICES, Settings
from gpufleet_extender.plugin_args import ARG_NAMES
from gpufleet_extender.scoring import Policy
from gpufleet_extender.settings_contract import Setting

REPO = Path(__file__).resolve().parents[2]
CONTRACT = settings_contract.SETTINGS
# The files the checks read, relative to the repository root.
FILES = (
    "roles/gpu_extender/defaults/main.yml",
    "roles/gpu_extender/meta/argument_specs.yml",
    "roles/gpu_extender/templates/config.yaml.j2",
    "roles/kube_scheduler/defaults/main.yml",
    "extender/README.md",
)
ARGSPEC_TYPES = {
    "float": "float",
    "string": "str",
    "path": "path",
    "choice": "str",
    "bool": "bool",
    "strings": "list",
    "replicas": "dict",
}


def _same(a: Any, b: Any) -> bool:
    """Equal values; a number equals the same number of the other kind (60 and 60.0), never a bool."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return bool(a == b)


def _is_template(value: Any) -> bool:
    return isinstance(value, str) and "{{" in value


def _literal(text: str) -> tuple[bool, Any]:
    """A Jinja literal's value (true/false/none as Jinja writes them), or (False, None) when it is an expression."""
    python = re.sub(r"\btrue\b", "True", re.sub(r"\bfalse\b", "False", re.sub(r"\bnone\b", "None", text.strip())))
    try:
        return True, ast.literal_eval(python)
    except (ValueError, SyntaxError):
        return False, None


def _first_argument(text: str, start: int) -> str:
    """The text of the first argument of the call whose '(' is at ``start - 1``."""
    depth = 0
    for i in range(start, len(text)):
        char = text[i]
        if char in "([{":
            depth += 1
        elif char in ")]}":
            if depth == 0:
                return text[start:i]
            depth -= 1
        elif char == "," and depth == 0:
            return text[start:i]
    return text[start:]


def _fallbacks(expression: Any, defaults: dict[str, Any], seen: frozenset[str] = frozenset()) -> list[Any]:
    """The literal values an expression of the kube_scheduler role's defaults falls back to: a plain value, each
    literal first argument of default(...), the literal of a leading `X if ...`, and those of the role's own
    variables it reads."""
    if not isinstance(expression, str):
        return [expression]
    if "{{" not in expression:
        return [expression]
    found = []
    for match in re.finditer(r"\bdefault\(", expression):
        ok, value = _literal(_first_argument(expression, match.end()))
        if ok and value is not None:  # default(none): a test for "unset", not a fallback
            found.append(value)
    leading = re.match(r"\s*\{\{\s*(\S+)\s+if\b", expression)
    if leading:
        ok, value = _literal(leading.group(1))
        if ok:
            found.append(value)
    for name in re.findall(r"\b(kube_scheduler_\w+)", expression):
        if name in defaults and name not in seen:
            found += _fallbacks(defaults[name], defaults, seen | {name})
    return found


def _readme_cells(text: str) -> dict[str, str]:
    """Setting name -> its default cell in the README's settings table."""
    cells = {}
    for line in text.splitlines():
        parts = [part.strip() for part in line.split("|")]
        if len(parts) < 4 or not parts[1].startswith("`"):
            continue
        for name in re.findall(r"`([A-Z][A-Z0-9_]+)`", parts[1]):
            cells[name] = parts[2]
    return cells


def _readme_says(setting: Setting, cell: str) -> bool:
    if not cell.startswith("`"):
        return setting.default in ("", None)  # unset, empty (any)
    value = cell.strip("`")
    if setting.type == "float":
        return _same(float(value), setting.default)
    if setting.type == "bool":
        return value == str(setting.default).lower()
    if setting.type == "strings":
        return value == ",".join(setting.default)
    if setting.type == "replicas":
        return bool(json.loads(value) == setting.default)
    return bool(value == setting.default)


def contract_mismatches(root: Path, contract: dict[str, Setting]) -> list[str]:
    """Every place under ``root`` that says otherwise than ``contract``."""
    problems = []
    extender_defaults = yaml.safe_load((root / FILES[0]).read_text(encoding="utf-8"))
    specs = yaml.safe_load((root / FILES[1]).read_text(encoding="utf-8"))["argument_specs"]["main"]["options"]
    template = (root / FILES[2]).read_text(encoding="utf-8")
    scheduler_defaults = yaml.safe_load((root / FILES[3]).read_text(encoding="utf-8"))
    readme = _readme_cells((root / FILES[4]).read_text(encoding="utf-8"))
    plugin_args = scheduler_defaults["kube_scheduler_plugin_args"]
    for setting in contract.values():
        var = setting.role_var
        if var is not None:
            value = extender_defaults.get(var, "<missing>")
            if setting.has_role_default:
                if value != setting.role_default:
                    problems.append(
                        f"{FILES[0]}: {var} is {value!r}, the contract's role default {setting.role_default!r}"
                    )
            elif value is not None and not _same(value, setting.default):
                problems.append(f"{FILES[0]}: {var} is {value!r}, not null or the contract's {setting.default!r}")
            spec = specs.get(var)
            if spec is None:
                problems.append(f"{FILES[1]}: no option {var}")
            else:
                if spec.get("type") != ARGSPEC_TYPES[setting.type]:
                    problems.append(f"{FILES[1]}: {var} has type {spec.get('type')}, the contract's {setting.type}")
                if setting.type == "choice" and sorted(spec.get("choices", [])) != sorted(setting.choices):
                    problems.append(
                        f"{FILES[1]}: {var} choices {spec.get('choices')}, the contract's {setting.choices}"
                    )
            if not re.search(rf"'{setting.name}': {var}\b", template):
                problems.append(f"{FILES[2]}: {setting.name} is not rendered from {var}")
        if setting.scheduler_arg:
            if setting.arg not in plugin_args:
                problems.append(f"{FILES[3]}: kube_scheduler_plugin_args has no {setting.arg}")
            elif not _is_template(setting.deployed_default):
                for fallback in _fallbacks(plugin_args[setting.arg], scheduler_defaults):
                    if not _same(fallback, setting.deployed_default):
                        problems.append(
                            f"{FILES[3]}: {setting.arg} falls back to {fallback!r}, the contract's "
                            f"{setting.deployed_default!r}"
                        )
        cell = readme.get(setting.name)
        if cell is None:
            problems.append(f"{FILES[4]}: no row for {setting.name}")
        elif not _readme_says(setting, cell):
            problems.append(f"{FILES[4]}: {setting.name} default {cell}, the contract's {setting.default!r}")
    declared = {s.arg for s in contract.values() if s.scheduler_arg}
    problems += [f"{FILES[3]}: {arg} is not in the settings contract" for arg in sorted(set(plugin_args) - declared)]
    return problems


def test_the_repository_follows_the_settings_contract():
    assert contract_mismatches(REPO, CONTRACT) == []


def test_the_extender_reads_the_contract():
    settings, policy = Settings(), Policy()
    assert {s.name: s.arg for s in CONTRACT.values()} == ARG_NAMES
    python_types = {"float": float, "string": str, "path": Path | None, "bool": bool, "replicas": dict}
    for setting in CONTRACT.values():
        field = Settings.model_fields[setting.name]
        value = getattr(settings, setting.name)
        if setting.type == "choice":
            assert issubclass(field.annotation, enum.Enum), setting.name
            # The contract's choices, then those the extender alone takes for the lab (METRICS_SOURCE=file), named
            # one by one in config.LAB_ONLY_CHOICES.
            extra = list(LAB_ONLY_CHOICES.get(setting.name, ()))
            assert [m.value for m in field.annotation] == list(setting.choices) + extra, setting.name
            assert value == setting.default, setting.name
        elif setting.type == "strings":
            assert field.annotation == tuple[str, ...] and list(value) == setting.default, setting.name
        else:
            annotation = field.annotation
            if isinstance(annotation, types.GenericAlias):
                annotation = typing.get_origin(annotation)
            assert annotation == python_types[setting.type], setting.name
            assert _same(value, setting.default), setting.name
    assert policy == Policy.from_settings(settings)
    assert (policy.gpu_util_threshold, policy.pack_target_util) == (
        CONTRACT["GPU_UTIL_THRESHOLD"].default,
        CONTRACT["PACK_TARGET_UTIL"].default,
    )


def test_the_lab_only_choices_are_few_and_named():
    # The one value beyond the contract: the lab's exposition file, which GPUScore does not read.
    assert LAB_ONLY_CHOICES == {"METRICS_SOURCE": ("file",)}
    assert not set(LAB_ONLY_CHOICES["METRICS_SOURCE"]) & set(CONTRACT["METRICS_SOURCE"].choices)


def test_the_extender_refuses_what_the_contract_refuses():
    # The bounds Settings enforce are the contract's: each end and the next number past it.
    from gpufleet_extender.config import SettingsError, check_settings

    partner = {"WEIGHT_GPU_UTIL": "WEIGHT_MEM_UTIL", "WEIGHT_MEM_UTIL": "WEIGHT_GPU_UTIL"}  # the two add up to 1

    def refused(name: str, value: float) -> bool:
        values = {name: repr(value)}
        if name in partner:
            values[partner[name]] = repr(1.0 - value)
        try:
            check_settings(values)
        except SettingsError as exc:
            return name in str(exc).replace(partner.get(name, "-"), "")
        return False

    for setting in CONTRACT.values():
        if setting.type != "float":
            continue
        for end, is_open, outward in ((setting.min, setting.min_open, -1), (setting.max, setting.max_open, 1)):
            if end is None:
                continue
            assert refused(setting.name, end) == is_open, (setting.name, end)
            past = end + outward * max(abs(end), 1) * 1e-9
            assert refused(setting.name, past), (setting.name, past)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the files the check reads."""
    for relative in FILES:
        target = tmp_path / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / relative, target)
    return tmp_path


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert text.count(old) == 1, old
    path.write_text(text.replace(old, new), encoding="utf-8")


@pytest.mark.parametrize(
    ("where", "old", "new", "expected"),
    [
        (
            FILES[3],
            "gpu_extender_gpu_util_threshold | default(0.8, true)",
            "gpu_extender_gpu_util_threshold | default(0.75, true)",
            "gpuUtilThreshold falls back to 0.75, the contract's 0.8",
        ),
        (
            FILES[3],
            "gpu_extender_metrics_max_age_seconds | default(60)",
            "gpu_extender_metrics_max_age_seconds | default(30)",
            "metricsMaxAgeSeconds falls back to 30, the contract's 60",
        ),
        (FILES[0], "gpu_extender_pack_target_util: null", "gpu_extender_pack_target_util: 0.5", "is 0.5, not null"),
        (
            FILES[0],
            "gpu_extender_metrics_max_age_seconds: 60",
            "gpu_extender_metrics_max_age_seconds: 45",
            "gpu_extender_metrics_max_age_seconds is 45, the contract's role default 60",
        ),
        (FILES[1], "choices: [spread, pack, auto]", "choices: [spread, pack]", "gpu_extender_scoring_strategy choices"),
        (FILES[2], "'AUTO_PACK_BELOW': gpu_extender_auto_pack_below", "'AUTO_PACK_BELOW': 0.3", "AUTO_PACK_BELOW is"),
        (FILES[4], "| `MEM_UTIL_THRESHOLD` | `0.9` |", "| `MEM_UTIL_THRESHOLD` | `0.95` |", "MEM_UTIL_THRESHOLD def"),
    ],
)
def test_a_change_in_one_place_only_fails_the_check(tree, where, old, new, expected):
    _edit(tree / where, old, new)
    problems = contract_mismatches(tree, CONTRACT)
    assert len(problems) == 1 and expected in problems[0], problems


def test_a_default_changed_in_the_contract_only_fails_the_check(tmp_path):
    contract_file = tmp_path / "settings_contract.json"
    shutil.copy(settings_contract.CONTRACT_FILE, contract_file)
    _edit(
        contract_file,
        '"GPU_UTIL_THRESHOLD": {"arg": "gpuUtilThreshold", "type": "float", "default": 0.8,',
        '"GPU_UTIL_THRESHOLD": {"arg": "gpuUtilThreshold", "type": "float", "default": 0.85,',
    )
    problems = contract_mismatches(REPO, settings_contract.load(contract_file))
    assert problems == [
        f"{FILES[3]}: gpuUtilThreshold falls back to 0.8, the contract's 0.85",
        f"{FILES[4]}: GPU_UTIL_THRESHOLD default `0.8`, the contract's 0.85",
    ]


def test_a_contract_that_contradicts_itself_is_refused(tmp_path):
    contract_file = tmp_path / "settings_contract.json"
    shutil.copy(settings_contract.CONTRACT_FILE, contract_file)
    _edit(contract_file, '"default": 0.6, "min": 0,', '"default": 1.6, "min": 0,')
    with pytest.raises(settings_contract.ContractError, match=r"PACK_TARGET_UTIL: default 1\.6 is not a number in its"):
        settings_contract.load(contract_file)
