"""dcgm-exporter series -> per-node devices, through the same text the file source and the lab use."""

from __future__ import annotations

import pytest
from exposition import DeviceLoad, render_exposition

from gpufleet_extender.metrics_source import parse_exposition
from gpufleet_extender.snapshot import Sample, build_snapshot

from extender_helpers import gpus, mig


def snapshot_of(fleet, host_label="Hostname", labels=("Hostname", "hostname"), timestamp_ms=None):
    samples = list(parse_exposition(render_exposition(fleet, host_label=host_label, timestamp_ms=timestamp_ms)))
    return build_snapshot(samples, labels, default_time=1000.0, taken_at=1001.0, version=3)


def test_whole_gpus_util_percent_and_memory_ratio():
    snap = snapshot_of({"n1": [DeviceLoad(0, 0.25, 20389.75, 81559.0), DeviceLoad(1, 1.0, 0.0, 81559.0)]})
    devices = snap.nodes["n1"].devices["nvidia.com/gpu"]
    assert [d.key for d in devices] == ["0", "1"]
    assert devices[0].util == pytest.approx(0.25)
    assert devices[0].mem == pytest.approx(20390 / 81559)  # FB_USED / (FB_USED + FB_FREE), MiB rounded
    assert devices[1].util == pytest.approx(1.0) and devices[1].mem == 0.0
    assert snap.version == 3 and snap.taken_at == 1001.0


def test_mig_instances_use_gr_engine_active_and_leave_their_gpu_out():
    fleet = {"n1": [*gpus(0.1), *mig(1, "3g.40gb", 0.5, 0.75), *mig(1, "1g.10gb", 0.2, total=10240.0, first_id=5)]}
    snap = snapshot_of(fleet)
    node = snap.nodes["n1"]
    assert set(node.devices) == {"nvidia.com/gpu", "nvidia.com/mig-3g.40gb", "nvidia.com/mig-1g.10gb"}
    assert [d.key for d in node.devices["nvidia.com/gpu"]] == ["0"]
    assert [d.util for d in node.devices["nvidia.com/mig-3g.40gb"]] == pytest.approx([0.5, 0.75])


def test_split_gpu_reporting_gpu_util_is_not_a_whole_gpu():
    # Some exporters still report the parent GPU of MIG instances; the device plugin cannot hand it out.
    samples = [
        Sample("DCGM_FI_DEV_GPU_UTIL", {"gpu": "0", "Hostname": "n1"}, 3.0),
        Sample(
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
            {"gpu": "0", "GPU_I_ID": "1", "GPU_I_PROFILE": "7g.80gb", "Hostname": "n1"},
            0.4,
        ),
    ]
    snap = build_snapshot(samples, ("Hostname",), 0.0, 0.0, 1)
    assert set(snap.nodes["n1"].devices) == {"nvidia.com/mig-7g.80gb"}


@pytest.mark.parametrize("host_label", ["Hostname", "hostname"])
def test_both_host_label_spellings(host_label):
    snap = snapshot_of({"n1": gpus(0.5)}, host_label=host_label)
    assert list(snap.nodes) == ["n1"]


def test_series_without_a_host_label_are_ignored():
    snap = snapshot_of({"n1": gpus(0.5)}, host_label="instance", labels=("Hostname",))
    assert snap.nodes == {}


def test_missing_fb_metrics_leave_memory_unknown():
    samples = [Sample("DCGM_FI_DEV_GPU_UTIL", {"gpu": "0", "Hostname": "n1"}, 50.0)]
    device = build_snapshot(samples, ("Hostname",), 0.0, 0.0, 1).nodes["n1"].devices["nvidia.com/gpu"][0]
    assert device.util == 0.5 and device.mem is None


def test_sample_time_is_the_newest_sample_or_the_default():
    assert snapshot_of({"n1": gpus(0.5)}).nodes["n1"].sample_time == 1000.0
    stamped = snapshot_of({"n1": gpus(0.5)}, timestamp_ms=1_700_000_000_500)
    assert stamped.nodes["n1"].sample_time == pytest.approx(1_700_000_000.5)


def test_out_of_range_values_are_clamped_and_nan_dropped():
    samples = [
        Sample("DCGM_FI_DEV_GPU_UTIL", {"gpu": "0", "Hostname": "n1"}, 140.0),
        Sample("DCGM_FI_DEV_GPU_UTIL", {"gpu": "1", "Hostname": "n1"}, float("nan")),
    ]
    devices = build_snapshot(samples, ("Hostname",), 0.0, 0.0, 1).nodes["n1"].devices["nvidia.com/gpu"]
    assert [(d.key, d.util) for d in devices] == [("0", 1.0)]


def test_pods_per_device_come_from_the_exporters_pod_mapping():
    # Time-slicing: dcgm-exporter repeats a device's series for each pod sharing it; Prometheus may rename the
    # label to exported_pod (its own pod label names the exporter).
    mig1 = {"gpu": "0", "GPU_I_ID": "7", "GPU_I_PROFILE": "1g.10gb", "Hostname": "n1"}
    mig2 = {"gpu": "0", "GPU_I_ID": "8", "GPU_I_PROFILE": "1g.10gb", "Hostname": "n1"}
    samples = [
        Sample("DCGM_FI_PROF_GR_ENGINE_ACTIVE", {**mig1, "pod": "a", "namespace": "finnlp"}, 0.5),
        Sample("DCGM_FI_PROF_GR_ENGINE_ACTIVE", {**mig1, "pod": "b", "namespace": "finnlp"}, 0.5),
        Sample("DCGM_FI_DEV_FB_USED", {**mig1, "pod": "b", "namespace": "finnlp"}, 10.0),
        Sample("DCGM_FI_PROF_GR_ENGINE_ACTIVE", {**mig2, "pod": "x", "exported_pod": "", "namespace": "ops"}, 0.0),
    ]
    devices = build_snapshot(samples, ("Hostname",), 0.0, 0.0, 1).nodes["n1"].devices["nvidia.com/mig-1g.10gb"]
    assert [(d.key, d.pods) for d in devices] == [("0/7", 2), ("0/8", 0)]
    plain = [Sample("DCGM_FI_PROF_GR_ENGINE_ACTIVE", mig1, 0.5)]
    device = build_snapshot(plain, ("Hostname",), 0.0, 0.0, 1).nodes["n1"].devices["nvidia.com/mig-1g.10gb"][0]
    assert device.pods is None
