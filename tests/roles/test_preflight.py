"""playbooks/preflight.yml: every missing prerequisite refuses its host, naming the host, what was found and what
is needed; read-only (its refusals are the same in check mode); in the lab the NVML simulator answers nvidia-smi,
and site.yml stops at a refused host before anything is configured."""

from __future__ import annotations

import json
import re
import sys

from conftest import REPO
from gpufleet_testsupport.collection import collections_path, run_playbook, write_inventory

COLLECTIONS_PATH = collections_path()  # makes ansible_collections.gpufleet.mig importable

from ansible_collections.gpufleet.mig.plugins.module_utils.nvml_sim import new_state  # noqa: E402

H100 = "NVIDIA H100 80GB HBM3"
CONTAINERD_NVIDIA = '[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia]\n'
MIG_LAYOUT = [{"devices": "all", "mig_enabled": True, "mig_devices": {"3g.40gb": 2}}]
SMI_SIM = "ansible_collections.gpufleet.mig.plugins.module_utils.nvidia_smi_sim"


def _host(tmp_path, name: str, *, state: dict | None = None, kubelet="v1.36.3", **broken) -> dict:
    """A GPU host's tree under tmp_path/name: simulated GPUs, toolkit, containerd config, kubelet, plugin dir."""
    root = tmp_path / name
    (root / "usr/bin").mkdir(parents=True)
    (root / "etc/containerd").mkdir(parents=True)
    sim = new_state(gpus=2, product=H100)
    for key, value in (state or {}).items():
        if key == "gpu1":
            sim["gpus"][1].update(value)
        else:
            sim[key] = value
    (root / "nvml.json").write_text(json.dumps(sim))
    if not broken.get("no_toolkit"):
        (root / "usr/bin/nvidia-ctk").write_text("")
    config = "version = 3\n" + ("" if broken.get("no_handler") else CONTAINERD_NVIDIA)
    (root / "etc/containerd/config.toml").write_text(config)
    kubelet_bin = root / "usr/bin/kubelet"
    kubelet_bin.write_text(f"#!/bin/sh\necho 'Kubernetes {kubelet}'\n")  # the line kubelet --version prints
    kubelet_bin.chmod(0o755)
    if not broken.get("no_plugin_dir"):
        (root / "var/lib/kubelet/device-plugins").mkdir(parents=True)
    if broken.get("nvswitches"):
        (root / "proc/driver/nvidia-nvswitch/devices").mkdir(parents=True)
        for index in range(broken["nvswitches"]):
            (root / f"proc/driver/nvidia-nvswitch/devices/0000:0{index}:00.0").write_text("")
    return {
        "mig_partition_config": MIG_LAYOUT,
        "preflight_nvidia_smi": [sys.executable, "-m", SMI_SIM, "--state", str(root / "nvml.json")],
        "preflight_nvswitch_dir": str(root / "proc/driver/nvidia-nvswitch/devices"),
        "preflight_toolkit_binaries": [
            str(root / "usr/bin/nvidia-container-runtime"),
            str(root / "usr/bin/nvidia-ctk"),
        ],
        "preflight_runtime_configs": {"containerd": [str(root / "etc/containerd/config.toml")]},
        "preflight_kubelet": [str(kubelet_bin)],
        "preflight_device_plugin_dir": str(root / "var/lib/kubelet/device-plugins"),
    }


def _refusals(result) -> dict[str, str]:
    """host -> the problems of its refusal, from ansible-playbook's error lines (one per failed host)."""
    pattern = r"Task failed: Action failed: (\S+) is not ready for gpufleet\.mig \(\d+ problem\(s\)\): (.*)$"
    return dict(re.findall(pattern, result.stdout + result.stderr, re.MULTILINE))


def _recap(output: str) -> dict[str, dict[str, int]]:
    return {
        host: {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", fields)}
        for host, fields in re.findall(r"^(\S+)\s+:\s+(ok=.*)$", output, re.MULTILINE)
    }


def test_each_missing_prerequisite_refuses_its_host_in_check_mode_too(tmp_path):
    hosts = {
        "ready": _host(tmp_path, "ready", nvswitches=0),
        "no-driver": _host(tmp_path, "no-driver", state={"driver_version": None}),
        "gpu-problems": _host(
            tmp_path,
            "gpu-problems",
            state={"driver_version": "470.82.01", "gpu1": {"persistence_mode": False, "mig_capable": False}},
            nvswitches=4,
        ),
        "host-problems": _host(
            tmp_path, "host-problems", kubelet="v1.28.15", no_toolkit=True, no_handler=True, no_plugin_dir=True
        ),
    }
    systemctl = tmp_path / "systemctl"
    systemctl.write_text("#!/bin/sh\necho inactive\nexit 3\n")  # systemctl is-active on a stopped unit
    systemctl.chmod(0o755)
    common = {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        "preflight_nvidia_smi_environment": {"PYTHONPATH": COLLECTIONS_PATH},
        "preflight_systemctl": [str(systemctl)],
    }
    inventory = write_inventory(tmp_path, {"all": {"children": {"gpu_nodes": {"hosts": hosts, "vars": common}}}})
    result = run_playbook(str(REPO / "playbooks/preflight.yml"), inventory, {}, tmp_path, ("--check",))
    assert result.returncode != 0
    refusals = _refusals(result)
    # Every problem of a host is named at once, in the order of the checks, each with what was found and needed.
    expected = {
        "no-driver": [
            ("found no working NVIDIA driver (nvidia-smi exited 9: NVIDIA-SMI has failed", "datacenter driver"),
        ],
        "gpu-problems": [
            (f"found driver 470.82.01 on {H100}", "needed: driver branch 525 or newer"),
            ("found persistence mode off on GPU 1", "needed: nvidia-persistenced running"),
            (f"found GPU 1 ({H100}) without MIG support", "needed: MIG-capable GPUs"),
            ("found 4 NVSwitch device(s) and nvidia-fabricmanager inactive", "needed: nvidia-fabricmanager of"),
        ],
        "host-problems": [
            ("found no NVIDIA container toolkit", "needed: nvidia-container-toolkit installed"),
            ("found no NVIDIA runtime handler for containerd in", "needed: nvidia-ctk runtime configure"),
            ("found kubelet v1.28.15", "needed: kubelet v1.30 or newer"),
            ("found no ", "needed: the kubelet's device plugin socket directory"),
        ],
    }
    assert set(refusals) == set(expected), result.stdout[-4000:] + result.stderr[-4000:]
    for host, problems in expected.items():
        numbered = re.split(r"(?:^|; )\((\d+)\) ", refusals[host])[1:]
        assert numbered[0::2] == [str(n) for n in range(1, len(problems) + 1)], (host, refusals[host])
        for text, (found, needed) in zip(numbered[1::2], problems, strict=True):
            assert text.startswith(found) and needed in text, (host, text)
    assert "Traceback" not in result.stdout + result.stderr
    assert _recap(result.stdout)["ready"]["failed"] == 0


def test_the_lab_refuses_one_host_and_site_yml_stops_before_configuring_anything(tmp_path):
    """The lab's simulated hk-gpu-17 has a driver too old for MIG on its H100s; hk-gpu-01 is a fresh host."""
    lab = tmp_path / "lab"
    (lab / "nvml").mkdir(parents=True)
    (lab / "nvml" / "hk-gpu-17.json").write_text(json.dumps({**new_state(gpus=8), "driver_version": "470.82.01"}))
    result = run_playbook(
        "playbooks/site.yml",
        "inventories/hongkong+lab",
        {"gpufleet_lab_dir": str(lab)},
        tmp_path,
        ("--limit", "hk-gpu-01,hk-gpu-17"),
    )
    assert result.returncode != 0
    refusals = _refusals(result)
    assert refusals == {
        "hk-gpu-17": f"(1) found driver 470.82.01 on {H100}; needed: driver branch 525 or newer, the first with MIG "
        f"on {H100}"
    }
    assert "TASK [gpufleet.mig.mig_partition" not in result.stdout  # nothing after the preflight ran
    assert not (lab / "hosts" / "hk-gpu-01" / "etc" / "gpufleet" / "mig-layout.json").exists()
    assert not (lab / "nvml" / "hk-gpu-01.json").exists()  # the simulated nvidia-smi only read
