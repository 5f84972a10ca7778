"""GPU-load-aware, MIG-aware kube-scheduler extender for gpufleet.mig fleets."""

__version__ = "0.1.0"
