"""dcgm-exporter series -> per-node devices, through the same text the file source and the lab use."""

from __future__ import annotations

import math

import pytest
from gpufleet_testsupport.exposition import DeviceLoad, render_exposition

from gpufleet_extender.metrics_source import parse_exposition
from gpufleet_extender.snapshot import (
    EMPTY_SNAPSHOT,
    FB_FREE,
    FB_USED,
    GPU_UTIL,
    GR_ENGINE_ACTIVE,
    Sample,
    _pod_of,
    build_snapshot,
    keep_unchanged,
    node_from_row,
    node_row,
)

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


def _sample(name, value, timestamp=None, **labels):
    return Sample(name, {"Hostname": "n1", **labels}, value, timestamp)


def test_pod_key_is_namespace_and_name_and_the_renamed_label_wins():
    assert _pod_of({"pod": "a", "namespace": "finnlp"}) == "finnlp/a"
    assert _pod_of({"pod": "a"}) == "/a"  # a pod label without its namespace
    assert _pod_of({"exported_pod": "b", "exported_namespace": "ops", "pod": "exp", "namespace": "mon"}) == "ops/b"
    assert _pod_of({"pod": ""}) == ""
    assert _pod_of({"gpu": "0"}) is None


def test_same_pod_name_in_two_namespaces_is_two_pods():
    mig1 = {"gpu": "0", "GPU_I_ID": "7", "GPU_I_PROFILE": "1g.10gb"}
    samples = [
        _sample(GR_ENGINE_ACTIVE, 0.5, pod="train", namespace="finnlp", **mig1),
        _sample(GR_ENGINE_ACTIVE, 0.5, pod="train", namespace="risk", **mig1),
        _sample(GR_ENGINE_ACTIVE, 0.5, exported_pod="infer", exported_namespace="finnlp", **mig1),
        _sample(GR_ENGINE_ACTIVE, 0.5, exported_pod="infer", exported_namespace="risk", **mig1),
    ]
    device = build_snapshot(samples, ("Hostname",), 0.0, 0.0, 1).nodes["n1"].devices["nvidia.com/mig-1g.10gb"][0]
    assert device.pods == 4


def test_memory_is_unknown_for_an_empty_framebuffer_and_a_ratio_for_any_other():
    samples = [
        _sample(GPU_UTIL, 10.0, gpu="0"),
        _sample(FB_USED, 0.0, gpu="0"),
        _sample(FB_FREE, 0.0, gpu="0"),
        _sample(GPU_UTIL, 10.0, gpu="1"),
        _sample(FB_USED, 1.0, gpu="1"),
        _sample(FB_FREE, 0.0, gpu="1"),
    ]
    devices = build_snapshot(samples, ("Hostname",), 0.0, 0.0, 1).nodes["n1"].devices["nvidia.com/gpu"]
    assert [(d.key, d.mem) for d in devices] == [("0", None), ("1", 1.0)]


def test_skipped_series_do_not_stop_the_ones_after_them():
    samples = [
        Sample("DCGM_FI_DEV_SM_CLOCK", {"gpu": "0", "Hostname": "n1"}, 1980.0),  # not a metric the extender reads
        Sample(GPU_UTIL, {"gpu": "0"}, 50.0),  # no host label
        _sample(GPU_UTIL, 50.0, gpu="0"),
    ]
    snap = build_snapshot(samples, ("Hostname",), 0.0, 0.0, 1)
    assert [d.util for d in snap.nodes["n1"].devices["nvidia.com/gpu"]] == [0.5]


def test_gpus_without_an_index_label_are_keyed_by_uuid():
    samples = [_sample(GPU_UTIL, 20.0, UUID="GPU-4f1d"), _sample(GPU_UTIL, 30.0)]
    devices = build_snapshot(samples, ("Hostname",), 0.0, 0.0, 1).nodes["n1"].devices["nvidia.com/gpu"]
    assert [(d.key, d.util) for d in devices] == [("", 0.3), ("GPU-4f1d", 0.2)]


def test_an_empty_instance_label_is_the_whole_gpu():
    # An empty label value is no label in Prometheus: these series are all of one whole GPU.
    samples = [
        _sample(GPU_UTIL, 40.0, gpu="0"),
        _sample(FB_USED, 25.0, gpu="0", GPU_I_ID="", GPU_I_PROFILE=""),
        _sample(FB_FREE, 75.0, gpu="0", GPU_I_ID=""),
    ]
    node = build_snapshot(samples, ("Hostname",), 0.0, 0.0, 1).nodes["n1"]
    assert list(node.devices) == ["nvidia.com/gpu"]
    assert [(d.key, d.util, d.mem) for d in node.devices["nvidia.com/gpu"]] == [("0", 0.4, 0.25)]


def test_an_instance_without_a_profile_label_is_left_out():
    samples = [_sample(GR_ENGINE_ACTIVE, 0.5, gpu="0", GPU_I_ID="3"), _sample(GPU_UTIL, 10.0, gpu="1")]
    node = build_snapshot(samples, ("Hostname",), 0.0, 0.0, 1).nodes["n1"]
    assert list(node.devices) == ["nvidia.com/gpu"]
    assert [d.key for d in node.devices["nvidia.com/gpu"]] == ["1"]


def test_whole_gpu_without_gpu_util_uses_gr_engine_active():
    samples = [_sample(GR_ENGINE_ACTIVE, 0.625, gpu="0")]
    device = build_snapshot(samples, ("Hostname",), 0.0, 0.0, 1).nodes["n1"].devices["nvidia.com/gpu"][0]
    assert device.util == 0.625


def test_node_sample_time_is_its_newest_sample_whatever_the_order_and_can_be_overridden():
    samples = [_sample(GPU_UTIL, 10.0, 500.0, gpu="0"), _sample(FB_USED, 1.0, 200.0, gpu="0")]
    samples.append(Sample(GPU_UTIL, {"Hostname": "n2", "gpu": "0"}, 10.0, 300.0))
    snap = build_snapshot(samples, ("Hostname",), 0.0, 0.0, 1)
    assert snap.nodes["n1"].name == "n1"
    assert {name: node.sample_time for name, node in snap.nodes.items()} == {"n1": 500.0, "n2": 300.0}
    assert snap.newest_sample == 500.0
    # Prometheus reports the sample time per node apart from the values.
    overridden = build_snapshot(samples, ("Hostname",), 0.0, 0.0, 1, node_sample_times={"n2": 900.0})
    assert {name: node.sample_time for name, node in overridden.nodes.items()} == {"n1": 500.0, "n2": 900.0}
    assert overridden.newest_sample == 900.0


def test_age_is_that_of_the_newest_sample_never_negative_and_infinite_without_any():
    snap = build_snapshot([_sample(GPU_UTIL, 10.0, 500.0, gpu="0")], ("Hostname",), 0.0, 0.0, 1)
    assert snap.age(512.5) == 12.5
    assert snap.age(400.0) == 0.0  # a clock behind the exporter's
    assert EMPTY_SNAPSHOT.age(512.5) == math.inf


def test_node_rows_round_trip_to_equal_metrics():
    fleet = {"n1": [*gpus(0.1), *mig(1, "3g.40gb", 0.5, 0.75)]}
    node = snapshot_of(fleet).nodes["n1"]
    row = node_row(node)
    assert row[0] == "n1" and row[1] == 1000.0
    assert dict(row[2])["nvidia.com/gpu"] == (("0", pytest.approx(0.1), node.devices["nvidia.com/gpu"][0].mem, None),)
    back = node_from_row(row)
    assert back == node
    assert dict(back.devices) == dict(node.devices)


def test_keep_unchanged_reuses_the_previous_object_of_equal_nodes_only():
    before = build_snapshot(
        [_sample(GPU_UTIL, 10.0, gpu="0"), _sample(GPU_UTIL, 10.0, Hostname="n2", gpu="0")], ("Hostname",), 0.0, 0.0, 1
    )
    after = build_snapshot(
        [
            _sample(GPU_UTIL, 10.0, gpu="0"),
            _sample(GPU_UTIL, 90.0, Hostname="n2", gpu="0"),
            _sample(GPU_UTIL, 10.0, Hostname="n3", gpu="0"),
        ],
        ("Hostname",),
        0.0,
        0.0,
        2,
    )
    kept = keep_unchanged(after.nodes, before)
    assert kept["n1"] is before.nodes["n1"]
    assert kept["n2"] is after.nodes["n2"] and kept["n2"] != before.nodes["n2"]
    assert kept["n3"] is after.nodes["n3"]
