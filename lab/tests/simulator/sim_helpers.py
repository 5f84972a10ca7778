"""Builders for the simulator tests' small fleets and pods, so each test shows its whole input."""

from __future__ import annotations

from gpufleet_extender.pods import WHOLE_GPU_RESOURCE

from gpufleet_lab.simulate.fleet import Device, Node
from gpufleet_lab.simulate.trace import PodSpec, Schedule


def whole_gpu_node(name: str, gpus: int, tenant: str | None = None) -> Node:
    return Node(name, tenant, tuple(Device(f"gpu{i}", WHOLE_GPU_RESOURCE, 80.0) for i in range(gpus)))


def pod(name: str, arrival: float, util: float | Schedule, duration: float = 1000.0, **fields) -> PodSpec:
    """A 1-GPU pod in namespace "default" using no memory, unless ``fields`` say otherwise."""
    values = {
        "namespace": "default",
        "resource": WHOLE_GPU_RESOURCE,
        "count": 1,
        "mem_gb": Schedule.constant(0.0),
        **fields,
    }
    util_schedule = util if isinstance(util, Schedule) else Schedule.constant(util)
    return PodSpec(name=name, arrival=arrival, duration=duration, util=util_schedule, **values)
