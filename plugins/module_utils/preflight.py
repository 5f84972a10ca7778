"""What a GPU host must have before gpufleet.mig configures it, judged from what the real tools answer.

The preflight role (roles/preflight) gathers the answers on each host - `nvidia-smi --query-gpu`, the NVSwitch
devices and nvidia-fabricmanager's state, the container toolkit's binaries, the container runtime's config,
`kubelet --version`, the device plugin socket directory - and `problems()` turns them into one line per missing
prerequisite, each saying what was found and what is needed. Pure: no I/O here, so every refusal is unit-tested.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from typing import Any

# `nvidia-smi --query-gpu=<QUERY> --format=csv,noheader`: the fields the checks read, in this order.
QUERY_FIELDS = ("index", "name", "driver_version", "persistence_mode", "mig.mode.current")
QUERY = ",".join(QUERY_FIELDS)
# The first driver branch that supports MIG on a product (NVIDIA's MIG user guide, supported GPUs), by the
# product name nvidia-smi reports; the first entry the name contains wins (H200 before H100).
MIN_DRIVER_BRANCH = (("H200", 550), ("H100", 525), ("H800", 525), ("H20", 550), ("A100", 470), ("A30", 470))
CHECKS = ("driver", "persistence", "fabric_manager", "mig", "toolkit", "runtime", "kubelet", "device_plugin_dir")
# The NVIDIA handler in a container runtime's config: containerd 1.x and 2.x, CRI-O.
_RUNTIME_HANDLER = {
    "containerd": re.compile(r'^\s*\[plugins\.[^\]]*\.runtimes\.["\']?nvidia["\']?\]\s*$', re.MULTILINE),
    "cri-o": re.compile(r"^\s*\[crio\.runtime\.runtimes\.nvidia\]\s*$", re.MULTILINE),
}
_KUBELET_VERSION = re.compile(r"Kubernetes v(\d+)\.(\d+)\.(\d+)")


@dataclass(frozen=True)
class GpuAnswer:
    index: int
    name: str
    driver_version: str
    persistence_mode: str
    mig_mode: str

    @property
    def mig_capable(self) -> bool:
        return self.mig_mode in ("Enabled", "Disabled")


def parse_query(text: str) -> list[GpuAnswer]:
    """nvidia-smi's CSV answer (noheader), one GPU per line; raises ValueError on anything else."""
    gpus = []
    for row in csv.reader(line for line in text.splitlines() if line.strip()):
        if len(row) != len(QUERY_FIELDS):
            raise ValueError(f"expected {len(QUERY_FIELDS)} fields ({QUERY}), got {row!r}")
        index, name, driver, persistence, mig = (field.strip() for field in row)
        gpus.append(GpuAnswer(int(index), name, driver, persistence, mig))
    return gpus


def min_driver_branch(product: str) -> int | None:
    for family, branch in MIN_DRIVER_BRANCH:
        if family in product:
            return branch
    return None


def _driver_branch(version: str) -> int | None:
    match = re.match(r"(\d+)\.", version)
    return int(match.group(1)) if match else None


def _gpu_list(indices: list[int]) -> str:
    return ("GPU " if len(indices) == 1 else "GPUs ") + ", ".join(str(i) for i in indices)


def gpu_problems(nvidia_smi: dict[str, Any], needs_mig: bool, checks: set[str]) -> list[str]:
    """Driver, persistence mode and MIG capability from `nvidia-smi --query-gpu` ({rc, stdout, stderr})."""
    if nvidia_smi.get("rc") != 0:
        # stderr/stdout: it ran and failed; else msg: Ansible's command module could not start it (not installed).
        answer = f"{nvidia_smi.get('stderr') or ''} {nvidia_smi.get('stdout') or ''}".strip() or nvidia_smi.get("msg")
        said = " ".join(str(answer or "").split())[:200]
        return [
            f"found no working NVIDIA driver (nvidia-smi exited {nvidia_smi.get('rc')}: {said or 'no output'}); "
            "needed: the NVIDIA datacenter driver installed and loaded (nvidia-smi lists the GPUs)"
        ]
    try:
        gpus = parse_query(nvidia_smi.get("stdout", ""))
    except ValueError as exc:
        return [f"found an nvidia-smi answer this check cannot read ({exc}); needed: nvidia-smi --query-gpu={QUERY}"]
    if not gpus:
        return ["found no GPU (nvidia-smi lists none); needed: the node's NVIDIA GPUs visible to the driver"]
    problems = []
    if "driver" in checks:
        for name in sorted({gpu.name for gpu in gpus}):
            branch, needed = _driver_branch(gpus[0].driver_version), min_driver_branch(name)
            if needed is not None and (branch is None or branch < needed):
                problems.append(
                    f"found driver {gpus[0].driver_version} on {name}; needed: driver branch {needed} or newer, "
                    f"the first with MIG on {name}"
                )
    if "persistence" in checks:
        off = [gpu.index for gpu in gpus if gpu.persistence_mode != "Enabled"]
        if off:
            problems.append(
                f"found persistence mode off on {_gpu_list(off)}; needed: nvidia-persistenced running (systemctl "
                "enable --now nvidia-persistenced), so MIG instances and the driver state survive idle periods"
            )
    if "mig" in checks and needs_mig:
        incapable = [gpu.index for gpu in gpus if not gpu.mig_capable]
        if incapable:
            names = sorted({gpu.name for gpu in gpus if gpu.index in incapable})
            problems.append(
                f"found {_gpu_list(incapable)} ({', '.join(names)}) without MIG support; needed: MIG-capable GPUs "
                "for the node's declared layout (mig_partition_config enables MIG), or a layout with MIG disabled"
            )
    return problems


def fabric_problem(nvswitches: int, fabricmanager_state: str) -> str | None:
    """An NVSwitch board (HGX) needs nvidia-fabricmanager running, or its GPUs cannot start CUDA work."""
    if nvswitches == 0 or fabricmanager_state == "running":
        return None
    return (
        f"found {nvswitches} NVSwitch device(s) and nvidia-fabricmanager {fabricmanager_state}; needed: "
        "nvidia-fabricmanager of the driver's version running (systemctl enable --now nvidia-fabricmanager)"
    )


def runtime_problem(runtime: str, configs: dict[str, str]) -> str | None:
    """The container runtime's config must name the NVIDIA handler (nvidia-ctk runtime configure writes it)."""
    handler = _RUNTIME_HANDLER[runtime]
    if any(handler.search(text) for text in configs.values()):
        return None
    where = ", ".join(sorted(configs)) or "no config file"
    return (
        f"found no NVIDIA runtime handler for {runtime} in {where}; needed: nvidia-ctk runtime configure "
        f"--runtime={runtime}, then restart {runtime}"
    )


def kubelet_problem(answer: dict[str, Any], minimum: str) -> str | None:
    """`kubelet --version` ({rc, stdout}) at least `minimum` (major.minor)."""
    match = _KUBELET_VERSION.search(answer.get("stdout", "")) if answer.get("rc") == 0 else None
    needed = tuple(int(part) for part in minimum.split(".")[:2])
    if match and (int(match.group(1)), int(match.group(2))) >= needed:
        return None
    found = f"kubelet v{'.'.join(match.groups())}" if match else f"no kubelet ({answer.get('msg') or 'not runnable'})"
    return f"found {found}; needed: kubelet v{minimum} or newer"


def problems(facts: dict[str, Any]) -> list[str]:
    """Every missing prerequisite of one host, from the facts the preflight role gathered."""
    checks = set(facts.get("checks", CHECKS))
    unknown = checks - set(CHECKS)
    if unknown:
        raise ValueError(f"unknown preflight check(s) {', '.join(sorted(unknown))} (known: {', '.join(CHECKS)})")
    found: list[str | None] = []
    if checks & {"driver", "persistence", "mig"}:
        found += gpu_problems(facts["nvidia_smi"], bool(facts.get("needs_mig")), checks)
    if "fabric_manager" in checks:
        found.append(fabric_problem(int(facts.get("nvswitches", 0)), str(facts.get("fabricmanager", "not found"))))
    if "toolkit" in checks and not facts.get("toolkit_found"):
        searched = ", ".join(facts.get("toolkit_searched", []))
        found.append(
            f"found no NVIDIA container toolkit ({searched} missing); needed: nvidia-container-toolkit installed"
        )
    if "runtime" in checks:
        found.append(runtime_problem(facts.get("runtime", "containerd"), facts.get("runtime_configs", {})))
    if "kubelet" in checks:
        found.append(kubelet_problem(facts.get("kubelet", {}), facts["kubelet_min_version"]))
    if "device_plugin_dir" in checks and not facts.get("device_plugin_dir_exists"):
        found.append(
            f"found no {facts.get('device_plugin_dir')}; needed: the kubelet's device plugin socket directory "
            "(kubelet running with its default root dir, or preflight_device_plugin_dir set to its own)"
        )
    return [problem for problem in found if problem]
