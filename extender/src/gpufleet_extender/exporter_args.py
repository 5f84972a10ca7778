"""The command-line arguments that say which dcgm series a command reads (its host labels, the exporter's job and
namespace), one definition for every command that takes them: remote-write-config, probe-prometheus."""

from __future__ import annotations

import argparse


def node_labels_of(args: argparse.Namespace) -> tuple[str, ...]:
    """--node-label, repeated or comma-separated, as NODE_NAME_LABELS reads it (default Hostname, hostname)."""
    return tuple(label for value in args.node_label for label in value.split(",") if label) or ("Hostname", "hostname")


def add_exporter_arguments(parser: argparse.ArgumentParser) -> None:
    """Which dcgm series a generated configuration reads: their host labels, the exporter's job and namespace."""
    parser.add_argument(
        "--node-label",
        action="append",
        default=[],
        help="host label of the dcgm series, as NODE_NAME_LABELS (repeat or comma-separate; default Hostname,hostname)",
    )
    parser.add_argument("--exporter-job", default="", help="the exporter's scrape job, as EXPORTER_JOB ('': any)")
    parser.add_argument(
        "--exporter-namespace", default="", help="the exporter's namespace label, as EXPORTER_NAMESPACE ('': any)"
    )
