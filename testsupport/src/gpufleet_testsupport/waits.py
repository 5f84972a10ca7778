"""One wait: poll until something holds."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import httpx
import pytest

T = TypeVar("T")

# A server still starting: these count as "not yet", not as a failure (the last one is named if time runs out).
NOT_YET: tuple[type[BaseException], ...] = (OSError, httpx.HTTPError)


def wait_for(
    condition: Callable[[], T],
    timeout: float = 30,
    interval: float = 0.2,
    what: str = "condition",
    not_yet: tuple[type[BaseException], ...] = NOT_YET,
) -> T:
    """Poll `condition()` until it returns something truthy; return that, or fail the test naming `what` (and the
    last value or `not_yet` error seen)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            last: object = condition()
            if last:
                return last  # type: ignore[return-value]
        except not_yet as exc:
            last = exc
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")
        time.sleep(interval)
