"""One exception root per component: the simulator's errors are SimulationErrors (the runtime's are the extender's
ExtenderErrors, extender/tests/test_errors.py)."""

from __future__ import annotations

import pytest

from gpufleet_lab.simulate.errors import SimulationError
from gpufleet_lab.simulate.fleet import Fleet, fleet_from_yaml, parse_sharing
from gpufleet_lab.simulate.relayout import pools_from_fleet
from gpufleet_lab.simulate.trace import normalise_resource


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
