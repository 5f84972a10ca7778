"""Re-export for test_scheduling_faults.py alone (merged from another branch):
it moved to gpufleet_testsupport.tcp_proxy; remove once that test imports it from there."""

from gpufleet_testsupport.tcp_proxy import RoundRobinProxy

__all__ = ["RoundRobinProxy"]
