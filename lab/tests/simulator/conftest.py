"""Fixtures of the simulator tests (builders live in sim_helpers.py: the name "conftest" is taken twice)."""

from __future__ import annotations

import pytest

from gpufleet_lab.simulate.fleet import Fleet

from sim_helpers import whole_gpu_node


@pytest.fixture
def two_shared_nodes() -> Fleet:
    """Nodes a and b with 2 whole GPUs each, no tenant, 2 pods per GPU (time-slicing)."""
    return Fleet((whole_gpu_node("a", 2), whole_gpu_node("b", 2)), {}, replicas=2, source="test")
