"""``gpufleet-lab`` command line: ``simulate`` (the placement simulator) and the steps of ``make lab``.

Each command is a module with ``main(argv) -> exit code``, imported only when it runs.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from gpufleet_lab import __version__

# name -> (module, one line of help)
COMMANDS = {
    "simulate": ("gpufleet_lab.simulate.cli", "compare placement policies on a fleet and a trace (docs/simulator.md)"),
    "hosts": ("gpufleet_lab.lab_hosts", "make lab: the inventory's simulated hosts"),
    "plan": ("gpufleet_lab.lab_plan", "make lab: the runs the inventory and the rendered settings call for"),
    "verdict": ("gpufleet_lab.lab_verdict", "make lab: the closing block"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpufleet-lab",
        description="The gpufleet.mig lab: "
        + "; ".join(f"{name}: {text}" for name, (_, text) in COMMANDS.items())
        + ". `gpufleet-lab COMMAND --help` for a command's options.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("command", choices=COMMANDS, metavar="COMMAND", help=", ".join(COMMANDS))
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the command's own arguments")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    module = importlib.import_module(COMMANDS[args.command][0])
    status: int = module.main(args.args)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
