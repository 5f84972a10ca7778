"""The bundled extender as a process, and stopping what a test started."""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx

from gpufleet_testsupport.ports import free_port
from gpufleet_testsupport.processes import stop_process


def start_extender(
    workdir: Path,
    env: dict[str, str],
    *args: str,
    tls: dict[str, Path] | None = None,
    server_name: str | None = None,
    ready: bool = True,
) -> tuple[subprocess.Popen, str]:
    """The bundled extender (`gpufleet-extender serve [args]`) on a free 127.0.0.1 port, its log in `workdir`;
    returned once /readyz answers 200, or with `ready=False` once the app itself serves (/healthz ok: a test that
    watches /readyz go from 503 to 200). With `tls` (controlplane.serving_files) it serves https with that
    certificate, checked against `server_name` when the certificate is for a name rather than 127.0.0.1."""
    port = free_port()
    log = (workdir / f"extender-{port}.log").open("w")
    tls_args = ["--tls-cert-file", str(tls["tls.crt"]), "--tls-key-file", str(tls["tls.key"])] if tls else []
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpufleet_extender",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            *tls_args,
            *args,
        ],
        env={**os.environ, **env},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    verify = ssl.create_default_context(cafile=str(tls["ca.crt"])) if tls else True
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the extender exited with {process.returncode}: see {log.name}")
        try:
            extensions = {"sni_hostname": server_name} if server_name else None
            with httpx.Client(verify=verify, timeout=2) as client:
                if ready:
                    up = client.get(f"{url}/readyz", extensions=extensions).status_code == 200
                else:  # {"status": "starting"} comes from the start-up responder, before the app itself serves
                    up = client.get(f"{url}/healthz", extensions=extensions).json() == {"status": "ok"}
            if up:
                return process, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    stop_process(process)
    raise RuntimeError(f"the extender was not {'ready' if ready else 'serving'} in 120 s: see {log.name}")
