"""GPUScore's args checked by the extender's rules in the plugin's words (plugin_args.py, check-config --plugin-args).

The conformance vectors (lab/tests/test_conformance.py, k8s/gpuscore/vectors_test.go) hold these messages for Go to
match; here: what each kind of problem says, that all are listed, and the command the kube_scheduler role runs."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest

from gpufleet_extender.cli import EXIT_BAD_SETTINGS, main
from gpufleet_extender.config import go_number, go_quote
from gpufleet_extender.plugin_args import ARG_NAMES, check_plugin_args


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0.5, "0.5"),
        (1.0, "1"),
        (-0.0, "-0"),
        (1e-05, "1e-05"),
        (0.0001, "0.0001"),
        (123456.0, "123456"),
        (1e6, "1e+06"),
        (1234567.0, "1.234567e+06"),
        (0.1 + 0.2, "0.30000000000000004"),
        (float("inf"), "+Inf"),
        (float("nan"), "NaN"),
    ],
)
def test_numbers_read_as_go_writes_them(value, text):
    assert go_number(value) == text


def test_strings_quoted_as_go_quotes_them():
    assert go_quote('a"b\\c\n\x01é\x7f') == '"a\\"b\\\\c\\n\\x01é\\x7f"'


def test_the_defaults_and_good_args_pass():
    assert check_plugin_args({}) == []
    assert check_plugin_args(None) == []
    assert (
        check_plugin_args({"scoringStrategy": "pack", "packTargetUtil": 0.5, "sharedResources": {"nvidia.com/gpu": 4}})
        == []
    )


def test_every_problem_is_listed_in_the_plugins_words():
    args = {
        "gpuUtilThreshold": "0.8",  # Go decodes JSON strictly: a string is no number
        "threshold": 1,
        "weightGPUUtil": 1.5,
        "scoringStrategy": "pack",
        "packTargetUtil": 0.9,
        "memUtilThreshold": 0.5,
        "onMissingMetrics": "ignore",
        "sharedResources": {"nvidia.com/mig-1g.10gb": 65},
    }
    assert check_plugin_args(args) == [
        "gpuUtilThreshold: must be a number",
        "threshold: unknown argument",
        "weightGPUUtil: 1.5 is not in [0, 1]",
        'onMissingMetrics: must be allow or deny (got "ignore")',
        "sharedResources: nvidia.com/mig-1g.10gb: 65 replicas is not in [1, 64]",
        # gpuUtilThreshold keeps its default (0.8) as the plugin's decoding does; the weights rule waits for
        # weightGPUUtil to be valid.
        "packTargetUtil (0.9) must be below gpuUtilThreshold (0.8) with scoringStrategy=pack",
    ]
    assert check_plugin_args([1]) == ["args must be a mapping of argument name to value, not list"]


def test_every_argument_has_the_json_type_of_its_go_field():
    kinds = {
        "tenantPools": "true or false",
        "nodeNameLabels": "a list of strings",
        "sharedResources": "a mapping of resource name to whole replicas",
    }
    strings = {
        "prometheusURL",
        "prometheusCAFile",
        "prometheusTokenFile",
        "exporterJob",
        "exporterNamespace",
        "tenantLabel",
        "onMissingMetrics",
        "scoringStrategy",
        "metricsSource",
        "remoteWriteAddress",
        "remoteWriteTokenFile",
        "remoteWriteCertFile",
        "remoteWriteKeyFile",
    }
    for arg in ARG_NAMES.values():
        kind = kinds.get(arg, "a string" if arg in strings else "a number")
        wrong = 1 if kind == "a string" else "x"
        assert check_plugin_args({arg: wrong}) == [f"{arg}: must be {kind}"]
    assert check_plugin_args({"gpuUtilThreshold": True}) == ["gpuUtilThreshold: must be a number"]
    assert check_plugin_args({"sharedResources": {"nvidia.com/gpu": 2.0}}) == [
        "sharedResources: must be a mapping of resource name to whole replicas"
    ]


def test_check_config_plugin_args_reads_stdin_or_a_file(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("GPU_UTIL_THRESHOLD", "0.1")  # the environment never counts
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps({"interferenceWeight": 12, "tenantPools": "no"})))
    assert main(["check-config", "--plugin-args", "-"]) == EXIT_BAD_SETTINGS
    assert capsys.readouterr().err == (
        "gpufleet-extender: invalid GPUScore args: tenantPools: must be true or false; "
        "interferenceWeight: 12 is not in [0, 10]\n"
    )
    path = tmp_path / "args.yaml"
    path.write_text("scoringStrategy: auto\nautoPackBelow: 0.3\n")
    assert main(["check-config", "--plugin-args", str(path)]) == 0
    assert json.loads(capsys.readouterr().out) == {"autoPackBelow": 0.3, "scoringStrategy": "auto"}
    assert main(["check-config", "--plugin-args", str(tmp_path / "missing.yaml")]) == EXIT_BAD_SETTINGS
    assert "cannot read" in capsys.readouterr().err


def test_the_argument_names_are_the_plugins():
    # The plugin's Args struct (k8s/gpuscore/args_types.go) decodes each name: one missing here would be refused by the
    # check, one too many by the plugin.
    source = (Path(__file__).resolve().parents[2] / "k8s" / "gpuscore" / "args_types.go").read_text(encoding="utf-8")
    struct = source[source.index("type Args struct {") : source.index("\n}\n", source.index("type Args struct {"))]
    assert set(re.findall(r'`json:"(\w+)"`', struct)) == set(ARG_NAMES.values())


def test_the_push_source_args_as_the_plugin_reads_them():
    # The lab's METRICS_SOURCE=file is the extender's alone: the plugin takes prometheus or push.
    assert check_plugin_args({"metricsSource": "file"}) == ['metricsSource: must be prometheus or push (got "file")']
    assert check_plugin_args({"metricsSource": "push"}) == [
        "metricsSource push needs remoteWriteTokenFile (the bearer token remote-write senders must present)"
    ]
    assert check_plugin_args({"metricsSource": "push", "remoteWriteTokenFile": "/etc/t/token"}) == []
    assert check_plugin_args({"remoteWriteCertFile": "/etc/tls/tls.crt"}) == [
        "remoteWriteCertFile and remoteWriteKeyFile go together (both for https, neither for http)"
    ]
    assert check_plugin_args({"remoteWriteAddress": "9402"}) == [
        'remoteWriteAddress: must be host:port or :port (got "9402")'
    ]


def test_the_prometheus_ca_and_token_files_as_the_plugin_reads_them():
    https = {"prometheusURL": "https://prometheus.monitoring.svc:9090"}
    files = {"prometheusCAFile": "/etc/gpufleet/prometheus-ca/ca.crt", "prometheusTokenFile": "/etc/t/token"}
    assert check_plugin_args({**https, **files}) == []
    # A CA pins an https certificate only; a token may go over http (a lab's explicit opt-out).
    assert check_plugin_args({**files, "prometheusURL": "http://p:9090"}) == [
        'prometheusCAFile needs an https:// prometheusURL (got "http://p:9090")'
    ]
    assert check_plugin_args({"prometheusURL": "http://p:9090", "prometheusTokenFile": "/etc/t/token"}) == []
    # Empty is Go's zero value, no file: not the path "." (which would break the CA rule over http).
    assert check_plugin_args({"prometheusCAFile": "", "prometheusTokenFile": ""}) == []


# The plugin's own words for each kind of range and list of choices (its validation's messages, written out here
# so that a change to how they are built shows).
@pytest.mark.parametrize(
    ("args", "problem"),
    [
        ({"gpuUtilThreshold": 0}, "gpuUtilThreshold: 0 is not in (0, 1]"),
        ({"weightGPUUtil": 1.5}, "weightGPUUtil: 1.5 is not in [0, 1]"),
        ({"packTargetUtil": 1}, "packTargetUtil: 1 is not in (0, 1)"),
        ({"autoHysteresis": -0.25}, "autoHysteresis: -0.25 is not in [0, 1)"),
        ({"metricsMaxAgeSeconds": -1}, "metricsMaxAgeSeconds: -1 is not in [0, +Inf]"),
        ({"inflightMaxSeconds": 0}, "inflightMaxSeconds: 0 is not in (0, +Inf]"),
        ({"prometheusTimeoutSeconds": 61}, "prometheusTimeoutSeconds: 61 is not in (0, 60]"),
        ({"scoringStrategy": "fastest"}, 'scoringStrategy: must be spread, pack or auto (got "fastest")'),
        ({"onMissingMetrics": "maybe"}, 'onMissingMetrics: must be allow or deny (got "maybe")'),
        ({"metricsSource": "file"}, 'metricsSource: must be prometheus or push (got "file")'),
        ({"nodeNameLabels": ["Hostname", 1]}, "nodeNameLabels: must be a list of strings"),
        ({"nodeNameLabels": None}, "nodeNameLabels: needs at least one label name, e.g. Hostname,hostname"),
        (
            {"sharedResources": {"nvidia.com/gpu": "2"}},
            "sharedResources: must be a mapping of resource name to whole replicas",
        ),
    ],
)
def test_each_kind_of_problem_is_worded_as_the_plugin_words_it(args, problem):
    assert check_plugin_args(args) == [problem]


def test_a_null_mapping_is_empty_and_a_null_number_keeps_its_default():
    assert check_plugin_args({"sharedResources": None, "gpuUtilThreshold": None, "prometheusURL": None}) == []


def test_every_unknown_argument_and_every_wrong_one_is_said_not_only_the_first():
    assert check_plugin_args({"aaa": 1, "gpuUtilThreshold": "high", "zzz": 2}) == [
        "aaa: unknown argument",
        "gpuUtilThreshold: must be a number",
        "zzz: unknown argument",
    ]


def test_an_empty_file_name_is_no_file_and_the_arguments_after_it_are_still_read():
    assert check_plugin_args({"prometheusCAFile": "", "zzz": 1}) == ["zzz: unknown argument"]


def test_the_removed_prometheus_query_gets_what_replaced_it_whatever_its_value():
    removed = (
        "prometheusQuery: removed with the recorded form: the dcgm series are read raw from Prometheus, or pushed by "
        "its remote write (metricsSource push); delete it"
    )
    for value in ("recorded", "raw", 1, None):
        assert check_plugin_args({"prometheusQuery": value}) == [removed]
    assert check_plugin_args({"prometheusQuery": "raw", "promQuery": "raw"}) == ["promQuery: unknown argument", removed]
