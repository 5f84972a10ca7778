"""One reader of a pod's GPU request: the MIG advisor (the collection's library, as the lab ships it) reads every
pod shape as the extender does, and refuses a quantity the extender refuses with the same reason."""

from __future__ import annotations

import json

import pytest
from gpufleet_extender.pods import pod_gpu_request
from gpufleet_extender.wire import WireError, decode_args
from gpufleet_testsupport.scheduler_requests import make_pod


def request_of(pod: dict):
    return pod_gpu_request(decode_args(json.dumps({"Pod": pod, "NodeNames": []}).encode()).pod)


SHAPES = [
    make_pod({"nvidia.com/mig-1g.10gb": "2"}),
    make_pod({"nvidia.com/mig-1g.10gb": "1k"}),
    make_pod({"nvidia.com/mig-3g.40gb": "2e0"}, init={"nvidia.com/mig-3g.40gb": "3"}),
    {
        "metadata": {"name": "sidecar"},
        "spec": {
            "containers": [{"name": "main", "resources": {"requests": {"nvidia.com/mig-2g.20gb": 1}}}],
            "initContainers": [
                {"name": "s", "restartPolicy": "Always", "resources": {"limits": {"nvidia.com/mig-2g.20gb": "1"}}},
                {"name": "i", "resources": {"limits": {"nvidia.com/mig-2g.20gb": "2"}}},
            ],
        },
    },
]


@pytest.mark.parametrize("pod", SHAPES, ids=range(len(SHAPES)))
def test_the_advisor_reads_a_pods_mig_request_as_the_extender_does(pod):
    from gpufleet_lab.mig_utils.advisor import demand_from_pods

    extender = {r.resource.removeprefix("nvidia.com/mig-"): r.count for r in request_of(pod)}
    assert demand_from_pods([pod]) == extender
    assert extender  # every shape asks for MIG instances


def test_the_advisor_refuses_a_quantity_the_extender_refuses_with_the_same_reason():
    from gpufleet_lab.mig_utils.advisor import AdviceError, demand_from_pods

    pod = make_pod({"nvidia.com/mig-1g.10gb": "500m"})
    with pytest.raises(WireError) as extender:
        request_of(pod)
    with pytest.raises(AdviceError) as advisor:
        demand_from_pods([pod])
    assert str(extender.value) in str(advisor.value)
