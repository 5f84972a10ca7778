"""The extender's own test helpers: devices and dcgm-exporter metrics files, settings, request bodies (pods and
ExtenderArgs as kube-scheduler sends them: gpufleet_testsupport.scheduler_requests)."""

from __future__ import annotations

import json
from pathlib import Path

from gpufleet_testsupport.exposition import DeviceLoad, render_exposition

from gpufleet_extender.config import Settings, load_settings


def gpus(*utils: float, mem_used_mib: float = 8000.0) -> list[DeviceLoad]:
    """Whole GPUs 0..n-1 with the given utilisations (0..1)."""
    return [DeviceLoad(i, util, mem_used_mib) for i, util in enumerate(utils)]


def mig(gpu: int, profile: str, *utils: float, mem_used_mib=1000.0, total=40960.0, first_id=1) -> list[DeviceLoad]:
    """MIG instances of one profile on GPU ``gpu``; GPU_I_IDs from ``first_id`` (unique per GPU, as in DCGM)."""
    return [
        DeviceLoad(gpu, util, mem_used_mib, total, profile, instance)
        for instance, util in enumerate(utils, start=first_id)
    ]


def write_metrics(path: Path, fleet: dict, host_label: str = "Hostname", timestamp_ms: int | None = None) -> Path:
    path.write_text(render_exposition(fleet, host_label=host_label, timestamp_ms=timestamp_ms))
    return path


def file_settings(metrics_file: Path, **overrides) -> Settings:
    return load_settings(METRICS_SOURCE="file", METRICS_FILE=str(metrics_file), KUBE_API="off", **overrides)


def body(obj) -> bytes:
    return json.dumps(obj).encode()
