"""``gpufleet-extender`` command line: ``serve``, ``check-config``, ``remote-write-config`` and ``probe-prometheus``.

The server's commands only: the placement simulator and the lab are the ``gpufleet-lab`` package's
(``gpufleet-lab simulate``), which imports this package, never the reverse.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from gpufleet_extender import __version__, startup
from gpufleet_extender.exporter_args import add_exporter_arguments, node_labels_of

EXIT_CANNOT_LISTEN = 1
EXIT_BAD_SETTINGS = 2


def tls_options(args: argparse.Namespace) -> dict[str, Any]:
    """uvicorn's TLS arguments from --tls-cert-file/--tls-key-file/--tls-client-ca-file; {} for plain HTTP.

    Raises SettingsError (a sentence, no traceback) when only one of the pair is given or the files do not make a
    certificate and its key: better refused at start than a server that fails every handshake.
    """
    import ssl  # here, not at the top: serve's first answer must not wait for imports (startup.py)

    from gpufleet_extender.config import SettingsError

    cert, key, client_ca = args.tls_cert_file, args.tls_key_file, args.tls_client_ca_file
    if not cert and not key:
        if client_ca:
            raise SettingsError("--tls-client-ca-file needs --tls-cert-file and --tls-key-file")
        return {}
    if not (cert and key):
        raise SettingsError("--tls-cert-file and --tls-key-file go together (the certificate and its private key)")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert, key)
        if client_ca:
            context.load_verify_locations(client_ca)
    except (OSError, ssl.SSLError) as exc:
        raise SettingsError(
            f"cannot use the TLS files ({cert}, {key}{', ' + client_ca if client_ca else ''}): {exc}"
        ) from None
    options = {"ssl_certfile": cert, "ssl_keyfile": key}
    if client_ca:
        # Only clients holding a certificate from this CA get a connection (kube-scheduler's tlsConfig certFile).
        options.update(ssl_ca_certs=client_ca, ssl_cert_reqs=ssl.CERT_REQUIRED)
    return options


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _serve(args: argparse.Namespace) -> int:
    # Listen and answer probes first: the imports below take a second or more (startup.py says why it matters).
    try:
        sock = startup.bind(args.host, args.port)
    except OSError as exc:
        print(f"gpufleet-extender: cannot listen on {args.host}:{args.port}: {exc.strerror}", file=sys.stderr)
        return EXIT_CANNOT_LISTEN
    responder = startup.StartupResponder(sock).start()

    from gpufleet_extender.config import CONFIG_FILE_ENV, SettingsError, get_settings

    if args.config:
        os.environ[CONFIG_FILE_ENV] = args.config  # get_settings() reads the same file
    get_settings.cache_clear()
    try:
        settings = get_settings()
        tls = tls_options(args)
    except SettingsError as exc:
        print(f"gpufleet-extender: {exc}", file=sys.stderr)
        responder.handover().close()
        return EXIT_BAD_SETTINGS

    import uvicorn

    from gpufleet_extender.app import create_app
    from gpufleet_extender.errors import ExtenderError

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        app = create_app(settings)
    except ExtenderError as exc:  # e.g. a PROMETHEUS_CA_FILE that is not a readable PEM CA
        print(f"gpufleet-extender: {exc}", file=sys.stderr)
        responder.handover().close()
        return EXIT_BAD_SETTINGS
    config = uvicorn.Config(
        app,
        log_level=args.log_level,
        access_log=args.access_log,
        http=args.http or ("httptools" if _installed("httptools") else "h11"),
        loop=args.loop or ("uvloop" if _installed("uvloop") else "asyncio"),
        **tls,
    )
    uvicorn.Server(config).run(sockets=[responder.handover()])
    return 0


def _add_serve(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = subparsers.add_parser("serve", help="run the HTTP extender kube-scheduler calls")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    serve.add_argument("--port", type=int, default=8000, help="port to listen on (default: %(default)s)")
    serve.add_argument("--config", help="YAML or JSON settings file; environment variables override it")
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    serve.add_argument("--access-log", action="store_true", help="log every request (off: the verbs are hot)")
    # kube-scheduler waits on every call: the C HTTP parser and event loop take a good part off each request.
    serve.add_argument("--http", choices=["httptools", "h11"], help="default: httptools when installed, else h11")
    serve.add_argument("--loop", choices=["uvloop", "asyncio"], help="default: uvloop when installed, else asyncio")
    # kube-scheduler sends whole Pod specs (environment values included): serve them over TLS outside a laptop.
    tls = serve.add_argument_group("TLS (https; without these the extender serves plain http)")
    tls.add_argument(
        "--tls-cert-file", help="PEM serving certificate (chain), e.g. tls.crt of a kubernetes.io/tls Secret"
    )
    tls.add_argument("--tls-key-file", help="PEM private key of --tls-cert-file (tls.key)")
    tls.add_argument("--tls-client-ca-file", help="require client certificates issued by this PEM CA (mutual TLS)")
    serve.set_defaults(handler=_serve)


def _check_config(args: argparse.Namespace) -> int:
    """Validate a settings mapping (a file, or JSON on stdin with ``-``) without the environment; print it back.

    With ``--plugin-args``: the GPUScore plugin's args instead (its pluginConfig args, camelCase names), every
    problem listed in the plugin's words (plugin_args.py)."""
    from gpufleet_extender.config import SettingsError, check_settings, read_config_file

    what = "GPUScore args" if args.plugin_args else "settings"
    try:
        if args.file == "-":
            try:
                values = json.loads(sys.stdin.read() or "{}")
            except json.JSONDecodeError as exc:
                raise SettingsError(f"stdin is not a JSON mapping of {what}: {exc}") from None
            if not isinstance(values, dict):
                raise SettingsError(f"stdin must hold a JSON mapping of {what}, not {type(values).__name__}")
        elif args.plugin_args:
            values = _read_plugin_args(args.file)
        else:
            values = read_config_file(args.file)
        if args.plugin_args:
            from gpufleet_extender.plugin_args import check_plugin_args

            problems = check_plugin_args(values)
            if problems:
                raise SettingsError("invalid GPUScore args: " + "; ".join(problems))
            print(json.dumps(values, sort_keys=True))
            return 0
        settings = check_settings(values)
    except SettingsError as exc:
        print(f"gpufleet-extender: {exc}", file=sys.stderr)
        return EXIT_BAD_SETTINGS
    print(settings.model_dump_json())
    return 0


def _read_plugin_args(path: str) -> Any:
    """The plugin's args from a YAML or JSON file, names as they are (camelCase)."""
    import yaml

    from gpufleet_extender.config import SettingsError

    try:
        with open(path, encoding="utf-8") as handle:
            return yaml.safe_load(handle) or {}  # JSON is YAML
    except OSError as exc:
        raise SettingsError(f"cannot read {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise SettingsError(f"{path} is not valid YAML or JSON: {exc}") from None


def _add_check_config(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    check = subparsers.add_parser(
        "check-config",
        help="validate settings as the extender would at start, from a file or stdin alone (not the environment)",
    )
    check.add_argument("file", help="YAML or JSON settings file, or - for a JSON mapping on stdin (a ConfigMap's data)")
    check.add_argument(
        "--plugin-args",
        action="store_true",
        help="the file holds the GPUScore plugin's pluginConfig args instead: check them as the plugin would",
    )
    check.set_defaults(handler=_check_config)


def _remote_write_config(args: argparse.Namespace) -> int:
    import yaml

    from gpufleet_extender.push_config import PushTarget, operator_remote_write, remote_write

    node_labels = node_labels_of(args)
    pinned = {"job": args.exporter_job, "namespace": args.exporter_namespace}
    if args.operator:
        secret = _secret_key(args.token_secret, "--token-secret") if args.token_secret else None
        config_map = _secret_key(args.ca_config_map, "--ca-config-map") if args.ca_config_map else None
        document = {
            "remoteWrite": operator_remote_write(
                args.url, node_labels, **pinned, token_secret=secret, ca_config_map=config_map
            )
        }
    else:
        targets = [PushTarget(url, args.token_file, args.ca_file) for url in args.url]
        document = {"remote_write": remote_write(targets, node_labels, **pinned)}
    sys.stdout.write(yaml.safe_dump(document, sort_keys=False, width=1_000_000))
    return 0


def _secret_key(value: str, option: str) -> tuple[str, str]:
    name, _, key = value.partition("/")
    if not name or not key:
        raise SystemExit(f"gpufleet-extender: {option} takes <name>/<key>, got {value!r}")
    return name, key


def _add_remote_write_config(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    push = subparsers.add_parser(
        "remote-write-config",
        help="print the Prometheus remote-write configuration METRICS_SOURCE=push needs (YAML)",
    )
    push.add_argument("--url", action="append", required=True, help="a receiver's URL (repeat: one per receiver)")
    add_exporter_arguments(push)
    push.add_argument("--token-file", default="", help="plain Prometheus: file holding the receivers' bearer token")
    push.add_argument("--ca-file", default="", help="plain Prometheus: the CA the receivers' certificates chain to")
    push.add_argument(
        "--operator",
        action="store_true",
        help="print entries of the Prometheus Operator's Prometheus.spec.remoteWrite instead of remote_write",
    )
    push.add_argument("--token-secret", default="", help="--operator: <Secret>/<key> holding the bearer token")
    push.add_argument("--ca-config-map", default="", help="--operator: <ConfigMap>/<key> holding the CA")
    push.set_defaults(handler=_remote_write_config)


def build_parser() -> argparse.ArgumentParser:
    """The CLI. Every command imports what it needs when it runs: the kubelet's probes time serve's start."""
    parser = argparse.ArgumentParser(
        prog="gpufleet-extender", description="GPU-load-aware, MIG-aware kube-scheduler extender."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_serve(subparsers)
    _add_check_config(subparsers)
    _add_remote_write_config(subparsers)
    _add_probe_prometheus(subparsers)
    return parser


def _add_probe_prometheus(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from gpufleet_extender import probe

    command = subparsers.add_parser("probe-prometheus", help=probe.HELP, description=probe.HELP)
    probe.add_arguments(command)
    command.set_defaults(handler=probe.run)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    status: int = args.handler(args)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
