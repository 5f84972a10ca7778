"""The host's layout check: drift counted per GPU against the declared layout, published as a textfile."""

from __future__ import annotations

import json

import pytest
from _helpers import layout, new_sim
from ansible_collections.gpufleet.mig.plugins.module_utils import boot_apply, layout_check
from ansible_collections.gpufleet.mig.plugins.module_utils.nvml_sim import SimulatedNvml
from prometheus_client.parser import text_string_to_metric_families

DECLARED = [
    {"devices": [0], "mig_enabled": True, "mig_devices": {"3g.40gb": 2}},
    {"devices": [1], "mig_enabled": True, "mig_devices": {"2g.20gb": 3, "1g.10gb": 1}},
    {"devices": [2], "mig_enabled": False},
]


def _run(tmp_path, sim, config=None) -> tuple[int, dict[tuple[str, tuple], float]]:
    request = tmp_path / "mig-layout.json"
    request.write_text(json.dumps({"config": config or DECLARED}))
    textfile = tmp_path / "gpufleet_mig_layout.prom"
    code = layout_check.main(
        [
            "--config",
            str(request),
            "--textfile",
            str(textfile),
            "--node",
            "hk-gpu-11",
            "--pool",
            "imagegen",
            "--nvml-sim-state",
            sim.path,
        ]
    )
    samples = {}
    for family in text_string_to_metric_families(textfile.read_text()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return code, samples


def _value(samples, name, **labels) -> float | None:
    return samples.get((name, tuple(sorted({"node": "hk-gpu-11", "pool": "imagegen", **labels}.items()))))


def _applied(tmp_path):
    sim = new_sim(tmp_path, gpus=3)
    request = tmp_path / "apply.json"
    request.write_text(json.dumps({"config": DECLARED}))
    assert boot_apply.main(["--config", str(request), "--nvml-sim-state", sim.path]) == 0
    return sim


def test_no_drift_on_the_declared_layout_and_every_gpu_after_a_reboot_without_the_boot_unit(tmp_path, capsys):
    sim = _applied(tmp_path)
    code, samples = _run(tmp_path, sim)
    assert code == 0
    assert _value(samples, "gpufleet_mig_layout_drift") == 0
    assert _value(samples, "gpufleet_mig_layout_check_success") == 1
    assert _value(samples, "gpufleet_mig_node_info") == 1
    for source in ("declared", "actual"):
        assert _value(samples, "gpufleet_mig_layout_instances", gpu="0", profile="3g.40gb", source=source) == 2
        assert _value(samples, "gpufleet_mig_layout_instances", gpu="1", profile="2g.20gb", source=source) == 3
        assert _value(samples, "gpufleet_mig_layout_instances", gpu="2", profile="whole", source=source) == 1

    SimulatedNvml(sim.path).reboot()  # instances gone; MIG mode stays on the two MIG GPUs
    capsys.readouterr()
    code, samples = _run(tmp_path, sim)
    assert code == 0
    assert _value(samples, "gpufleet_mig_layout_drift") == 2
    assert _value(samples, "gpufleet_mig_layout_instances", gpu="0", profile="3g.40gb", source="actual") is None
    assert _value(samples, "gpufleet_mig_layout_instances", gpu="0", profile="3g.40gb", source="declared") == 2
    assert capsys.readouterr().out == "MIG layout checked on 3 GPU(s); drifted: 0, 1\n"
    assert SimulatedNvml(sim.path).mig_devices(0) == []  # the check wrote nothing


def test_a_hand_made_change_on_one_gpu_is_one_drifted_gpu(tmp_path):
    sim = _applied(tmp_path)
    gpu = SimulatedNvml(sim.path)
    victim = gpu.gpu_instances(1, [p.id for p in gpu.gpu_instance_profiles(1) if p.name == "1g.10gb"])[0]
    for ci_id, _slices in victim.compute_instances:
        gpu.destroy_compute_instance(1, victim.gi_id, ci_id)
    gpu.destroy_gpu_instance(1, victim.gi_id)
    code, samples = _run(tmp_path, sim)
    assert code == 0
    assert _value(samples, "gpufleet_mig_layout_drift") == 1
    assert _value(samples, "gpufleet_mig_layout_instances", gpu="1", profile="1g.10gb", source="actual") is None
    assert _value(samples, "gpufleet_mig_layout_instances", gpu="1", profile="1g.10gb", source="declared") == 1


def test_a_gpu_that_cannot_be_read_is_a_failed_check_not_a_drift(tmp_path, capsys):
    sim = _applied(tmp_path)
    SimulatedNvml(sim.path).add_fault("nvmlDeviceGetGpuInstances", "GPU_IS_LOST", gpu=1, times=5)
    code, samples = _run(tmp_path, sim)
    assert code == layout_check.EXIT_FAILED
    assert _value(samples, "gpufleet_mig_layout_check_success") == 0
    assert _value(samples, "gpufleet_mig_layout_drift") is None  # unknown, not 0
    assert _value(samples, "gpufleet_mig_layout_check_timestamp_seconds") > 0
    err = capsys.readouterr().err
    assert err.startswith("gpufleet-mig-layout-check: ") and "GPU_IS_LOST" in err and err.count("\n") == 1


@pytest.mark.parametrize(
    ("config", "message"),
    [([{"devices": "all", "mig_enabled": True, "mig_devices": {"5g.50gb": 1}}], "unknown MIG profile(s) 5g.50gb")],
)
def test_a_bad_declared_layout_is_a_failed_check(tmp_path, capsys, config, message):
    sim = new_sim(tmp_path, gpus=1)
    code, samples = _run(tmp_path, sim, config)
    assert code == layout_check.EXIT_FAILED
    assert _value(samples, "gpufleet_mig_layout_check_success") == 0
    assert message in capsys.readouterr().err


def test_a_missing_textfile_directory_is_bad_input_and_writes_nothing(tmp_path, capsys):
    sim = new_sim(tmp_path, gpus=1)
    request = tmp_path / "mig-layout.json"
    request.write_text(json.dumps({"config": layout({"1g.10gb": 7})}))
    missing = str(tmp_path / "nope" / "x.prom")
    code = layout_check.main(
        ["--config", str(request), "--textfile", missing, "--node", "n", "--nvml-sim-state", sim.path]
    )
    assert code == layout_check.EXIT_BAD_INPUT
    assert "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "nope").exists()


def test_label_values_are_escaped_and_no_temporary_file_is_left(tmp_path):
    text = layout_check.exposition('we"ird\\node', "pool", [], 1.5)
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["gpufleet_mig_node_info"].samples[0].labels["node"] == 'we"ird\\node'
    target = tmp_path / "out.prom"
    layout_check.write_atomically(str(target), text)
    layout_check.write_atomically(str(target), text)
    assert [p.name for p in tmp_path.iterdir()] == ["out.prom"]
    assert oct(target.stat().st_mode & 0o777) == "0o644"
