"""One MIG change at a time on a host: the nvidia_mig module (a playbook) and the boot unit take this lock.

An advisory `flock` on one file per host. The kernel drops it when its holder's process ends, however it ends
(SIGKILL and power loss included), so a dead run never leaves the host locked. The holder writes who it is into the
file, so the run that waits, or gives up after `timeout` seconds, can say what it is waiting for.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO

from .exceptions import MigError

# The host's lock when the real GPUs are driven; a simulated host's lock lies beside its state file, so that the
# simulated hosts of one lab machine do not wait for each other.
HOST_LOCK = "/run/lock/gpufleet-mig.lock"
POLL_SECONDS = 0.2


class LockTimeoutError(MigError):
    """Another MIG change held the host's lock for longer than the caller would wait (raised before any write)."""


def lock_path(sim_state: str | None) -> str:
    return f"{sim_state}.lock" if sim_state else HOST_LOCK


def _holder(handle: TextIO) -> str:
    handle.seek(0)
    text = handle.read().strip()
    return text or "a process that has not written its name yet"


@contextmanager
def mig_change_lock(
    path: str, who: str, timeout: float, on_wait: Callable[[str], None] | None = None
) -> Iterator[float]:
    """Hold the host's MIG lock for the body; yields the seconds waited for it. Waits up to `timeout` seconds for a
    holder to finish (0: do not wait), then raises LockTimeoutError naming the holder."""
    directory = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(directory, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise MigError(f"cannot open the MIG lock file {path}: {exc.strerror}") from None
    with os.fdopen(fd, "r+", encoding="utf-8") as handle:
        started = time.monotonic()
        told = False
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                waited = time.monotonic() - started
                holder = _holder(handle)
                if waited >= timeout:
                    raise LockTimeoutError(
                        f"another MIG change is running on this host ({holder}); gave up after waiting {waited:.0f} s "
                        f"for {path}. Nothing was changed: run again once it has finished (or raise the lock timeout)"
                    ) from None
                if on_wait is not None and not told:
                    on_wait(f"waiting for another MIG change on this host to finish ({holder})")
                    told = True
                time.sleep(POLL_SECONDS)
        waited = time.monotonic() - started
        handle.seek(0)
        handle.truncate()
        handle.write(f"{who}, PID {os.getpid()}, since {time.strftime('%Y-%m-%dT%H:%M:%S%z')}\n")
        handle.flush()
        try:
            yield waited
        finally:
            handle.seek(0)
            handle.truncate()
            handle.flush()
            fcntl.flock(handle, fcntl.LOCK_UN)
