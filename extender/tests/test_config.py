"""Settings: defaults, file + environment (environment wins), refusal of bad values with clear messages."""

from __future__ import annotations

import json

import pytest

from gpufleet_extender.cli import EXIT_BAD_SETTINGS, main
from gpufleet_extender.config import (
    CONFIG_FILE_ENV,
    MetricsSourceKind,
    MissingMetricsPolicy,
    SettingsError,
    get_settings,
    load_settings,
)


def test_defaults_are_the_documented_ones():
    settings = load_settings()
    assert (settings.GPU_UTIL_THRESHOLD, settings.MEM_UTIL_THRESHOLD) == (0.8, 0.9)
    assert (settings.WEIGHT_GPU_UTIL, settings.WEIGHT_MEM_UTIL) == (0.7, 0.3)
    assert settings.METRICS_SOURCE is MetricsSourceKind.PROMETHEUS
    assert (settings.METRICS_REFRESH_SECONDS, settings.METRICS_MAX_AGE_SECONDS) == (5, 30)
    assert settings.ON_MISSING_METRICS is MissingMetricsPolicy.ALLOW
    assert settings.NODE_NAME_LABELS == ("Hostname", "hostname")
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
        ({"METRICS_SOURCE": "carrier-pigeon"}, "METRICS_SOURCE: Input should be 'prometheus' or 'file'"),
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
