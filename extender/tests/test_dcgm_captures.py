"""The metrics parser on dcgm-exporter text in the exporter's own layout, not the project's renderer.

tests/data/dcgm-exporter-{Hostname,hostname}.prom follow dcgm-exporter's GPU template (rendermetrics): labels
gpu, UUID, pci_bus_id, device, modelName, then GPU_I_PROFILE/GPU_I_ID on MIG instances, then the host label
(`Hostname` up to 4.5.3-4.8.2, `hostname` after), then label fields (DCGM_FI_DRIVER_VERSION) and the pod
attributes (container, namespace, pod) in key order; integers as `%d`, floats as `%f`. Each file holds the
default counters of one H100 node: GPU 0 split into two 3g.40gb instances (GPU instance IDs 1 and 2; DCGM has no
GPU_UTIL for a split GPU, but profiling fields such as GR_ENGINE_ACTIVE still come for the parent), GPU 1 whole.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from gpufleet_testsupport.exposition import DeviceLoad, render_exposition

from gpufleet_extender.metrics_source import NO_DCGM_SERIES, load_file
from gpufleet_extender.snapshot import DeviceMetrics

DATA = Path(__file__).parent / "data"
BOTH = ("Hostname", "hostname")  # the extender's default NODE_NAME_LABELS
CAPTURES = {
    "Hostname": ("dcgm-exporter-Hostname.prom", "hk-gpu-01"),
    "hostname": ("dcgm-exporter-hostname.prom", "hk-gpu-02"),
}
EXPECTED = {
    # GPU_UTIL 100 %; FB 81000 used of 81000 + 59; one pod named in the pod attributes (time-slicing counts them)
    "nvidia.com/gpu": (DeviceMetrics("1", 1.0, 81000 / 81059, pods=1),),
    # GR_ENGINE_ACTIVE per instance; FB used of used + free per instance
    "nvidia.com/mig-3g.40gb": (
        DeviceMetrics("0/1", 0.8125, 20000 / 40096, pods=1),
        DeviceMetrics("0/2", 0.0, 13 / 40096),
    ),
}


def without_pods(nodes):
    return {
        name: replace(
            node,
            devices={res: tuple(replace(d, pods=None) for d in devices) for res, devices in node.devices.items()},
        )
        for name, node in nodes.items()
    }


def load(path: Path, labels=BOTH):
    return load_file(path, labels, default_time=1000.0, taken_at=1001.0, version=7)


@pytest.mark.parametrize("spelling", sorted(CAPTURES))
def test_capture_reads_as_one_whole_gpu_and_two_instances(spelling):
    name, node = CAPTURES[spelling]
    snapshot, report = load(DATA / name)
    assert list(snapshot.nodes) == [node]
    metrics = snapshot.nodes[node]
    assert dict(metrics.devices) == EXPECTED  # the split GPU 0 itself is no whole GPU, whatever it reports
    assert metrics.sample_time == 1000.0 and snapshot.taken_at == 1001.0 and snapshot.version == 7
    assert report.faults == {} and report.notes == []  # nothing in a real capture is out of range or doubled


@pytest.mark.parametrize(("spelling", "other"), [("Hostname", "hostname"), ("hostname", "Hostname")])
def test_only_the_configured_host_label_names_the_node(spelling, other):
    name, _node = CAPTURES[spelling]
    snapshot, report = load(DATA / name, labels=(other,))
    assert snapshot.nodes == {}
    assert report.faults == {NO_DCGM_SERIES: 1}


@pytest.mark.parametrize("spelling", sorted(CAPTURES))
def test_the_project_renderer_reads_the_same_as_the_capture(tmp_path, spelling):
    # The fake exporter the other tests use must not drift from the real layout: same devices, same figures.
    name, node = CAPTURES[spelling]
    fleet = {
        node: [
            DeviceLoad(1, 1.0, 81000, 81059),
            DeviceLoad(0, 0.8125, 20000, 40096, "3g.40gb", 1),
            DeviceLoad(0, 0.0, 13, 40096, "3g.40gb", 2),
        ]
    }
    rendered = tmp_path / "rendered.prom"
    rendered.write_text(render_exposition(fleet, host_label=spelling))
    # The renderer writes no pod attributes (kubelet's pod mapping): the captures' pod counts are set aside here,
    # test_capture_reads_as_one_whole_gpu_and_two_instances checks them.
    assert load(rendered)[0].nodes == without_pods(load(DATA / name)[0].nodes)
