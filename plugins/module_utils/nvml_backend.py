"""Opening an NVML backend: the simulator when a state file is named, else the real NVML through pynvml.

Kept apart from nvml.py (the interface and the real wrapper) and nvml_sim.py (the simulator) so that neither of
them imports the other: both depend on nvml.py's interface and record types, and only this module knows both.
"""

from __future__ import annotations

import os

from .nvml import SIM_ENV, NvmlInterface, PynvmlBackend
from .nvml_sim import SimulatedNvml


def open_nvml(sim_state: str | None = None) -> NvmlInterface:
    """The simulator when a state file is named (argument, else $GPUFLEET_NVML_SIM), else NVML through pynvml."""
    path = sim_state or os.environ.get(SIM_ENV)
    if path:
        return SimulatedNvml(path)
    return PynvmlBackend()
