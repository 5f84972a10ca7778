#!/usr/bin/env python3
"""Capture the request bodies the real kube-scheduler sends to a scheduler extender, as extender test data.

Starts etcd + kube-apiserver and kube-scheduler (gpufleet_testsupport.controlplane) with the scheduler configuration the
kube_scheduler role renders, pointed at a recording stand-in for the extender on 127.0.0.1 that passes every node.
Registers two GPU nodes and a CPU node, creates a MIG pod and a whole-GPU pod for the gpufleet-scheduler profile,
and writes the bytes kube-scheduler POSTed to the filter and prioritize verbs, unchanged, to
extender/tests/data/kube-scheduler/<pod>.<verb>.json (extender/tests/test_scheduler_captures.py replays them).

    KUBE_ASSETS=build/k8s/bin python tests/capture_scheduler_requests.py

Run it again when the Kubernetes version in k8s/go.mod changes; the files say which version sent them.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from gpufleet_testsupport import servers
from gpufleet_testsupport.collection import collections_path
from gpufleet_testsupport.controlplane import ControlPlane
from gpufleet_testsupport.scheduling import gpu_pod, register_node, rendered_scheduler_config
from gpufleet_testsupport.servers import QuietHandler, serve
from kubernetes import client as k8s
from kubernetes import config as k8s_config

REPO = Path(__file__).resolve().parents[1]

OUT = REPO / "extender" / "tests" / "data" / "kube-scheduler"
# Two nodes fit each pod (with one feasible node kube-scheduler skips scoring, so prioritize would never come);
# the CPU node is filtered out by kube-scheduler itself before the extender is asked.
NODES = {
    "hk-gpu-01": {"nvidia.com/gpu": "4", "nvidia.com/mig-3g.40gb": "8"},
    "hk-gpu-02": {"nvidia.com/gpu": "4", "nvidia.com/mig-3g.40gb": "8"},
    "hk-cpu-01": {},
}
PODS = {"mig-job": {"nvidia.com/mig-3g.40gb": "1"}, "whole-gpu-job": {"nvidia.com/gpu": "2"}}


BODIES: dict[tuple[str, str], bytes] = {}  # each POST body by (pod name, verb)


class _Handler(QuietHandler):
    """Records each POST body in BODIES and answers as an extender that passes every node."""

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        args = json.loads(body)
        verb = self.path.rsplit("/", 1)[-1]
        pod = args["Pod"]["metadata"]["name"]
        BODIES.setdefault((pod, verb), body)
        names = args.get("NodeNames")
        if names is None:
            names = [item["metadata"]["name"] for item in (args.get("Nodes") or {}).get("items") or []]
        if verb == "filter":
            answer = {"NodeNames": names, "FailedNodes": {}, "FailedAndUnresolvableNodes": {}, "Error": ""}
            if args.get("NodeNames") is None:
                answer = {"Nodes": args["Nodes"], "FailedNodes": {}, "FailedAndUnresolvableNodes": {}, "Error": ""}
        else:
            answer = [{"Host": name, "Score": 5} for name in names]
        self.send_json(answer)


def main() -> int:
    collections_path()  # the role renders the scheduler configuration through ansible
    with (
        serve(_Handler) as recorder,
        tempfile.TemporaryDirectory(prefix="gpufleet-capture-") as tmp,
        ControlPlane(Path(tmp) / "cp") as plane,
    ):
        url = servers.url(recorder)
        config = rendered_scheduler_config(
            Path(tmp), kube_scheduler_extender_url_prefix=url, kube_scheduler_extender_ignorable=False
        )
        scheduler = config["profiles"][0]["schedulerName"]
        core = k8s.CoreV1Api(k8s_config.new_client_from_config(config_file=str(plane.kubeconfig)))
        # No controller manager runs to make the namespace's default service account; admission wants one.
        core.create_namespaced_service_account("default", {"metadata": {"name": "default"}})
        for name, resources in NODES.items():
            register_node(core, name, resources, labels={"gpufleet.io/pool": "training"})
        plane.start_scheduler(config, name="gpufleet-scheduler")
        for name, resources in PODS.items():
            core.create_namespaced_pod("default", gpu_pod(name, scheduler, resources))
        wanted = {(pod, verb) for pod in PODS for verb in ("filter", "prioritize")}
        deadline = time.monotonic() + 120
        while not wanted <= set(BODIES):
            if time.monotonic() > deadline:
                missing = sorted(wanted - set(BODIES))
                print(f"kube-scheduler sent no {missing} within 120 s", file=sys.stderr)
                print(plane.log_tail("gpufleet-scheduler"), file=sys.stderr)
                return 1
            time.sleep(0.2)
        version = core.api_client.call_api("/version", "GET", response_type="object")[0]["gitVersion"]
    OUT.mkdir(parents=True, exist_ok=True)
    for (pod, verb), body in sorted(BODIES.items()):
        if (pod, verb) in wanted:
            (OUT / f"{pod}.{verb}.json").write_bytes(body)
            print(f"{OUT / f'{pod}.{verb}.json'}: {len(body)} bytes")
    (OUT / "VERSION").write_text(f"kube-scheduler {version}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
