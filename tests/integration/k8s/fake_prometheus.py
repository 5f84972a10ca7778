"""Re-export for test_scheduling_faults.py alone (merged from another branch):
it moved to gpufleet_testsupport.prometheus; remove once that test imports it from there."""

from gpufleet_testsupport.prometheus import PROMETHEUS

__all__ = ["PROMETHEUS"]
