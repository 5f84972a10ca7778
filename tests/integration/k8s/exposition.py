"""Re-export for test_scheduling_faults.py alone (merged from another branch):
it moved to gpufleet_testsupport.exposition; remove once that test imports it from there."""

from gpufleet_testsupport.exposition import render_exposition

__all__ = ["render_exposition"]
