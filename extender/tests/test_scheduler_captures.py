"""The extender on the bytes the real kube-scheduler sent (tests/data/kube-scheduler, captured by
tests/capture_scheduler_requests.py from the scheduler configuration the kube_scheduler role renders).

Both GPU nodes fit each pod as far as kube-scheduler knows; the metrics make hk-gpu-01's devices hot, so the
extender must turn it down in filter and rank it last in prioritize.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from gpufleet_extender.app import create_app
from gpufleet_extender.pods import ResourceRequest, pod_gpu_request
from gpufleet_extender.wire import decode_args

from extender_helpers import file_settings, gpus, mig, write_metrics

CAPTURED = Path(__file__).parent / "data" / "kube-scheduler"
REQUESTS = {
    "mig-job": ResourceRequest("nvidia.com/mig-3g.40gb", 1),
    "whole-gpu-job": ResourceRequest("nvidia.com/gpu", 2),
}
FLEET = {
    "hk-gpu-01": gpus(0.95, 0.97, 0.99, 0.96) + mig(4, "3g.40gb", 0.93, 0.98),
    "hk-gpu-02": gpus(0.10, 0.20, 0.05, 0.00) + mig(4, "3g.40gb", 0.15, 0.40),
}


def captured(pod: str, verb: str) -> bytes:
    return (CAPTURED / f"{pod}.{verb}.json").read_bytes()


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    path = write_metrics(tmp_path_factory.mktemp("captures") / "dcgm.prom", FLEET)
    with TestClient(create_app(file_settings(path))) as test_client:
        yield test_client


@pytest.mark.parametrize("pod", sorted(REQUESTS))
def test_captured_bodies_decode_as_kube_scheduler_meant_them(pod):
    for verb in ("filter", "prioritize"):
        args = decode_args(captured(pod, verb))
        assert args.pod.metadata.name == pod and json.loads(captured(pod, verb))["Pod"]["spec"]["schedulerName"] == (
            "gpufleet-scheduler"
        )
        assert pod_gpu_request(args.pod) == (REQUESTS[pod],)
        # nodeCacheCapable: names only, Nodes null; the CPU node never reaches the extender
        assert args.nodes.raw is None and args.nodes.names_json is not None
        assert sorted(args.nodes.names) == ["hk-gpu-01", "hk-gpu-02"]
    assert (CAPTURED / "VERSION").read_text().startswith("kube-scheduler v1.")


@pytest.mark.parametrize("pod", sorted(REQUESTS))
def test_filter_turns_down_the_hot_node(client, pod):
    answer = client.post("/filter", content=captured(pod, "filter"))
    assert answer.status_code == 200, answer.text
    result = answer.json()
    assert result["NodeNames"] == ["hk-gpu-02"]
    assert list(result["FailedNodes"]) == ["hk-gpu-01"]
    assert result["FailedNodes"]["hk-gpu-01"].startswith(f"hk-gpu-01: no {REQUESTS[pod].resource} ")
    assert not result.get("Error")


@pytest.mark.parametrize("pod", sorted(REQUESTS))
def test_prioritize_ranks_the_idle_node_first_in_the_order_sent(client, pod):
    sent = json.loads(captured(pod, "prioritize"))["NodeNames"]
    answer = client.post("/prioritize", content=captured(pod, "prioritize"))
    assert answer.status_code == 200, answer.text
    scores = {entry["Host"]: entry["Score"] for entry in answer.json()}
    assert [entry["Host"] for entry in answer.json()] == sent
    assert scores["hk-gpu-02"] > scores["hk-gpu-01"]
