"""The preflight's verdicts on what the real tools answer (nvidia-smi's CSV, kubelet --version, runtime configs)."""

from __future__ import annotations

import pytest
import yaml
from _helpers import REPO
from ansible_collections.gpufleet.mig.plugins.module_utils import nvidia_smi_sim, preflight

H100 = "NVIDIA H100 80GB HBM3"
# What nvidia-ctk runtime configure writes for containerd 2.x (and the 1.x table name).
CONTAINERD_2 = (
    '[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia]\n  runtime_type = "io.containerd.runc.v2"\n'
)
CONTAINERD_1 = '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes."nvidia"]\n'
CRIO = '[crio.runtime.runtimes.nvidia]\nruntime_path = "/usr/bin/nvidia-container-runtime"\n'


def smi(*rows: str, rc: int = 0) -> dict:
    return {"rc": rc, "stdout": "".join(row + "\n" for row in rows), "stderr": ""}


def healthy(**overrides) -> dict:
    facts = {
        "nvidia_smi": smi(f"0, {H100}, 550.90.07, Enabled, Enabled", f"1, {H100}, 550.90.07, Enabled, Disabled"),
        "needs_mig": True,
        "nvswitches": 4,
        "fabricmanager": "running",
        "toolkit_found": True,
        "toolkit_searched": ["/usr/bin/nvidia-container-runtime"],
        "runtime": "containerd",
        "runtime_configs": {"/etc/containerd/config.toml": CONTAINERD_2},
        "kubelet": {"rc": 0, "stdout": "Kubernetes v1.36.3\n"},
        "kubelet_min_version": "1.29",
        "device_plugin_dir": "/var/lib/kubelet/device-plugins",
        "device_plugin_dir_exists": True,
    }
    return {**facts, **overrides}


def test_a_ready_host_has_no_problem():
    assert preflight.problems(healthy()) == []
    assert preflight.problems(healthy(runtime_configs={"/etc/containerd/config.toml": CONTAINERD_1})) == []
    assert preflight.problems(healthy(runtime="cri-o", runtime_configs={"/etc/crio/crio.conf": CRIO})) == []
    assert preflight.problems(healthy(nvswitches=0, fabricmanager="not installed")) == []  # PCIe: no fabric


@pytest.mark.parametrize(
    ("overrides", "found", "needed"),
    [
        (
            {"nvidia_smi": smi(nvidia_smi_sim.NO_DRIVER, rc=9)},
            "found no working NVIDIA driver (nvidia-smi exited 9: NVIDIA-SMI has failed",
            "needed: the NVIDIA datacenter driver installed and loaded",
        ),
        (
            {"nvidia_smi": {"rc": 2, "stdout": "", "stderr": "", "msg": "[Errno 2] No such file or directory"}},
            "found no working NVIDIA driver (nvidia-smi exited 2: [Errno 2] No such file",
            "needed: the NVIDIA datacenter driver",
        ),
        (
            {"nvidia_smi": smi(f"0, {H100}, 470.82.01, Enabled, Enabled")},
            f"found driver 470.82.01 on {H100}",
            f"needed: driver branch 525 or newer, the first with MIG on {H100}",
        ),
        (
            {"nvidia_smi": smi("0, NVIDIA H200, 535.183.01, Enabled, Enabled")},
            "found driver 535.183.01 on NVIDIA H200",
            "needed: driver branch 550 or newer",
        ),
        (
            {"nvidia_smi": smi(f"0, {H100}, 550.90.07, Disabled, Enabled", f"3, {H100}, 550.90.07, Disabled, Enabled")},
            "found persistence mode off on GPUs 0, 3",
            "needed: nvidia-persistenced running",
        ),
        (
            {"nvswitches": 4, "fabricmanager": "stopped"},
            "found 4 NVSwitch device(s) and nvidia-fabricmanager stopped",
            "needed: nvidia-fabricmanager of the driver's version running",
        ),
        (
            {"nvidia_smi": smi(f"0, {H100}, 550.90.07, Enabled, Enabled", "1, NVIDIA L40S, 550.90.07, Enabled, [N/A]")},
            "found GPU 1 (NVIDIA L40S) without MIG support",
            "needed: MIG-capable GPUs for the node's declared layout",
        ),
        ({"toolkit_found": False}, "found no NVIDIA container toolkit", "needed: nvidia-container-toolkit installed"),
        (
            {"runtime_configs": {"/etc/containerd/config.toml": "version = 3\n"}},
            "found no NVIDIA runtime handler for containerd in /etc/containerd/config.toml",
            "needed: nvidia-ctk runtime configure --runtime=containerd, then restart containerd",
        ),
        (
            {"kubelet": {"rc": 0, "stdout": "Kubernetes v1.28.15\n"}},
            "found kubelet v1.28.15",
            "needed: kubelet v1.29 or newer",
        ),
        (
            {"kubelet": {"rc": 2, "stdout": "", "msg": "[Errno 2] No such file or directory: b'kubelet'"}},
            "found no kubelet ([Errno 2] No such file or directory",
            "needed: kubelet v1.29 or newer",
        ),
        (
            {"device_plugin_dir_exists": False},
            "found no /var/lib/kubelet/device-plugins",
            "needed: the kubelet's device plugin socket directory",
        ),
    ],
    ids=[
        "no-driver",
        "no-nvidia-smi",
        "old-driver",
        "h200-branch",
        "persistence",
        "fabric-manager",
        "not-mig-capable",
        "toolkit",
        "runtime-handler",
        "kubelet-old",
        "kubelet-missing",
        "device-plugin-dir",
    ],
)
def test_each_missing_prerequisite_is_one_problem_with_what_was_found_and_what_is_needed(overrides, found, needed):
    (problem,) = preflight.problems(healthy(**overrides))
    assert problem.startswith(found), problem
    assert needed in problem


def test_only_the_named_checks_run_and_a_layout_without_mig_accepts_any_gpu():
    broken = healthy(toolkit_found=False, kubelet={"rc": 2, "stdout": ""}, device_plugin_dir_exists=False)
    assert preflight.problems({**broken, "checks": ["driver", "persistence", "fabric_manager", "mig"]}) == []
    not_mig = healthy(nvidia_smi=smi("0, NVIDIA L40S, 550.90.07, Enabled, [N/A]"), needs_mig=False)
    assert preflight.problems(not_mig) == []
    with pytest.raises(ValueError, match="unknown preflight check"):
        preflight.problems({**healthy(), "checks": ["driver", "gpu_burn"]})
    (garbled,) = preflight.problems(healthy(nvidia_smi=smi("0, H100")))
    assert garbled.startswith("found an nvidia-smi answer this check cannot read")


def test_the_role_queries_the_fields_the_checks_read():
    role_vars = yaml.safe_load((REPO / "roles" / "preflight" / "vars" / "main.yml").read_text())
    assert role_vars["preflight_query"] == preflight.QUERY
    assert role_vars["preflight_known_checks"] == list(preflight.CHECKS)


def test_the_simulated_nvidia_smi_answers_as_the_real_one(tmp_path, capsys):
    from ansible_collections.gpufleet.mig.plugins.module_utils.nvml_sim import SimulatedNvml

    state = tmp_path / "nvml.json"
    sim = SimulatedNvml(str(state))  # a fresh host: 8 x H100, MIG off
    sim.state["gpus"][2]["persistence_mode"] = False
    sim.state["gpus"][3]["mig_capable"] = False
    sim._save()
    args = ["--state", str(state), f"--query-gpu={preflight.QUERY}", "--format=csv,noheader"]
    assert nvidia_smi_sim.main(args) == 0
    gpus = preflight.parse_query(capsys.readouterr().out)
    assert [(g.index, g.name, g.driver_version) for g in gpus[:1]] == [(0, H100, "550.90.07")]
    assert [g.persistence_mode for g in gpus[1:4]] == ["Enabled", "Disabled", "Enabled"]
    assert [g.mig_mode for g in gpus[2:4]] == ["Disabled", "[N/A]"]
    sim.state["driver_version"] = None
    sim._save()
    assert nvidia_smi_sim.main(args) == nvidia_smi_sim.EXIT_NO_DRIVER
    assert capsys.readouterr().out == nvidia_smi_sim.NO_DRIVER + "\n"
    sim.state["driver_version"] = "535.183.01"
    sim._save()
    assert nvidia_smi_sim.main([*args[:2], "--query-gpu=index,clocks.sm", "--format=csv,noheader"]) == 2
    assert 'Field "clocks.sm" is not a valid field to query.' in capsys.readouterr().err
