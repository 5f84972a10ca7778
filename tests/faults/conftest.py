"""The fault suite imports the collection as ansible_collections.gpufleet.mig (tests/support.py's private tree)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from support import collections_path

collections_path()

REPORTS: list[str] = []


def pytest_terminal_summary(terminalreporter):
    for text in REPORTS:
        terminalreporter.write_sep("-", "host faults survived, per class")
        terminalreporter.write_line(text)
