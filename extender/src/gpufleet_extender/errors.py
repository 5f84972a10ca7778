"""The extender's exception root: every error the runtime raises for a person to read derives from ExtenderError
(settings, the wire format, the metrics source), so a caller can catch the component's errors in one clause. The
layout library has its own (mig_utils.exceptions.MigError), the simulator its own (simulate.errors)."""

from __future__ import annotations


class ExtenderError(Exception):
    """Base of the extender's errors; the message is meant for a person."""
