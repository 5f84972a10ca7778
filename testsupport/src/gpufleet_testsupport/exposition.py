"""Write dcgm-exporter-shaped Prometheus text: the METRICS_FILE format, as the tests and benchmarks fake it.

Metric names, HELP texts and labels are those of NVIDIA's dcgm-exporter (default counters). Whole GPUs
get ``DCGM_FI_DEV_GPU_UTIL`` (percent); MIG instances carry ``GPU_I_PROFILE``/``GPU_I_ID`` and get
``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` (ratio) instead, as DCGM reports no GPU_UTIL per instance.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

H100_MODEL = "NVIDIA H100 80GB HBM3"
H100_FB_MIB = 81559

_HELP = {
    "DCGM_FI_DEV_GPU_UTIL": "GPU utilization (in %).",
    "DCGM_FI_DEV_FB_FREE": "Framebuffer memory free (in MiB).",
    "DCGM_FI_DEV_FB_USED": "Framebuffer memory used (in MiB).",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "Ratio of time the graphics engine is active.",
}


@dataclass(frozen=True, slots=True)
class DeviceLoad:
    """One whole GPU (``mig_profile`` None) or one MIG instance, with its load as the exporter sees it."""

    gpu: int
    util: float  # 0..1
    mem_used_mib: float
    mem_total_mib: float = H100_FB_MIB
    mig_profile: str | None = None  # e.g. "3g.40gb"
    mig_instance: int | None = None  # GPU_I_ID


def label_pairs(node: str, device: DeviceLoad, host_label: str) -> list[tuple[str, str]]:
    """dcgm-exporter's own labels of a device's series, in its order."""
    pairs = [
        ("gpu", str(device.gpu)),
        ("UUID", f"GPU-{zlib.crc32(node.encode()):08x}-0000-4000-8000-{device.gpu:012x}"),
        ("pci_bus_id", f"00000000:{0x18 + device.gpu * 0x10:02X}:00.0"),
        ("device", f"nvidia{device.gpu}"),
        ("modelName", H100_MODEL),
    ]
    if device.mig_profile is not None:
        pairs += [("GPU_I_PROFILE", device.mig_profile), ("GPU_I_ID", str(device.mig_instance or 0))]
    pairs.append((host_label, node))
    pairs.append(("DCGM_FI_DRIVER_VERSION", "550.54.15"))
    return pairs


def _labels(node: str, device: DeviceLoad, host_label: str) -> str:
    return ",".join(f'{key}="{value}"' for key, value in label_pairs(node, device, host_label))


def device_values(device: DeviceLoad) -> dict[str, float]:
    """The series values of one device as the exporter reports them: metric name -> value."""
    free = max(0.0, device.mem_total_mib - device.mem_used_mib)
    util = (
        {"DCGM_FI_DEV_GPU_UTIL": float(round(device.util * 100))}
        if device.mig_profile is None
        else {"DCGM_FI_PROF_GR_ENGINE_ACTIVE": round(device.util, 6)}
    )
    return {**util, "DCGM_FI_DEV_FB_FREE": float(round(free)), "DCGM_FI_DEV_FB_USED": float(round(device.mem_used_mib))}


def remote_write_series(
    nodes: Mapping[str, Iterable[DeviceLoad]],
    timestamp_ms: int,
    host_label: str = "Hostname",
    job: str = "dcgm-exporter",
    namespace: str = "gpufleet-node-agents",
) -> list[tuple[dict[str, str], list[tuple[float, int]]]]:
    """write_series as a list."""
    return list(write_series(nodes.items(), timestamp_ms, host_label, job, namespace))


def write_series(
    nodes: Iterable[tuple[str, Iterable[DeviceLoad]]],
    timestamp_ms: int,
    host_label: str = "Hostname",
    job: str = "dcgm-exporter",
    namespace: str = "gpufleet-node-agents",
) -> Iterator[tuple[dict[str, str], list[tuple[float, int]]]]:
    """The series Prometheus remote-writes after scraping these exporters: the exporter's labels, the scrape's
    target labels (job, instance, namespace, container, endpoint, service; not the exporter's own pod, which the
    decision would count as a pod on the device), one sample each at ``timestamp_ms``."""
    for index, (node, devices) in enumerate(nodes):
        target = {
            "job": job,
            "instance": f"10.{index >> 16 & 255}.{index >> 8 & 255}.{index & 255}:9400",
            "namespace": namespace,
            "container": "exporter",
            "endpoint": "metrics",
            "service": "dcgm-exporter",
        }
        for device in devices:
            labels = dict(label_pairs(node, device, host_label))
            for name, value in device_values(device).items():
                yield {"__name__": name, **labels, **target}, [(value, timestamp_ms)]


def render_exposition(
    nodes: Mapping[str, Iterable[DeviceLoad]],
    host_label: str = "Hostname",
    timestamp_ms: int | None = None,
) -> str:
    """Text exposition of the devices of each node (``timestamp_ms`` appended to every sample when given)."""
    rows: dict[str, list[str]] = {name: [] for name in _HELP}
    suffix = f" {timestamp_ms}" if timestamp_ms is not None else ""
    for node, devices in nodes.items():
        for device in devices:
            labels = _labels(node, device, host_label)
            if device.mig_profile is None:
                percent = round(device.util * 100)
                rows["DCGM_FI_DEV_GPU_UTIL"].append(f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} {percent}{suffix}")
            else:
                rows["DCGM_FI_PROF_GR_ENGINE_ACTIVE"].append(
                    f"DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{labels}}} {device.util:.6f}{suffix}"
                )
            free = max(0.0, device.mem_total_mib - device.mem_used_mib)
            rows["DCGM_FI_DEV_FB_FREE"].append(f"DCGM_FI_DEV_FB_FREE{{{labels}}} {free:.0f}{suffix}")
            rows["DCGM_FI_DEV_FB_USED"].append(f"DCGM_FI_DEV_FB_USED{{{labels}}} {device.mem_used_mib:.0f}{suffix}")
    out: list[str] = []
    for name, lines in rows.items():
        if lines:
            out += [f"# HELP {name} {_HELP[name]}", f"# TYPE {name} gauge", *lines]
    return "\n".join(out) + "\n"
