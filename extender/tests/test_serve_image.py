"""The serve image (extender/Dockerfile) drops the lab from the installed package: the simulator, the conformance
generator and the layout library (mig_utils: NVML, its simulator, the kubelet's gRPC stubs). The server must start
without them: here they are made unimportable in a fresh interpreter, the app is built and answers, and the CLI
leaves the simulate command out."""

from __future__ import annotations

import subprocess
import sys
import textwrap

DROPPED = ("gpufleet_extender.simulate", "gpufleet_extender.mig_utils", "gpufleet_extender.conformance")

SCRIPT = textwrap.dedent(
    f"""
    import importlib.abc, sys

    class Dropped(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.startswith({DROPPED!r}):
                raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
            return None

    sys.meta_path.insert(0, Dropped())
    from fastapi.testclient import TestClient
    from gpufleet_extender import cli
    from gpufleet_extender.app import create_app
    from gpufleet_extender.config import load_settings

    commands = cli.build_parser()._subparsers._group_actions[0].choices
    print(sorted(commands))
    with TestClient(create_app(load_settings(KUBE_API="off", PROMETHEUS_URL="http://127.0.0.1:9"))) as client:
        print(client.get("/healthz").status_code)
    print(sorted(m for m in sys.modules if m.startswith({DROPPED!r})))
    """
)


def test_the_server_runs_without_the_lab():
    ran = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, check=False)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert ran.stdout.splitlines() == ["['check-config', 'serve']", "200", "[]"]
