"""Free local ports."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A 127.0.0.1 port nothing listens on right now (for a server a test or benchmark starts)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
