"""One exception root per component: the runtime's errors are ExtenderErrors (the simulator's are SimulationErrors,
lab/tests/test_errors.py)."""

from __future__ import annotations

import asyncio

import pytest

from gpufleet_extender.config import load_settings
from gpufleet_extender.errors import ExtenderError
from gpufleet_extender.metrics_source import FileSource
from gpufleet_extender.wire import decode_args


def test_the_runtimes_errors_share_one_root(tmp_path):
    with pytest.raises(ExtenderError, match="WEIGHT_GPU_UTIL"):
        load_settings(WEIGHT_GPU_UTIL=5)
    with pytest.raises(ExtenderError, match="JSON"):
        decode_args(b"{")
    with pytest.raises(ExtenderError, match="cannot stat METRICS_FILE"):
        asyncio.run(FileSource(tmp_path / "absent.prom", ("Hostname",)).fetch(1))
