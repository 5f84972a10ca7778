"""The serve image (`make extender-image`) holds the extender's wheel, the server alone: no lab (the gpufleet-lab
package: the simulator, the decision-vector generator) and of the collection's layout library (NVML, its simulator,
the kubelet's gRPC stubs) only the two rules the server shares with the collection (names, pod_requests;
test_wheel.py checks the wheel). The server must start without the rest: here it is made unimportable in a fresh
interpreter, the app is built and answers, and the CLI has the server's commands. And where the lab is installed (the
development venv), the serve path must not load it (sys.modules), so that the boundary cannot rot behind an image
that happens to be built rarely."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

DROPPED = ("gpufleet_lab", "gpufleet_extender.mig_utils.")
# What the wheel keeps of the collection's library: the rules the server shares with it (extender/pyproject.toml's
# py-modules), a pod's GPU request and the resource names.
SHARED = ("gpufleet_extender.mig_utils.names", "gpufleet_extender.mig_utils.pod_requests")

SCRIPT = textwrap.dedent(
    f"""
    import importlib.abc, sys

    class Dropped(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.startswith({DROPPED!r}) and name not in {SHARED!r}:
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
    print(sorted(m for m in sys.modules if m.startswith({DROPPED!r}) and m not in {SHARED!r}))
    """
)


def test_the_server_runs_without_the_lab():
    ran = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, check=False)
    assert ran.returncode == 0, ran.stderr[-2000:]
    commands = "['check-config', 'probe-prometheus', 'remote-write-config', 'serve']"
    assert ran.stdout.splitlines() == [commands, "200", "[]"]


# What `gpufleet-extender serve` loads, in an installation that has the lab (the development venv): the command
# itself with uvicorn's loop stopped before it listens, then the app it built answering a probe and both verbs with
# kube-scheduler's captured bodies (a lazy import on a request counts too). The boundary the image relies on: the
# serve path loads none of the lab, so leaving it out of the wheel removes nothing the server uses. It is checked
# where the lab is importable, so that an import of it cannot go unseen.
SERVE_PATH = textwrap.dedent(
    """
    import importlib.util, json, sys
    import uvicorn

    LAB = ("gpufleet_lab", "gpufleet_extender.mig_utils", "grpc")
    SHARED = (
        "gpufleet_extender.mig_utils",
        "gpufleet_extender.mig_utils.names",
        "gpufleet_extender.mig_utils.pod_requests",
    )

    def lab(name):
        last = name.rsplit(".", 1)[-1]
        return name not in SHARED and (
            any(name == root or name.startswith(root + ".") for root in LAB)
            or last == "nvml_sim"  # the NVML simulator, under any package name (the collection's too)
            or last.endswith(("_pb2", "_pb2_grpc"))  # generated gRPC / protobuf stubs
        )

    served = []

    def run_without_listening(self, sockets=None):
        served.append(self.config.app)
        for sock in sockets or ():
            sock.close()

    uvicorn.Server.run = run_without_listening
    from gpufleet_extender import cli

    status = cli.main(["serve", "--host", "127.0.0.1", "--port", "0"])
    from fastapi.testclient import TestClient

    answers = {"serve": status}
    with TestClient(served[0]) as client:
        answers["/healthz"] = client.get("/healthz").status_code
        for verb in ("filter", "prioritize"):
            body = open(f"{sys.argv[1]}/mig-job.{verb}.json", "rb").read()
            answers[f"/{verb}"] = client.post(f"/{verb}", content=body).status_code
    loaded = sorted(filter(lab, sys.modules))
    # Only now: find_spec of a submodule imports its package.
    lab_modules = ("gpufleet_lab.simulate", "gpufleet_lab.conformance", "gpufleet_lab.mig_utils.nvml_sim")
    importable = [name for name in lab_modules if importlib.util.find_spec(name) is not None]
    print(json.dumps({"importable": importable, "answers": answers, "lab_loaded": loaded}))
    """
)


def test_the_serve_path_loads_none_of_the_lab():
    captures = Path(__file__).parent / "data" / "kube-scheduler"
    env = {**os.environ, "KUBE_API": "off", "PROMETHEUS_URL": "http://127.0.0.1:9"}
    ran = subprocess.run(
        [sys.executable, "-c", SERVE_PATH, str(captures)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )
    assert ran.returncode == 0, ran.stderr[-2000:]
    result = json.loads(ran.stdout.splitlines()[-1])
    # The lab is installed here (otherwise nothing below could fail), serve built its app, and the app answered.
    assert len(result["importable"]) == 3, result["importable"]
    assert result["answers"] == {"serve": 0, "/healthz": 200, "/filter": 200, "/prioritize": 200}
    assert result["lab_loaded"] == []
