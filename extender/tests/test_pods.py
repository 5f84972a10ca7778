from __future__ import annotations

import json

import pytest
from gpufleet_testsupport.scheduler_requests import make_pod

from gpufleet_extender.pods import ResourceRequest, pod_gpu_request
from gpufleet_extender.wire import Container, Pod, PodSpec, ResourceRequirements, WireError, decode_args


def request_of(pod: dict):
    return pod_gpu_request(decode_args(json.dumps({"Pod": pod, "NodeNames": []}).encode()).pod)


def test_no_gpu_request():
    assert request_of(make_pod({"cpu": "2", "memory": "1Gi"})) == ()


def test_whole_gpus_from_limits_as_string_or_number():
    assert request_of(make_pod({"nvidia.com/gpu": "2"})) == (ResourceRequest("nvidia.com/gpu", 2),)
    assert request_of(make_pod({"nvidia.com/gpu": 3})) == (ResourceRequest("nvidia.com/gpu", 3),)


def test_mig_profile():
    assert request_of(make_pod({"nvidia.com/mig-2g.20gb": "1"})) == (ResourceRequest("nvidia.com/mig-2g.20gb", 1),)


def test_requests_without_limits_count():
    pod = make_pod()
    pod["spec"]["containers"][0]["resources"] = {"requests": {"nvidia.com/gpu": "1"}}
    assert request_of(pod) == (ResourceRequest("nvidia.com/gpu", 1),)


def test_containers_add_up_and_init_containers_take_the_max():
    pod = make_pod({"nvidia.com/gpu": "1"}, init={"nvidia.com/gpu": "4"})
    pod["spec"]["containers"].append({"name": "side", "resources": {"limits": {"nvidia.com/gpu": "2"}}})
    assert request_of(pod) == (ResourceRequest("nvidia.com/gpu", 4),)  # max(1 + 2, 4)
    pod["spec"]["initContainers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "1"
    assert request_of(pod) == (ResourceRequest("nvidia.com/gpu", 3),)


def test_sidecars_run_beside_the_containers_and_the_later_init_containers():
    # component-helpers' PodRequests: a restartable init container (a sidecar) adds to the steady state and to
    # every init container started after it.
    pod = make_pod({"nvidia.com/gpu": "1"})
    pod["spec"]["initContainers"] = [
        {"name": "sidecar", "restartPolicy": "Always", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
        {"name": "warm-up", "resources": {"limits": {"nvidia.com/gpu": "2"}}},
    ]
    assert request_of(pod) == (ResourceRequest("nvidia.com/gpu", 3),)  # max(1 + 1, 1 + 2)
    pod["spec"]["initContainers"][1]["resources"]["limits"]["nvidia.com/gpu"] = "0"
    assert request_of(pod) == (ResourceRequest("nvidia.com/gpu", 2),)  # the sidecar keeps running beside main
    del pod["spec"]["initContainers"][0]["restartPolicy"]  # an ordinary init container: it ends before main
    assert request_of(pod) == (ResourceRequest("nvidia.com/gpu", 1),)


def test_init_container_only_resource_counts():
    pod = make_pod({"cpu": "1"}, init={"nvidia.com/mig-1g.10gb": "1"})
    assert request_of(pod) == (ResourceRequest("nvidia.com/mig-1g.10gb", 1),)


def test_zero_is_no_request():
    assert request_of(make_pod({"nvidia.com/gpu": "0"})) == ()


def _request(quantity):
    container = Container(resources=ResourceRequirements(limits={"nvidia.com/gpu": quantity}))
    return pod_gpu_request(Pod(spec=PodSpec(containers=[container])))


@pytest.mark.parametrize(
    ("quantity", "count"),
    [("2", 2), (2, 2), (2.0, 2), ("1k", 1000), ("2e3", 2000), ("1Ki", 1024), ("+3", 3), (".5e1", 5), ("3.0", 3)],
)
def test_kubernetes_quantities_that_are_whole_numbers_are_read_as_kubernetes_reads_them(quantity, count):
    # "1k" is 1000 to kube-apiserver, which accepts it for an extended resource: so does the extender.
    assert _request(quantity) == (ResourceRequest("nvidia.com/gpu", count),)


@pytest.mark.parametrize("quantity", [-1, -2.0, -(2**63)])
def test_negative_integer_quantities_are_refused_not_read_as_no_request(quantity):
    # An integer -1 is a whole number: only the sign check stands between it and "this pod wants no GPU".
    with pytest.raises(WireError, match=r"^resource nvidia.com/gpu: quantity must not be negative, got -"):
        request_of(make_pod({"nvidia.com/gpu": quantity}))


@pytest.mark.parametrize(
    ("quantity", "message"),
    [
        ("-3", "resource nvidia.com/gpu: quantity must not be negative, got '-3'"),
        (-1, "resource nvidia.com/gpu: quantity must not be negative, got -1"),
        ("500m", "quantity '500m' is 0.5, not a whole number: an extended resource counts whole devices"),
        (1.5, "quantity 1.5 is 1.5, not a whole number"),
        ("1e-3", "quantity '1e-3' is 0.001, not a whole number"),
        ("1kb", "'1kb' is not a Kubernetes quantity (a number with an optional suffix, such as 2, 1k or 2e3)"),
        (True, "True is not a Kubernetes quantity"),
        ("²", "'²' is not a Kubernetes quantity"),
        ("٣", "'٣' is not a Kubernetes quantity"),
        ("9" * 4301, "(4303 characters) is longer than any Kubernetes accepts"),
        (str(2**63), "quantity is larger than Kubernetes allows, got '9223372036854775808'"),
        ("1e999", "quantity is larger than Kubernetes allows"),
        (1e300, "quantity is larger than Kubernetes allows"),
    ],
)
def test_refused_quantities_say_exactly_why(quantity, message):
    with pytest.raises(WireError) as refused:
        _request(quantity)
    assert message in str(refused.value)


def test_the_largest_int64_quantity_is_accepted():
    assert request_of(make_pod({"nvidia.com/gpu": 2**63 - 1})) == (ResourceRequest("nvidia.com/gpu", 2**63 - 1),)
