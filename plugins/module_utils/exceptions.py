"""One exception tree for everything under module_utils; the modules and boot_apply convert it once, at the edge.

Every error that can happen after something was written carries `results`: the per-GPU results built so far
(what was already done on which GPU), so a failed apply still reports its partial progress.
"""

from __future__ import annotations

from typing import Any


class MigError(Exception):
    """Base of all errors raised by gpufleet.mig's module_utils."""

    def __init__(self, message: str, results: list[Any] | None = None):
        super().__init__(message)
        self.message = message
        self.results = results or []


class SpecError(MigError):
    """The requested layout is malformed or impossible (raised before any NVML write)."""


class BusyInstanceError(MigError):
    """An instance that must be destroyed has running processes and `force` is off (raised before any write)."""


class NvmlUnavailableError(MigError):
    """Neither the NVML library nor a simulator state file could be used."""


class SimulatorStateError(NvmlUnavailableError):
    """The NVML simulator's state file cannot be used (unreadable, not JSON, unsupported version, wrong shape)."""


class NvmlError(MigError):
    """An NVML call failed. `code` is the nvmlReturn_t value, `code_name` its NVML_ERROR_* name without prefix."""

    def __init__(self, call: str, code: int, code_name: str, detail: str = ""):
        message = f"{call} failed: NVML_ERROR_{code_name} ({code})"
        if detail:
            message += f": {detail}"
        super().__init__(message)
        self.call = call
        self.code = code
        self.code_name = code_name


class ApplyError(MigError):
    """An NVML write failed part-way through an apply; `results` says what was already done on which GPU."""
