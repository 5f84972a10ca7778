"""module_utils/pod_requests.py: a pod's GPU request as kube-scheduler and the kubelet read it (component-helpers'
PodRequests), and Kubernetes quantities of devices, each boundary where the reader would go wrong."""

from __future__ import annotations

from decimal import Decimal

import pytest
from ansible_collections.gpufleet.mig.plugins.module_utils.pod_requests import (
    MAX_QUANTITY_TEXT,
    ContainerResources,
    QuantityError,
    container_devices,
    device_count,
    is_gpu_resource,
    pod_devices,
    pod_devices_from_object,
    quantity_value,
    shorten,
)

MIG = "nvidia.com/mig-1g.10gb"
GPU = "nvidia.com/gpu"


def c(requests=None, limits=None, restart=None) -> ContainerResources:
    return ContainerResources(limits, requests, restart)


@pytest.mark.parametrize(
    ("name", "gpu"),
    [(GPU, True), (MIG, True), ("nvidia.com/mig-3g.40gb", True), ("nvidia.com/gpu.shared", False),
     ("nvidia.com/mig", False), ("cpu", False), ("example.com/gpu", False)],
)  # fmt: skip
def test_gpu_resources_are_whole_gpus_and_mig_profiles(name, gpu):
    assert is_gpu_resource(name) is gpu


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("2", Decimal(2)), (" 3 ", Decimal(3)), ("+4", Decimal(4)), ("-1", Decimal(-1)), ("1k", Decimal(1000)),
        ("1M", Decimal(10**6)), ("1G", Decimal(10**9)), ("1T", Decimal(10**12)), ("1P", Decimal(10**15)),
        ("1E", Decimal(10**18)), ("1Ki", Decimal(1024)), ("1Mi", Decimal(1024**2)), ("2Gi", Decimal(2 * 1024**3)),
        ("1Ti", Decimal(1024**4)), ("1Pi", Decimal(1024**5)), ("1Ei", Decimal(1024**6)), ("500m", Decimal("0.5")),
        ("2e1", Decimal(20)), ("2E2", Decimal(200)), ("5e-1", Decimal("0.5")), ("1.5", Decimal("1.5")),
        (".5k", Decimal(500)), ("3.", Decimal(3)), (7, Decimal(7)), (2.0, Decimal(2)),
    ],
)  # fmt: skip
def test_quantities_read_as_kubernetes_reads_them(text, value):
    assert quantity_value(text) == value


@pytest.mark.parametrize(
    "text", ["", "k", "1x", "1 k", "1kk", "1e", "1e1234", "٣", "0x10", "1,000", True, None, [], float("inf"),
             float("nan"), "1" * (MAX_QUANTITY_TEXT + 1)]
)  # fmt: skip
def test_anything_else_is_no_quantity(text):
    assert quantity_value(text) is None


def test_a_quantity_of_the_longest_text_allowed_is_still_read():
    assert quantity_value("1" * MAX_QUANTITY_TEXT) == Decimal("1" * MAX_QUANTITY_TEXT)


@pytest.mark.parametrize(
    ("value", "count"), [("0", 0), ("2", 2), (3, 3), ("1k", 1000), ("2e1", 20), (2**63 - 1, 2**63 - 1)]
)
def test_device_counts_are_whole_numbers(value, count):
    assert device_count(MIG, value) == count
    assert type(device_count(MIG, value)) is int


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("500m", f"resource {MIG}: quantity '500m' is 0.5, not a whole number: an extended resource counts whole"),
        ("-1", f"resource {MIG}: quantity must not be negative, got '-1'"),
        ("two", f"resource {MIG}: 'two' is not a Kubernetes quantity (a number with an optional suffix, such as 2, 1k"),
        (2**63, f"resource {MIG}: quantity is larger than Kubernetes allows, got {2**63}"),
        ("9" * 65, f"resource {MIG}: quantity '{'9' * 39}... (67 characters) is longer than any Kubernetes accepts"),
    ],
)
def test_a_quantity_kubernetes_would_refuse_says_why(value, says):
    with pytest.raises(QuantityError) as refused:
        device_count(MIG, value)
    assert str(refused.value).startswith(says), str(refused.value)


def test_messages_carry_a_short_value():
    assert shorten("x" * 38) == repr("x" * 38)
    assert shorten("x" * 39) == repr("x" * 39)[:40] + "... (41 characters)"


def test_a_container_asks_for_its_request_else_its_limit():
    assert container_devices(c(limits={MIG: "2"})) == {MIG: 2}
    assert container_devices(c(requests={MIG: "1"}, limits={MIG: "2"})) == {MIG: 1}  # requests win
    assert container_devices(c(requests={"cpu": "4", GPU: 1}, limits={"memory": "1Gi"})) == {GPU: 1}
    assert container_devices(c()) == {}
    assert container_devices(c(requests={"example.com/fpga": 1}), wanted=lambda n: n.startswith("example.com/")) == {
        "example.com/fpga": 1
    }


def test_a_pod_sums_its_containers_and_sidecars_or_takes_its_largest_init_step():
    app = [c({MIG: 1}), c({MIG: 2, GPU: 1})]
    assert pod_devices(app) == {MIG: 3, GPU: 1}
    # A plain init container runs alone, before the app: the larger of the two counts.
    assert pod_devices(app, [c({MIG: 5})]) == {MIG: 5, GPU: 1}
    assert pod_devices(app, [c({MIG: 2})]) == {MIG: 3, GPU: 1}
    # A sidecar (restartPolicy Always) keeps running: it adds to the app and to every init container after it.
    assert pod_devices(app, [c({MIG: 1}, restart="Always")]) == {MIG: 4, GPU: 1}
    assert pod_devices([c({MIG: 1})], [c({MIG: 1}, restart="Always"), c({MIG: 4})]) == {MIG: 5}
    # ... but not to those before it.
    assert pod_devices([c({MIG: 1})], [c({MIG: 4}), c({MIG: 1}, restart="Always")]) == {MIG: 4}
    # Another restart policy is a plain init container.
    assert pod_devices([c({MIG: 1})], [c({MIG: 1}, restart="OnFailure")]) == {MIG: 1}
    # Zero counts are left out; the result is sorted by name.
    assert pod_devices([c({MIG: 0, GPU: 0})]) == {}
    assert list(pod_devices([c({MIG: 1, GPU: 1})])) == [GPU, MIG]


def test_a_pod_object_as_the_api_returns_it():
    pod = {
        "spec": {
            "containers": [
                {"resources": {"limits": {MIG: "2"}}},
                {"resources": {"requests": {MIG: 1}, "limits": {MIG: 3}}},
                {"name": "no-resources"},
            ],
            "initContainers": [
                {"restartPolicy": "Always", "resources": {"requests": {GPU: "1"}}},
                {"resources": {"limits": {MIG: "1k"}}},
            ],
        }
    }
    # The plain init container's 1000 run beside the sidecar alone, before the app's 3.
    assert pod_devices_from_object(pod) == {GPU: 1, MIG: 1000}


@pytest.mark.parametrize(
    "pod",
    [None, [], {}, {"spec": None}, {"spec": []}, {"spec": {"containers": None}}, {"spec": {"containers": {}}},
     {"spec": {"containers": [None, 3]}}, {"spec": {"containers": [{"resources": []}]}},
     {"spec": {"containers": [{"resources": {"limits": [], "requests": "x"}}]}}],
)  # fmt: skip
def test_a_pod_object_of_the_wrong_shape_asks_for_nothing(pod):
    assert pod_devices_from_object(pod) == {}


def test_a_pod_object_counts_its_containers_and_its_sidecars_by_their_restart_policy():
    pod = {
        "spec": {
            "containers": [{"resources": {"requests": {MIG: "3"}}}],
            "initContainers": [{"restartPolicy": "Always", "resources": {"limits": {MIG: "1"}}}],
        }
    }
    assert pod_devices_from_object(pod) == {MIG: 4}  # the sidecar runs beside the app
    pod["spec"]["initContainers"][0]["restartPolicy"] = "Never"
    assert pod_devices_from_object(pod) == {MIG: 3}  # a plain init container is done before the app starts


def test_only_the_wanted_resources_are_counted_everywhere():
    fpga = "example.com/fpga"
    wanted = {fpga}.__contains__
    assert pod_devices([c({fpga: 1, MIG: 5})], [c({fpga: 2, MIG: 9})], wanted=wanted) == {fpga: 2}
    assert pod_devices([c({fpga: 1, MIG: 5})], [c({fpga: 1, MIG: 9}, restart="Always")], wanted=wanted) == {fpga: 2}
    pod = {"spec": {"containers": [{"resources": {"limits": {fpga: "3", MIG: "1"}}}]}}
    assert pod_devices_from_object(pod, wanted) == {fpga: 3}


def test_a_zero_request_of_an_init_container_adds_nothing():
    assert pod_devices([c({MIG: 1})], [c({GPU: 0})]) == {MIG: 1}


def test_a_bad_quantity_in_a_container_names_its_resource():
    with pytest.raises(QuantityError, match=f"^resource {MIG}: 'x' is not a Kubernetes quantity"):
        container_devices(c({MIG: "x"}))
    with pytest.raises(QuantityError, match=f"^resource {GPU}: quantity must not be negative"):
        pod_devices_from_object({"spec": {"containers": [{"resources": {"limits": {GPU: "-2"}}}]}})


def test_the_longest_quantity_text_allowed_counts():
    assert device_count(MIG, "0" * (MAX_QUANTITY_TEXT - 1) + "1") == 1


def test_limits_and_requests_that_are_not_mappings_are_ignored():
    pod = {
        "spec": {
            "containers": [{"resources": {"limits": [MIG], "requests": (GPU,)}}, {"resources": {"limits": {MIG: 1}}}]
        }
    }
    assert pod_devices_from_object(pod) == {MIG: 1}
