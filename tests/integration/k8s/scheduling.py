"""Re-export for test_scheduling_faults.py alone (merged from another branch):
it moved to gpufleet_testsupport.scheduling; remove once that test imports it from there."""

from gpufleet_testsupport.extender import start_extender
from gpufleet_testsupport.processes import stop_process
from gpufleet_testsupport.scheduling import (
    MIG_RESOURCE,
    create_nodes,
    create_pods,
    gpu_pod,
    mig_devices,
    rendered_scheduler_config,
    write_mig_metrics,
)

__all__ = [
    "MIG_RESOURCE",
    "create_nodes",
    "create_pods",
    "gpu_pod",
    "mig_devices",
    "rendered_scheduler_config",
    "start_extender",
    "stop_process",
    "write_mig_metrics",
]
