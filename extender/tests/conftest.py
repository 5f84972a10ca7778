"""Fixtures for all extender tests; helpers live in extender_helpers.py."""

from __future__ import annotations

import pytest

from gpufleet_extender import app as app_module
from gpufleet_extender.config import Settings


@pytest.fixture(autouse=True)
def _clean_settings_env(monkeypatch):
    """Settings read the environment: keep the developer's variables out of the tests."""
    for name in Settings.model_fields:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("GPUFLEET_EXTENDER_CONFIG", raising=False)


@pytest.fixture(autouse=True)
def _first_snapshot_before_requests(monkeypatch):
    """In-process apps (TestClient) start with their first snapshot in, however loaded the machine is: the server
    waits only 50 ms for it (probes must answer at once), which a busy CI machine can miss. The tests of that
    start-up behaviour set the production value back."""
    monkeypatch.setattr(app_module, "FIRST_SNAPSHOT_WAIT_SECONDS", 30.0)


def pytest_configure(config):
    # Registered here too, so runs from the repository root (without extender/pyproject.toml) know it.
    config.addinivalue_line("markers", "integration: starts real local servers (uvicorn, Prometheus) on 127.0.0.1")
