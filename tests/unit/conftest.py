"""Fixtures the unit tests share."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def promtool() -> str:
    """Prometheus' own checker (Debian's prometheus package, tests/setup-system.sh). Without it the tests that use it
    skip, unless CI or GPUFLEET_REQUIRE_PROMETHEUS=1 makes its absence a failure."""
    binary = os.environ.get("GPUFLEET_PROMTOOL_BINARY") or shutil.which("promtool") or "/usr/bin/promtool"
    if not Path(binary).is_file():
        message = f"promtool not found ({binary}): Debian's prometheus package ships it (tests/setup-system.sh)"
        if os.environ.get("GPUFLEET_REQUIRE_PROMETHEUS") == "1" or os.environ.get("CI", "false") not in ("", "false"):
            pytest.fail(message + ", and CI / GPUFLEET_REQUIRE_PROMETHEUS=1 needs it")
        pytest.skip(message)
    return binary
