"""One exception root per component: the runtime's errors are ExtenderErrors, the simulator's SimulationErrors."""

from __future__ import annotations

import asyncio

import pytest

from gpufleet_extender.config import load_settings
from gpufleet_extender.errors import ExtenderError
from gpufleet_extender.metrics_source import FileSource
from gpufleet_extender.simulate.errors import SimulationError
from gpufleet_extender.simulate.fleet import Fleet, fleet_from_yaml, parse_sharing
from gpufleet_extender.simulate.relayout import pools_from_fleet
from gpufleet_extender.simulate.trace import normalise_resource
from gpufleet_extender.wire import decode_args


def test_the_runtimes_errors_share_one_root(tmp_path):
    with pytest.raises(ExtenderError, match="WEIGHT_GPU_UTIL"):
        load_settings(WEIGHT_GPU_UTIL=5)
    with pytest.raises(ExtenderError, match="JSON"):
        decode_args(b"{")
    with pytest.raises(ExtenderError, match="cannot stat METRICS_FILE"):
        asyncio.run(FileSource(tmp_path / "absent.prom", ("Hostname",)).fetch(1))


def test_the_simulators_errors_share_one_root(tmp_path):
    (tmp_path / "fleet.yaml").write_text("nodes: []\n")
    with pytest.raises(SimulationError, match="nodes"):
        fleet_from_yaml(tmp_path / "fleet.yaml")
    with pytest.raises(SimulationError, match="sharing"):
        parse_sharing("t", {"gpu": 0}, "here")
    with pytest.raises(SimulationError, match=r"is not nvidia\.com/gpu"):
        normalise_resource("tpu")
    with pytest.raises(SimulationError, match="no MIG pool"):
        pools_from_fleet(Fleet(()))
