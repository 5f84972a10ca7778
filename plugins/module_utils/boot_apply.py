"""Boot-time re-apply of the declared MIG layout (MIG instances do not survive a reboot).

    python3 -m ansible_collections.gpufleet.mig.plugins.module_utils.boot_apply --config FILE [--nvml-sim-state FILE]
        [--lock-timeout SECONDS]

FILE is JSON: {"config": [...the nvidia_mig module's config...], "force": false, "reset": true}. Progress lines go to
stdout (journald); on failure one line goes to stderr and the exit status is non-zero:
1 = the layout could not be applied, 2 = bad arguments or config file, 3 = MIG mode change still pending (reboot).
Same code path as the nvidia_mig module (runner.apply), so boot and Ansible cannot disagree.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .exceptions import MigError, SpecError
from .host_lock import lock_path, mig_change_lock
from .nvml_backend import open_nvml
from .runner import apply

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_PENDING = 3


def load_request(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as handle:
            request = json.load(handle)
    except OSError as exc:
        raise SpecError(f"cannot read {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise SpecError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(request, dict) or "config" not in request:
        raise SpecError(f'{path} must be a JSON object with a "config" list')
    unknown = sorted(set(request) - {"config", "force", "reset"})
    if unknown:
        raise SpecError(f"{path}: unknown key(s) {', '.join(unknown)} (allowed: config, force, reset)")
    for key in ("force", "reset"):
        if key in request and not isinstance(request[key], bool):
            raise SpecError(f"{path}: {key!r} must be true or false")
    return request


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpufleet-mig-boot-apply", description="Re-apply the MIG layout at boot.")
    parser.add_argument("--config", required=True, help='JSON file: {"config": [...], "force": false, "reset": true}')
    parser.add_argument("--nvml-sim-state", help="NVML simulator state file (else the real GPUs through NVML)")
    parser.add_argument(
        "--nvml-sim-on-gpu-host", action="store_true", help="allow the simulator on a host with an NVIDIA driver loaded"
    )
    parser.add_argument(
        "--lock-timeout",
        type=int,
        default=300,
        help="seconds to wait while another MIG change (a playbook) holds the host's lock (default 300, half the "
        "unit's start timeout)",
    )
    args = parser.parse_args(argv)

    # A command-line entry point (the boot unit), not module code: stdout goes to the journal.
    def progress(message: str) -> None:
        sys.stdout.write(message.rstrip() + "\n")
        sys.stdout.flush()

    def error(message: str) -> None:
        sys.stderr.write(f"gpufleet-mig-boot-apply: {message}\n")

    try:
        request = load_request(args.config)
        lock = lock_path(args.nvml_sim_state)
        with mig_change_lock(lock, "the boot unit (gpufleet-mig-boot-apply)", args.lock_timeout, progress):
            nvml = open_nvml(args.nvml_sim_state, sim_on_gpu_host=args.nvml_sim_on_gpu_host)
            try:
                result = apply(
                    nvml,
                    request["config"],
                    force=request.get("force", False),
                    reset=request.get("reset", True),
                    progress=progress,
                )
            finally:
                nvml.close()
    except SpecError as exc:
        error(exc.message)
        return EXIT_BAD_INPUT
    except MigError as exc:
        error(exc.message)
        return EXIT_FAILED
    changed = [str(g["index"]) for g in result["gpus"] if g["changed"]]
    progress(f"MIG layout in place on {len(result['gpus'])} GPU(s); changed: {', '.join(changed) or 'none'}")
    if result["reboot_required"]:
        pending = [str(g["index"]) for g in result["gpus"] if g["mig_mode_pending"]]
        error(f"MIG mode change pending on GPU(s) {', '.join(pending)}")
        return EXIT_PENDING
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
