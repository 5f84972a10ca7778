"""Settings: defaults, file + environment (environment wins), refusal of bad values with clear messages."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest

from gpufleet_extender.cli import EXIT_BAD_SETTINGS, main
from gpufleet_extender.config import (
    CONFIG_FILE_ENV,
    MetricsSourceKind,
    MissingMetricsPolicy,
    SettingsError,
    check_settings,
    get_settings,
    host_port,
    load_settings,
)
from gpufleet_extender.settings_contract import SETTINGS


def test_defaults_are_the_contracts_and_the_documented_ones():
    # The decision settings' defaults are the settings contract's (tests/unit/test_settings_contract.py checks the
    # README's table, the roles and GPUScore against it); the extender's own settings are written here.
    settings = load_settings()
    for name, setting in SETTINGS.items():
        value = getattr(settings, name)
        assert (list(value) if isinstance(value, tuple) else value) == setting.default, name
    assert settings.METRICS_SOURCE is MetricsSourceKind.PROMETHEUS
    assert settings.ON_MISSING_METRICS is MissingMetricsPolicy.ALLOW
    assert settings.MAX_BODY_BYTES == 4 * 1024 * 1024


def test_yaml_file_read_and_environment_wins(tmp_path, monkeypatch):
    config = tmp_path / "extender.yaml"
    config.write_text("gpu_util_threshold: 0.6\nON_MISSING_METRICS: deny\nnode_name_labels: [hostname]\n")
    monkeypatch.setenv("GPU_UTIL_THRESHOLD", "0.75")
    settings = load_settings(config)
    assert settings.GPU_UTIL_THRESHOLD == 0.75  # env over file
    assert settings.ON_MISSING_METRICS is MissingMetricsPolicy.DENY  # file over default
    assert settings.NODE_NAME_LABELS == ("hostname",)


def test_json_file(tmp_path):
    config = tmp_path / "extender.json"
    config.write_text(json.dumps({"METRICS_SOURCE": "file", "METRICS_FILE": "/var/lib/dcgm.prom"}))
    assert load_settings(config).METRICS_FILE.name == "dcgm.prom"


def test_comma_separated_labels_from_env(monkeypatch):
    monkeypatch.setenv("NODE_NAME_LABELS", "node, Hostname")
    assert load_settings().NODE_NAME_LABELS == ("node", "Hostname")


def test_get_settings_reads_the_file_named_by_the_cli(tmp_path, monkeypatch):
    config = tmp_path / "c.yaml"
    config.write_text("MEM_UTIL_THRESHOLD: 0.5\n")
    monkeypatch.setenv(CONFIG_FILE_ENV, str(config))
    get_settings.cache_clear()
    try:
        assert get_settings().MEM_UTIL_THRESHOLD == 0.5
    finally:
        get_settings.cache_clear()


@pytest.mark.parametrize(
    ("values", "fragment"),
    [
        ({"GPU_UTIL_THRESHOLD": 1.5}, "GPU_UTIL_THRESHOLD: Input should be less than or equal to 1"),
        ({"GPU_UTIL_THRESHOLD": 0}, "GPU_UTIL_THRESHOLD: Input should be greater than 0"),
        ({"WEIGHT_GPU_UTIL": 0.5}, "WEIGHT_GPU_UTIL + WEIGHT_MEM_UTIL must be 1.0 (got 0.5 + 0.3 = 0.8)"),
        ({"METRICS_SOURCE": "carrier-pigeon"}, "METRICS_SOURCE: Input should be 'prometheus', 'push' or 'file'"),
        (
            {"METRICS_SOURCE": "push"},
            "METRICS_SOURCE push needs REMOTE_WRITE_TOKEN_FILE (the bearer token remote-write senders must present)",
        ),
        (
            {"REMOTE_WRITE_CERT_FILE": "/etc/tls/tls.crt"},
            "REMOTE_WRITE_CERT_FILE and REMOTE_WRITE_KEY_FILE go together (both for https, neither for http)",
        ),
        (
            {"REMOTE_WRITE_KEY_FILE": "/etc/tls/tls.key"},
            "REMOTE_WRITE_CERT_FILE and REMOTE_WRITE_KEY_FILE go together (both for https, neither for http)",
        ),
        ({"REMOTE_WRITE_ADDRESS": "9402"}, 'REMOTE_WRITE_ADDRESS: must be host:port or :port (got "9402")'),
        ({"REMOTE_WRITE_ADDRESS": ":0"}, 'port must be a number in [1, 65535] (got "0")'),
        ({"REMOTE_WRITE_ADDRESS": "a b:9402"}, 'host "a b" is no host name or address'),
        ({"METRICS_SOURCE": "file"}, "METRICS_SOURCE=file needs METRICS_FILE"),
        ({"ON_MISSING_METRICS": "maybe"}, "ON_MISSING_METRICS: Input should be 'allow' or 'deny'"),
        ({"PROMETHEUS_URL": "prometheus:9090"}, "must start with http:// or https://"),
        ({"METRICS_REFRESH_SECONDS": -1}, "METRICS_REFRESH_SECONDS"),
        ({"NODE_NAME_LABELS": ""}, "needs at least one label name"),
        ({"GPU_TRESHOLD": 0.5}, "GPU_TRESHOLD: unknown setting"),
    ],
)
def test_invalid_settings_are_refused_with_a_clear_message(values, fragment):
    with pytest.raises(SettingsError) as caught:
        load_settings(**values)
    assert fragment in str(caught.value)
    assert str(caught.value).startswith("invalid extender settings:")


@pytest.mark.parametrize(
    ("text", "suffix", "fragment"),
    [
        ("a: [", ".yaml", "is not valid yaml"),
        ("[1, 2]", ".yaml", "must hold a mapping"),
        ("{", ".json", "not valid json"),
    ],
)
def test_bad_config_files(tmp_path, text, suffix, fragment):
    config = tmp_path / f"c{suffix}"
    config.write_text(text)
    with pytest.raises(SettingsError, match=fragment):
        load_settings(config)


def test_missing_config_file(tmp_path):
    with pytest.raises(SettingsError, match="cannot read config file"):
        load_settings(tmp_path / "absent.yaml")


def test_serve_refuses_to_start_with_exit_code_2(monkeypatch, capsys):
    monkeypatch.setenv("MEM_UTIL_THRESHOLD", "7")
    get_settings.cache_clear()
    try:
        assert main(["serve", "--port", "0"]) == EXIT_BAD_SETTINGS
    finally:
        get_settings.cache_clear()
    err = capsys.readouterr().err
    assert "invalid extender settings" in err and "MEM_UTIL_THRESHOLD" in err
    assert "Traceback" not in err


def test_serve_lists_every_problem_at_once(monkeypatch, capsys):
    # A field error does not hide the rules between settings, and no rule hides another.
    for name, value in {
        "MEM_UTIL_THRESHOLD": "7",
        "WEIGHT_GPU_UTIL": "0.9",
        "SCORING_STRATEGY": "auto",
        "AUTO_PACK_BELOW": "0.7",
        "AUTO_HYSTERESIS": "0.5",
        "PACK_TARGET_UTIL": "0.85",
    }.items():
        monkeypatch.setenv(name, value)
    get_settings.cache_clear()
    try:
        assert main(["serve", "--port", "1"]) == EXIT_BAD_SETTINGS
    finally:
        get_settings.cache_clear()
    assert capsys.readouterr().err == (
        "gpufleet-extender: invalid extender settings:\n"
        "  MEM_UTIL_THRESHOLD: Input should be less than or equal to 1\n"
        "  settings: WEIGHT_GPU_UTIL + WEIGHT_MEM_UTIL must be 1.0 (got 0.9 + 0.3 = 1.2)\n"
        "  settings: PACK_TARGET_UTIL (0.85) must be below GPU_UTIL_THRESHOLD (0.8) with SCORING_STRATEGY=auto\n"
        "  settings: AUTO_PACK_BELOW + AUTO_HYSTERESIS must be below 1 (got 0.7 + 0.5): auto would never spread\n"
    )


def test_a_rule_reading_an_invalid_field_is_left_to_that_fields_error():
    with pytest.raises(SettingsError) as caught:
        load_settings(scoring_strategy="pack", gpu_util_threshold="high", pack_target_util=0.9)
    assert str(caught.value) == (
        "invalid extender settings:\n"
        "  GPU_UTIL_THRESHOLD: Input should be a valid number, unable to parse string as a number"
    )


def test_check_config_reads_stdin_alone_and_gives_the_pods_message(monkeypatch, capsys):
    # The ConfigMap's data, strings as envFrom hands them over; the caller's environment must not count.
    monkeypatch.setenv("SCORING_STRATEGY", "spread")
    data = {"SCORING_STRATEGY": "auto", "AUTO_PACK_BELOW": "0.6", "AUTO_HYSTERESIS": "0.5"}
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(data)))
    assert main(["check-config", "-"]) == EXIT_BAD_SETTINGS
    assert capsys.readouterr().err == (
        "gpufleet-extender: invalid extender settings:\n"
        "  settings: AUTO_PACK_BELOW + AUTO_HYSTERESIS must be below 1 (got 0.6 + 0.5): auto would never spread\n"
    )
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps({**data, "AUTO_PACK_BELOW": "0.4"})))
    assert main(["check-config", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["SCORING_STRATEGY"] == "auto"
    monkeypatch.setattr("sys.stdin", io.StringIO("[1]"))
    assert main(["check-config", "-"]) == EXIT_BAD_SETTINGS
    assert "must hold a JSON mapping of settings, not list" in capsys.readouterr().err


def test_readme_table_states_the_defaults_of_the_code():
    # The defaults are written once (scoring.Policy, then Settings); the README's table must say the same.
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    documented = dict(re.findall(r"^\| `([A-Z_]+)` \| `([^`]*)` \|", readme, re.M))
    defaults = load_settings().model_dump(mode="json")
    checked = 0
    for name, text in documented.items():
        if isinstance(defaults.get(name), float | int) and not isinstance(defaults[name], bool):
            assert float(text) == defaults[name], name
            checked += 1
    assert checked >= 10


def test_check_config_reads_shared_resources_as_the_configmap_holds_them_json_text():
    # A ConfigMap's data values are strings; the pod's environment gives the extender the same JSON text.
    assert check_settings({"SHARED_RESOURCES": '{"nvidia.com/mig-1g.10gb": 4}'}).SHARED_RESOURCES == {
        "nvidia.com/mig-1g.10gb": 4
    }
    with pytest.raises(
        SettingsError, match=r'SHARED_RESOURCES: is not JSON .*write it as \{"nvidia.com/mig-1g.10gb": 4\}'
    ):
        check_settings({"SHARED_RESOURCES": "nvidia.com/mig-1g.10gb=4"})
    with pytest.raises(SettingsError, match=r"SHARED_RESOURCES\.nvidia\.com/mig-1g\.10gb: Input should be less than"):
        check_settings({"SHARED_RESOURCES": '{"nvidia.com/mig-1g.10gb": 65}'})


def test_a_pinned_prometheus_ca_needs_an_https_url():
    https = {"PROMETHEUS_URL": "https://prometheus.monitoring.svc:9090", "PROMETHEUS_CA_FILE": "/etc/ca/ca.crt"}
    settings = check_settings({**https, "PROMETHEUS_TOKEN_FILE": "/etc/token/token"})
    assert (str(settings.PROMETHEUS_CA_FILE), str(settings.PROMETHEUS_TOKEN_FILE)) == (
        "/etc/ca/ca.crt",
        "/etc/token/token",
    )
    with pytest.raises(
        SettingsError, match='PROMETHEUS_CA_FILE needs an https:// PROMETHEUS_URL \\(got "http://p:9090"\\)'
    ):
        check_settings({**https, "PROMETHEUS_URL": "http://p:9090"})


def test_a_file_setting_of_the_wrong_type_is_listed_with_the_others_not_a_traceback():
    # pydantic's Path error (path_type) is not a core error type: raised again with the rules, it used to be a KeyError.
    with pytest.raises(SettingsError) as refused:
        check_settings({"PROMETHEUS_CA_FILE": 3, "PROMETHEUS_TOKEN_FILE": ["/t"], "WEIGHT_GPU_UTIL": 0.5})
    assert str(refused.value).splitlines() == [
        "invalid extender settings:",
        "  PROMETHEUS_CA_FILE: Input is not a valid path for <class 'pathlib.Path'>",
        "  PROMETHEUS_TOKEN_FILE: Input is not a valid path for <class 'pathlib.Path'>",
        "  settings: WEIGHT_GPU_UTIL + WEIGHT_MEM_UTIL must be 1.0 (got 0.5 + 0.3 = 0.8)",
    ]


def test_serve_with_an_unusable_prometheus_ca_exits_2_with_the_reason(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PROMETHEUS_URL", "https://127.0.0.1:9")
    monkeypatch.setenv("PROMETHEUS_CA_FILE", str(tmp_path / "missing.crt"))
    assert main(["serve", "--port", "0"]) == EXIT_BAD_SETTINGS
    assert f"cannot use PROMETHEUS_CA_FILE {tmp_path / 'missing.crt'}" in capsys.readouterr().err


def test_push_settings_that_go_together_are_accepted():
    settings = load_settings(
        METRICS_SOURCE="push",
        REMOTE_WRITE_TOKEN_FILE="/run/secrets/token",
        REMOTE_WRITE_ADDRESS="127.0.0.1:19402",
        REMOTE_WRITE_CERT_FILE="/etc/tls/tls.crt",
        REMOTE_WRITE_KEY_FILE="/etc/tls/tls.key",
    )
    assert settings.METRICS_SOURCE is MetricsSourceKind.PUSH
    assert host_port(settings.REMOTE_WRITE_ADDRESS) == ("127.0.0.1", 19402)
    assert host_port(":9402") == ("", 9402) and host_port("[::1]:9402") == ("::1", 9402)


REMOVED_QUERY = (
    "  PROMETHEUS_QUERY: removed with the recorded form: the dcgm series are read raw from Prometheus, or pushed by "
    "its remote write (metricsSource push); delete it\n"
)


@pytest.mark.parametrize("value", ["recorded", "raw"])
def test_the_removed_prometheus_query_gets_what_replaced_it_from_the_environment(monkeypatch, capsys, value):
    # A deployment that still exports the setting: one line saying what replaced it, exit 2, no traceback.
    monkeypatch.setenv("prometheus_query", value)
    get_settings.cache_clear()
    try:
        assert main(["serve", "--port", "1"]) == EXIT_BAD_SETTINGS
    finally:
        get_settings.cache_clear()
    assert capsys.readouterr().err == "gpufleet-extender: invalid extender settings:\n" + REMOVED_QUERY


def test_the_removed_prometheus_query_gets_what_replaced_it_from_a_file_or_a_configmap(tmp_path, monkeypatch, capsys):
    config = tmp_path / "extender.yaml"
    config.write_text("prometheus_query: recorded\nGPU_UTIL_THRESHOLD: 0.7\n")
    with pytest.raises(SettingsError) as caught:
        load_settings(config)
    assert str(caught.value) + "\n" == "invalid extender settings:\n" + REMOVED_QUERY
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps({"PROMETHEUS_QUERY": "raw"})))
    assert main(["check-config", "-"]) == EXIT_BAD_SETTINGS
    assert capsys.readouterr().err == "gpufleet-extender: invalid extender settings:\n" + REMOVED_QUERY
    # Any other unknown name stays an unknown setting.
    with pytest.raises(SettingsError, match="PROMETHEUS_QUERIES: unknown setting"):
        check_settings({"PROMETHEUS_QUERIES": "raw"})
