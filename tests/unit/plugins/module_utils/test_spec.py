"""spec: go-nvlib's profile-name grammar, mig-parted's device selection (device-filter with subsystem IDs,
GPUs without MIG, missing indexes) and mig-parted's file rules."""

from __future__ import annotations

import pytest
from _helpers import H100, layout, new_sim
from ansible_collections.gpufleet.mig.plugins.module_utils import runner
from ansible_collections.gpufleet.mig.plugins.module_utils.exceptions import SpecError
from ansible_collections.gpufleet.mig.plugins.module_utils.planner import validate_target
from ansible_collections.gpufleet.mig.plugins.module_utils.spec import (
    DeviceId,
    GpuSelectable,
    GpuTarget,
    config_from_mig_parted,
    parse_config,
    parse_profile_name,
    targets_for_gpus,
)

H100_ID, H100_SUBSYSTEM, H200_ID = 0x233010DE, 0x16C110DE, 0x233510DE


# --- profile names: go-nvlib pkg/nvlib/device/mig_profile.go ---------------------------------------------------


@pytest.mark.parametrize(
    ("name", "canonical"),
    [
        ("1g.10gb", "1g.10gb"),
        ("1g.10gb+me", "1g.10gb+me"),
        ("1g.24gb+me.all", "1g.24gb+me.all"),
        ("2g.48gb-me", "2g.48gb-me"),
        ("1g.24gb+gfx", "1g.24gb+gfx"),
        ("1g.24gb+me,gfx", "1g.24gb+gfx,me"),  # attribute order does not matter
        ("3c.3g.40gb", "3g.40gb"),  # C = G is the plain form
        ("1c.3g.40gb", "1c.3g.40gb"),
        ("01g.010gb", "1g.10gb"),  # strconv.Atoi reads leading zeros
        ("7g.141gb", "7g.141gb"),
    ],
)
def test_profile_names_go_nvlib_accepts(name, canonical):
    assert parse_profile_name(name).canonical == canonical


@pytest.mark.parametrize(
    "name",
    [
        "",
        "1g",
        "1g.10",
        "g.10gb",
        "1g.10gb+",
        "1g.10gb+me+gfx",
        "1g.10gb+me-gfx",  # '+' and '-' together
        "1g.10gb+me,me",
        "1g.10gb+1me",
        "1g.10gb+.me",
        "1g.10gb+me.",
        "1g.10gb+m_e",
        " 1g.10gb",
        "1x.1g.10gb",
        "1c.1g.10gb.5",
        "²g.10gb",
        "1g.10gb+mé",
        "9" * 5000 + "g.10gb",
    ],
)
def test_profile_names_go_nvlib_refuses(name):
    with pytest.raises(ValueError):
        parse_profile_name(name)
    with pytest.raises(SpecError, match=r"^config\[0\]: .* is not a MIG profile name"):
        parse_config(layout({name: 1}))


def test_spellings_of_one_profile_are_one_profile():
    assert parse_config(layout({"3c.3g.40gb": 2}))[0].mig_devices == {"3g.40gb": 2}
    with pytest.raises(SpecError, match="listed twice"):
        parse_config(layout({"3c.3g.40gb": 1, "3g.40gb": 1}))


def test_names_of_other_models_are_refused_only_when_they_select_the_gpu():
    with pytest.raises(SpecError, match=r"unknown MIG profile\(s\) 1g.24gb-me for this GPU; valid profiles"):
        validate_target({"1g.24gb-me": 4}, H100, "GPU 0")
    with pytest.raises(SpecError, match=r"1c\.3g\.40gb: compute-instance profiles smaller than their GPU instance"):
        validate_target({"1c.3g.40gb": 2}, H100, "GPU 0")


# --- device selection: mig-parted api/spec/v1/helpers.go, pkg/types/device.go --------------------------------


def gpus(*pairs, capable=True):
    return [GpuSelectable(i, device, subsystem, capable) for i, (device, subsystem) in enumerate(pairs)]


@pytest.mark.parametrize(
    ("device_filter", "selected"),
    [
        ("0x233010DE", [0, 1]),
        ("0x233010de", [0, 1]),
        ("0x233010DE:0x16C110DE", [0]),
        ("0x233010DE:0x16C210DE", []),
        (["0x233510DE", "0x233010DE:0x16C110DE"], [0, 2]),
        ("0x233510DE", [2]),
        (0x233010DE, [0, 1]),
    ],
)
def test_device_filter_with_and_without_subsystem(device_filter, selected):
    host = gpus((H100_ID, H100_SUBSYSTEM), (H100_ID, 0x17A610DE), (H200_ID, None))
    entries = parse_config([{"devices": "all", "mig_enabled": False, "device_filter": device_filter}])
    assert sorted(targets_for_gpus(entries, host)) == selected


@pytest.mark.parametrize("bad", ["0x233010DE:", ":0x16C110DE", "0x233010DE:0x1:0x2", "0x1233010DE", "GPU", -1, True])
def test_device_filter_refuses_what_is_not_a_pci_id(bad):
    with pytest.raises(SpecError, match=r"config\[0\]: device_filter entries must be PCI IDs"):
        parse_config([{"devices": "all", "mig_enabled": False, "device_filter": [bad]}])
    assert DeviceId(1, 2).matches(1, 2) and not DeviceId(1, 2).matches(1, None)


def test_gpus_without_mig_are_skipped_where_mig_parted_skips_them():
    host = [GpuSelectable(0, H100_ID), GpuSelectable(1, 0x27B810DE, mig_capable=False)]
    on_all = parse_config(layout({"3g.40gb": 2}))
    assert sorted(targets_for_gpus(on_all, host)) == [0]
    off_by_index = parse_config([{"devices": [0, 1], "mig_enabled": False}])
    assert sorted(targets_for_gpus(off_by_index, host)) == [0]
    on_by_index = parse_config(layout({"3g.40gb": 2}, devices=[1]))
    with pytest.raises(SpecError, match=r"config\[0\]: GPU 1 cannot do MIG"):
        targets_for_gpus(on_by_index, host)


def test_missing_indexes_fail_by_default_and_are_skipped_on_request():
    host = [GpuSelectable(0, H100_ID), GpuSelectable(1, H100_ID)]
    entries = parse_config([{"devices": [1, 5, 7], "mig_enabled": False}])
    with pytest.raises(SpecError, match=r"GPU index\(es\) \[5, 7\] do not exist on this host.*missing_devices=skip"):
        targets_for_gpus(entries, host)
    assert sorted(targets_for_gpus(entries, host, missing_devices="skip")) == [1]


def test_runner_skips_a_non_mig_gpu_under_all_and_misses_indexes_on_request(tmp_path):
    sim = new_sim(tmp_path, gpus=2)
    sim.state["gpus"][1].update(
        name="NVIDIA L4", memory_mib=23034, pci_device_id="0x27B810DE", pci_subsystem_id=None, mig_capable=False
    )
    sim._save()
    result = runner.apply(sim, layout({"3g.40gb": 2}))
    assert [g["index"] for g in result["gpus"]] == [0]
    with pytest.raises(SpecError, match="do not exist"):
        runner.apply(sim, layout({"7g.80gb": 1}, devices=[0, 3]))
    skipped = runner.apply(sim, layout({"7g.80gb": 1}, devices=[0, 3]), missing_devices="skip")
    assert [g["index"] for g in skipped["gpus"]] == [0] and skipped["gpus"][0]["after"] == [
        {"profile": "7g.80gb", "start": 0}
    ]


@pytest.mark.parametrize("value", [10**5000, -(10**5000), 10**7], ids=["huge", "huge-negative", "ten-million"])
def test_huge_integers_are_refused_without_printing_them(value):
    for config in (layout({"1g.10gb": value}), [{"devices": [value], "mig_enabled": False}]):
        with pytest.raises(SpecError, match=r"^config\[0\]: .*must be an integer from 0 to 999999") as failure:
            parse_config(config)
        assert len(failure.value.message) < 200


# --- mig-parted's file rules: api/spec/v1/spec.go, pkg/types/mig_config.go -------------------------------------


def document(*entries, **others) -> dict:
    return {"version": "v1", "mig-configs": {"chosen": list(entries), **others}}


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"devices": "all", "mig-enabled": True}, "missing required field 'mig-devices' when 'mig-enabled' is true"),
        ({"devices": "all", "mig-enabled": False, "mig-devices": {"1g.10gb": 1}}, "MIG devices included when"),
        ({"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 0}}, "all counts of mig-devices are 0"),
        ({"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": -1}}, "invalid count"),
        ({"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb+me-x": 1}}, "invalid MIG profile name"),
        ({"devices": "some", "mig-enabled": False}, "devices must be 'all' or a list of integers"),
        ({"devices": ["0"], "mig-enabled": False}, "devices must be 'all' or a list of integers"),
        ({"devices": "all", "mig-enabled": "true", "mig-devices": {}}, "mig-enabled must be true or false"),
        ({"mig-enabled": False}, "missing required field devices"),
        ({"devices": "all"}, "missing required field mig-enabled"),
        ({"devices": "all", "mig-enabled": False, "mig_devices": {}}, "unexpected field"),
        ({"devices": "all", "mig-enabled": False, "device-filter": 0x233010DE}, "device-filter must be a string"),
    ],
)
def test_mig_parted_file_rules(entry, message):
    with pytest.raises(SpecError, match=message):
        config_from_mig_parted(document(entry), "chosen")


def test_mig_parted_checks_every_config_of_the_file():
    ok = {"devices": "all", "mig-enabled": True, "mig-devices": {}}
    with pytest.raises(SpecError, match=r"'other' entry 0: missing required field 'mig-devices'"):
        config_from_mig_parted(document(ok, other=[{"devices": "all", "mig-enabled": True}]), "chosen")
    assert config_from_mig_parted(document(ok), "chosen") == [
        {"devices": "all", "mig_enabled": True, "mig_devices": {}}
    ]
    with pytest.raises(SpecError, match="'empty' must be a non-empty list"):
        config_from_mig_parted(document(ok, empty=[]), "chosen")
    with pytest.raises(SpecError, match="unexpected field"):
        config_from_mig_parted({**document(ok), "extra": 1}, "chosen")


# --- every refusal, word for word: the message is what the user reads to fix the request ------------------------

FIRST = {"devices": [7], "mig_enabled": False}  # a valid first entry: the messages must name the second one
PCI_HINT = "device_filter entries must be PCI IDs such as '0x233010DE' (device+vendor) or '0x233010DE:0x16C110DE' "


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("x", "each entry must be a mapping, got str"),
        (
            {"devices": "all", "mig_enabled": True, "foo": 1, "bar": 2},
            "unknown key(s) bar, foo; allowed: device_filter, devices, mig_devices, mig_enabled",
        ),
        ({"mig_enabled": True}, "'devices' is required ('all' or a list of GPU indexes)"),
        ({"devices": "all"}, "'mig_enabled' is required (true or false)"),
        (
            {"devices": "some", "mig_enabled": False},
            "'devices' must be 'all' or a non-empty list of GPU indexes, got 'some'",
        ),
        ({"devices": [], "mig_enabled": False}, "'devices' must be 'all' or a non-empty list of GPU indexes, got []"),
        ({"devices": [-1, 2], "mig_enabled": False}, "GPU indexes must be >= 0, got [-1, 2]"),
        ({"devices": [1, 1], "mig_enabled": False}, "GPU indexes are listed twice in [1, 1]"),
        ({"devices": [True], "mig_enabled": False}, "devices[] must be an integer, got True"),
        ({"devices": [1.5], "mig_enabled": False}, "devices[] must be an integer, got 1.5"),
        ({"devices": [10**7], "mig_enabled": False}, "devices[] must be an integer from 0 to 999999, got 10000000"),
        ({"devices": "all", "mig_enabled": "maybe"}, "'mig_enabled' must be a boolean, got 'maybe'"),
        (
            {"devices": "all", "mig_enabled": True, "mig_devices": ["1g.10gb"]},
            "'mig_devices' must map profile names to counts, got ['1g.10gb']",
        ),
        (
            {"devices": "all", "mig_enabled": False, "mig_devices": {"1g.10gb": 1}},
            "'mig_devices' is set but 'mig_enabled' is false",
        ),
        (
            {"devices": "all", "mig_enabled": True, "mig_devices": {"1x.10gb": 1}},
            "'1x.10gb' is not a MIG profile name (expected '<number>g', got '1x'; expected e.g. '1g.10gb', "
            "'1g.10gb+me', '3g.40gb')",
        ),
        (
            {"devices": "all", "mig_enabled": True, "mig_devices": {"1g.10gb": -2}},
            "count of 1g.10gb must be >= 0, got -2",
        ),
        (
            {"devices": "all", "mig_enabled": True, "mig_devices": {"1g.10gb": None}},
            "count of 1g.10gb must be an integer, got None",
        ),
        (
            {"devices": "all", "mig_enabled": True, "mig_devices": {"1g.10gb": "x" * 50}},
            "count of 1g.10gb must be an integer from 0 to 999999, got 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx... "
            "(52 characters)",
        ),
        (
            {"devices": "all", "mig_enabled": True, "mig_devices": {"1g.10gb": 10**50}},
            "count of 1g.10gb must be an integer from 0 to 999999, got an integer of about 50 digits",
        ),
        (
            {"devices": "all", "mig_enabled": True, "mig_devices": {"3c.3g.40gb": 1, "3g.40gb": 1}},
            "3g.40gb is listed twice (as two spellings of one profile)",
        ),
        (
            {"devices": "all", "mig_enabled": True, "device_filter": ["zz"]},
            PCI_HINT + "(with the subsystem ID), got 'zz'",
        ),
    ],
)
def test_config_refusals_name_the_entry_and_say_exactly_what_is_wrong(entry, message):
    with pytest.raises(SpecError) as failure:
        parse_config([FIRST, entry])
    assert failure.value.message == f"config[1]: {message}"


@pytest.mark.parametrize("config", ["x", [], (), {"devices": "all"}])
def test_config_that_is_not_a_list_of_entries_is_refused(config):
    with pytest.raises(SpecError) as failure:
        parse_config(config)
    assert failure.value.message == "config must be a non-empty list of entries ({devices, mig_enabled, mig_devices})"


def test_accepted_spellings_are_normalised():
    entries = parse_config(
        [
            {"devices": ["3", " 2 ", 0], "mig_enabled": "off"},
            {"devices": "all", "mig_enabled": "Yes", "mig_devices": {"1g.10gb": "2", "2g.20gb": 0}},
            {"devices": (5,), "mig_enabled": "ON", "device_filter": "0x233010DE:0x16C110DE"},
            {"devices": [6], "mig_enabled": "No", "mig_devices": None, "device_filter": 0x233510DE},
        ]
    )
    assert [(e.devices, e.mig_enabled, e.mig_devices, e.device_filter, e.position) for e in entries] == [
        ((0, 2, 3), False, {}, (), 0),
        ("all", True, {"1g.10gb": 2}, (), 1),  # a count of 0 asks for none
        ((5,), True, {}, (DeviceId(H100_ID, H100_SUBSYSTEM),), 2),
        ((6,), False, {}, (DeviceId(H200_ID),), 3),
    ]


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("", "empty profile name"),
        ("1g.10gb+me-x", "both '+' and '-' attributes"),
        ("1g.10gb+", "empty attribute"),
        ("1g.10gb+me,me", "an attribute is listed twice"),
        ("1g.10gb+1me", "attribute '1me' starts with a digit or starts/ends with a dot"),
        ("1g.10gb+m_e", "attribute 'm_e' has characters other than letters, digits and dots"),
        ("1x.10gb", "expected '<number>g', got '1x'"),
        ("1g.1x", "expected '<number>gb', got '1x'"),
        ("1g.x0gb", "malformed number in 'x0gb'"),
        (" 1g.10gb", "expected '<number>g', got ' 1g'"),
        ("1g", "expected [<C>c.]<G>g.<GB>gb"),
        ("a.1g.10gb", "expected '<number>c', got 'a'"),
        # The name splits at the first '+' or '-' and into at most three dotted fields, as go-nvlib does.
        ("1g.10gb+me+gfx", "attribute 'me+gfx' has characters other than letters, digits and dots"),
        ("1g.10gb-me-gfx", "attribute 'me-gfx' has characters other than letters, digits and dots"),
        ("1c.1g.10gb.5", "expected '<number>gb', got '10gb.5'"),
    ],
)
def test_profile_name_refusals_say_what_is_wrong(name, message):
    with pytest.raises(ValueError) as failure:
        parse_profile_name(name)
    assert str(failure.value) == message


def test_parsed_profile_names_keep_their_parts():
    parsed = parse_profile_name("2c.4g.40gb-me,gfx")
    assert (parsed.compute, parsed.gpu, parsed.gb, parsed.attributes, parsed.negated) == (2, 4, 40, (), ("gfx", "me"))
    assert parsed.canonical == "2c.4g.40gb-gfx,me" and parsed.partial_compute
    plain = parse_profile_name("3g.40gb+me")
    assert (plain.compute, plain.attributes, plain.negated, plain.partial_compute) == (3, ("me",), (), False)


SELECTION_HOST = [GpuSelectable(0, H100_ID), GpuSelectable(1, H100_ID, mig_capable=False)]


@pytest.mark.parametrize(
    ("config", "options", "message"),
    [
        (
            [{"devices": [0], "mig_enabled": False}, {"devices": [0, 4, 9], "mig_enabled": False}],
            {},
            "config[1]: GPU index(es) [4, 9] do not exist on this host (GPUs: [0, 1]; missing_devices=skip ignores "
            "them, as mig-parted does)",
        ),
        (
            [{"devices": [0], "mig_enabled": False}],
            {"missing_devices": "bogus"},
            "missing_devices must be one of fail, skip, got 'bogus'",
        ),
        (
            [{"devices": "all", "mig_enabled": False}, {"devices": [0], "mig_enabled": False}],
            {},
            "GPU 0 is selected by more than one entry (config[0], config[1])",
        ),
        (
            [{"devices": [0], "mig_enabled": False}, {"devices": [1], "mig_enabled": True}],
            {},
            "config[1]: GPU 1 cannot do MIG (NVML reports no MIG mode)",
        ),
    ],
)
def test_selection_refusals_say_exactly_what_is_wrong(config, options, message):
    with pytest.raises(SpecError) as failure:
        targets_for_gpus(parse_config(config), SELECTION_HOST, **options)
    assert failure.value.message == message


def test_missing_indexes_on_a_host_without_gpus_say_so():
    with pytest.raises(SpecError) as failure:
        targets_for_gpus(parse_config([{"devices": [0], "mig_enabled": False}]), [])
    assert "(GPUs: none;" in failure.value.message
    skipped = parse_config([FIRST, {"devices": [0, 4], "mig_enabled": False}])
    assert targets_for_gpus(skipped, SELECTION_HOST, missing_devices="skip") == {0: GpuTarget(False, {}, 1)}


def test_targets_carry_the_entrys_layout_and_position():
    host = [GpuSelectable(0, H100_ID), GpuSelectable(1, H100_ID, mig_capable=False), GpuSelectable(2, H100_ID)]
    entries = parse_config(
        [
            {"devices": [1], "mig_enabled": False},
            {"devices": [0], "mig_enabled": True, "mig_devices": {"1g.10gb": 2}},
            {"devices": [2], "mig_enabled": False},
        ]
    )
    assert targets_for_gpus(entries, host) == {0: GpuTarget(True, {"1g.10gb": 2}, 1), 2: GpuTarget(False, {}, 2)}


OK_ENTRY = {"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 1}}


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("x", "must be a mapping, got 'x'"),
        ({"devices": "all", "mig-enabled": False, "b": 1, "a": 2}, "unexpected field(s) a, b"),
        ({"mig-enabled": False}, "missing required field devices"),
        ({"devices": "all"}, "missing required field mig-enabled"),
        (
            {"devices": "all", "mig-enabled": False, "device-filter": ["a", 1]},
            "device-filter must be a string or a list of strings, got ['a', 1]",
        ),
        ({"devices": [0, True], "mig-enabled": False}, "devices must be 'all' or a list of integers, got [0, True]"),
        ({"devices": "all", "mig-enabled": 1}, "mig-enabled must be true or false, got 1"),
        (
            {"devices": "all", "mig-enabled": True},
            "missing required field 'mig-devices' when 'mig-enabled' is true (use {} for none)",
        ),
        (
            {"devices": "all", "mig-enabled": True, "mig-devices": []},
            "mig-devices must map profile names to counts, got []",
        ),
        (
            {"devices": "all", "mig-enabled": False, "mig-devices": {"1g.10gb": 1}},
            "MIG devices included when 'mig-enabled' is false",
        ),
        (
            {"devices": "all", "mig-enabled": True, "mig-devices": {"1x": 1}},
            "invalid MIG profile name '1x': expected [<C>c.]<G>g.<GB>gb",
        ),
        ({"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": True}}, "invalid count for 1g.10gb: True"),
        ({"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": -1}}, "invalid count for 1g.10gb: -1"),
        ({"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 0}}, "all counts of mig-devices are 0"),
    ],
)
def test_mig_parted_entry_refusals_name_config_and_entry_exactly(entry, message):
    with pytest.raises(SpecError) as failure:
        config_from_mig_parted(document(OK_ENTRY, entry), "chosen")
    assert failure.value.message == f"mig-parted config: 'chosen' entry 1: {message}"


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ("x", "the file must contain a mapping with 'version' and 'mig-configs'"),
        ({"version": "v2"}, "unsupported version 'v2' (supported: v1)"),
        ({"mig-configs": {"chosen": [OK_ENTRY]}}, "unsupported version None (supported: v1)"),
        ({"version": "v1", "mig-configs": {"chosen": [OK_ENTRY]}, "x": 1, "a": 2}, "unexpected field(s) a, x"),
        ({"version": "v1", "mig-configs": {}}, "'mig-configs' must be a non-empty mapping of config names to entries"),
        ({"version": "v1", "mig-configs": []}, "'mig-configs' must be a non-empty mapping of config names to entries"),
        (
            {"version": "v1", "mig-configs": {"chosen": [OK_ENTRY], "other": "x"}},
            "'other' must be a non-empty list of entries",
        ),
        (
            {"version": "v1", "mig-configs": {"b": [OK_ENTRY], "a": [OK_ENTRY]}},
            "no config named 'chosen' (available: a, b)",
        ),
    ],
)
def test_mig_parted_file_refusals_say_exactly_what_is_wrong(doc, message):
    with pytest.raises(SpecError) as failure:
        config_from_mig_parted(doc, "chosen")
    assert failure.value.message == f"mig-parted config: {message}"


def test_mig_parted_entries_come_back_with_our_key_names():
    entry = {"device-filter": ["0x233010DE"], "devices": [0], "mig-enabled": False}
    mixed = {"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 0, "2g.20gb": 1}}
    assert config_from_mig_parted(document(entry, mixed), "chosen") == [
        {"device_filter": ["0x233010DE"], "devices": [0], "mig_enabled": False},
        {"devices": "all", "mig_enabled": True, "mig_devices": {"1g.10gb": 0, "2g.20gb": 1}},
    ]
    assert config_from_mig_parted(document({"devices": "all", "mig-enabled": False, "device-filter": "0x1"}), "chosen")


@pytest.mark.parametrize(
    ("count", "shown"),
    [
        ("y" * 38, "'" + "y" * 38 + "'"),  # 40 characters: shown whole
        (10**40, "1" + "0" * 39 + "... (41 characters)"),  # 41 characters: cut
        (10**40 + 1, "an integer of about 40 digits"),  # too big to print at all
    ],
)
def test_values_in_messages_are_shown_whole_up_to_40_characters(count, shown):
    with pytest.raises(SpecError) as failure:
        parse_config(layout({"1g.10gb": count}))
    assert failure.value.message == f"config[0]: count of 1g.10gb must be an integer from 0 to 999999, got {shown}"


@pytest.mark.parametrize(("value", "accepted"), [(0, True), (0xFFFFFFFF, True), (0x100000000, False), (-1, False)])
def test_device_filter_integers_are_32_bit_pci_ids(value, accepted):
    config = [{"devices": "all", "mig_enabled": False, "device_filter": [value]}]
    if accepted:
        assert parse_config(config)[0].device_filter == (DeviceId(value),)
        return
    with pytest.raises(SpecError) as failure:
        parse_config(config)
    assert failure.value.message == f"config[0]: {PCI_HINT}(with the subsystem ID), got {value}"


@pytest.mark.parametrize(
    ("spelling", "value"),
    [("true", True), ("Yes", True), ("ON", True), ("False", False), ("no", False), ("OFF", False), (True, True)],
)
def test_mig_enabled_takes_yaml_boolean_spellings(spelling, value):
    assert parse_config([{"devices": "all", "mig_enabled": spelling}])[0].mig_enabled is value


@pytest.mark.parametrize(
    ("count", "message"),
    [
        (999_999, None),
        (-999_999, "count of 1g.10gb must be >= 0, got -999999"),
        (1_000_000, "count of 1g.10gb must be an integer from 0 to 999999, got 1000000"),
        (-1_000_000, "count of 1g.10gb must be an integer from 0 to 999999, got -1000000"),
    ],
)
def test_counts_are_bounded_to_six_digits(count, message):
    if message is None:
        assert parse_config(layout({"1g.10gb": count}))[0].mig_devices == {"1g.10gb": count}
        return
    with pytest.raises(SpecError) as failure:
        parse_config(layout({"1g.10gb": count}))
    assert failure.value.message == f"config[0]: {message}"


def test_a_gpu_without_mig_does_not_stop_selection_of_the_gpus_after_it():
    host = [GpuSelectable(0, 0x27B810DE, mig_capable=False), GpuSelectable(1, H100_ID), GpuSelectable(2, H100_ID)]
    targets = targets_for_gpus(parse_config(layout({"3g.40gb": 2})), host)
    assert targets == {1: GpuTarget(True, {"3g.40gb": 2}, 0), 2: GpuTarget(True, {"3g.40gb": 2}, 0)}
