"""Fixtures for all extender tests; helpers live in extender_helpers.py."""

from __future__ import annotations

import pytest

from gpufleet_extender.config import Settings


@pytest.fixture(autouse=True)
def _clean_settings_env(monkeypatch):
    """Settings read the environment: keep the developer's variables out of the tests."""
    for name in Settings.model_fields:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("GPUFLEET_EXTENDER_CONFIG", raising=False)


def pytest_configure(config):
    # Registered here too, so runs from the repository root (without extender/pyproject.toml) know it.
    config.addinivalue_line("markers", "integration: starts real local servers (uvicorn, Prometheus) on 127.0.0.1")
