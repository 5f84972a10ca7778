"""The simulator's exception root: the fleet, trace and re-layout readers and the model raise SimulationError's
subclasses, with messages meant for a person; the CLI catches the root once."""

from __future__ import annotations


class SimulationError(ValueError):
    """The fleet and trace cannot be simulated together; the message is meant for a person."""
