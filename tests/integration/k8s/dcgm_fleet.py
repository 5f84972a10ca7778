"""Re-export for test_scheduling_faults.py alone (merged from another branch):
it moved to gpufleet_testsupport.dcgm_fleet; remove once that test imports it from there."""

from gpufleet_testsupport.dcgm_fleet import EXPORTER_NAMESPACE, Fleet, FleetPrometheus

__all__ = ["EXPORTER_NAMESPACE", "Fleet", "FleetPrometheus"]
