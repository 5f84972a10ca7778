"""settings_contract.py, the reader of the one settings contract: every field read as written, every malformed
contract refused naming the setting, ranges open and closed at each end (the repository-wide agreement of the
contract with Go, the roles and the docs: tests/unit/test_settings_contract.py)."""

from __future__ import annotations

import json
import math

import pytest
from annotated_types import Ge, Gt, Le, Lt

from gpufleet_extender import settings_contract
from gpufleet_extender.settings_contract import (
    CONTRACT_FILE,
    ContractError,
    Setting,
    bounds,
    default,
    load,
    load_resources,
)

THRESHOLD = {"arg": "threshold", "type": "float", "default": 0.8, "min": 0, "minOpen": True, "max": 1, "doc": "t"}


def contract(tmp_path, settings: dict, resources: dict | None = None):
    path = tmp_path / "contract.json"
    body = {"settings": settings, "resources": resources or {"wholeGPU": "example.com/gpu", "migPrefix": "ex/mig-"}}
    path.write_text(json.dumps(body))
    return path


def test_every_field_is_read_as_written(tmp_path):
    settings = load(
        contract(
            tmp_path,
            {
                "THRESHOLD": THRESHOLD,
                "MODE": {"arg": "mode", "type": "choice", "default": "b", "choices": ["a", "b"], "roleVar": "x_mode",
                         "roleDefault": "a", "roleWhy": "why", "schedulerArg": False},
                "LABELS": {"arg": "labels", "type": "strings", "default": ["h"], "maxOpen": True, "max": 3},
            },
        )
    )  # fmt: skip
    assert list(settings) == ["THRESHOLD", "MODE", "LABELS"]  # the file's order
    assert settings["THRESHOLD"] == Setting(
        name="THRESHOLD", arg="threshold", type="float", default=0.8, min=0, min_open=True, max=1, doc="t"
    )
    mode = settings["MODE"]
    assert (mode.choices, mode.role_var, mode.role_default, mode.has_role_default, mode.scheduler_arg) == (
        ("a", "b"),
        "x_mode",
        "a",
        True,
        False,
    )
    assert mode.deployed_default == "a" and mode.doc == ""
    labels = settings["LABELS"]
    assert (labels.min, labels.min_open, labels.max, labels.max_open, labels.scheduler_arg) == (
        None,
        False,
        3,
        True,
        True,
    )
    assert (labels.role_var, labels.has_role_default, labels.deployed_default) == (None, False, ["h"])


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ({**THRESHOLD, "unit": "s"}, "THRESHOLD: unknown keys ['unit']"),
        ({**THRESHOLD, "type": "int"}, "THRESHOLD: type must be one of ['bool', 'choice', 'float', 'path', "
         "'replicas', 'string', 'strings'] (got 'int')"),
        ({k: v for k, v in THRESHOLD.items() if k != "type"}, "THRESHOLD: type must be one of"),
        ({**THRESHOLD, "roleDefault": 0.5}, "THRESHOLD: a roleDefault needs its roleWhy"),
        ({**THRESHOLD, "roleDefault": 0.5, "roleWhy": ""}, "THRESHOLD: a roleDefault needs its roleWhy"),
        ({**THRESHOLD, "default": 0}, "THRESHOLD: default 0 is not a number in its range"),
        ({**THRESHOLD, "default": "0.8"}, "THRESHOLD: default '0.8' is not a number in its range"),
        ({**THRESHOLD, "default": 1.5}, "THRESHOLD: default 1.5 is not a number in its range"),
        ({"arg": "m", "type": "choice", "default": "c", "choices": ["a", "b"]},
         "THRESHOLD: default 'c' is not one of ['a', 'b']"),
    ],
)  # fmt: skip
def test_a_malformed_setting_is_refused_naming_it(tmp_path, entry, says):
    with pytest.raises(ContractError) as refused:
        load(contract(tmp_path, {"THRESHOLD": entry}))
    assert str(refused.value).startswith(says), str(refused.value)


def test_known_extra_keys_are_taken_and_a_role_default_with_its_reason_is_read(tmp_path):
    entry = {**THRESHOLD, "roleDefault": 0.5, "roleWhy": "the fleet's", "schedulerArg": True, "doc": "d"}
    setting = load(contract(tmp_path, {"THRESHOLD": entry}))["THRESHOLD"]
    assert (setting.deployed_default, setting.default, setting.doc) == (0.5, 0.8, "d")


def test_two_settings_of_one_arg_name_are_refused(tmp_path):
    with pytest.raises(ContractError, match=r"^two settings share an arg name$"):
        load(contract(tmp_path, {"A": THRESHOLD, "B": THRESHOLD}))


@pytest.mark.parametrize(
    ("min_open", "max_open", "inside", "outside"),
    [
        (False, False, [0, 0.5, 1], [-0.01, 1.01, math.nan]),
        (True, False, [0.01, 1], [0, -1, 1.01]),
        (False, True, [0, 0.99], [1, -0.01]),
        (True, True, [0.5], [0, 1]),
    ],
)
def test_a_range_is_open_or_closed_at_each_end(min_open, max_open, inside, outside):
    setting = Setting("X", "x", "float", 0.5, min=0, min_open=min_open, max=1, max_open=max_open)
    assert all(setting.accepts(value) for value in inside)
    assert not any(setting.accepts(value) for value in outside)
    metadata = setting.bounds().metadata
    assert (Gt(0) if min_open else Ge(0)) in metadata and (Lt(1) if max_open else Le(1)) in metadata
    assert len(metadata) == 2


def test_an_unbounded_range_accepts_every_number_but_nan():
    setting = Setting("X", "x", "float", 0.0)
    assert setting.accepts(-1e308) and setting.accepts(1e308) and not setting.accepts(math.nan)
    assert setting.bounds().metadata == []
    low_only = Setting("X", "x", "float", 0.0, min=0)
    assert low_only.accepts(1e308) and not low_only.accepts(-1)


def test_the_resources_are_read_from_the_contract(tmp_path):
    assert load_resources(contract(tmp_path, {"T": THRESHOLD})) == ("example.com/gpu", "ex/mig-")
    assert load_resources() == ("nvidia.com/gpu", "nvidia.com/mig-")
    assert load_resources() == (settings_contract.WHOLE_GPU_RESOURCE, settings_contract.MIG_RESOURCE_PREFIX)


def test_the_shipped_contract_is_the_one_loaded_and_defaults_are_fresh_copies():
    assert CONTRACT_FILE.name == "settings_contract.json" and CONTRACT_FILE.exists()
    assert load() == settings_contract.SETTINGS
    labels = default("NODE_NAME_LABELS")
    assert labels == settings_contract.SETTINGS["NODE_NAME_LABELS"].default
    labels.append("changed")
    assert default("NODE_NAME_LABELS") != labels  # the contract's own list is untouched
    assert default("GPU_UTIL_THRESHOLD") == settings_contract.SETTINGS["GPU_UTIL_THRESHOLD"].default
    assert bounds("GPU_UTIL_THRESHOLD").metadata == settings_contract.SETTINGS["GPU_UTIL_THRESHOLD"].bounds().metadata
