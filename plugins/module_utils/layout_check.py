"""The host's MIG layout against the declared one, published for node-exporter's textfile collector.

    python3 -m ansible_collections.gpufleet.mig.plugins.module_utils.layout_check --config FILE \
        --textfile DIR/gpufleet_mig_layout.prom --node NAME --pool NAME [--nvml-sim-state FILE]

FILE is the boot unit's input (mig-layout.json). The check plans the declared layout against the GPUs exactly as
the nvidia_mig module would (runner.plan, nothing written) and counts the GPUs whose plan is not empty: those
drifted (a boot unit that failed after a reboot, a hand-run `nvidia-smi mig`). It runs after the boot unit and
from a timer (roles/mig_partition). The metrics (alerts: roles/monitoring, docs/monitoring.md):

    gpufleet_mig_node_info{node,pool} 1
    gpufleet_mig_layout_drift{node,pool}                       GPUs not in the declared layout
    gpufleet_mig_layout_instances{node,pool,gpu,profile,source}  instances per profile, source=declared|actual
    gpufleet_mig_layout_check_success{node,pool}               0 when the GPUs or the file could not be read
    gpufleet_mig_layout_check_timestamp_seconds{node,pool}     when the check ran

Exit status: 0 checked (drift or not), 1 the check failed (the textfile then says check_success 0), 2 bad
arguments.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from .boot_apply import load_request
from .exceptions import MigError
from .nvml import NvmlInterface
from .nvml_backend import open_nvml
from .runner import plan

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
WHOLE_GPU = "whole"  # the profile label of a GPU with MIG disabled


@dataclass(frozen=True)
class GpuDrift:
    index: int
    drifted: bool
    declared: dict[str, int] = field(default_factory=dict)
    actual: dict[str, int] = field(default_factory=dict)


def check(nvml: NvmlInterface, config: list[object]) -> list[GpuDrift]:
    """Per selected GPU: declared and actual instances per profile, and whether applying would change it."""
    results = []
    # force: a busy instance does not matter to a check that writes nothing.
    for gpu_plan, _catalog in plan(nvml, config, force=True):
        declared = Counter(slot.profile for slot in gpu_plan.after) if gpu_plan.mig_after else {WHOLE_GPU: 1}
        actual = Counter(slot.profile for slot in gpu_plan.before) if gpu_plan.mig_before else {WHOLE_GPU: 1}
        results.append(GpuDrift(gpu_plan.index, gpu_plan.changed, dict(declared), dict(actual)))
    return results


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def exposition(node: str, pool: str, gpus: Sequence[GpuDrift] | None, now: float) -> str:
    """The textfile's content; gpus None = the check failed (no drift or layout figures, success 0)."""
    base = f'node="{_escape(node)}",pool="{_escape(pool)}"'
    lines = [
        "# HELP gpufleet_mig_node_info The node's tenant pool (join on node).",
        "# TYPE gpufleet_mig_node_info gauge",
        f"gpufleet_mig_node_info{{{base}}} 1",
        "# HELP gpufleet_mig_layout_check_success 1 when the GPUs were read and compared with the declared layout.",
        "# TYPE gpufleet_mig_layout_check_success gauge",
        f"gpufleet_mig_layout_check_success{{{base}}} {0 if gpus is None else 1}",
        "# HELP gpufleet_mig_layout_check_timestamp_seconds When the layout check last ran (Unix time).",
        "# TYPE gpufleet_mig_layout_check_timestamp_seconds gauge",
        f"gpufleet_mig_layout_check_timestamp_seconds{{{base}}} {now:.3f}",
    ]
    if gpus is not None:
        lines += [
            "# HELP gpufleet_mig_layout_drift GPUs whose MIG layout differs from the declared one.",
            "# TYPE gpufleet_mig_layout_drift gauge",
            f"gpufleet_mig_layout_drift{{{base}}} {sum(1 for gpu in gpus if gpu.drifted)}",
            "# HELP gpufleet_mig_layout_instances Instances per GPU and profile (whole: MIG off), declared and actual.",
            "# TYPE gpufleet_mig_layout_instances gauge",
        ]
        for gpu in gpus:
            for source, counts in (("declared", gpu.declared), ("actual", gpu.actual)):
                for profile in sorted(counts):
                    labels = f'{base},gpu="{gpu.index}",profile="{_escape(profile)}",source="{source}"'
                    lines.append(f"gpufleet_mig_layout_instances{{{labels}}} {counts[profile]}")
    return "\n".join(lines) + "\n"


def write_atomically(path: str, text: str) -> None:
    """node-exporter may read the file at any moment: write beside it, then rename over it."""
    directory = os.path.dirname(os.path.abspath(path))
    handle, temporary = tempfile.mkstemp(dir=directory, prefix=".gpufleet_mig_layout.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="gpufleet-mig-layout-check", description="Compare the MIG layout with the declared one."
    )
    parser.add_argument("--config", required=True, help="the declared layout (the boot unit's mig-layout.json)")
    parser.add_argument("--textfile", required=True, help="the .prom file node-exporter's textfile collector reads")
    parser.add_argument("--node", required=True, help="the node's name in Kubernetes")
    parser.add_argument("--pool", default="", help="the node's tenant pool")
    parser.add_argument("--nvml-sim-state", help="NVML simulator state file (else the real GPUs through NVML)")
    parser.add_argument(
        "--nvml-sim-on-gpu-host", action="store_true", help="allow the simulator on a host with an NVIDIA driver loaded"
    )
    args = parser.parse_args(argv)
    if not os.path.isdir(os.path.dirname(os.path.abspath(args.textfile))):
        sys.stderr.write(f"gpufleet-mig-layout-check: the directory of {args.textfile} does not exist\n")
        return EXIT_BAD_INPUT

    gpus: list[GpuDrift] | None = None
    status = 0
    nvml = None
    try:
        request = load_request(args.config)
        nvml = open_nvml(args.nvml_sim_state, sim_on_gpu_host=args.nvml_sim_on_gpu_host)
        gpus = check(nvml, request["config"])
    except MigError as exc:
        sys.stderr.write(f"gpufleet-mig-layout-check: {exc.message}\n")
        status = EXIT_FAILED
    finally:
        if nvml is not None:
            nvml.close()
    write_atomically(args.textfile, exposition(args.node, args.pool, gpus, time.time()))
    if gpus is not None:
        drifted = [str(gpu.index) for gpu in gpus if gpu.drifted]
        sys.stdout.write(f"MIG layout checked on {len(gpus)} GPU(s); drifted: {', '.join(drifted) or 'none'}\n")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
