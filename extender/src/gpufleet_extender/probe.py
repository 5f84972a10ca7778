"""``gpufleet-extender probe-prometheus``: one refresh, as a reader of the fleet would make it, before the fleet is
deployed (the preflight role runs it on the controller).

The probe is the extender's own Prometheus client (PrometheusSource): the same https, CA, bearer token and queries,
so what it finds is what the extender, GPUScore and the descheduler will meet. It prints one JSON object:
``{"ok", "kind", "message", "nodes", "newest_age_seconds"}`` where ``kind`` is ``ok``, ``unreachable``, ``tls``,
``credential``, ``answer`` (Prometheus answered something else than a query result) or ``no_series`` (with
``--expect-series``: the answer holds no GPU node). The token and the CA come on standard input, as a JSON object
``{"token": ..., "ca": <PEM>}``, never on the command line: a process list would show them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gpufleet_extender.exporter_args import add_exporter_arguments, node_labels_of

HELP = "query Prometheus once as the fleet's readers will (https, CA, token, queries) and print what was found"

EXIT_PROBLEM = 1
EXIT_USAGE = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", required=True, help="Prometheus' base URL, as the readers reach it or the controller")
    parser.add_argument(
        "--server-name",
        default="",
        help="the name Prometheus' certificate holds, when --url reaches it by another (a port-forward)",
    )
    add_exporter_arguments(parser)
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds for the whole refresh (default 5)")
    parser.add_argument(
        "--expect-series", action="store_true", help="dcgm-exporter runs already: an answer without a GPU node fails"
    )
    parser.add_argument("--allow-http", action="store_true", help="accept an http:// URL (a lab)")


def run(args: argparse.Namespace) -> int:
    try:
        secrets = _read_stdin()
    except ValueError as exc:
        print(f"gpufleet-extender probe-prometheus: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if not (args.url.startswith("https://") or (args.allow_http and args.url.startswith("http://"))):
        finding = _finding("answer", f"{args.url} is not an https:// URL (http:// only with --allow-http)")
    else:
        finding = asyncio.run(_probe(args, secrets))
    print(json.dumps(finding, sort_keys=True))
    return 0 if finding["ok"] else EXIT_PROBLEM


def _read_stdin() -> dict[str, str]:
    text = "" if sys.stdin is None or sys.stdin.isatty() else sys.stdin.read()
    if not text.strip():
        return {}
    try:
        values = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"standard input is not a JSON object: {exc}") from None
    if not isinstance(values, dict) or not all(isinstance(values.get(key, ""), str) for key in ("token", "ca")):
        raise ValueError('standard input must be a JSON object {"token": "...", "ca": "<PEM>"}')
    return {key: values[key] for key in ("token", "ca") if values.get(key)}


def _finding(kind: str, message: str, nodes: int = 0, age: float | None = None) -> dict[str, Any]:
    return {"ok": kind == "ok", "kind": kind, "message": message, "nodes": nodes, "newest_age_seconds": age}


async def _probe(args: argparse.Namespace, secrets: dict[str, str]) -> dict[str, Any]:
    from gpufleet_extender.metrics_source import MetricsSourceError, PrometheusSource, exporter_matchers

    node_labels = node_labels_of(args)
    with tempfile.TemporaryDirectory(prefix="gpufleet-probe-") as directory:
        files: dict[str, Path] = {}
        for key in secrets:
            path = Path(directory, key)
            path.touch(mode=0o600)
            path.write_text(secrets[key], encoding="utf-8")
            files[key] = path
        try:
            source = PrometheusSource(
                args.url,
                node_labels,
                args.timeout,
                matchers=exporter_matchers(args.exporter_job, args.exporter_namespace),
                ca_file=files.get("ca"),
                token_file=files.get("token"),
                server_name=args.server_name,
            )
        except MetricsSourceError:
            return _finding("tls", "the CA given is not a PEM certificate (bundle) Python's ssl can load")
        try:
            snapshot = await source.fetch(0)
        except MetricsSourceError as exc:
            kind = "tls" if exc.tls else "unreachable" if exc.unreachable else "answer"
            if exc.status in (401, 403):
                kind = "credential"
            return _finding(kind, str(exc))
        finally:
            await source.aclose()
    nodes = len(snapshot.nodes) if snapshot is not None else 0
    age = snapshot.age(time.time()) if snapshot is not None else math.inf
    shown_age = None if math.isinf(age) else round(age, 1)
    if nodes == 0 and args.expect_series:
        return _finding("no_series", "Prometheus answers but holds no dcgm series of any GPU node")
    return _finding("ok", f"Prometheus answers: {nodes} GPU nodes", nodes, shown_age)
