from __future__ import annotations

import json

import pytest

from gpufleet_extender.pods import ResourceRequest, describe_request, pod_gpu_request
from gpufleet_extender.wire import Container, Pod, PodSpec, ResourceRequirements, WireError, decode_args

from extender_helpers import make_pod


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


def test_init_container_only_resource_counts():
    pod = make_pod({"cpu": "1"}, init={"nvidia.com/mig-1g.10gb": "1"})
    assert request_of(pod) == (ResourceRequest("nvidia.com/mig-1g.10gb", 1),)


def test_zero_is_no_request():
    assert request_of(make_pod({"nvidia.com/gpu": "0"})) == ()


@pytest.mark.parametrize("quantity", ["500m", "1Gi", "-1", 1.5, True, "²", "٣", "9" * 4301, str(2**63), 1e300])
def test_fractional_or_odd_quantities_are_refused(quantity):
    container = Container(resources=ResourceRequirements(limits={"nvidia.com/gpu": quantity}))
    with pytest.raises(WireError, match=r"whole number|negative|larger than Kubernetes allows"):
        pod_gpu_request(Pod(spec=PodSpec(containers=[container])))


@pytest.mark.parametrize("quantity", [-1, -2.0, -(2**63)])
def test_negative_integer_quantities_are_refused_not_read_as_no_request(quantity):
    # An integer -1 is a whole number: only the sign check stands between it and "this pod wants no GPU".
    with pytest.raises(WireError, match=r"^resource nvidia.com/gpu: quantity must not be negative, got -"):
        request_of(make_pod({"nvidia.com/gpu": quantity}))


@pytest.mark.parametrize(
    ("quantity", "message"),
    [
        ("500m", "quantity must be a whole number, got '500m'"),
        (2**63, "quantity is larger than Kubernetes allows, got 9223372036854775808"),
        ("x" * 38, f"quantity must be a whole number, got '{'x' * 38}'"),  # 40 characters quoted: shown whole
        ("x" * 39, f"quantity must be a whole number, got '{'x' * 39}... (41 characters)"),  # cut at 40
    ],
)
def test_refusals_quote_the_value_shortened_past_40_characters(quantity, message):
    with pytest.raises(WireError) as raised:
        request_of(make_pod({"nvidia.com/gpu": quantity}))
    assert str(raised.value) == f"resource nvidia.com/gpu: {message}"


def test_the_largest_int64_quantity_is_accepted():
    assert request_of(make_pod({"nvidia.com/gpu": 2**63 - 1})) == (ResourceRequest("nvidia.com/gpu", 2**63 - 1),)


def test_describe_request():
    assert describe_request(()) == "no GPU"
    pair = (ResourceRequest("nvidia.com/gpu", 2), ResourceRequest("nvidia.com/mig-1g.10gb", 1))
    assert describe_request(pair) == "2x nvidia.com/gpu, 1x nvidia.com/mig-1g.10gb"
