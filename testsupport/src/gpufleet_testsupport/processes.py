"""Stopping a process a test started, by its PID."""

from __future__ import annotations

import subprocess


def stop_process(process: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL after 10 s; waited for either way."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
