"""Fuzzing the verbs with hypothesis: whatever a client sends, the answer is 200 or a 4xx, never a 5xx.

Besides well-formed JSON of every shape, the bodies carry the classes that once escaped as 500s: quantities
``str.isdigit()`` takes but ``int()`` refuses (superscripts, digit strings past int()'s 4,300-digit limit),
invalid UTF-8 inside any string, and nesting deep enough to hit the decoder's recursion limit. Every answer
other than 200 must show in ``gpufleet_extender_bad_requests_total``.
"""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient
from gpufleet_testsupport.scheduler_requests import make_pod
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from gpufleet_extender.app import create_app

from extender_helpers import file_settings, gpus, mig, write_metrics

FLEET = {"hk-gpu-01": gpus(0.1, 0.95), "hk-gpu-02": gpus(0.9), "hk-gpu-03": mig(0, "2g.20gb", 0.5, total=20480)}

# Placeholders put into strings and values by the strategies, swapped for raw bytes once the body is JSON text.
BAD_UTF8 = "@@bad-utf8@@"
DEEP = "@@deep@@"
RAW_BAD_UTF8 = [b"\xff", b"\xc3(", b"\xed\xa0\x80", b"\xf0\x28\x8c\x28", b"n\x80"]
NESTING = [64, 500, 990, 1200, 5000]

texts = st.text(max_size=8) | st.just(BAD_UTF8)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | texts | st.just(DEEP),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
quantities = st.one_of(
    st.integers(-3, 9),
    st.text(max_size=4),
    st.floats(allow_nan=True),
    st.none(),
    st.booleans(),
    # Unicode digits: "²".isdigit() is True and int("²") fails; "٣" is 3 to int() but no Kubernetes quantity.
    st.text(st.characters(categories=["Nd", "No"]), min_size=1, max_size=3),
    st.sampled_from(["²", "1²", "٣", " 2 ", "0x1", "1e3", "9" * 4301, "1" * 19, str(2**63), str(2**63 - 1)]),
    st.integers(min_value=2**63 - 2, max_value=2**70),
    st.just(BAD_UTF8),
    st.just(DEEP),
)
resource_names = st.sampled_from(["nvidia.com/gpu", "nvidia.com/mig-2g.20gb", "nvidia.com/mig-", "cpu", ""])
pods = st.fixed_dictionaries(
    {},
    optional={
        "metadata": st.fixed_dictionaries({}, optional={"name": st.text(max_size=5), "namespace": json_values}),
        "spec": st.fixed_dictionaries(
            {},
            optional={
                "containers": st.lists(
                    st.fixed_dictionaries(
                        {
                            "resources": st.fixed_dictionaries(
                                {},
                                optional={
                                    "limits": st.dictionaries(resource_names, quantities, max_size=2),
                                    "requests": json_values,
                                },
                            )
                        }
                    ),
                    max_size=3,
                )
                | json_values,
                "initContainers": json_values,
            },
        ),
    },
)
names = st.lists(
    st.sampled_from(["hk-gpu-01", "hk-gpu-02", "hk-gpu-03", "x", "", BAD_UTF8]) | st.text(max_size=6), max_size=6
)
extender_args = st.fixed_dictionaries(
    {},
    optional={
        "Pod": pods | json_values,
        "Nodes": st.none()
        | st.fixed_dictionaries(
            {
                "items": st.lists(
                    st.fixed_dictionaries(
                        {
                            "metadata": st.fixed_dictionaries(
                                {}, optional={"name": st.text(max_size=5) | st.just(BAD_UTF8), "labels": json_values}
                            )
                        }
                    ),
                    max_size=3,
                )
                | json_values
            },
            optional={"metadata": json_values, "unread": json_values},
        )
        | json_values,
        "NodeNames": st.none() | names | json_values,
    },
)


@pytest.fixture(scope="module")
def fuzz_client(tmp_path_factory):
    path = write_metrics(tmp_path_factory.mktemp("fuzz") / "dcgm.prom", FLEET)
    with TestClient(create_app(file_settings(path)), raise_server_exceptions=False) as test_client:
        yield test_client


def non_200_count(client) -> float:
    text = client.get("/metrics").text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "gpufleet_extender_bad_requests"
        for sample in family.samples
        if sample.name.endswith("_total")
    )


def to_body(payload, bad_utf8: bytes, depth: int) -> tuple[bytes, bool]:
    """The JSON text of ``payload`` with the placeholders swapped in; True when something was swapped."""
    text = json.dumps(payload).encode()
    swapped = text.replace(BAD_UTF8.encode(), bad_utf8).replace(json.dumps(DEEP).encode(), b"[" * depth + b"]" * depth)
    return swapped, swapped != text


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    payload=extender_args,
    verb=st.sampled_from(["/filter", "/prioritize"]),
    bad_utf8=st.sampled_from(RAW_BAD_UTF8),
    depth=st.sampled_from(NESTING),
)
def test_fuzz_structured_requests_never_5xx(fuzz_client, payload, verb, bad_utf8, depth):
    content, swapped = to_body(payload, bad_utf8, depth)
    counted_before = non_200_count(fuzz_client)
    answer = fuzz_client.post(verb, content=content)
    event(
        f"HTTP {answer.status_code}, {'with' if swapped else 'without'} raw bytes swapped in"
    )  # --hypothesis-show-statistics
    assert answer.status_code in (200, 400, 422), (content[:300], answer.text[:300])
    assert non_200_count(fuzz_client) - counted_before == (answer.status_code != 200)
    answer.content.decode("utf-8")  # never invalid UTF-8 echoed back, in a 200 or a 4xx
    if answer.status_code != 200:
        assert answer.json()["detail"]
        return
    if swapped:  # the raw bytes sat in a part the extender does not read; nothing more to compare
        return
    nodes = payload.get("Nodes")
    sent = payload["NodeNames"] if nodes is None else [item["metadata"]["name"] for item in nodes.get("items") or []]
    result = answer.json()
    if verb == "/prioritize":
        assert [entry["Host"] for entry in result] == sent  # one per input node, in order
        return
    kept = result["NodeNames"] if nodes is None else [item["metadata"]["name"] for item in result["Nodes"]["items"]]
    rejected = [*result["FailedNodes"], *result["FailedAndUnresolvableNodes"]]
    assert set(kept) | set(rejected) == set(sent) and not set(kept) & set(rejected)  # never a node not sent


# Bodies kube-scheduler could send (right shape, one form) with the hostile values where the extender reads:
# quantities, node names, labels, and unread fields that travel back in the answer.
hostile_text = st.text(max_size=6) | st.just(BAD_UTF8)
well_formed_pod = st.fixed_dictionaries(
    {
        "metadata": st.fixed_dictionaries({"name": hostile_text, "namespace": hostile_text}),
        "spec": st.fixed_dictionaries(
            {
                "containers": st.lists(
                    st.fixed_dictionaries(
                        {"resources": st.fixed_dictionaries({"limits": st.dictionaries(resource_names, quantities)})}
                    ),
                    min_size=1,
                    max_size=2,
                )
            }
        ),
    },
    optional={"status": json_values},
)
node_names = st.sampled_from(["hk-gpu-01", "hk-gpu-02", "hk-gpu-03", "n9", BAD_UTF8]) | st.text(min_size=1, max_size=5)
well_formed = st.one_of(
    st.fixed_dictionaries(
        {"Pod": well_formed_pod, "Nodes": st.none(), "NodeNames": st.lists(node_names | st.just(DEEP), max_size=5)}
    ),
    st.fixed_dictionaries(
        {
            "Pod": well_formed_pod,
            "NodeNames": st.none(),
            "Nodes": st.fixed_dictionaries(
                {
                    "items": st.lists(
                        st.fixed_dictionaries(
                            {
                                "metadata": st.fixed_dictionaries(
                                    {"name": node_names, "labels": st.dictionaries(hostile_text, hostile_text)}
                                ),
                                "spec": json_values,
                            }
                        ),
                        max_size=4,
                    )
                }
            ),
        }
    ),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    payload=well_formed,
    verb=st.sampled_from(["/filter", "/prioritize"]),
    bad_utf8=st.sampled_from(RAW_BAD_UTF8),
    depth=st.sampled_from(NESTING),
)
def test_fuzz_well_formed_requests_with_hostile_values(fuzz_client, payload, verb, bad_utf8, depth):
    content, swapped = to_body(payload, bad_utf8, depth)
    counted_before = non_200_count(fuzz_client)
    answer = fuzz_client.post(verb, content=content)
    event(f"HTTP {answer.status_code}, {'with' if swapped else 'without'} raw bytes swapped in")
    assert answer.status_code in (200, 400, 422), (content[:300], answer.text[:300])
    assert non_200_count(fuzz_client) - counted_before == (answer.status_code != 200)
    answer.content.decode("utf-8")
    body = answer.json()  # valid JSON either way (and valid UTF-8, checked above)
    assert answer.status_code == 200 or body["detail"]
    if negative_gpu_quantity(payload["Pod"]):  # kube-apiserver would refuse the pod; so does the extender
        assert answer.status_code in (400, 422), (content[:300], body)


def negative_gpu_quantity(pod: dict) -> bool:
    """True when a container limit asks for a negative integer number of GPU devices (bools are not integers)."""
    return any(
        name.startswith("nvidia.com/") and type(value) is int and value < 0
        for container in pod["spec"]["containers"]
        for name, value in container["resources"]["limits"].items()
    )


@settings(max_examples=100, deadline=None)
@given(raw=st.binary(max_size=64), verb=st.sampled_from(["/filter", "/prioritize"]))
def test_fuzz_raw_bytes_never_5xx(fuzz_client, raw, verb):
    assert fuzz_client.post(verb, content=raw).status_code in (200, 400, 422)


# The three classes that were 500s, each on its own (the reproductions), on both verbs.
ESCAPED_500S = {
    "superscript quantity": b'{"Pod":{"spec":{"containers":[{"resources":{"limits":{"nvidia.com/gpu":"\xc2\xb2"}}}]}},'
    b'"Nodes":null,"NodeNames":["n1"]}',
    "4301-digit quantity": b'{"Pod":{"spec":{"containers":[{"resources":{"limits":{"nvidia.com/gpu":"'
    + b"9" * 4301
    + b'"}}}]}},"Nodes":null,"NodeNames":["n1"]}',
    "invalid UTF-8 in NodeNames": b'{"Pod":{},"Nodes":null,"NodeNames":["\xff"]}',
    "deep nesting in an unread field": b'{"Pod":{"status":'
    + b"[" * 1000
    + b"]" * 1000
    + b'},"Nodes":null,"NodeNames":[]}',
    "deep nesting in NodeNames": b'{"Pod":{},"Nodes":null,"NodeNames":' + b"[" * 1000 + b"]" * 1000 + b"}",
    "invalid UTF-8 in an unread Node field": b'{"Pod":{"spec":{"containers":[{"resources":{"limits":'
    b'{"nvidia.com/gpu":"1"}}}]}},"NodeNames":null,"Nodes":{"items":[{"metadata":{"name":"hk-gpu-01"},'
    b'"spec":{"podCIDR":"\xff"}}]}}',
}


@pytest.mark.parametrize("verb", ["/filter", "/prioritize"])
@pytest.mark.parametrize("case", sorted(ESCAPED_500S))
def test_former_500s_are_counted_4xx(fuzz_client, verb, case):
    counted_before = non_200_count(fuzz_client)
    answer = fuzz_client.post(verb, content=ESCAPED_500S[case])
    assert answer.status_code in (400, 422), answer.text[:300]
    assert answer.json()["detail"] and len(answer.content) < 1000  # the 4301 digits are not echoed
    assert non_200_count(fuzz_client) - counted_before == 1


@pytest.mark.parametrize("verb", ["/filter", "/prioritize"])
@pytest.mark.parametrize("quantity", [-1, -(2**63), "-1"])
def test_negative_gpu_quantity_is_422_not_a_pod_without_gpus(fuzz_client, verb, quantity):
    # -1 must not read as "no GPU request" (which passes every node with the neutral score).
    body = {"Pod": make_pod({"nvidia.com/gpu": quantity}), "Nodes": None, "NodeNames": ["hk-gpu-01"]}
    counted_before = non_200_count(fuzz_client)
    answer = fuzz_client.post(verb, json=body)
    assert answer.status_code == 422, answer.text
    assert answer.json()["detail"].startswith("resource nvidia.com/gpu: quantity must ")
    assert non_200_count(fuzz_client) - counted_before == 1


@pytest.mark.parametrize("method", ["GET", "PUT", "PATCH", "DELETE"])
@pytest.mark.parametrize("verb", ["/filter", "/prioritize"])
def test_wrong_methods_are_405_and_counted(fuzz_client, method, verb):
    counted_before = non_200_count(fuzz_client)
    answer = fuzz_client.request(method, verb)
    assert answer.status_code == 405 and answer.headers["allow"] == "POST"
    assert non_200_count(fuzz_client) - counted_before == 1


@pytest.mark.parametrize("length", ["²", "9" * 5000, "-1", "1e3", " 5"])
def test_odd_content_length_is_400_and_counted(fuzz_client, length):
    counted_before = non_200_count(fuzz_client)
    answer = fuzz_client.post("/filter", content=b"{}", headers={"content-length": length.encode()})
    assert answer.status_code == 400, answer.text
    assert non_200_count(fuzz_client) - counted_before == 1
