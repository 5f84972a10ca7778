"""The fault suite imports the collection as ansible_collections.gpufleet.mig (a private tree:
gpufleet_testsupport.collection)."""

from __future__ import annotations

from gpufleet_testsupport.collection import collections_path

collections_path()

REPORTS: list[str] = []


def pytest_terminal_summary(terminalreporter):
    for text in REPORTS:
        terminalreporter.write_sep("-", "host faults survived, per class")
        terminalreporter.write_line(text)
