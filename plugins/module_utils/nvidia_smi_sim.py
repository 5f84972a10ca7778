"""`nvidia-smi --query-gpu` answered from an NVML simulator state file, as the real tool answers on that host.

    python3 -m ansible_collections.gpufleet.mig.plugins.module_utils.nvidia_smi_sim --state FILE \
        --query-gpu=index,name,driver_version,persistence_mode,mig.mode.current --format=csv,noheader

The preflight role runs it instead of nvidia-smi in the lab (docs/preflight.md). The state file is the simulator's
(docs/nvml_simulator.md); a missing one is the simulator's fresh host (8 x H100 80GB HBM3, MIG off), read, never
written. Two optional keys describe the host's driver as the preflight sees it: top-level `driver_version`
(default 550.90.07; null: no driver loaded, and the tool fails as the real one does) and per GPU
`persistence_mode` (default true).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from .exceptions import MigError
from .nvml_sim import load_state, new_state

DEFAULT_DRIVER_VERSION = "550.90.07"
# What nvidia-smi prints, and its exit status, when it cannot talk to the driver.
NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest "
    "NVIDIA driver is installed and running."
)
EXIT_NO_DRIVER = 9
EXIT_BAD_ARGS = 2


def _field(name: str, gpu: dict[str, Any], driver: str) -> str:
    if name == "index":
        return str(gpu["index"])
    if name == "name":
        return str(gpu["name"])
    if name == "uuid":
        return str(gpu["uuid"])
    if name == "driver_version":
        return driver
    if name == "persistence_mode":
        return "Enabled" if gpu.get("persistence_mode", True) else "Disabled"
    if name in ("mig.mode.current", "mig.mode.pending"):
        if not gpu.get("mig_capable", True):
            return "[N/A]"
        return "Enabled" if gpu["mig_mode"][name.rsplit(".", 1)[1]] else "Disabled"
    raise KeyError(name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nvidia-smi (simulated)", description=__doc__.splitlines()[0])
    parser.add_argument("--state", required=True, help="NVML simulator state file")
    parser.add_argument("--query-gpu", required=True, help="comma-separated fields")
    parser.add_argument("--format", required=True, choices=["csv,noheader"], help="the one format answered")
    args = parser.parse_args(argv)
    try:
        state = load_state(args.state) if os.path.exists(args.state) else new_state()
    except MigError as exc:
        sys.stderr.write(f"nvidia-smi (simulated): {exc.message}\n")
        return EXIT_BAD_ARGS
    driver = state.get("driver_version", DEFAULT_DRIVER_VERSION)
    if driver is None:
        sys.stdout.write(NO_DRIVER + "\n")
        return EXIT_NO_DRIVER
    fields = [name.strip() for name in args.query_gpu.split(",")]
    try:
        rows = [", ".join(_field(name, gpu, str(driver)) for name in fields) for gpu in state["gpus"]]
    except KeyError as exc:
        sys.stderr.write(f'Field "{exc.args[0]}" is not a valid field to query.\n')
        return EXIT_BAD_ARGS
    sys.stdout.write("".join(row + "\n" for row in rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
