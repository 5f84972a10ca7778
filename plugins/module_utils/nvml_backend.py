"""Opening an NVML backend: the simulator when the task names a state file, else the real NVML through pynvml.

Kept apart from nvml.py (the interface and the real wrapper) and nvml_sim.py (the simulator) so that neither of
them imports the other: both depend on nvml.py's interface and record types, and only this module knows both.

The simulator is chosen only by an explicit option (a module's `nvml_sim_state`, the boot unit's
`--nvml-sim-state`), never by the environment: a variable left over on a real host must not turn a repartition into
one that "succeeds" on a JSON file. On a host where an NVIDIA driver is loaded the simulator is refused unless the
task says so too (`nvml_sim_on_gpu_host`), for the same reason.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from .exceptions import NvmlUnavailableError
from .nvml import SIM_ENV, NvmlInterface, PynvmlBackend
from .nvml_sim import SimulatedNvml

# What the NVIDIA kernel driver leaves on a host where it is loaded (the first is the driver's own version file).
DRIVER_MARKERS = ("/proc/driver/nvidia/version", "/dev/nvidiactl")


def loaded_driver_marker(markers: tuple[str, ...] | None = None) -> str | None:
    """The first sign of a loaded NVIDIA driver on this host, or None."""
    return next((path for path in (markers or DRIVER_MARKERS) if os.path.exists(path)), None)


def open_nvml(sim_state: str | None = None, *, sim_on_gpu_host: bool = False) -> NvmlInterface:
    """The simulator on `sim_state` when given (refused on a host with an NVIDIA driver unless `sim_on_gpu_host`),
    else NVML through pynvml."""
    if not sim_state:
        return PynvmlBackend()
    marker = loaded_driver_marker()
    if marker and not sim_on_gpu_host:
        raise NvmlUnavailableError(
            f"refusing the NVML simulator ({sim_state}) on a host with an NVIDIA driver loaded ({marker} exists): "
            "a layout applied to the simulator would be reported as done while no GPU changed. Leave nvml_sim_state "
            "unset to partition this host's GPUs, or set nvml_sim_on_gpu_host: true if simulating here is intended"
        )
    return SimulatedNvml(sim_state)


def warn_ignored_environment(warn: Callable[[str], object], sim_state: str | None) -> None:
    """Warn (a module's ``warn``) when the environment names a simulator the task does not: it is ignored, and the
    user should know."""
    value = os.environ.get(SIM_ENV)
    if value and not sim_state:
        warn(
            f"{SIM_ENV}={value} is set in this host's environment and ignored: the NVML simulator is chosen only by "
            "the nvml_sim_state option; the real GPUs are used"
        )
